"""Where replayed reads land (``replay --read-memory``, ``replayer.engine``): with ``fresh`` every read faults in
the pages it fills, as a read into newly mapped memory does, through the run loop (reads at known offsets), one
read at a time (at the file position) and the io_uring path, past the fresh arena's end (where it is released
and filled again); with ``reused`` they land in one buffer, faulted in once; with ``malloc`` (the default) the
reads of recorded operations of 32 MiB and more fault, the smaller ones do not, also where ``aggregated`` reads
them in pieces of 4 MiB with O_DIRECT. Counted by the kernel: the process's minor page faults (getrusage(2)
``ru_minflt``) during the run."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from ckpt_trace.formats import read_trace
from ckpt_trace.iolayer.buffers import PAGE_BYTES
from ckpt_trace.replayer import build_plan
from ckpt_trace.replayer.engine import FRESH_READ_BYTES, MALLOC_MMAP_THRESHOLD_BYTES
from ckpt_trace.replayer.optable import READ
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.replay import make_executor
from tests.helpers.traces import make_trace

MIB = 1 << 20
AT_OFFSETS = FRESH_READ_BYTES // MIB + 32  # past the arena's end: it is released once and filled again
AT_POSITION = 8
LARGE = 3  # operations of MALLOC_MMAP_THRESHOLD_BYTES + 4 MiB each, after the small ones
LARGE_BYTES = MALLOC_MMAP_THRESHOLD_BYTES + 4 * MIB


def _load_trace(path: Path, large_twice: bool = False) -> Path:
    """A load of /ck/m.bin: ``AT_OFFSETS`` preads of 1 MiB, ``LARGE`` of ``LARGE_BYTES`` (``large_twice``: the
    same ``LARGE`` again), then ``AT_POSITION`` reads of 1 MiB at the file position."""
    rows = [{"op": "open", "path": "/ck/m.bin", "fd": 3, "flags": 0, "ret": 3}]
    rows += [
        {"op": "read", "path": "/ck/m.bin", "fd": 3, "offset": i * MIB, "size": MIB, "ret": MIB}
        for i in range(AT_OFFSETS)
    ]
    rows += [
        {"op": "read", "path": "/ck/m.bin", "fd": 3, "offset": AT_OFFSETS * MIB + i * LARGE_BYTES}
        | {"size": LARGE_BYTES, "ret": LARGE_BYTES}
        for _ in range(2 if large_twice else 1)
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
    "strategy",
    [
        "posix",
        pytest.param("uring-buffered", marks=pytest.mark.io_uring, id="uring-buffered"),
        pytest.param("aggregated", marks=pytest.mark.io_uring, id="aggregated"),
    ],
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
    # malloc: the large operations' pages (aggregated's 4 MiB pieces of them too), and of the small ones' at
    # most a quarter, beside the buffers
    bound = (large_bytes + small_bytes // 4) // PAGE_BYTES + buffer_pages
    assert large_bytes // page <= faults["malloc"] < bound, faults
    # reused: the write and read buffers, each faulted once
    assert faults["reused"] < large_bytes // PAGE_BYTES, faults


def test_an_aggregated_piece_carries_the_size_of_the_recorded_read_it_belongs_to(tmp_path):
    """The aggregated plan cuts the load into pieces of at most 4 MiB; each keeps, as ``op_size``, the largest
    recorded read it holds bytes of (what ``malloc`` decides by); the posix plan sets none."""
    table = read_trace(_load_trace(tmp_path / "load.arrow")).table
    posix, aggregated = build_plan(table, "posix"), build_plan(table, "aggregated")
    assert (posix.ops.op_size == -1).all()
    t = aggregated.ops
    reads = t.kind == READ
    assert t.size[reads].max() <= 4 * MIB < t.size[reads].sum()
    at_offset = reads & (t.offset >= 0)
    large = at_offset & (t.offset >= AT_OFFSETS * MIB)
    assert (t.op_size[large] == LARGE_BYTES).all() and int(t.size[large].sum()) == LARGE * LARGE_BYTES
    assert (t.op_size[at_offset & ~large] == MIB).all()
    assert (t.op_sizes()[reads & (t.offset < 0)] == MIB).all()  # at the file position: kept, their own size


@pytest.mark.slow
def test_malloc_notes_a_strategy_that_reads_fewer_bytes_into_fresh_pages(tmp_path, io_uring):
    """Under ``--read-memory malloc`` (the default) every strategy lands the large recorded reads fresh, so no
    result is noted; where the trace reads the large ranges twice, aggregated merges them and reads them once:
    its result says by how many bytes fewer, the others' do not."""
    from ckpt_trace.replayer import replay

    noted = {}
    for twice in (False, True):
        report = replay(
            _load_trace(tmp_path / f"load-{twice}.arrow", large_twice=twice),
            target=tmp_path / f"t-{twice}",
            strategy="all",
            repeat=1,
        )
        assert report.options["read_memory"] == "malloc"
        noted[twice] = {r.strategy: [n for n in r.notes if n.startswith("read memory malloc")] for r in report.results}
        report.release()
    assert not any(noted[False].values()), noted
    assert noted[True]["aggregated"] and f"{LARGE * LARGE_BYTES:,} B fewer" in noted[True]["aggregated"][0], noted
    assert not any(noted[True][name] for name in ("posix", "uring-buffered", "uring-direct")), noted
