"""Recording real processes: every operation exact, both backends alike, exit codes, lost events."""

from __future__ import annotations

import sys
from collections import Counter

from conftest import cli

from ckpt_trace.formats import read_trace
from ckpt_trace.tracer import syscalls as sc


def data_ops(table):
    return Counter((r["op"], r["path"], r["offset"], r["ret"]) for r in table.to_pylist() if r["op"] in ("read", "write"))


def test_every_read_and_write_is_exact(backend, odd_recording):
    trace_path, expected, out = odd_recording
    trace = read_trace(trace_path)
    want = Counter((e["op"], e["path"], e["offset"], e["bytes"]) for e in expected)
    assert data_ops(trace.table) == want
    rows = trace.table.to_pylist()
    assert ("rename", str(out / "a.bin"), str(out / "a.final")) in {(r["op"], r["path"], r["new_path"]) for r in rows}
    assert ("unlink", str(out / "gone.tmp")) in {(r["op"], r["path"]) for r in rows}
    assert ("mkdir", str(out / "sub")) in {(r["op"], r["path"]) for r in rows}
    ops = {r["syscall"] for r in rows}
    assert {"writev", "pwritev2", "pwrite64", "readv", "pread64", "lseek", "fcntl", "dup2"} <= ops
    if (out / "d.direct").exists():
        opens = [r for r in rows if r["op"] == "open" and r["path"] == str(out / "d.direct")]
        assert opens and opens[0]["flags"] & sc.O_DIRECT
    assert trace.metadata["backend"] == backend and trace.metadata["lost_events"] == 0
    assert any(out.as_posix().startswith(mount) for mount in trace.metadata["filesystems"])
    from ckpt_trace.iolayer.host import mount_of

    mount = mount_of(str(out))  # the file system's device, as /proc/self/mountinfo names it
    assert trace.metadata["filesystems"][mount.mount_point]["device"] == mount.source


def _comparable(table, out):
    """Rows with paths relative to the recording's output directory (the two backends record different runs)."""
    def rel(path):
        return path.replace(str(out), "OUT") if path else path

    return Counter(
        (r["op"], r["syscall"], rel(r["path"]), rel(r["new_path"]), r["offset"], r["size"],
         r["ret"] if r["op"] not in ("open", "dup") else None, r["flags"], r["iov_count"])
        for r in table.to_pylist()
    )


def test_both_backends_write_the_same_rows(bcc_backend, strace_backend, odd_recordings):
    rows = {}
    for backend in (strace_backend, bcc_backend):
        trace, _, out = odd_recordings(backend)
        rows[backend] = _comparable(read_trace(trace).table, out)
    strace_rows, bcc_rows = rows["strace"], rows["bcc"]
    assert strace_rows - bcc_rows == Counter() and bcc_rows - strace_rows == Counter()


def test_record_returns_the_commands_exit_code(backend, tmp_path):
    trace = tmp_path / "t.arrow"
    proc = cli("record", "--backend", backend, "-o", str(trace), "--", "sh", "-c",
               f"echo hi > {tmp_path}/f; exit 7", check=False)
    assert proc.returncode == 7, proc.stderr
    rows = read_trace(trace).table.to_pylist()
    writes = [(r["offset"], r["ret"]) for r in rows if r["path"] == f"{tmp_path}/f" and r["op"] == "write"]
    assert writes == [(0, 3)]  # "hi\n" through the descriptor the shell dup2'ed onto stdout


def test_existing_trace_is_never_overwritten(tmp_path):
    trace = tmp_path / "t.arrow"
    trace.write_bytes(b"keep me")
    proc = cli("record", "-o", str(trace), "--", "true", check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert trace.read_bytes() == b"keep me"


def test_a_missing_command_fails_cleanly(backend, tmp_path):
    proc = cli("record", "--backend", backend, "-o", str(tmp_path / "t.arrow"), "--",
               "/nonexistent/ckpt-trace-cmd", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr


def test_lost_events_are_counted_and_strict_refuses(bcc_backend, tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_TRACE_BPF_RINGBUF_PAGES", "1")
    monkeypatch.setenv("CKPT_TRACE_BPF_POLL_MS", "2000")
    scratch = tmp_path / "busy"
    busy = [sys.executable, "-c",
            f"import os\nfor _ in range(30000): os.close(os.open('{scratch}', os.O_WRONLY | os.O_CREAT, 0o644))"]
    strict = cli("record", "--backend", "bcc", "--strict", "-o", str(tmp_path / "s.arrow"), "--", *busy, check=False)
    assert strict.returncode == 2 and "lost" in strict.stderr
    assert not (tmp_path / "s.arrow").exists()
    loose = cli("record", "--backend", "bcc", "-o", str(tmp_path / "l.arrow"), "--", *busy)
    assert "events were lost" in loose.stderr
    assert read_trace(tmp_path / "l.arrow").metadata["lost_events"] > 0


def test_auto_names_the_backend_and_why(tmp_path):
    proc = cli("record", "-o", str(tmp_path / "t.arrow"), "--", "true")
    assert "backend" in proc.stderr and "(" in proc.stderr.splitlines()[0]


def test_auto_falls_back_to_strace_when_the_kernel_refuses_bpf(bcc_backend, strace_backend, tmp_path, monkeypatch):
    from ckpt_trace.errors import TracerError
    from ckpt_trace.tracer import bcc_backend as module
    from ckpt_trace.tracer import choose_backend, record

    def refuse(self):
        raise TracerError("the kernel refused the BPF program (test)")

    monkeypatch.setattr(module.BccTracer, "load", refuse)
    choice = choose_backend("auto")
    assert choice.name == "bcc" and choice.may_fall_back
    result = record(["sh", "-c", f"echo x > {tmp_path}/f"], tmp_path / "t.arrow", choice=choice)
    assert result.backend == "strace" and "refused" in result.backend_reason
    trace = read_trace(tmp_path / "t.arrow")
    assert trace.metadata["backend"] == "strace" and "refused" in trace.metadata["backend_reason"]
    assert [r["ret"] for r in trace.table.to_pylist() if r["op"] == "write" and r["path"] == f"{tmp_path}/f"] == [2]
