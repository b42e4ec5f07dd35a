"""The aggregated strategy's plan: coalescing, alignment, barriers; and its replay on real traces."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.traces import CREATE, make_trace
from hypothesis import given
from hypothesis import strategies as st

from ckpt_trace.formats import read_trace
from ckpt_trace.ranges import merge_grouped_ranges
from ckpt_trace.replayer import build_plan, merge_extents, replay, split_extent
from ckpt_trace.tracer import syscalls as sc

MIB = 1 << 20


@given(st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 5000)), max_size=30))
def test_merged_extents_cover_exactly_the_union(ranges):
    ranges = [(start, start + length) for start, length in ranges]
    merged = merge_extents(ranges)
    covered = {b for start, end in ranges for b in range(start, end)}
    assert {b for start, end in merged for b in range(start, end)} == covered
    assert all(a[1] < b[0] for a, b in zip(merged, merged[1:]))  # disjoint, sorted, not touching


@given(
    st.lists(
        st.tuples(st.sampled_from([0, 3, 200, 32_767, 40_000, 1 << 40]), st.integers(0, 1 << 16), st.integers(0, 5000)),
        max_size=40,
    )
)
def test_grouped_unions_equal_each_group_alone(rows):
    # Groups in any order, small ones (sorted as int16) and large ones (as int64), per group the same union
    # as that group's ranges alone, counted byte by byte (merge_extents is this function for one group).
    groups = np.array([g for g, _, _ in rows], np.int64)
    starts = np.array([s for _, s, _ in rows], np.int64)
    ends = starts + np.array([n for _, _, n in rows], np.int64)
    out_groups, out_starts, out_ends = merge_grouped_ranges(groups, starts, ends)
    got: dict[int, list] = {}
    for g, s, e in zip(out_groups.tolist(), out_starts.tolist(), out_ends.tolist()):
        got.setdefault(g, []).append((s, e))
    expected = {g: {b for h, s, n in rows if h == g for b in range(s, s + n)} for g in {g for g, _, _ in rows}}
    assert {g: {b for s, e in r for b in range(s, e)} for g, r in got.items()} == {
        g: b for g, b in expected.items() if b
    }
    assert all(a[1] < b[0] for r in got.values() for a, b in zip(r, r[1:]))  # disjoint, sorted, not touching
    assert list(out_groups) == sorted(out_groups)


@given(
    st.integers(0, 1 << 24), st.integers(1, 1 << 24), st.sampled_from([512, 4096]), st.sampled_from([1 * MIB, 4 * MIB])
)
def test_split_pieces_are_contiguous_with_an_aligned_body(start, length, block, buffer):
    pieces = split_extent(start, start + length, buffer, block)
    assert pieces[0][0] == start and sum(size for _, size in pieces) == length
    assert all(a[0] + a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    unaligned = [p for p in pieces if p[0] % block or p[1] % block]
    assert len(unaligned) <= 2 and all(size <= buffer for _, size in pieces)


def test_dcp_like_writes_coalesce_into_aligned_buffers_between_barriers(tmp_path):
    ops = [{"op": "open", "path": "/ck/__0_0.distcp", "fd": 3, "flags": CREATE, "ret": 3}]
    offset = 0
    for size in (704, 3 * MIB + 5, 873, 704, 5 * MIB, 873):
        ops.append({"op": "write", "path": "/ck/__0_0.distcp", "fd": 3, "offset": offset, "size": size, "ret": size})
        offset += size
        ops.append({"op": "lseek", "path": "/ck/__0_0.distcp", "fd": 3, "offset": offset})
    ops += [
        {"op": "fsync", "path": "/ck/__0_0.distcp", "fd": 3},
        {"op": "write", "path": "/ck/__0_0.distcp", "fd": 3, "offset": offset, "size": 100, "ret": 100},
        {"op": "close", "path": "/ck/__0_0.distcp", "fd": 3},
        {"op": "rename", "path": "/ck/__0_0.distcp", "new_path": "/ck/final"},
    ]
    table = read_trace(make_trace(tmp_path / "t.arrow", ops)).table
    plan = build_plan(table, "aggregated", buffer_bytes=4 * MIB, block_bytes=4096)
    kinds = [(op.kind, op.offset, op.size) for op in plan.workers[0].ops if op.kind != "lseek"]
    assert offset == 8 * MIB + 3159  # 2 x (704 + 873) header and trailer bytes, 3 MiB + 5 and 5 MiB payloads
    assert kinds == [
        ("open", None, None),
        ("write", 0, 4 * MIB),
        ("write", 4 * MIB, 4 * MIB),
        ("write", 8 * MIB, 3159),
        ("fsync", None, None),
        ("write", offset, 100),
        ("close", None, None),
        ("rename", None, None),
    ]
    assert dict(plan.checks.expected_sizes) == {"ck/final": offset + 100}


@pytest.mark.slow
def test_aggregated_replay_reproduces_every_file_size(io_uring, odd_strace, tmp_path):
    trace, _, out = odd_strace
    target = tmp_path / "target"
    report = replay(trace, target=target, strategy="aggregated", buffer_bytes=MIB)
    for path in (p for p in out.rglob("*") if p.is_file()):
        assert (target / str(path).lstrip("/")).stat().st_size == path.stat().st_size, path
    assert report.size_mismatches == ()


def test_unknown_offsets_are_not_aggregated(tmp_path):
    ops = [
        {"op": "open", "path": "/log", "fd": 3, "flags": CREATE | sc.O_APPEND, "ret": 3},
        {"op": "write", "path": "/log", "fd": 3, "offset": 0, "size": 10, "ret": 10},
        {"op": "write", "path": "/log", "fd": 3, "offset": None, "size": 7, "ret": 7},
        {"op": "write", "path": "/log", "fd": 3, "offset": 17, "size": 3, "ret": 3},
    ]
    plan = build_plan(read_trace(make_trace(tmp_path / "t.arrow", ops)).table, "aggregated")
    assert [(op.offset, op.size) for op in plan.workers[0].ops if op.kind == "write"] == [(0, 10), (None, 7), (17, 3)]


def test_merged_writes_keep_their_wait_on_another_workers_open(tmp_path):
    ops = [
        {"op": "open", "path": "/f", "fd": 3, "flags": CREATE, "ret": 3},
        {"op": "write", "path": "/f", "fd": 3, "pid": 2, "tid": 2, "offset": 0, "size": 10, "ret": 10},
        {"op": "write", "path": "/f", "fd": 3, "pid": 2, "tid": 2, "offset": 10, "size": 10, "ret": 10},
    ]
    plan = build_plan(read_trace(make_trace(tmp_path / "t.arrow", ops)).table, "aggregated")
    child = next(w for w in plan.workers if w.pid == 2)
    assert [(op.kind, op.offset, op.size, op.deps) for op in child.ops] == [("write", 0, 20, (0,))]


def test_a_written_piece_starts_when_its_bytes_are_all_written(tmp_path):
    """--timing original paces a piece when the last write reaching into it started (an aggregating writer
    flushes a buffer once it is full), not at its group's first write; a read piece is read ahead, at its
    group's first read."""
    ms = 1_000_000
    ops = [{"op": "open", "path": "/f", "fd": 3, "flags": CREATE, "ret": 3, "ts_ns": 0}]
    ops += [  # 512 KiB writes 10 ms apart: each 1 MiB piece is full at its second write
        {
            "op": "write",
            "path": "/f",
            "fd": 3,
            "offset": i * MIB // 2,
            "size": MIB // 2,
            "ret": MIB // 2,
            "ts_ns": (i + 1) * 10 * ms,
        }
        for i in range(6)
    ]
    ops += [  # rewrites the first 4 KiB last: the first piece is ready only then
        {"op": "write", "path": "/f", "fd": 3, "offset": 0, "size": 4096, "ret": 4096, "ts_ns": 70 * ms},
        {"op": "fsync", "path": "/f", "fd": 3, "ts_ns": 75 * ms},
        {"op": "read", "path": "/f", "fd": 3, "offset": 0, "size": MIB, "ret": MIB, "ts_ns": 80 * ms},
        {"op": "read", "path": "/f", "fd": 3, "offset": MIB, "size": MIB, "ret": MIB, "ts_ns": 90 * ms},
        {"op": "close", "path": "/f", "fd": 3, "ts_ns": 100 * ms},
    ]
    plan = build_plan(read_trace(make_trace(tmp_path / "t.arrow", ops)).table, "aggregated", buffer_bytes=MIB)
    pieces = [(op.kind, op.offset, op.size, op.ts_ns) for op in plan.workers[0].ops if op.kind in ("write", "read")]
    assert pieces == [
        ("write", 0, MIB, 70 * ms),
        ("write", MIB, MIB, 40 * ms),
        ("write", 2 * MIB, MIB, 60 * ms),
        ("read", 0, MIB, 80 * ms),
        ("read", MIB, MIB, 80 * ms),
    ]


@given(st.lists(st.tuples(st.integers(0, 1 << 12), st.integers(0, 300)), max_size=30))
def test_the_tracers_coverage_and_the_gpu_unions_are_the_same_union(ranges):
    """ranges.covered_bytes (the tracer's mapped-bytes coverage) and union_ranges (the GPU overlap's
    timelines) count the bytes the ranges cover, byte by byte."""
    from ckpt_trace.ranges import covered_bytes, union_ranges

    pairs = [(start, start + length) for start, length in ranges]
    covered = {b for start, end in pairs for b in range(start, end)}
    assert covered_bytes(pairs) == len(covered)
    starts, ends = union_ranges(np.array([s for s, _ in pairs], np.int64), np.array([e for _, e in pairs], np.int64))
    assert {b for s, e in zip(starts.tolist(), ends.tolist()) for b in range(s, e)} == covered
