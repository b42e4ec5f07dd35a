"""I/O paths engines take beyond plain read/write, captured on both backends and checked against references
the project does not produce: strace's own log of the same run and the program's own log of what it did.

- libaio batches: two threads sharing one AIO context, each io_submit carrying 1-4 O_DIRECT iocbs
  (``ckpt_trace.workloads.aio_threads``).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import CKPT_TRACE, cli, record

from ckpt_trace.formats import read_trace

_IOCB = re.compile(r"aio_fildes=\d+<([^>]+)>.*?aio_nbytes=(\d+), aio_offset=(\d+)\}")


def _strace_iocbs(log: Path) -> Counter:
    """(path, offset, bytes) of every iocb strace printed in an io_submit line of its own log (-y)."""
    found = Counter()
    for line in log.read_text(errors="replace").splitlines():
        if " io_submit(" in line:
            for path, size, offset in _IOCB.findall(line):
                found[(path, int(offset), int(size))] += 1
    return found


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(3))
@pytest.mark.parametrize("backend_name", ["bcc", "strace"])
def test_every_iocb_of_every_batch_of_two_threads_is_in_the_trace(request, tmp_path, backend_name, attempt):
    request.getfixturevalue(f"{backend_name}_backend")
    out, log, trace = tmp_path / "out", tmp_path / "own.json", tmp_path / "t.arrow"
    command = [sys.executable, "-m", "ckpt_trace.workloads.aio_threads", str(out), str(log)]
    strace_log = tmp_path / "strace.log"
    if backend_name == "bcc" and shutil.which("strace"):
        # strace's own log of the very run bcc records (strace is traced too; it only watches io_submit)
        command = [
            "strace",
            "-f",
            "-qq",
            "-y",
            "-s",
            "8",
            "-e",
            "trace=io_submit",
            "-o",
            str(strace_log),
            "--",
            *command,
        ]
    record(backend_name, trace, f"{out}/", *command)
    own = Counter((path, offset, size) for path, _, offset, size in json.loads(log.read_text()))
    assert sum(own.values()) == 384 and max(own.values()) == 1
    data = read_trace(trace)
    rows = [r for r in data.table.to_pylist() if r["interface"] == "libaio" and r["op"] == "write"]
    got = Counter((r["path"], r["offset"], r["size"]) for r in rows)
    assert got == own
    assert all(r["ret"] == 4096 and r["syscall"] == "aio:PWRITE" for r in rows)
    assert data.metadata["lost_events"] == 0 and data.metadata["unreaped_requests"] == 0
    submits = [r for r in data.table.to_pylist() if r["op"] == "io_submit"]
    assert sum(r["size"] for r in submits) == 384 and {r["size"] for r in submits} == {1, 2, 3, 4}
    assert len({r["tid"] for r in rows}) == 2, "both threads submit"
    assert {r["queue_id"] for r in rows + submits} == {0}, "queue_id numbers queues from 0 (formats/README.md)"
    if strace_log.exists():
        assert _strace_iocbs(strace_log) == got


def test_an_iocb_the_tracer_cannot_read_is_counted_as_lost(bcc_backend, tmp_path, monkeypatch):
    out, log, trace = tmp_path / "out", tmp_path / "own.json", tmp_path / "t.arrow"
    monkeypatch.setenv("CKPT_TRACE_BPF_MAX_IOCBS", "2")  # batches of 3 and 4 are longer than the tracer reads
    record("bcc", trace, f"{out}/", sys.executable, "-m", "ckpt_trace.workloads.aio_threads", str(out), str(log), "48")
    data = read_trace(trace)
    submits = [r for r in data.table.to_pylist() if r["op"] == "io_submit"]
    beyond = sum(max(0, r["ret"] - 2) for r in submits)
    assert beyond > 0
    reasons = data.metadata["lost_reasons"]
    assert reasons["iocbs_unread"] == beyond
    assert data.metadata["lost_events"] == sum(reasons.values())
    rows = [r for r in data.table.to_pylist() if r["interface"] == "libaio" and r["op"] == "write"]
    assert len(rows) == 96 - beyond


# -- in-kernel copies --------------------------------------------------------------------------------------------

_COPY_LINE = re.compile(r"^\d+\s+(sendfile|copy_file_range|splice|ioctl)\((.*)\) += (-?\d+)")
_FD = re.compile(r"(?:src_fd=)?\d+<([^>]*)>")


def _strace_copy_rows(log: Path, out: Path) -> Counter:
    """The rows a copy call of strace's own log (-y) should become: (call, op, file, other file, ret), a file
    being a path under ``out`` (a pipe is none)."""
    rows = Counter()
    names: dict[int, str] = {}  # descriptor -> path, as strace last printed it (FICLONE's source is a bare number)
    for line in log.read_text(errors="replace").splitlines():
        names.update((int(fd), path) for fd, path in re.findall(r"(\d+)<([^>]*)>", line))
        match = _COPY_LINE.match(line)
        if not match or (match.group(1) == "ioctl" and "0x4020940d" not in line and "0x40049409" not in line):
            continue
        call, args, ret = match.group(1), match.group(2), int(match.group(3))
        paths = [p if p.startswith(f"{out}/") else None for p in _FD.findall(args)]
        if call == "sendfile":
            dst, src = paths[0], paths[1]
        elif call == "ioctl":
            if len(paths) == 1:
                source = names.get(int(re.search(r", 0x40049409, (\d+)", args).group(1)), "")
                paths.append(source if source.startswith(f"{out}/") else None)
            dst, src = paths[0], paths[1]
            ret = -95 if ret == -1 and "EOPNOTSUPP" in line else ret
        else:
            src, dst = paths[0], paths[1]
        if src:
            rows[(call, "read", src, dst, ret)] += 1
        if dst:
            rows[(call, "write", dst, src, ret)] += 1
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["bcc", "strace"])
def test_sendfile_copy_file_range_splice_and_ficlone_are_rows_naming_both_files(request, tmp_path, backend_name):
    request.getfixturevalue(f"{backend_name}_backend")
    out, log, trace, strace_log = tmp_path / "out", tmp_path / "own.json", tmp_path / "t.arrow", tmp_path / "s.log"
    command = [sys.executable, "-m", "ckpt_trace.workloads.copies", str(out), str(log)]
    if shutil.which("strace"):  # strace's own log of the same run (under bcc; under strace, a second strace
        # cannot attach, so its log comes from a separate run of the same deterministic program)
        reference = [
            "strace",
            "-f",
            "-qq",
            "-y",
            "-X",
            "raw",
            "-e",
            "trace=sendfile,copy_file_range,splice,ioctl",
            "-o",
            str(strace_log),
            "--",
        ]
        if backend_name == "bcc":
            command = reference + command
        else:
            import subprocess

            subprocess.run(
                reference
                + [
                    sys.executable,
                    "-m",
                    "ckpt_trace.workloads.copies",
                    str(tmp_path / "ref"),
                    str(tmp_path / "ref.json"),
                ],
                check=True,
            )
            strace_log.write_text(strace_log.read_text().replace(str(tmp_path / "ref"), str(out)))
    record(backend_name, trace, f"{out}/", *command)
    own = json.loads(log.read_text())
    rows = [
        r
        for r in read_trace(trace).table.to_pylist()
        if r["interface"] in ("sendfile", "copy_file_range", "splice", "ficlone")
    ]
    got = Counter((r["syscall"], r["op"], r["path"], r["new_path"], r["ret"]) for r in rows)
    if strace_log.exists():
        assert got == _strace_copy_rows(strace_log, out)
    size = 1 << 20
    for interface in ("sendfile", "copy_file_range", "splice"):
        copy = str(out / f"{interface}.bin")
        writes = sorted((r["offset"], r["ret"]) for r in rows if r["interface"] == interface and r["op"] == "write")
        reads = sorted((r["offset"], r["ret"]) for r in rows if r["interface"] == interface and r["op"] == "read")
        expected = sorted((entry[4], entry[6]) for entry in own if entry[0] == interface and entry[2])
        assert writes == expected and sum(n for _, n in writes) == size, interface
        assert sorted((entry[3], entry[6]) for entry in own if entry[0] == interface and entry[1]) == reads
        assert [o for o, _ in writes] == [sum(n for _, n in writes[:i]) for i in range(len(writes))], "contiguous"
        assert all(r["path"] == copy for r in rows if r["interface"] == interface and r["op"] == "write")
        assert {r["new_path"] for r in rows if r["interface"] == interface and r["op"] == "write"} <= {
            str(out / "source.bin"),
            None,
        }
    clones = [r for r in rows if r["interface"] == "ficlone"]
    assert [(r["op"], r["size"], r["ret"]) for r in clones] == [
        ("read", size, own[-2][6]),
        ("write", size, own[-2][6]),
        ("read", 65536, own[-1][6]),
        ("write", 65536, own[-1][6]),
    ]


def test_a_posix_replay_leaves_each_copy_whole(bcc_backend, tmp_path):
    out, log, trace, target = tmp_path / "out", tmp_path / "own.json", tmp_path / "t.arrow", tmp_path / "replay"
    record("bcc", trace, f"{out}/", sys.executable, "-m", "ckpt_trace.workloads.copies", str(out), str(log))
    cli("replay", str(trace), "--strategy", "posix", "--target", str(target), "--verify")
    replayed = target / str(out).lstrip("/")
    for name in ("sendfile.bin", "copy_file_range.bin", "splice.bin", "source.bin"):
        assert (replayed / name).stat().st_size == 1 << 20, name


# -- mapped I/O ------------------------------------------------------------------------------------------------

_MAPPED_FILES = {"shared.bin": "write", "cold.bin": "read", "warm.bin": "read"}


def _covered(rows: list[dict], path: str, op: str | None) -> int:
    """Bytes of ``path`` covered by page rows (of ``op``, or any), overlaps counted once."""
    ranges = sorted(
        (r["offset"], r["offset"] + r["size"])
        for r in rows
        if r["path"] == path
        and r["interface"] == "mmap"
        and r["offset_source"] == "page"
        and (op is None or r["op"] == op)
    )
    covered, end = 0, -1
    for start, stop in ranges:
        if stop > end:
            covered += stop - max(start, end)
            end = stop
    return covered


def _record_mapped(tmp_path: Path, name: str, *extra: str, env: dict | None = None, check: bool = True):
    out, log, trace = tmp_path / name, tmp_path / f"{name}.json", tmp_path / f"{name}.arrow"
    import os
    import subprocess

    environment = {**os.environ, **(env or {}), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [
            *CKPT_TRACE,
            "record",
            "--backend",
            "bcc",
            "-o",
            str(trace),
            "--path-filter",
            f"{out}/",
            *extra,
            "--",
            sys.executable,
            "-m",
            "ckpt_trace.workloads.mapped",
            str(out),
            str(log),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return out, log, trace, proc


def test_mapped_reads_cold_and_warm_and_shared_writes_are_covered_by_rows(bcc_backend, tmp_path):
    out, log, trace, proc = _record_mapped(tmp_path, "m")
    own = json.loads(log.read_text())
    data = read_trace(trace)
    rows = data.table.to_pylist()
    for phase, path, offset, size in own:
        name = Path(path).name
        covered = _covered(rows, path, _MAPPED_FILES[name])
        assert offset == 0 and covered >= 0.99 * size, f"{phase}: {covered / size:.1%} of {size:,} bytes"
    # The kernel's file-page count is read exactly (kmem:rss_stat's size, the per-CPU parts summed): a page
    # another mapping mapped is not counted for these (the raw counter's lag once left up to 32 pages per CPU).
    assert data.metadata["mapped_uncovered_bytes"] == 0
    assert "covered by no row" not in proc.stderr


def test_an_omitted_page_tracepoint_leaves_uncovered_bytes_stated_exactly(bcc_backend, tmp_path):
    omit = {"CKPT_TRACE_BPF_OMIT_TRACEPOINTS": "filemap:mm_filemap_map_pages"}  # a kernel without it
    *_, trace, proc = _record_mapped(tmp_path, "strict", "--strict", env=omit, check=False)
    assert proc.returncode != 0 and "covered by no row" in proc.stderr and not trace.exists()
    out, log, trace, proc = _record_mapped(tmp_path, "m", env=omit)
    rows = read_trace(trace).table.to_pylist()
    size = 64 << 20
    expected = sum(size - _covered(rows, str(out / name), None) for name in _MAPPED_FILES)
    assert expected > size  # the warm reads are all fault-around: none of them is a row now
    uncovered = read_trace(trace).metadata["mapped_uncovered_bytes"]
    assert uncovered == expected, (uncovered, expected)
    line = [line for line in proc.stderr.splitlines() if "covered by no row" in line]
    assert len(line) == 1 and f"{uncovered:,} bytes" in line[0]
    shown = cli("summary", str(trace)).stdout
    assert len([line for line in shown.splitlines() if "covered by no row" in line and f"{uncovered:,}" in line]) == 1
    assert json.loads(cli("summary", str(trace), "--json").stdout)["mapped_uncovered_bytes"] == uncovered


@pytest.fixture
def reflink_dir(tmp_path):
    """A directory on a fresh XFS with reflinks (a loop-mounted image; root and mkfs.xfs), unmounted after."""
    import os
    import subprocess

    if os.geteuid() != 0 or shutil.which("mkfs.xfs") is None:
        pytest.skip("a reflink file system needs root and mkfs.xfs (apt-get install xfsprogs)")
    image, mount = tmp_path / "xfs.img", tmp_path / "xfs"
    with open(image, "wb") as handle:
        handle.truncate(320 << 20)
    mount.mkdir()
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
    if subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot loop-mount an image here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["bcc", "strace"])
def test_a_reflink_is_a_ficlone_copy_of_the_whole_range(request, reflink_dir, tmp_path, backend_name):
    request.getfixturevalue(f"{backend_name}_backend")
    out, log, trace = reflink_dir / "c", tmp_path / "own.json", tmp_path / "t.arrow"
    record(backend_name, trace, f"{out}/", sys.executable, "-m", "ckpt_trace.workloads.copies", str(out), str(log))
    own = json.loads(log.read_text())
    assert own[-2][-1] == own[-1][-1] == 0, "the reflinks succeeded"
    assert (out / "ficlone.bin").stat().st_size == 1 << 20 and (out / "ficlonerange.bin").stat().st_size == 65536
    rows = [r for r in read_trace(trace).table.to_pylist() if r["interface"] == "ficlone"]
    source = str(out / "source.bin")
    assert [(r["op"], r["path"], r["new_path"], r["offset"], r["size"], r["ret"]) for r in rows] == [
        ("read", source, str(out / "ficlone.bin"), 0, 1 << 20, 0),
        ("write", str(out / "ficlone.bin"), source, 0, 1 << 20, 0),
        ("read", source, str(out / "ficlonerange.bin"), 0, 65536, 0),
        ("write", str(out / "ficlonerange.bin"), source, 0, 65536, 0),
    ]
