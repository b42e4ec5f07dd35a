"""--pack-files: small files move into one pack per worker with an index; content and sizes still check out."""

from __future__ import annotations

import json

from test_replay import CREATE, make_trace

from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import build_plan, replay
from ckpt_trace.replayer.pack import INDEX_PATH


def small_files_trace(tmp_path, shared_by_two_workers: bool = False):
    ops = []
    for number, size in enumerate((5000, 100, 9000)):
        path = f"/ck/layer_{number}.pt"
        tid = 2 if shared_by_two_workers and number == 1 else 1
        ops += [{"op": "open", "path": path + ".tmp", "fd": 3, "flags": CREATE, "ret": 3},
                {"op": "write", "path": path + ".tmp", "fd": 3, "offset": 0, "size": size, "ret": size},
                {"op": "fsync", "path": path + ".tmp", "fd": 3},
                {"op": "close", "path": path + ".tmp", "fd": 3},
                {"op": "rename", "path": path + ".tmp", "new_path": path, "tid": tid, "pid": tid}]
    return read_trace(make_trace(tmp_path / "t.arrow", ops)).table


def test_files_of_one_worker_are_packed_with_an_index(tmp_path):
    plan = build_plan(small_files_trace(tmp_path), "aggregated", pack_files=True)
    ops = [(op.kind, op.offset, op.size) for op in plan.workers[0].ops]
    # layer_0: body 0-4096 + tail padded to 4096-8192, one write again; layer_1 (100 B) padded to one
    # block at 8192; layer_2: body 0-8192 and its padded tail, from 12288. Every write is block aligned.
    assert ops == [("open", None, None), ("write", 0, 8192), ("write", 8192, 4096), ("write", 12288, 12288),
                   ("fsync", None, None), ("close", None, None)]
    assert dict(plan.pack_index["ck/layer_0.pt"]) == {"pack": "ckpt-trace-packs/pack-1-1.bin", "offset": 0,
                                                       "size_bytes": 5000}
    assert plan.pack_index["ck/layer_2.pt"]["offset"] == 12288
    assert plan.metadata_ops_saved == 12 - 3  # 3 x (open, fsync, close, rename) replaced by the pack's open, fsync, close
    assert "ck/layer_0.pt" not in plan.checks.expected_sizes


def test_a_file_another_worker_touches_stays_a_file(tmp_path):
    plan = build_plan(small_files_trace(tmp_path, shared_by_two_workers=True), "aggregated", pack_files=True)
    assert sorted(plan.pack_index) == ["ck/layer_0.pt", "ck/layer_2.pt"]
    assert plan.checks.expected_sizes["ck/layer_1.pt"] == 100


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
    assert all(op.offset % 4096 == 0 and op.size % 4096 == 0 for w in report.plan.workers for op in w.ops
               if op.kind == "write" and op.pattern_offset is not None)


def test_the_packs_own_operations_signal_nothing_others_wait_on(tmp_path):
    plan = build_plan(small_files_trace(tmp_path), "aggregated", pack_files=True)
    own = [op for op in plan.workers[0].ops if op.path == "ckpt-trace-packs/pack-1-1.bin" or op.kind in ("fsync", "close")]
    assert own and all(op.seq < 0 and op.seq not in plan.awaited for op in own)


def test_padded_head_and_tail_rejoin_their_body_and_bodies_stay_within_the_buffer(tmp_path):
    """One unaligned 3 MiB write, aggregated with 1 MiB buffers: head, three bodies, tail. In the pack the
    padded head and tail are aligned, so each joins its neighbouring body; the bodies stay 1 MiB apart."""
    size = 3 << 20
    ops = [{"op": "open", "path": "/ck/a.pt", "fd": 3, "flags": CREATE, "ret": 3},
           {"op": "write", "path": "/ck/a.pt", "fd": 3, "offset": 100, "size": size, "ret": size},
           {"op": "close", "path": "/ck/a.pt", "fd": 3}]
    table = read_trace(make_trace(tmp_path / "t.arrow", ops)).table
    aggregated = build_plan(table, "aggregated", buffer_bytes=1 << 20)
    pieces = [(op.offset, op.size) for op in aggregated.workers[0].ops if op.kind == "write"]
    mib, body_end = 1 << 20, 3 << 20  # the last body ends at the last block boundary, 3 MiB
    assert pieces == [(100, 3996), (4096, mib), (4096 + mib, mib), (4096 + 2 * mib, body_end - 4096 - 2 * mib),
                      (body_end, 100)]
    packed = build_plan(table, "aggregated", buffer_bytes=mib, pack_files=True)
    writes = [(op.offset, op.size, op.pattern_offset) for op in packed.workers[0].ops if op.kind == "write"]
    assert writes == [(0, 4096 + mib, 0), (4096 + mib, mib, 4096 + mib),
                      (4096 + 2 * mib, body_end + 4096 - 4096 - 2 * mib, 4096 + 2 * mib)]
