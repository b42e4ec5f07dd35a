"""Replay of in-kernel copies (sendfile, copy_file_range, splice, FICLONE rows): each copy is a read row on the
source and a write row on the destination naming each other in ``new_path``; every strategy replays them as
that read and that write (the issue's "read+write"), so the copies keep their recorded size and the pattern
``--verify`` checks, also when the descriptors cross threads."""

from __future__ import annotations

import sys

import pytest
from conftest import record
from helpers.traces import CREATE, make_trace

from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import build_posix_plan, replay
from ckpt_trace.replayer.replay import STRATEGIES
from ckpt_trace.tracer import syscalls as sc

MIB = 1 << 20


def _copy(
    tid: int,
    interface: str,
    src: str,
    src_fd: int,
    src_off: int,
    dst: str,
    dst_fd: int,
    dst_off: int,
    size: int,
    ts: int,
) -> list[dict]:
    """The two rows of one in-kernel copy, as the tracer writes them."""
    common = {"tid": tid, "syscall": interface, "interface": interface, "size": size, "ret": size, "ts_ns": ts}
    return [
        {**common, "op": "read", "path": src, "fd": src_fd, "offset": src_off, "new_path": dst},
        {**common, "op": "write", "path": dst, "fd": dst_fd, "offset": dst_off, "new_path": src},
    ]


@pytest.mark.slow
def test_copy_rows_replay_under_every_strategy_across_threads(tmp_path):
    rows = [
        {
            "tid": 1,
            "op": "open",
            "path": "/c/src",
            "fd": 3,
            "flags": sc.O_RDWR | sc.O_CREAT | sc.O_TRUNC,
            "ret": 3,
            "ts_ns": 0,
        },
        {"tid": 1, "op": "write", "path": "/c/src", "fd": 3, "offset": 0, "size": MIB, "ret": MIB, "ts_ns": 10},
        {"tid": 1, "op": "open", "path": "/c/dst", "fd": 4, "flags": CREATE, "ret": 4, "ts_ns": 20},
    ]
    for i, interface in enumerate(("sendfile", "copy_file_range", "splice", "ficlone")):  # thread 2 copies
        rows += _copy(2, interface, "/c/src", 3, i * (MIB // 4), "/c/dst", 4, i * (MIB // 4), MIB // 4, 30 + i)
    rows += [
        {"tid": 3, "op": "close", "path": "/c/src", "fd": 3, "ts_ns": 100},  # thread 3 closes both
        {"tid": 3, "op": "close", "path": "/c/dst", "fd": 4, "ts_ns": 101},
    ]
    trace = make_trace(tmp_path / "t.arrow", [{"interface": "syscall", **row} for row in rows])
    plan = build_posix_plan(read_trace(trace).table)
    closes = [op for w in plan.workers if w.tid == 3 for op in w.ops]
    assert 9 in closes[0].deps and 10 in closes[1].deps  # each close waits for thread 2's last copy (rows 9, 10)
    for run in range(3):
        target = tmp_path / f"r{run}"
        report = replay(trace, target=target, strategy="all", verify=True)
        assert not report.size_mismatches
        for strategy in STRATEGIES:
            assert (target / strategy / "c/dst").stat().st_size == MIB
            result = next(r for r in report.results if r.strategy == strategy)
            assert result.bytes_written == 2 * MIB and result.bytes_read == MIB
        report.release()


def test_a_recorded_copies_workload_replays_under_every_strategy(strace_backend, tmp_path, io_uring):
    out = tmp_path / "out"
    out.mkdir()
    trace = tmp_path / "t.arrow"
    record(
        strace_backend,
        trace,
        out,
        sys.executable,
        "-m",
        "ckpt_trace.workloads.copies",
        str(out),
        str(tmp_path / "log.json"),
    )
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    assert sizes["sendfile.bin"] == sizes["copy_file_range.bin"] == sizes["splice.bin"] == MIB
    report = replay(trace, target=tmp_path / "r", strategy="all", strip_prefix=str(out), verify=True)
    assert not report.size_mismatches
    for strategy in STRATEGIES:
        assert {p.name: p.stat().st_size for p in (tmp_path / "r" / strategy).iterdir()} == sizes
