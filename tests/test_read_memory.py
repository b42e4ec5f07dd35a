"""Where replayed reads land (``replay --read-memory``, ``replayer.engine``): with ``fresh`` every read faults in
the pages it fills, as a read into newly mapped memory does, through the run loop (reads at known offsets), one
read at a time (at the file position) and the io_uring path, past the fresh arena's end (where it is released
and filled again); with ``reused`` (the default) they land in one buffer, faulted in once; with ``malloc`` the
reads of operations of 32 MiB and more fault, the smaller ones do not. Counted by the kernel: the process's
minor page faults (getrusage(2) ``ru_minflt``) during the run."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from ckpt_trace.formats import read_trace
from ckpt_trace.iolayer.buffers import PAGE_BYTES
from ckpt_trace.replayer import build_plan
from ckpt_trace.replayer.engine import FRESH_READ_BYTES, MALLOC_MMAP_THRESHOLD_BYTES
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.replay import make_executor
from tests.helpers.traces import make_trace

MIB = 1 << 20
AT_OFFSETS = FRESH_READ_BYTES // MIB + 32  # past the arena's end: it is released once and filled again
AT_POSITION = 8
LARGE = 3  # operations of MALLOC_MMAP_THRESHOLD_BYTES + 4 MiB each, after the small ones
LARGE_BYTES = MALLOC_MMAP_THRESHOLD_BYTES + 4 * MIB


def _load_trace(path: Path) -> Path:
    """A load of /ck/m.bin: ``AT_OFFSETS`` preads of 1 MiB, ``LARGE`` of ``LARGE_BYTES``, then ``AT_POSITION``
    reads of 1 MiB at the file position."""
    rows = [{"op": "open", "path": "/ck/m.bin", "fd": 3, "flags": 0, "ret": 3}]
    rows += [
        {"op": "read", "path": "/ck/m.bin", "fd": 3, "offset": i * MIB, "size": MIB, "ret": MIB}
        for i in range(AT_OFFSETS)
    ]
    rows += [
        {"op": "read", "path": "/ck/m.bin", "fd": 3, "offset": AT_OFFSETS * MIB + i * LARGE_BYTES}
        | {"size": LARGE_BYTES, "ret": LARGE_BYTES}
        for i in range(LARGE)
    ]
    rows += [{"op": "read", "path": "/ck/m.bin", "fd": 3, "size": MIB, "ret": MIB} for _ in range(AT_POSITION)]
    rows.append({"op": "close", "path": "/ck/m.bin", "fd": 3})
    return make_trace(path, rows)


def _huge_pages_always() -> bool:
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


def _faults_of_run(trace: Path, target: Path, strategy: str, read_memory: str) -> tuple[int, int]:
    """(minor page faults of this process during the run, bytes the run read)."""
    plan = build_plan(read_trace(trace).table, strategy)
    target.mkdir()
    executor = make_executor(strategy, TargetRoot(target), 8)
    executor.read_memory = read_memory
    executor.prepare(plan)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    result = executor.run(plan)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, result.bytes_read


@pytest.mark.parametrize(
    "strategy", ["posix", pytest.param("uring-buffered", marks=pytest.mark.io_uring, id="uring-buffered")]
)
def test_fresh_reads_fault_in_every_page_they_fill_reused_ones_do_not_and_malloc_only_the_large(
    tmp_path, strategy, request
):
    if strategy != "posix":
        request.getfixturevalue("io_uring")
    trace = _load_trace(tmp_path / "load.arrow")
    small_bytes = (AT_OFFSETS + AT_POSITION) * MIB
    large_bytes = LARGE * LARGE_BYTES
    faults, read = {}, {}
    for mode in ("fresh", "reused", "malloc"):
        faults[mode], read[mode] = _faults_of_run(trace, tmp_path / mode, strategy, mode)
    assert set(read.values()) == {small_bytes + large_bytes}
    page = 2 * MIB if _huge_pages_always() else PAGE_BYTES
    buffer_pages = LARGE_BYTES // PAGE_BYTES  # a worker's buffers are as large as its largest operation
    assert faults["fresh"] >= (small_bytes + large_bytes) // page, faults  # every page each read filled
    # malloc: the large operations' pages, and of the small ones' at most a quarter, beside the buffers
    bound = (large_bytes + small_bytes // 4) // PAGE_BYTES + buffer_pages
    assert large_bytes // page <= faults["malloc"] < bound, faults
    # reused: the write and read buffers, each faulted once
    assert faults["reused"] < large_bytes // PAGE_BYTES, faults


@pytest.mark.slow
def test_malloc_says_which_strategies_read_large_operations_in_smaller_pieces(tmp_path, io_uring):
    """Under ``--read-memory malloc`` a strategy that re-plans the large reads into pieces under the threshold
    (aggregated) lands their bytes in the reused buffer: its result says so, the others' do not."""
    from ckpt_trace.replayer import replay

    report = replay(
        _load_trace(tmp_path / "load.arrow"), target=tmp_path / "t", strategy="all", repeat=1, read_memory="malloc"
    )
    noted = {r.strategy: [n for n in r.notes if n.startswith("read memory malloc")] for r in report.results}
    report.release()
    assert noted["aggregated"] and f"{LARGE * LARGE_BYTES:,} B" in noted["aggregated"][0], noted
    assert not any(noted[name] for name in ("posix", "uring-buffered", "uring-direct")), noted
