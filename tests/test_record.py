"""Recording real processes: every operation exact, both backends alike, exit codes, lost events."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from conftest import cli, record

from ckpt_trace.formats import read_trace
from ckpt_trace.tracer import syscalls as sc


def data_ops(table):
    return Counter(
        (r["op"], r["path"], r["offset"], r["ret"]) for r in table.to_pylist() if r["op"] in ("read", "write")
    )


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
        (
            r["op"],
            r["syscall"],
            rel(r["path"]),
            rel(r["new_path"]),
            r["offset"],
            r["size"],
            r["ret"] if r["op"] not in ("open", "dup") else None,
            r["flags"],
            r["iov_count"],
        )
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
    proc = cli(
        "record",
        "--backend",
        backend,
        "-o",
        str(trace),
        "--",
        "sh",
        "-c",
        f"echo hi > {tmp_path}/f; exit 7",
        check=False,
    )
    assert proc.returncode == 7, proc.stderr
    rows = read_trace(trace).table.to_pylist()
    writes = [(r["offset"], r["ret"]) for r in rows if r["path"] == f"{tmp_path}/f" and r["op"] == "write"]
    assert writes == [(0, 3)]  # "hi\n" through the descriptor the shell dup2'ed onto stdout


@pytest.mark.slow
def test_existing_trace_is_never_overwritten(tmp_path):
    trace = tmp_path / "t.arrow"
    trace.write_bytes(b"keep me")
    proc = cli("record", "-o", str(trace), "--", "true", check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert trace.read_bytes() == b"keep me"


def test_a_missing_command_fails_cleanly(backend, tmp_path):
    proc = cli(
        "record",
        "--backend",
        backend,
        "-o",
        str(tmp_path / "t.arrow"),
        "--",
        "/nonexistent/ckpt-trace-cmd",
        check=False,
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr


def test_lost_events_are_counted_and_strict_refuses(bcc_backend, tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_TRACE_BPF_RINGBUF_PAGES", "1")
    monkeypatch.setenv("CKPT_TRACE_BPF_POLL_MS", "2000")
    scratch = tmp_path / "busy"
    busy = [
        sys.executable,
        "-c",
        f"import os\nfor _ in range(30000): os.close(os.open('{scratch}', os.O_WRONLY | os.O_CREAT, 0o644))",
    ]
    strict = cli("record", "--backend", "bcc", "--strict", "-o", str(tmp_path / "s.arrow"), "--", *busy, check=False)
    assert strict.returncode == 2 and "lost" in strict.stderr
    assert not (tmp_path / "s.arrow").exists()
    loose = cli("record", "--backend", "bcc", "-o", str(tmp_path / "l.arrow"), "--", *busy)
    assert "events were lost" in loose.stderr
    assert read_trace(tmp_path / "l.arrow").metadata["lost_events"] > 0


def test_calls_without_strings_go_to_the_compact_ring(bcc_backend, tmp_path, monkeypatch):
    """A storm of writes records every write, exact, with the path ring one page (six full records): the
    writes travel in the compact ring as 144-byte headers, only the exec and the open need the strings."""
    monkeypatch.setenv("CKPT_TRACE_BPF_RINGBUF_PAGES", "1")
    out = tmp_path / "out"
    out.mkdir()
    target = out / "storm.bin"
    writes = [
        sys.executable,
        "-c",
        f"import os\nfd = os.open('{target}', os.O_WRONLY | os.O_CREAT, 0o644)\n"
        f"for _ in range(20000): os.write(fd, b'x' * 512)\nos.close(fd)",
    ]
    record("bcc", tmp_path / "t.arrow", f"{out}/", *writes)
    trace = read_trace(tmp_path / "t.arrow")
    assert trace.metadata["lost_events"] == 0
    assert data_ops(trace.table) == Counter({("write", str(target), 512 * i, 512): 1 for i in range(20000)})
    assert target.stat().st_size == 512 * 20000


@pytest.mark.slow
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


def test_a_spilled_recording_is_the_same_recording(backend, odd_recording, tmp_path, monkeypatch):
    """Rows spilled as sorted runs every 16 rows, raw BPF records compressed to disk as they come and
    decoded 5 at a time, events fed in effect order once 50 ms old: the same rows as the session's
    recording that held everything, exact against the kernel, and no scratch file left behind. (The
    re-ordering itself: tests/test_state.py.)"""
    from conftest import record_odd_pattern

    monkeypatch.setenv("CKPT_TRACE_RECORD_RUN_ROWS", "16")
    monkeypatch.setenv("CKPT_TRACE_RECORD_RAW_BYTES", "1")
    monkeypatch.setenv("CKPT_TRACE_RECORD_DECODE_EVENTS", "5")
    monkeypatch.setenv("CKPT_TRACE_RECORD_REORDER_SLACK_NS", "50000000")
    monkeypatch.setenv("CKPT_TRACE_RECORD_RELEASE_EVERY", "1")
    trace_path, expected, out = record_odd_pattern(backend, tmp_path / "spilled")
    trace = read_trace(trace_path)
    assert trace.metadata["spilled_runs"] >= 2 and "late_events" in trace.metadata  # merged from runs
    if backend == "bcc":
        assert trace.metadata["spilled_raw_bytes"] > 0
    assert data_ops(trace.table) == Counter((e["op"], e["path"], e["offset"], e["bytes"]) for e in expected)
    ts = trace.table["ts_ns"].to_pylist()
    assert ts == sorted(ts)
    held_trace, _, held_out = odd_recording
    assert _comparable(trace.table, out) == _comparable(read_trace(held_trace).table, held_out)
    assert sorted(p.name for p in trace_path.parent.iterdir()) == sorted(["expected.json", "out", trace_path.name])


@pytest.mark.parametrize("order", ["shuffled", "in-order"])
def test_spooled_runs_merge_into_one_stable_sort_by_start_time(tmp_path, order):
    """Rows of a real trace handed over in a shuffled emission order (runs that interleave: merged) or in
    start-time order (each run after the one before: passed through), with many equal start times, in parts
    of 7 rows: the runs merge into exactly what one stable sort of every row gives."""
    import random

    import pyarrow as pa

    from ckpt_trace.formats import write_trace
    from ckpt_trace.tracer.spool import RowSpool

    golden = read_trace(
        sorted((__import__("pathlib").Path(__file__).parent.parent / "traces" / "golden").glob("v3-*.arrow"))[0]
    )
    rows = golden.table.to_pylist()
    if order == "shuffled":
        random.Random(7).shuffle(rows)
    for i, row in enumerate(rows):
        row["ts_ns"] = row["ts_ns"] // 1_000_000 * 1_000_000 + (i % 3)  # ties, across parts and within them
    if order == "in-order":
        rows.sort(key=lambda row: row["ts_ns"])  # stable: the runs follow one another, ties included
    columns = {name: [r[name] for r in rows] for name in golden.table.column_names}
    meta = {k: v for k, v in golden.metadata.items() if k != "format_version"}
    whole = pa.Table.from_pydict(columns, schema=golden.table.schema).sort_by([("ts_ns", "ascending")])
    write_trace(tmp_path / "whole.arrow", whole, meta)
    spool = RowSpool(tmp_path / "spooled.arrow", run_rows=7)
    try:
        for start in range(0, len(rows), 7):
            spool.add({name: values[start : start + 7] for name, values in columns.items()})
        assert spool.spilled_runs == -(-len(rows) // 7)
        assert spool.write(tmp_path / "spooled.arrow", meta, overwrite=False, batch_rows=10) == len(rows)
    finally:
        spool.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spooled.arrow", "whole.arrow"]
    assert (
        read_trace(tmp_path / "spooled.arrow").table.to_pylist()
        == read_trace(tmp_path / "whole.arrow").table.to_pylist()
    )


_MAPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
for name in ("munmap", "msync", "madvise"):
    getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * (name != "munmap")
P, out = 4096, sys.argv[1]

def anonymous(count):
    for _ in range(count):
        address = libc.mmap(None, 16 * P, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|MAP_ANONYMOUS
        assert libc.munmap(address, 16 * P) == 0

def file_mapping(name, remap):
    fd = os.open(f"{out}/{name}", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, 8 * P)
    address = libc.mmap(None, 4 * P, 3, 0x01, fd, 0)  # MAP_SHARED
    if remap:
        address = libc.mremap(address, 4 * P, 8 * P, 1)  # MREMAP_MAYMOVE
    ctypes.memset(address, 7, 4 * P)
    assert libc.msync(address, 4 * P, 4) == 0  # MS_SYNC
    assert libc.madvise(address, 2 * P, 4) == 0  # MADV_DONTNEED
    anonymous(5)  # a group with a file mapping: its anonymous munmaps still make no row
    assert libc.munmap(address + 2 * P, 2 * P) == 0
    assert libc.munmap(address, 2 * P) == 0
    os.close(fd)

parent = libc.mmap(None, 4 * P, 3, 0x01, os.open(f"{out}/inherited.bin", os.O_RDWR | os.O_CREAT, 0o644), 0)
pid = os.fork()
if pid == 0:
    anonymous(50)
    libc.munmap(parent, 4 * P)  # the parent's mapping: the builder keeps a group's own mappings only
    file_mapping("child.bin", remap=False)
    os._exit(0)
os.waitpid(pid, 0)
anonymous(50)
file_mapping("parent.bin", remap=True)
"""


