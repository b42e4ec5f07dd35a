"""Descriptors that cross threads (``replayer.ordering``): a file opened in one thread, written in a second
and closed in a third replays under every strategy with its recorded size; workers whose descriptors are
disjoint gain no dependency on each other."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from conftest import record
from helpers.traces import CREATE, make_trace

from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import build_posix_plan, replay
from ckpt_trace.replayer.distributed import owners, share_batches, share_of, share_plan
from ckpt_trace.replayer.ordering import cross_worker_edges
from ckpt_trace.replayer.replay import STRATEGIES, build_plan

# A program whose descriptors cross threads, as torchsnapshot's and DeepSpeed's pools hand them on:
# A opens, B writes (at known offsets and at the file position), C closes; D dups a descriptor the main
# thread opened, the main thread closes its own after the dup, D writes through the dup and closes it;
# E and F write files of their own; before them, a forked child writes through an inherited descriptor the
# parent closes later, and execs, closing a close-on-exec one. Every hand-over waits for the step before it.
PROGRAM = textwrap.dedent("""
    import os, sys, threading
    out = sys.argv[1]
    box = {}
    # Fork inheritance: the child writes through the parent's descriptor, the parent closes it afterwards;
    # a close-on-exec descriptor is closed in a child by its exec, the parent still writes through it.
    inherited = os.open(os.path.join(out, "forked.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    cloexec = os.open(os.path.join(out, "cloexec.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    child = os.fork()
    if child == 0:
        os.pwrite(inherited, b"c" * 200000, 0)
        os.execv("/bin/true", ["true"])
    os.waitpid(child, 0)
    os.pwrite(inherited, b"p" * 1000, 200000)
    os.close(inherited)
    os.pwrite(cloexec, b"e" * 5000, 0)
    os.close(cloexec)
    def a():
        box["fd"] = os.open(os.path.join(out, "shared.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    def b():
        fd = box["fd"]
        for i in range(16):
            os.pwrite(fd, bytes([i]) * 65536, i * 65536)
        os.lseek(fd, 16 * 65536, os.SEEK_SET)
        for i in range(4):
            os.write(fd, b"x" * 4000)
    def c():
        os.close(box["fd"])
    for step in (a, b, c):
        t = threading.Thread(target=step); t.start(); t.join()
    main_fd = os.open(os.path.join(out, "dup.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    def d():
        box["dup"] = os.dup(main_fd)
    t = threading.Thread(target=d); t.start(); t.join()
    os.close(main_fd)
    def d2():
        os.pwrite(box["dup"], b"y" * 300000, 0)
        os.close(box["dup"])
    t = threading.Thread(target=d2); t.start(); t.join()
    def own(name, size):
        fd = os.open(os.path.join(out, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(fd, b"z" * size, 0)
        os.close(fd)
    ts = [threading.Thread(target=own, args=(f"own{i}.bin", 100000 + i)) for i in range(2)]
    [t.start() for t in ts]; [t.join() for t in ts]
""")
SIZES = {
    "shared.bin": 16 * 65536 + 4 * 4000,
    "dup.bin": 300000,
    "own0.bin": 100000,
    "own1.bin": 100001,
    "forked.bin": 201000,
    "cloexec.bin": 5000,
}


def _record(backend: str, tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / f"out-{backend}"
    out.mkdir()
    program = tmp_path / "threads.py"
    program.write_text(PROGRAM)
    trace = tmp_path / f"{backend}.arrow"
    record(backend, trace, out, sys.executable, str(program), str(out))
    assert {p.name: p.stat().st_size for p in out.iterdir()} == SIZES
    return trace, out


def _replayed_sizes(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["strace", "bcc"])
def test_a_descriptor_crossing_threads_replays_under_every_strategy(backend_name, request, tmp_path, io_uring):
    backend = request.getfixturevalue(f"{backend_name}_backend")
    trace, out = _record(backend, tmp_path)
    table = read_trace(trace).table
    rows = table.to_pylist()
    shared = [r for r in rows if r["path"] == str(out / "shared.bin") and r["op"] in ("open", "write", "close")]
    assert len({r["tid"] for r in shared}) == 3  # opened, written and closed by three threads
    plan = build_posix_plan(table, strip_prefix=str(out))
    close = next(
        op
        for w in plan.workers
        for op in w.ops
        if op.kind == "close"
        and op.path is None
        and plan.files.file_paths[plan.files.handle_files[op.handle]] == "shared.bin"
    )
    last_write = max(
        r_seq
        for r_seq, r in enumerate(sorted(rows, key=lambda r: r["ts_ns"]))
        if r["path"] == str(out / "shared.bin") and r["op"] == "write"
    )
    assert last_write in close.deps  # the close waits for the other thread's last write
    forked = [
        op
        for w in plan.workers
        for op in w.ops
        if op.handle is not None and plan.files.file_paths.get(plan.files.handle_files[op.handle]) == "forked.bin"
    ]
    child_write = next(op for op in forked if op.kind == "write" and op.size == 200000)
    parent_close = next(op for op in forked if op.kind == "close")
    assert child_write.seq in parent_close.deps  # the parent's close after the child's write, across processes
    for run in range(10):
        target = tmp_path / f"replay-{run}"
        report = replay(trace, target=target, strategy="all", strip_prefix=str(out), verify=True)
        assert not report.size_mismatches, report.size_mismatches
        for strategy in STRATEGIES:
            assert _replayed_sizes(target / strategy) == SIZES, (run, strategy)
        report.release()


def test_workers_with_disjoint_descriptors_gain_no_dependency(tmp_path):
    rows = []
    for tid in (1, 2, 3):
        path = f"/d/f{tid}"
        rows += [
            {"tid": tid, "ts_ns": i * 10 + tid, **op}
            for i, op in enumerate(
                [
                    {"op": "open", "path": path, "fd": 2 + tid, "flags": CREATE, "ret": 2 + tid},
                    {"op": "write", "path": path, "fd": 2 + tid, "offset": 0, "size": 100, "ret": 100},
                    {"op": "lseek", "path": path, "fd": 2 + tid, "offset": 0},
                    {"op": "write", "path": path, "fd": 2 + tid, "size": 50, "ret": 50},
                    {"op": "fsync", "path": path, "fd": 2 + tid},
                    {"op": "close", "path": path, "fd": 2 + tid},
                ]
            )
        ]
    # Thread 4 opens a file that thread 5 writes and thread 6 closes: only they gain edges.
    rows += [
        {"tid": 4, "ts_ns": 1000, "op": "open", "path": "/d/s", "fd": 9, "flags": CREATE, "ret": 9},
        {"tid": 5, "ts_ns": 1010, "op": "write", "path": "/d/s", "fd": 9, "offset": 0, "size": 10, "ret": 10},
        {"tid": 6, "ts_ns": 1020, "op": "close", "path": "/d/s", "fd": 9},
    ]
    trace = make_trace(tmp_path / "t.arrow", sorted(rows, key=lambda r: r["ts_ns"]))
    for strategy in STRATEGIES:
        plan = build_plan(read_trace(trace).table, strategy)
        tid_of = {op.seq: w.tid for w in plan.workers for op in w.ops}
        for w in plan.workers:
            for op in w.ops:
                if w.tid <= 3:
                    assert op.deps == (), (strategy, w.tid, op)
                for dep in op.deps:
                    assert tid_of[dep] in (4, 5, 6) and w.tid in (5, 6)
    plan = build_posix_plan(read_trace(trace).table)
    rows_, seqs = cross_worker_edges(plan.ops)
    assert sorted(zip(plan.ops.seq[rows_].tolist(), seqs.tolist())) == [(20, 18), (20, 19)]  # close <- open, write
    close = next(op for w in plan.workers for op in w.ops if op.kind == "close" and w.tid == 6)
    assert close.deps == (18, 19)  # the open (thread 4) and the write (thread 5)


def test_a_distributed_share_keeps_the_cross_thread_order(tmp_path):
    """Under torchrun, a process plans its owners' rows: threads of one process are one owner, so the
    close of a descriptor another thread wrote keeps its wait in the share's plan."""
    rows = [
        {"pid": 7, "tid": 7, "rank": 0, "ts_ns": 0, "op": "open", "path": "/d/s", "fd": 3, "flags": CREATE, "ret": 3},
        {
            "pid": 7,
            "tid": 8,
            "rank": 0,
            "ts_ns": 10,
            "op": "write",
            "path": "/d/s",
            "fd": 3,
            "offset": 0,
            "size": 10,
            "ret": 10,
        },
        {"pid": 7, "tid": 9, "rank": 0, "ts_ns": 20, "op": "close", "path": "/d/s", "fd": 3},
        {"pid": 9, "tid": 9, "rank": 1, "ts_ns": 30, "op": "open", "path": "/d/t", "fd": 3, "flags": CREATE, "ret": 3},
    ]
    trace = make_trace(tmp_path / "t.arrow", rows)
    found = owners(trace)
    share = share_of(found, 0, 2)
    cut = share_plan(build_posix_plan(share_batches(trace, share)), share)
    close = next(op for w in cut.plan.workers for op in w.ops if op.kind == "close")
    assert close.deps == (0, 1) and {0, 1} <= cut.plan.awaited and not cut.remote


def _fd_reused_across_threads(tmp_path: Path, second: list[dict]) -> Path:
    """Thread 2 gets fd 3 from a call (``second``, its last row the one returning 3) that enters while
    thread 1 still has its own fd 3 open and returns after thread 1 wrote and closed it, as the lead's
    recording of ``PROGRAM`` had it (pid 24383: own0.bin, own1.bin); the rows are in entry (``ts_ns``) order."""
    own0, own1 = "/d/own0.bin", "/d/own1.bin"
    rows = [
        {
            "tid": 1,
            "ts_ns": 259482204,
            "dur_ns": 131312,
            "op": "open",
            "path": own0,
            "fd": 3,
            "flags": CREATE,
            "ret": 3,
        },
        *second,
        {
            "tid": 1,
            "ts_ns": 259758006,
            "dur_ns": 41661,
            "op": "write",
            "path": own0,
            "fd": 3,
            "offset": 0,
            "size": 100000,
            "ret": 100000,
        },
        {"tid": 1, "ts_ns": 259813891, "dur_ns": 6588, "op": "close", "path": own0, "fd": 3},
        {
            "tid": 2,
            "ts_ns": 259977699,
            "dur_ns": 35770,
            "op": "write",
            "path": own1,
            "fd": 3,
            "offset": 0,
            "size": 100001,
            "ret": 100001,
        },
        {"tid": 2, "ts_ns": 260042293, "dur_ns": 6458, "op": "close", "path": own1, "fd": 3},
    ]
    return make_trace(tmp_path / "t.arrow", sorted(rows, key=lambda r: r["ts_ns"]))


_OPEN_OWN1 = [
    {
        "tid": 2,
        "ts_ns": 259717484,
        "dur_ns": 140396,
        "op": "open",
        "path": "/d/own1.bin",
        "fd": 3,
        "flags": CREATE,
        "ret": 3,
    },
]
_DUP_TO_3 = [  # own1.bin opened on fd 4, then dup2(4, 3) entering before and returning after thread 1's close
    {
        "tid": 2,
        "ts_ns": 259600000,
        "dur_ns": 50000,
        "op": "open",
        "path": "/d/own1.bin",
        "fd": 4,
        "flags": CREATE,
        "ret": 4,
    },
    {"tid": 2, "ts_ns": 259717484, "dur_ns": 140396, "op": "dup", "path": "/d/own1.bin", "fd": 4, "ret": 3},
    {"tid": 2, "ts_ns": 259900000, "dur_ns": 5000, "op": "close", "path": "/d/own1.bin", "fd": 4},
]


@pytest.mark.slow
@pytest.mark.parametrize("second", [_OPEN_OWN1, _DUP_TO_3], ids=["open", "dup"])
def test_a_descriptor_another_thread_gets_while_its_number_is_open_binds_once_returned(tmp_path, second):
    """An open or dup takes its descriptor at its exit, a write and a close look theirs up at their entry
    (``replayer.plan._effect_order``): thread 1's write and close of its fd 3 act on own0.bin though thread
    2's call that returned fd 3 (own1.bin) entered before them."""
    trace = _fd_reused_across_threads(tmp_path, second)
    target = tmp_path / "replay"
    report = replay(trace, target=target, strategy="posix", strip_prefix="/d", verify=True)
    assert not report.size_mismatches, report.size_mismatches
    assert _replayed_sizes(target) == {"own0.bin": 100000, "own1.bin": 100001}
    report.release()
    plan = build_posix_plan(read_trace(trace).table, strip_prefix="/d")
    path_of = {
        op.seq: plan.files.file_paths[plan.files.handle_files[op.handle]]
        for w in plan.workers
        for op in w.ops
        if op.kind in ("write", "close") and op.handle is not None
    }
    assert sorted(path_of.values()) == ["own0.bin", "own0.bin", "own1.bin", "own1.bin"] + (
        ["own1.bin"] if second is _DUP_TO_3 else []
    )


@pytest.mark.slow
@pytest.mark.parametrize("second", [_OPEN_OWN1, _DUP_TO_3], ids=["open", "dup"])
def test_a_plan_binding_a_write_to_another_file_than_its_row_names_is_refused(tmp_path, monkeypatch, second):
    """The check independent of the planner (``replayer.checks.check_bound_paths``): with the planner's
    effect ordering undone (descriptor changes at each row's entry, the bug fixed in 9a67e08), thread 1's
    write of own0.bin binds to own1.bin, and the replay is refused before any I/O, naming the row."""
    from ckpt_trace.errors import ReplayError
    from ckpt_trace.replayer import plan as planner

    trace = _fd_reused_across_threads(tmp_path, second)
    target = tmp_path / "replay"
    report = replay(trace, target=target, strategy="posix", strip_prefix="/d")  # the fixed planner: agreed
    assert _replayed_sizes(target) == {"own0.bin": 100000, "own1.bin": 100001}
    report.release()
    monkeypatch.setattr(planner, "_effect_order", lambda rows, walked: (slice(None), {}))
    again = tmp_path / "again"
    with pytest.raises(ReplayError, match=r"reads or writes /d/own0\.bin, but the plan binds it to own1\.bin"):
        replay(trace, target=again, strategy="all", strip_prefix="/d")
    assert not again.exists() or not any(again.rglob("*.bin"))
