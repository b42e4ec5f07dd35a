"""The columnar planner plans exactly what the one-row-at-a-time reference planner plans.

The reference (``reference_planner.py``) is the planner ckpt-trace used before
planning went columnar; every field of the plan is compared: each worker's
operations in order, what is made before the clock, sizes, the ranges
``--verify`` checks, waits, queue depths. Inputs: every golden trace and
random traces of descriptors opened, duplicated, closed and reused across
threads, reads and writes at known and unknown offsets, truncations,
renames, unlinks and fallocate.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import reference_aggregate
import reference_planner as reference
from helpers.traces import table_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_trace.formats import read_trace
from ckpt_trace.replayer.aggregate import build_aggregated_plan
from ckpt_trace.replayer.plan import PLAN_COLUMNS, build_posix_plan
from ckpt_trace.tracer import syscalls as sc

GOLDEN = sorted((Path(__file__).resolve().parent.parent / "traces" / "golden").glob("v*.arrow"))
_OP_FIELDS = (
    "seq",
    "kind",
    "ts_ns",
    "handle",
    "source_handle",
    "path",
    "new_path",
    "offset",
    "size",
    "flags",
    "release",
    "deps",
    "pattern_key",
    "pattern_offset",
    "queue",
    "mapped",
)


def _ops(plan) -> list[list[tuple]]:
    return [[tuple(getattr(op, name) for name in _OP_FIELDS) for op in worker.ops] for worker in plan.workers]


def assert_same_plan(table, arch="x86_64") -> None:
    assert_plans_equal(build_posix_plan(table, arch=arch), reference.build_posix_plan(table, arch=arch))


def assert_plans_equal(new, old) -> None:
    assert [(w.pid, w.tid, w.rank) for w in new.workers] == [(w.pid, w.tid, w.rank) for w in old.workers]
    assert _ops(new) == _ops(old)
    assert new.precreate_dirs == old.precreate_dirs
    assert new.precreate_files == old.precreate_files
    assert dict(new.skipped_ops) == dict(old.skipped_ops)
    assert new.bytes_to_write == old.bytes_to_write
    assert new.awaited == old.awaited
    assert dict(new.pattern_keys) == dict(old.pattern_keys)
    assert dict(new.checks.expected_sizes) == dict(old.checks.expected_sizes)
    assert dict(new.checks.verify_ranges) == dict(old.checks.verify_ranges)
    assert new.checks.unverifiable == old.checks.unverifiable
    assert dict(new.files.handle_files) == dict(old.files.handle_files)
    assert dict(new.files.file_paths) == dict(old.files.file_paths)
    assert dict(new.queue_depths) == dict(old.queue_depths)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_golden_traces_plan_the_same(path):
    """Host<->device copy rows (format version 3) came after the reference: the planners are compared on the
    rest, and the columnar planner plans one copy operation per copy row."""
    trace = read_trace(path)
    is_copy = pc.equal(trace.table["interface"].cast(pa.string()), "cuda")
    assert_same_plan(trace.table.filter(pc.invert(is_copy)), trace.metadata["arch"])
    copies = sum(op.kind == "copy" for worker in build_posix_plan(trace.table).workers for op in worker.ops)
    assert copies == pc.sum(is_copy.cast(pa.int64())).as_py()


CREATE = sc.O_WRONLY | sc.O_CREAT | sc.O_TRUNC
FILES = ["/d/a", "/d/b", "/d/c"]
_ROW = st.one_of(
    st.tuples(
        st.just("open"),
        st.sampled_from(FILES),
        st.sampled_from([CREATE, sc.O_RDONLY, sc.O_RDWR, sc.O_WRONLY | sc.O_CREAT]),
    ),
    st.tuples(st.just("write"), st.integers(0, 1 << 16), st.integers(0, 9000), st.booleans()),
    st.tuples(st.just("read"), st.integers(0, 1 << 16), st.integers(0, 9000), st.booleans()),
    st.tuples(st.just("close")),
    st.tuples(st.just("dup")),
    st.tuples(st.just("ftruncate"), st.integers(0, 1 << 16)),
    st.tuples(st.just("fallocate"), st.integers(0, 1 << 16), st.integers(1, 1 << 14)),
    st.tuples(st.just("rename"), st.sampled_from(FILES), st.sampled_from(FILES)),
    st.tuples(st.just("unlink"), st.sampled_from(FILES)),
    st.tuples(st.just("fsync")),
)


def _trace(steps: list[tuple[int, int, tuple]]):
    """Rows from (thread, fd, step) triples; each thread's descriptors follow what its steps did."""
    rows: list[dict] = []
    open_fds: dict[tuple[int, int], str] = {}

    def add(tid, op, **values):
        rows.append({"pid": 1 if tid < 3 else 2, "tid": tid, "op": op, **values})

    for tid, fd, step in steps:
        pid = 1 if tid < 3 else 2
        kind = step[0]
        path = open_fds.get((pid, fd), FILES[fd % len(FILES)])  # an fd never opened: inherited, as after fork
        if kind == "open":
            open_fds[(pid, fd)] = step[1]
            add(tid, "open", path=step[1], fd=fd, flags=step[2], ret=fd)
        elif kind in ("write", "read"):
            offset, size, known = step[1], step[2], step[3]
            add(
                tid,
                kind,
                path=path,
                fd=fd,
                offset=offset if known else None,
                size=size,
                ret=-28 if size == 13 else size,
            )
        elif kind == "close":
            open_fds.pop((pid, fd), None)
            add(tid, "close", path=path, fd=fd)
        elif kind == "dup":
            open_fds[(pid, fd + 10)] = path
            add(tid, "dup", path=path, fd=fd, ret=fd + 10)
        elif kind == "ftruncate":
            add(tid, "ftruncate", path=path, fd=fd, size=step[1])
        elif kind == "fallocate":
            add(tid, "fallocate", path=path, fd=fd, offset=step[1], size=step[2], flags=0)
        elif kind == "rename" and step[1] != step[2]:
            add(tid, "rename", path=step[1], new_path=step[2])
        elif kind == "unlink":
            add(tid, "unlink", path=step[1])
        elif kind == "fsync":
            add(tid, "fsync", path=path, fd=fd)
    return table_of(rows, gap_ns=10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(3, 6), _ROW), min_size=1, max_size=60))