def test_anonymous_mmaps_dropped_in_the_kernel_are_no_rows_of_the_trace(bcc_backend, strace_backend, tmp_path):
    """Anonymous mmaps are dropped in the kernel: the bcc trace's mapping rows are strace's, which sees every
    call, and exact, with anonymous mappings made and unmapped around file mappings by two processes."""
    mapping_ops = ("mmap", "munmap", "mremap", "msync", "madvise")
    rows = {}
    for backend in (strace_backend, bcc_backend):
        out = tmp_path / backend
        out.mkdir()
        trace = tmp_path / f"{backend}.arrow"
        record(backend, trace, f"{out}/", sys.executable, "-c", _MAPPER, str(out))
        table = read_trace(trace).table
        rows[backend] = Counter(
            (r["op"], r["path"].replace(str(out), "OUT"), r["offset"], r["size"])
            for r in table.to_pylist()
            if r["op"] in mapping_ops
        )
    page = 4096
    own = {("msync", 0, 4 * page), ("madvise", 0, 2 * page), ("munmap", 2 * page, 2 * page), ("munmap", 0, 2 * page)}
    want = Counter(
        {
            ("mmap", "OUT/inherited.bin", 0, 4 * page): 1,
            ("mmap", "OUT/child.bin", 0, 4 * page): 1,
            ("mmap", "OUT/parent.bin", 0, 4 * page): 1,
            ("mremap", "OUT/parent.bin", 0, 8 * page): 1,
            **{
                (op, f"OUT/{name}", offset, size): 1 for name in ("child.bin", "parent.bin") for op, offset, size in own
            },
        }
    )
    assert rows["strace"] == want
    assert rows["bcc"] == want
