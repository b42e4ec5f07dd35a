"""--pack-files: small files move into one pack per worker with an index; content and sizes still check out."""

from __future__ import annotations

import json

import pytest
from helpers.traces import CREATE, make_trace

from ckpt_trace.formats import read_trace
from ckpt_trace.iolayer import pattern
from ckpt_trace.replayer import build_plan, replay
from ckpt_trace.replayer.pack import INDEX_PATH
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.verify import ContentMismatch, verify_content


def small_files_trace(tmp_path, shared_by_two_workers: bool = False):
    ops = []
    for number, size in enumerate((5000, 100, 9000)):
        path = f"/ck/layer_{number}.pt"
        tid = 2 if shared_by_two_workers and number == 1 else 1
        ops += [
            {"op": "open", "path": path + ".tmp", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": path + ".tmp", "fd": 3, "offset": 0, "size": size, "ret": size},
            {"op": "fsync", "path": path + ".tmp", "fd": 3},
            {"op": "close", "path": path + ".tmp", "fd": 3},
            {"op": "rename", "path": path + ".tmp", "new_path": path, "tid": tid, "pid": tid},
        ]
    return read_trace(make_trace(tmp_path / "t.arrow", ops)).table


def test_files_of_one_worker_are_packed_with_an_index(tmp_path):
    plan = build_plan(small_files_trace(tmp_path), "aggregated", pack_files=True)
    ops = [(op.kind, op.offset, op.size) for op in plan.workers[0].ops]
    # Regions: layer_0 (5000 B) padded to 0-8192, layer_1 (100 B) to 8192-12288, layer_2 (9000 B) to
    # 12288-24576. Nothing between the three files' writes remains (their opens, fsyncs, closes and renames
    # became index entries), so the writes, contiguous in the pack, go out as one block-aligned write.
    assert ops == [("open", None, None), ("write", 0, 24576), ("fsync", None, None), ("close", None, None)]
    assert dict(plan.pack_index["ck/layer_0.pt"]) == {
        "pack": "ckpt-trace-packs/pack-1-1.bin",
        "offset": 0,
        "size_bytes": 5000,
    }
    assert plan.pack_index["ck/layer_2.pt"]["offset"] == 12288
    assert (
        plan.metadata_ops_saved == 12 - 3
    )  # 3 x (open, fsync, close, rename) replaced by the pack's open, fsync, close
    assert "ck/layer_0.pt" not in plan.checks.expected_sizes
    pack_open = plan.workers[0].ops[0]
    assert dict(plan.preallocate) == {pack_open.seq: 24576}  # the pack, not the files it replaced


def test_writes_across_files_fill_whole_buffers(tmp_path):
    """40 files of 100,000 B (each padded to 102,400 B in the pack) with 1 MiB buffers: one extent of
    4,096,000 B, cut into three 1 MiB writes and the rest; each write carries the pack's pattern at its offset."""
    mib, region = 1 << 20, 25 * 4096
    ops = []
    for number in range(40):
        path = f"/ck/shard_{number}.bin"
        ops += [
            {"op": "open", "path": path, "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": path, "fd": 3, "offset": 0, "size": 100_000, "ret": 100_000},
            {"op": "close", "path": path, "fd": 3},
        ]
    plan = build_plan(
        read_trace(make_trace(tmp_path / "t.arrow", ops)).table, "aggregated", buffer_bytes=mib, pack_files=True
    )
    writes = [op for op in plan.workers[0].ops if op.kind == "write"]
    assert [(op.offset, op.size) for op in writes] == [
        (0, mib),
        (mib, mib),
        (2 * mib, mib),
        (3 * mib, 40 * region - 3 * mib),
    ]
    key = pattern.file_key("ckpt-trace-packs/pack-1-1.bin")
    assert all(op.pattern_key == key and op.pattern_offset == op.offset for op in writes)
    assert plan.pack_index["ck/shard_39.bin"]["offset"] == 39 * region


def test_a_file_another_worker_touches_stays_a_file(tmp_path):
    plan = build_plan(small_files_trace(tmp_path, shared_by_two_workers=True), "aggregated", pack_files=True)
    assert sorted(plan.pack_index) == ["ck/layer_0.pt", "ck/layer_2.pt"]
    assert plan.checks.expected_sizes["ck/layer_1.pt"] == 100


@pytest.mark.slow
def test_packed_replay_verifies_and_writes_the_index(io_uring, odd_strace, tmp_path):
    trace, _, _ = odd_strace
    target = tmp_path / "t"
    report = replay(trace, target=target, strategy="aggregated", pack_files=True, verify=True, buffer_bytes=1 << 20)
    result = report.results[0]
    assert report.size_mismatches == ()
    index = json.loads((target / INDEX_PATH).read_text())
    assert index == {path: dict(entry) for path, entry in report.plan.pack_index.items()} and index
    assert result.metadata_ops_saved == report.plan.metadata_ops_saved > 0
    assert result.verified_files == len(report.plan.checks.verify_ranges)
    assert all(
        op.offset % 4096 == 0 and op.size % 4096 == 0
        for w in report.plan.workers
        for op in w.ops
        if op.kind == "write" and op.pattern_offset is not None
    )


@pytest.mark.slow
def test_verify_finds_a_changed_byte_of_a_packed_file_at_its_own_offset(io_uring, tmp_path):
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            op
            for number in range(3)
            for op in (
                {"op": "open", "path": f"/ck/s{number}", "fd": 3, "flags": CREATE, "ret": 3},
                {"op": "write", "path": f"/ck/s{number}", "fd": 3, "offset": 0, "size": 6000, "ret": 6000},
                {"op": "close", "path": f"/ck/s{number}", "fd": 3},
            )
        ],
    )
    target = tmp_path / "t"
    report = replay(trace, target=target, strategy="aggregated", pack_files=True, verify=True)
    entry = report.plan.pack_index["ck/s1"]
    assert entry["offset"] == 8192
    with open(target / entry["pack"], "r+b") as pack:
        pack.seek(entry["offset"] + 1234)
        byte = pack.read(1)
        pack.seek(entry["offset"] + 1234)
        pack.write(bytes([byte[0] ^ 0xFF]))
    assert verify_content(TargetRoot(target), report.plan) == [ContentMismatch(f"ck/s1 (in {entry['pack']})", 1234)]