def test_random_traces_plan_the_same(steps):
    assert_same_plan(_trace(steps))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(3, 6), _ROW), min_size=1, max_size=60), st.integers(1, 9))
def test_planning_record_batches_in_place_equals_planning_the_table(steps, batch_rows):
    """Columns filled in place batch by batch (``num_rows`` given), where a batch may have no value in a
    column an earlier one filled (no open: no flags), plan what the whole table plans."""
    table = _trace(steps).select(list(PLAN_COLUMNS))
    batches = table.to_batches(max_chunksize=batch_rows)
    assert_plans_equal(build_posix_plan(batches, num_rows=table.num_rows), build_posix_plan(table))


def assert_same_aggregation(table, arch="x86_64", buffer_bytes=1 << 20, block_bytes=4096) -> None:
    base = build_posix_plan(table, arch=arch)
    new = build_aggregated_plan(base, buffer_bytes=buffer_bytes, block_bytes=block_bytes)
    old = [
        reference_aggregate.aggregate_worker_ops(
            w.ops, base.awaited, buffer_bytes=buffer_bytes, block_bytes=block_bytes
        )
        for w in base.workers
    ]
    assert _ops(new) == [[tuple(getattr(op, name) for name in _OP_FIELDS) for op in ops] for ops in old]


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_golden_traces_aggregate_the_same(path):
    trace = read_trace(path)
    assert_same_aggregation(trace.table, trace.metadata["arch"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(1, 4), st.integers(3, 6), _ROW), min_size=1, max_size=60),
    st.sampled_from([512, 4096]),
)
def test_random_traces_aggregate_the_same(steps, block):
    assert_same_aggregation(_trace(steps), buffer_bytes=1 << 20, block_bytes=block)


@settings(deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40)), min_size=1, max_size=60),
    walk=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40)), max_size=5),
)
def test_worker_index_by_thread_table_equals_the_hash(pairs, walk):
    """The thread-id table and the hash agree, and a thread id two processes share falls back to the hash."""
    import numpy as np

    from ckpt_trace.replayer.plan import _worker_index

    pid = np.array([p for p, _ in pairs], np.int32)
    tid = np.array([t for _, t in pairs], np.int32)
    workers = (pid.astype(np.int64) << 32) | tid
    walk_workers = np.array([(p << 32) | t for p, t in walk], np.int64)
    keys, index = _worker_index(workers, walk_workers, pid, tid)
    hashed_keys, hashed = _worker_index(workers, walk_workers)
    assert keys.tolist() == hashed_keys.tolist() == sorted(set(workers.tolist()) | set(walk_workers.tolist()))
    assert index.tolist() == hashed.tolist() and keys[index].tolist() == workers.tolist()


