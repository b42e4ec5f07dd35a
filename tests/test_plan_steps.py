"""Each named step of the planning pipeline (``replayer.plan``, ``replayer.aggregate``) alone, on a small
trace whose every answer is worked out by hand in the comments.

The trace (row: thread, call):

    0: t1 open /ck/a fd 3 O_WRONLY|O_CREAT|O_TRUNC      5: t1 io_uring_enter (a ring call: skipped)
    1: t1 write fd 3 [0, 100)                           6: t1 write fd 3, failed (ENOSPC: skipped)
    2: t1 write fd 3 [100, 150)                         7: t1 io_uring write fd 3 [200, 208), queue 2, 4 in flight
    3: t2 write fd 3 [4096, 4106) (t1's descriptor)     8: t1 close fd 3
    4: t2 read fd 9 /ck/in [0, 30) (never opened)       9: t1 mkdir /ck/d

Whole plans are compared with the frozen ones in ``test_plan_frozen.py`` and with the one-row-at-a-time
reference in ``test_plan_equivalence.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.traces import table_of

from ckpt_trace.formats import vocabulary as v
from ckpt_trace.replayer import aggregate as agg
from ckpt_trace.replayer import plan as pl
from ckpt_trace.replayer.optable import COPY, KIND, KINDS, MAPPING_KINDS, OpTable, PlanOp

CREATE = v.open_flag("O_WRONLY", "x86_64") | v.open_flag("O_CREAT", "x86_64") | v.open_flag("O_TRUNC", "x86_64")
T1, T2 = (1 << 32) | 1, (1 << 32) | 2  # worker keys: pid << 32 | tid


def _table():
    rows = [
        dict(tid=1, op="open", path="/ck/a", fd=3, flags=CREATE, ret=3),
        dict(tid=1, op="write", path="/ck/a", fd=3, offset=0, size=100, ret=100),
        dict(tid=1, op="write", path="/ck/a", fd=3, offset=100, size=50, ret=50),
        dict(tid=2, op="write", path="/ck/a", fd=3, offset=4096, size=10, ret=10),
        dict(tid=2, op="read", path="/ck/in", fd=9, offset=0, size=30, ret=30),
        dict(tid=1, op="io_uring_enter", fd=5, ret=1),
        dict(tid=1, op="write", path="/ck/a", fd=3, size=7, ret=-28),
        dict(
            tid=1,
            op="write",
            path="/ck/a",
            fd=3,
            offset=200,
            size=8,
            ret=8,
            interface="io_uring",
            queue_id=2,
            in_flight=4,
        ),
        dict(tid=1, op="close", path="/ck/a", fd=3),
        dict(tid=1, op="mkdir", path="/ck/d"),
    ]
    return table_of(rows, gap_ns=10, ret=None)  # a row without ret holds null, as the answers above assume


def _rows():
    return pl._Rows([_table().select(list(pl.PLAN_COLUMNS))], 10)


def _bound():
    rows = _rows()
    return rows, pl._bind(rows, pl._classify(rows), None, "x86_64")


def _io():
    """The steps up to ``_gather_io``: (rows, walk, merged, workers, io, ret)."""
    rows, bound = _bound()
    p = bound.planner
    walk_workers = np.array([(pid << 32) | tid for (pid, tid), _ in p.ops], np.int64)
    merged = pl._merge_io(bound.data_rows, p.data_ops)
    workers = pl._index_workers(rows, merged.row, walk_workers)
    io, ret = pl._gather_io(rows, merged, bound.handles, p.data_ops)
    return rows, p, merged, workers, io, ret


def test_load_reads_columns_in_start_time_order_with_masks():
    table = _table()
    rows = pl._Rows([table.slice(5), table.slice(0, 5)], 10)  # batches out of order: rows sorted by ts_ns
    assert rows.cols["ts_ns"].tolist() == list(range(0, 100, 10))
    assert rows.valid("offset").tolist() == [False, True, True, True, True, False, False, True, False, False]
    assert rows.texts[rows.cols["op"][7]] == "write" and rows.code("no such op") == -2
    assert rows.row(4) == {**rows.row(4), "op": "read", "path": "/ck/in", "fd": 9, "offset": 0, "size": 30}
    rows.drop("offset")
    assert "offset" not in rows.cols and "offset?" not in rows.cols
    assert rows.take("ts_ns").tolist()[-1] == 90 and "ts_ns" not in rows.cols


def test_classify_splits_bulk_walked_and_skipped_rows():
    classes = pl._classify(_rows())
    assert classes.data.tolist() == [1, 2, 3, 4, 7]  # reads and writes on a descriptor
    assert classes.control.tolist() == [0, 8, 9]
    assert classes.skipped == {"queue_calls": 1, "failed": 1}


def test_walk_records_typed_bindings_origins_truncations():
    p = pl._walk(_rows(), np.array([0, 8, 9]), None, "x86_64")
    assert p.bindings == [pl.Binding(1, 3, 0, 0), pl.Binding(1, 3, 8, -1)]
    assert p.handle_origin == {0: pl.Origin(0, (1, 1))}
    assert p.truncations == [pl.Truncation(file=0, seq=0, length=0)]  # O_TRUNC
    assert [op.kind for _, op in p.ops] == [v.OPEN, v.CLOSE, v.MKDIR]


def test_bind_walks_the_reads_no_binding_covers():
    _, bound = _bound()
    assert bound.data_rows.tolist() == [1, 2, 3, 7] and bound.handles.tolist() == [0, 0, 0, 0]
    # row 4 (fd 9, never opened) was walked: an implicit open of /ck/in (handle 1) by thread 2, then the read
    assert bound.planner.data_ops == [pl.WalkedIO(row=4, handle=1, deps=(), offset=0, size=None, mapped=False)]
    assert [(op.seq, op.kind, op.handle) for _, op in bound.planner.ops] == [
        (0, "open", 0),
        (4, "open", 1),
        (8, "close", 0),
        (9, "mkdir", None),
    ]
    assert bound.planner.skipped["implicit_opens"] == 1


def test_merge_puts_bulk_and_walked_rows_in_row_order():
    merged = pl._merge_io(np.array([1, 2, 3, 7]), [pl.WalkedIO(4, 1, (), 0, None, False)])
    assert merged.row.tolist() == [1, 2, 3, 4, 7] and merged.source.tolist() == [0, 1, 2, 4, 3]
    assert merged.bulk.tolist() == [True, True, True, False, True]
    assert merged.in_row_order(np.array([10, 20, 30, 70]), np.array([40])).tolist() == [10, 20, 30, 40, 70]
    alone = pl._merge_io(np.array([5, 6]), [])
    bulk_values = np.array([1, 2])
    assert alone.in_row_order(bulk_values, np.zeros(0)) is bulk_values  # nothing walked: no copy


def test_index_workers_numbers_the_threads():
    _, _, _, workers, _, _ = _io()
    assert workers.keys.tolist() == [T1, T2]
    assert workers.of_row.tolist() == [0, 0, 1, 1, 0] and workers.row_key.tolist() == [T1, T1, T2, T2, T1]


def test_gather_takes_the_io_columns():
    rows, _, _, _, io, ret = _io()
    assert io.handle.tolist() == [0, 0, 0, 1, 0]
    assert io.is_write.tolist() == [True, True, True, False, True] and not io.mapped.any()
    assert io.offset.tolist() == [0, 100, 4096, 0, 200] and io.offset_known.all()
    assert io.size.tolist() == [100, 50, 10, 30, 8] and ret.tolist() == [100, 50, 10, 30, 8]
    assert io.queue.tolist() == [-1, -1, -1, -1, 2]  # the io_uring request's ring
    assert not {"op", "offset", "ret", "size", "interface", "queue_id", "pid", "tid"} & set(rows.cols)


def test_read_extents_of_files_the_trace_did_not_create():
    _, p, _, _, io, ret = _io()
    assert pl._read_extents(p, io, ret) == {"ck/in": 30}


def test_handles_waits_and_queue_depths():
    rows, p, merged, workers, io, _ = _io()
    handles = pl._handle_arrays(p)
    assert handles.file.tolist() == [0, 1] and handles.origin_seq.tolist() == [0, 4]
    assert handles.origin_worker.tolist() == [T1, T2]
    needs, awaited = pl._bulk_waits(merged.bulk, io.handle, workers.row_key, handles, p.awaited)
    assert needs.tolist() == [False, False, True, False, False] and awaited == {0}  # t2's write waits t1's open
    assert pl._queue_depths({}, rows, merged.row, merged.bulk, io.queue) == {2: 4}


def test_file_ends_layout_sizes_and_checks():
    _, p, merged, _, io, ret = _io()
    fid = pl._handle_arrays(p).file[io.handle]
    ends = pl._file_ends(p, fid, merged.row, io)
    assert ends.end.tolist() == [4106, 0] and ends.written.tolist() == [True, False]
    assert not ends.unknown_after.any()
    layout = pl._layout(p, pl._read_extents(p, io, ret))
    assert layout.final_path == {0: "ck/a", 1: "ck/in"} and layout.parents == {"ck"}
    assert layout.precreate_files == (("ck/in", 30),)
    assert layout.pattern_key.tolist() == [pl.file_key("ck/a"), pl.file_key("ck/in")]
    assert pl._expected_sizes(p, ends, layout) == {"ck/a": 4106, "ck/in": 30}
    assert pl._verify_ranges(p, fid, merged.row, io, layout.precreate_files) == {
        0: [(0, 150), (200, 208), (4096, 4106)],
        1: [(0, 30)],
    }
    checks = pl._plan_checks(p, io, fid, merged.row, layout, verify_ranges=True)
    assert dict(checks.verify_ranges) == {"ck/a": ((0, 150), (200, 208), (4096, 4106)), "ck/in": ((0, 30),)}
    assert checks.unverifiable == () and checks.ranges_planned
    assert dict(pl._plan_checks(p, io, fid, merged.row, layout, verify_ranges=False).verify_ranges) == {}


def test_table_steps_order_deps_and_interleave():
    _, p, merged, workers, io, _ = _io()
    walk_workers = np.array([(pid << 32) | tid for (pid, tid), _ in p.ops], np.int64)
    walk_table, handle_path = pl._walk_table(p, workers.keys, walk_workers)
    assert [(KINDS[k], s) for k, s in zip(walk_table.kind, walk_table.seq)] == [
        ("open", 0),
        ("close", 8),
        ("mkdir", 9),
        ("open", 4),
    ]  # by worker, then seq
    assert [walk_table.paths[i] for i in handle_path] == ["ck/a", "ck/in"]
    order = pl._worker_order(workers.of_row, merged)
    assert order.order.tolist() == [0, 1, 4, 2, 3]  # t1's rows 1, 2, 7, then t2's 3, 4
    assert order.walked_at.tolist() == [4] and order.walked_source.tolist() == [0]
    needs = np.array([False, False, True, False, False])
    dep_ptr, dep_seq = pl._io_deps(needs[order.order], io.handle[order.order], np.array([0, 4]), order, p.data_ops)
    assert dep_ptr.tolist() == [0, 0, 0, 0, 1, 1] and dep_seq.tolist() == [0]
    row, widx = merged.row[order.order], workers.of_row[order.order]
    at = pl._walk_positions(widx, row, walk_table)
    assert at.tolist() == [0, 4, 5, 7]  # the implicit open (7) lands just before the read it is for (8)


def test_io_columns_and_worker_plans():
    _, p, merged, workers, io, _ = _io()
    order = pl._worker_order(workers.of_row, merged)
    row, widx, handle = merged.row[order.order], workers.of_row[order.order], io.handle[order.order]
    columns = pl._io_columns(
        io, order.order, row, widx, handle, np.arange(10) * 10, np.array([5, 6]), np.array([111, 222])
    )
    assert columns["kind"].tolist() == [KIND["write"]] * 4 + [KIND["read"]]
    assert columns["seq"].tolist() == [1, 2, 7, 3, 4] and columns["ts_ns"].tolist() == [10, 20, 70, 30, 40]
    assert columns["path"].tolist() == [5, 5, 5, 5, 6]
    assert columns["pattern_key"].tolist() == [111, 111, 111, 111, 0]  # reads carry no pattern
    table = OpTable.from_ops(
        [0, 0, 1],
        [
            PlanOp(seq=1, kind="write", ts_ns=0),
            PlanOp(seq=2, kind="write", ts_ns=0),
            PlanOp(seq=3, kind="read", ts_ns=0),
        ],
    )
    ranks = np.array([-1, 7, 7, 5])
    workers = pl._worker_plans(table, np.array([T1, T2]), {(1, 1): 0}, ranks, np.array([1, 2, 3]), np.array([0, 0, 1]))
    assert [(w.pid, w.tid, w.rank, w.start, w.stop) for w in workers] == [(1, 1, 0, 0, 2), (1, 2, 5, 2, 3)]


def test_precreate_dirs_and_renumbering():
    rows, bound = _bound()
    assert pl._precreate_dirs(bound.planner) == ("ck",)  # ck/d is made by the trace
    plan = pl.build_posix_plan(_table())
    assert [(op.seq, op.kind) for op in plan.workers[0].ops] == [
        (0, "open"),
        (1, "write"),
        (2, "write"),
        (7, "write"),
        (8, "close"),
        (9, "mkdir"),
    ]
    assert [(op.seq, op.kind, op.deps) for op in plan.workers[1].ops] == [
        (3, "write", (0,)),
        (4, "open", ()),
        (4, "read", ()),
    ]
    assert plan.awaited == {0, 3}  # t1's close waits for t2's use of its descriptor (replayer.ordering)
    renumbered = pl._renumbered(plan, np.arange(10) * 100)
    assert renumbered.ops.seq.tolist() == (plan.ops.seq * 100).tolist()
    assert renumbered.awaited == {0, 300} and renumbered.ops.dep_seq.tolist() == (plan.ops.dep_seq * 100).tolist()


def test_plan_kinds_are_the_formats_names():
    """The table's kinds are the format's operation names (and the plan's own COPY), their codes derived."""
    assert set(KINDS) == v.METADATA_OPS | v.DATA_OPS | MAPPING_KINDS | {COPY}
    assert MAPPING_KINDS <= v.MAPPING_OPS and COPY not in v.OPS
    assert all(KINDS[KIND[name]] == name for name in KINDS) and len(KINDS) < 128  # int8 codes


# -- aggregate's steps --------------------------------------------------------------------------------------------


def _ops() -> OpTable:
    """One worker: open, writes [0, 150) in a run, lseek, write [150, 200), fsync, write [5000, 5100), rename,
    read [0, 10) waiting for seq 99, close."""
    ops = [
        PlanOp(seq=0, kind="open", ts_ns=0, handle=0, path="f", flags=CREATE),
        PlanOp(seq=1, kind="write", ts_ns=1, handle=0, offset=0, size=100),
        PlanOp(seq=2, kind="write", ts_ns=2, handle=0, offset=100, size=50),
        PlanOp(seq=3, kind="lseek", ts_ns=3, handle=0, offset=0),
        PlanOp(seq=4, kind="write", ts_ns=4, handle=0, offset=150, size=50),
        PlanOp(seq=5, kind="fsync", ts_ns=5, handle=0),
        PlanOp(seq=6, kind="write", ts_ns=6, handle=0, offset=5000, size=100),
        PlanOp(seq=7, kind="rename", ts_ns=7, path="f", new_path="g"),
        PlanOp(seq=8, kind="read", ts_ns=8, handle=0, offset=0, size=10, deps=(99,)),
        PlanOp(seq=9, kind="close", ts_ns=9, handle=0, release=True),
    ]
    return OpTable.from_ops([0] * len(ops), ops)


def test_aggregate_barriers_and_runs():
    ops = _ops()
    barriers = agg._barriers(ops, frozenset())
    assert np.flatnonzero(barriers.pending).tolist() == [1, 2, 4, 6, 8]
    assert np.flatnonzero(barriers.handle).tolist() == [5, 9]  # fsync, close (lseek is no barrier)
    assert np.flatnonzero(barriers.every).tolist() == [0, 7]  # operations naming paths
    assert np.flatnonzero(agg._barriers(ops, frozenset({6})).every).tolist() == [0, 6, 7]  # awaited: kept
    runs = agg._collect_runs(ops, barriers.pending)
    assert runs.pos.tolist() == [1, 4, 6, 8] and runs.heads.tolist() == [0, 2, 3, 4]
    assert runs.start.tolist() == [0, 150, 5000, 0] and runs.end.tolist() == [150, 200, 5100, 10]


def test_aggregate_flush_groups_and_pieces():
    ops = _ops()
    barriers = agg._barriers(ops, frozenset())
    runs = agg._collect_runs(ops, barriers.pending)
    flush, end = agg._flush_positions(ops, runs, barriers, 1)
    assert flush.tolist() == [5, 5, 7, 9] and end.tolist() == [10] * 4
    groups = agg._group_runs(ops, runs, flush, end, barriers.handle, 1)
    assert groups.of_run.tolist() == [0, 0, 1, 2] and groups.first_op.tolist() == [1, 6, 8]
    assert (groups.key[:, 0] // groups.span).tolist() == [5, 7, 9]
    pieces = agg._pieces(groups.of_run, runs.start, runs.end, 1 << 20, 4096)
    assert list(zip(pieces.group.tolist(), pieces.offset.tolist(), pieces.size.tolist())) == [
        (0, 0, 200),
        (1, 5000, 100),
        (2, 0, 10),
    ]
    big = agg._pieces(np.array([0]), np.array([100]), np.array([(2 << 20) + 4196]), 1 << 20, 4096)
    assert list(zip(big.offset.tolist(), big.size.tolist())) == agg.split_extent(100, (2 << 20) + 4196, 1 << 20, 4096)


def test_aggregate_deps_and_placement():
    ops = _ops()
    barriers = agg._barriers(ops, frozenset())
    runs = agg._collect_runs(ops, barriers.pending)
    flush, end = agg._flush_positions(ops, runs, barriers, 1)
    groups = agg._group_runs(ops, runs, flush, end, barriers.handle, 1)
    pairs = agg._group_deps(ops, barriers.pending, runs, groups.of_run)
    assert pairs.tolist() == [[2, 99]]  # the read's group waits for what the read waited for
    pieces = agg._pieces(groups.of_run, runs.start, runs.end, 1 << 20, 4096)
    cover = agg._cover(ops, runs, groups.of_run, pieces)
    assert cover.first.tolist() == [0, 0, 0, 1, 2] and cover.count.tolist() == [1, 1, 1, 1, 1]
    piece_ts = agg._ready_ts(ops, runs, pieces, groups.first_op, cover)
    assert piece_ts.tolist() == [4, 6, 8]  # writes: the last write into the piece; the read: its group's first
    piece_op_size = agg._piece_op_size(ops, runs, pieces, cover)
    assert piece_op_size.tolist() == [100, 100, 10]  # the largest recorded operation each piece holds bytes of
    placed = agg._place(
        ops, barriers.pending, pieces, groups.key[:, 0] // groups.span, groups.first_op, piece_ts, piece_op_size
    )
    assert placed.rows.tolist() == [0, 3, 1, 5, 6, 7, 8, 9]  # each piece just before its barrier
    assert placed.ts_ns.tolist() == [0, 3, 4, 5, 6, 7, 8, 9]
    assert placed.is_piece.tolist() == [False, False, True, False, True, False, True, False]
    assert placed.size.tolist()[2] == 200 and placed.group.tolist() == [-1, -1, 0, -1, 1, -1, 2, -1]
    assert placed.op_size.tolist() == [-1, -1, 100, -1, 100, -1, 10, -1]  # kept rows: their own (none set)
    group_dep_ptr = np.array([0, 0, 0, 1])
    dep_ptr, dep_seq = agg._placed_deps(ops, placed, group_dep_ptr, pairs)
    assert dep_ptr.tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1] and dep_seq.tolist() == [99]


@pytest.mark.parametrize("awaited", [frozenset(), frozenset({4})])
def test_aggregate_table_is_its_steps(awaited):
    """The steps composed: what ``aggregate_table`` returns for the table above."""
    table = agg.aggregate_table(_ops(), awaited, buffer_bytes=1 << 20, block_bytes=4096)
    got = [(KINDS[k], int(o), int(s)) for k, o, s in zip(table.kind, table.offset, table.size)]
    if not awaited:
        assert got == [
            ("open", -1, -1),
            ("lseek", 0, -1),
            ("write", 0, 200),
            ("fsync", -1, -1),
            ("write", 5000, 100),
            ("rename", -1, -1),
            ("read", 0, 10),
            ("close", -1, -1),
        ]
    else:  # the write at seq 4 is awaited: kept, flushing what came before it (after the lseek: no barrier)
        assert got[:4] == [("open", -1, -1), ("lseek", 0, -1), ("write", 0, 150), ("write", 150, 50)]