def test_the_packs_own_operations_signal_nothing_others_wait_on(tmp_path):
    plan = build_plan(small_files_trace(tmp_path), "aggregated", pack_files=True)
    own = [
        op for op in plan.workers[0].ops if op.path == "ckpt-trace-packs/pack-1-1.bin" or op.kind in ("fsync", "close")
    ]
    assert own and all(op.seq < 0 and op.seq not in plan.awaited for op in own)


def test_padded_head_and_tail_rejoin_their_body_and_bodies_stay_within_the_buffer(tmp_path):
    """One unaligned 3 MiB write, aggregated with 1 MiB buffers: head, three bodies, tail. In the pack the
    padded head and tail are aligned and contiguous with the bodies: one extent of 3 MiB + 4 KiB, written
    as three full buffers and one block."""
    size = 3 << 20
    ops = [
        {"op": "open", "path": "/ck/a.pt", "fd": 3, "flags": CREATE, "ret": 3},
        {"op": "write", "path": "/ck/a.pt", "fd": 3, "offset": 100, "size": size, "ret": size},
        {"op": "close", "path": "/ck/a.pt", "fd": 3},
    ]
    table = read_trace(make_trace(tmp_path / "t.arrow", ops)).table
    aggregated = build_plan(table, "aggregated", buffer_bytes=1 << 20)
    pieces = [(op.offset, op.size) for op in aggregated.workers[0].ops if op.kind == "write"]
    mib, body_end = 1 << 20, 3 << 20  # the last body ends at the last block boundary, 3 MiB
    assert pieces == [
        (100, 3996),
        (4096, mib),
        (4096 + mib, mib),
        (4096 + 2 * mib, body_end - 4096 - 2 * mib),
        (body_end, 100),
    ]
    packed = build_plan(table, "aggregated", buffer_bytes=mib, pack_files=True)
    writes = [(op.offset, op.size, op.pattern_offset) for op in packed.workers[0].ops if op.kind == "write"]
    assert writes == [(0, mib, 0), (mib, mib, mib), (2 * mib, mib, 2 * mib), (3 * mib, 4096, 3 * mib)]


@pytest.mark.slow
def test_a_file_another_worker_unlinks_stays_a_file(io_uring, tmp_path):
    """Worker 2 unlinks shard_0 after worker 1 renamed it into place: the rename stays (worker 2 waits on
    it; packing once removed it and the replay waited forever), so shard_0 is not packed; shard_1 is."""
    ops = []
    for number in range(2):
        path = f"/ck/shard_{number}.bin"
        ops += [
            {"op": "open", "path": path + ".tmp", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": path + ".tmp", "fd": 3, "offset": 0, "size": 8192, "ret": 8192},
            {"op": "close", "path": path + ".tmp", "fd": 3},
            {"op": "rename", "path": path + ".tmp", "new_path": path},
        ]
    ops.insert(4, {"op": "unlink", "path": "/ck/shard_0.bin", "pid": 2, "tid": 2})
    trace = make_trace(tmp_path / "t.arrow", ops)
    plan = build_plan(read_trace(trace).table, "aggregated", pack_files=True)
    assert sorted(plan.pack_index) == ["ck/shard_1.bin"]
    planned = {op.seq for w in plan.workers for op in w.ops}
    assert plan.awaited and plan.awaited <= planned
    assert all(dep in planned for w in plan.workers for op in w.ops for dep in op.deps)
    report = replay(trace, target=tmp_path / "out", strategy="aggregated", pack_files=True, verify=True)
    assert report.size_mismatches == () and not (tmp_path / "out" / "ck" / "shard_0.bin").exists()
    assert [rel for _, rel, _, _ in report.plan.checks.pack_verify] == ["ck/shard_1.bin"]  # read back: verify=True