@settings(deadline=None, max_examples=300)
@given(
    bindings=st.lists(
        st.tuples(st.integers(1, 2), st.integers(3, 5), st.integers(0, 400), st.integers(0, 50)), max_size=12
    ),
    runs=st.lists(st.tuples(st.integers(1, 2), st.integers(3, 5), st.integers(1, 40)), min_size=1, max_size=12),
)
def test_asof_join_of_descriptors_equals_a_scan_of_the_bindings(bindings, runs):
    """Rows in runs on one (pid, fd) (looked up at the runs' ends where runs are few) get the handle of
    their slot's last change strictly before them, as a scan of every binding finds it (a later binding at
    the same seq wins)."""
    import numpy as np

    from ckpt_trace.replayer.plan import _asof_handles

    pid = np.array([p for p, _, length in runs for _ in range(length)], np.int32)
    fd = np.array([f for _, f, length in runs for _ in range(length)], np.int32)
    seq = np.arange(len(pid), dtype=np.int64) * 3  # changes may fall between rows, or on one
    expected = []
    for p, f, s in zip(pid.tolist(), fd.tolist(), seq.tolist()):
        before = [
            (b_seq, i, handle)
            for i, (b_pid, b_fd, b_seq, handle) in enumerate(bindings)
            if (b_pid, b_fd) == (p, f) and b_seq < s
        ]
        expected.append(max(before)[2] if before else -1)
    assert _asof_handles(bindings, pid, fd, seq).tolist() == expected


@settings(deadline=None, max_examples=200)
@given(runs=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 30)), min_size=1, max_size=12), data=st.data())
def test_group_max_over_runs_equals_a_scan(runs, data):
    """Per key, the largest value, whether the keys come in few runs (folded first) or many."""
    import numpy as np

    from ckpt_trace.replayer.plan import _group_max

    keys = np.array([k for k, length in runs for _ in range(length)], np.int64)
    values = np.array(data.draw(st.lists(st.integers(0, 1 << 40), min_size=len(keys), max_size=len(keys))), np.int64)
    expected = [max([int(v) for k, v in zip(keys, values) if k == key], default=0) for key in range(6)]
    assert _group_max(keys, values, 6).tolist() == expected


@settings(deadline=None, max_examples=200)
@given(runs=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(1, 30)), min_size=1, max_size=10))
def test_worker_index_over_runs_equals_the_hash_of_each_row(runs):
    """Rows in few runs of one worker's (looked up at their first rows) get the index each row's own
    lookup gives."""
    import numpy as np

    from ckpt_trace.replayer.plan import _worker_index

    pid = np.array([p for p, _, length in runs for _ in range(length)], np.int32)
    tid = np.array([t for _, t, length in runs for _ in range(length)], np.int32)
    workers = (pid.astype(np.int64) << 32) | tid
    keys, index = _worker_index(workers, np.zeros(0, np.int64), pid, tid)
    assert keys.tolist() == sorted(set(workers.tolist())) and keys[index].tolist() == workers.tolist()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(1, 4), st.integers(3, 6), _ROW), min_size=1, max_size=60),
    st.lists(st.integers(0, 100), min_size=60, max_size=60),
)
def test_an_open_that_returns_late_plans_as_one_made_at_its_return(steps, durations):
    """An open takes effect at its return (``replayer.plan._effect_order``): the plan of a trace whose opens
    last a while (other threads' rows start meanwhile) is, operation for operation, the plan of the trace
    where each starts at its return and takes no time (its rows renumbered). (Not so for a dup, which looks
    its source up at its entry: the cross-worker order (``replayer.ordering``) keeps its row's place.)"""
    table = _trace(steps)
    rows = table.to_pylist()
    ts = [r["ts_ns"] for r in rows]
    for i, row in enumerate(rows):  # a call returns before its thread's next call starts
        if row["op"] == "open":
            later = [ts[j] for j in range(i + 1, len(rows)) if rows[j]["tid"] == row["tid"]]
            row["dur_ns"] = min([durations[i], *(t - ts[i] for t in later[:1])])
    moved = [{**r, "ts_ns": r["ts_ns"] + r["dur_ns"], "dur_ns": 0} if r["op"] == "open" else r for r in rows]
    order = sorted(range(len(rows)), key=lambda i: moved[i]["ts_ns"])  # (stable: ties keep row order)
    old_seq = dict(enumerate(order))  # a row's index in the moved trace -> its index in the trace
    lasting = build_posix_plan(table_of(rows))
    instant = build_posix_plan(table_of([moved[i] for i in order]))

    def renumbered(plan, seq_of) -> list[list[tuple]]:
        return [
            [
                (seq_of(op.seq), *(getattr(op, name) for name in _OP_FIELDS[1:] if name not in ("ts_ns", "deps")))
                + (tuple(sorted(seq_of(d) for d in op.deps)),)
                for op in worker.ops
            ]
            for worker in plan.workers
        ]

    assert renumbered(instant, old_seq.__getitem__) == renumbered(lasting, int)
    assert {old_seq[s] for s in instant.awaited} == set(lasting.awaited)
    assert dict(instant.files.handle_files) == dict(lasting.files.handle_files)
    assert dict(instant.files.file_paths) == dict(lasting.files.file_paths)
