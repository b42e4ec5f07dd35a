"""POSIX replay: plans, containment against hostile traces, size fidelity, reads, timing."""

from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest
from conftest import cli
from helpers.traces import CREATE, make_trace

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import build_posix_plan, replay
from ckpt_trace.tracer import syscalls as sc


def test_plan_turns_descriptors_into_handles(tmp_path):
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "open", "path": "/d/a", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": "/d/a", "fd": 3, "offset": 0, "size": 10, "ret": 10},
            {"op": "dup", "path": "/d/a", "fd": 3, "ret": 4},
            {"op": "close", "path": "/d/a", "fd": 3},
            {"op": "write", "path": "/d/a", "fd": 4, "offset": 10, "size": 5, "ret": 5},
            {"op": "open", "path": "/d/b", "fd": 3, "flags": sc.O_RDONLY, "ret": 3},
            {"op": "read", "path": "/d/b", "fd": 3, "offset": 100, "size": 50, "ret": 50},
            {"op": "write", "path": "/d/a", "fd": 4, "offset": 0, "size": 1, "ret": -28},
            {"op": "write", "path": "/d/c", "fd": 9, "pid": 2, "tid": 2, "offset": 0, "size": 7, "ret": 7},
        ],
    )
    plan = build_posix_plan(read_trace(trace).table)
    ops = [op for worker in plan.workers for op in worker.ops]
    kinds = [(op.kind, op.handle) for op in ops]
    assert kinds[:6] == [("open", 0), ("write", 0), ("dup", 1), ("close", 0), ("write", 1), ("open", 2)]
    assert ops[5].path == "d/b" and ops[2].source_handle == 0
    assert plan.skipped_ops["failed"] == 1 and plan.skipped_ops["implicit_opens"] == 1
    assert dict(plan.precreate_files) == {"d/b": 150, "d/c": 0}
    assert plan.precreate_dirs == ("d",)
    assert dict(plan.checks.expected_sizes) == {"d/a": 15, "d/b": 150, "d/c": 7}


def test_cross_worker_path_operations_wait_for_each_other(tmp_path):
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "mkdir", "path": "/ck"},
            {"op": "open", "path": "/ck/x.tmp", "fd": 3, "flags": CREATE, "ret": 3, "tid": 2},
            {"op": "close", "path": "/ck/x.tmp", "fd": 3, "tid": 2},
            {"op": "rename", "path": "/ck/x.tmp", "new_path": "/ck/x"},
        ],
    )
    plan = build_posix_plan(read_trace(trace).table)
    by_kind = {op.kind: op for worker in plan.workers for op in worker.ops}
    assert by_kind["open"].deps == (0,)  # waits for the mkdir of its directory
    assert by_kind["rename"].deps == (2,)  # waits for the other thread's close of x.tmp (after its open)
    assert plan.awaited == {0, 2}


@pytest.mark.slow
def test_hostile_paths_stay_inside_the_target(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    hostile = ["/../../../../" + str(outside / "escaped"), "../../" + str(outside / "rel"), "/a/../../../b"]
    ops = []
    for fd, path in enumerate(hostile, start=3):
        ops += [
            {"op": "open", "path": path, "fd": fd, "flags": CREATE, "ret": fd},
            {"op": "write", "path": path, "fd": fd, "offset": 0, "size": 4, "ret": 4},
        ]
    ops.append({"op": "rename", "path": hostile[0], "new_path": "/../../" + str(outside / "renamed")})
    report = replay(make_trace(tmp_path / "t.arrow", ops), target=target)
    assert list(outside.iterdir()) == []
    inside = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert inside == sorted([str(outside / "renamed")[1:], str(outside / "rel")[1:], "b"])
    assert report.size_mismatches == ()


@pytest.mark.slow
def test_symbolic_links_in_the_target_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "evil").symlink_to(outside)
    trace = make_trace(tmp_path / "t.arrow", [{"op": "open", "path": "/evil/x", "fd": 3, "flags": CREATE, "ret": 3}])
    with pytest.raises(ReplayError, match="symbolic link"):
        replay(trace, target=target, force=True)
    assert list(outside.iterdir()) == []


@pytest.mark.slow
def test_a_non_empty_target_is_refused_and_left_alone(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "precious").write_text("keep")
    trace = make_trace(tmp_path / "t.arrow", [{"op": "open", "path": "/precious", "fd": 3, "flags": CREATE, "ret": 3}])
    proc = cli("replay", str(trace), "--target", str(target), check=False)
    assert proc.returncode == 2 and "not empty" in proc.stderr and "Traceback" not in proc.stderr
    assert (target / "precious").read_text() == "keep"


@pytest.mark.slow
def test_too_little_free_space_is_refused(tmp_path, monkeypatch):
    trace = make_trace(tmp_path / "t.arrow", [{"op": "open", "path": "/a", "fd": 3, "flags": CREATE, "ret": 3}])
    monkeypatch.setenv("CKPT_TRACE_REPLAY_FREE_SPACE_MARGIN_BYTES", str(1 << 60))
    proc = cli("replay", str(trace), "--target", str(tmp_path / "target"), check=False)
    assert proc.returncode == 2 and "free" in proc.stderr


@pytest.mark.slow
def test_reads_read_real_bytes_from_precreated_files(tmp_path):
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "open", "path": "/data/in", "fd": 3, "flags": sc.O_RDONLY, "ret": 3},
            {"op": "read", "path": "/data/in", "fd": 3, "offset": 0, "size": 8192, "ret": 8192},
            {"op": "read", "path": "/data/in", "fd": 3, "offset": 1 << 20, "size": 4096, "ret": 4096},
            {"op": "close", "path": "/data/in", "fd": 3},
        ],
    )
    report = replay(trace, target=tmp_path / "target")
    result = report.results[0]
    assert result.bytes_read == 8192 + 4096 and result.data_ops == 2 and result.metadata_ops == 2
    assert (tmp_path / "target/data/in").stat().st_size == (1 << 20) + 4096
    assert report.trace_sha256 == hashlib.sha256(trace.read_bytes()).hexdigest()  # hashed while it planned


@pytest.mark.slow
def test_original_timing_keeps_the_recorded_gaps(tmp_path):
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "open", "path": "/a", "fd": 3, "flags": CREATE, "ret": 3, "ts_ns": 0},
            {"op": "write", "path": "/a", "fd": 3, "offset": 0, "size": 1, "ret": 1, "ts_ns": 300_000_000},
        ],
    )
    timed = replay(trace, target=tmp_path / "t1", timing="original").results[0]
    assert timed.elapsed_s >= 0.3


@pytest.mark.slow
def test_replay_of_a_real_recording_reproduces_every_file_size(odd_strace, tmp_path):
    trace, _, out = odd_strace
    target = tmp_path / "target"
    proc = cli("replay", str(trace), "--strategy", "posix", "--target", str(target), "-o", str(tmp_path / "r.json"))
    original = {p: p.stat().st_size for p in out.rglob("*") if p.is_file()}
    assert original
    for path, size in original.items():
        replayed = target / str(path).lstrip("/")
        assert replayed.stat().st_size == size, path
    result = json.loads((tmp_path / "r.json").read_text())["results"][0]
    for key in (
        "strategy",
        "elapsed_s",
        "bytes_written",
        "bytes_read",
        "write_throughput_bytes_per_s",
        "read_throughput_bytes_per_s",
        "data_ops",
        "metadata_ops",
        "latency_ns",
        "cpu_user_s",
        "cpu_sys_s",
    ):
        assert key in result
    assert {"p50", "p90", "p99", "max"} <= set(result["latency_ns"])
    recorded = read_trace(trace).table.to_pylist()
    assert result["bytes_written"] == sum(r["ret"] for r in recorded if r["op"] == "write")
    assert "warning" not in proc.stderr


@pytest.mark.slow
def test_strip_prefix_shortens_paths(tmp_path):
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "open", "path": "/scratch/run1/ck/a", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": "/scratch/run1/ck/a", "fd": 3, "offset": 0, "size": 9, "ret": 9},
        ],
    )
    replay(trace, target=tmp_path / "target", strip_prefix="/scratch/run1")
    assert (tmp_path / "target/ck/a").stat().st_size == 9


@pytest.mark.slow
@pytest.mark.root
def test_a_full_disk_stops_the_replay_with_one_line(tmp_path, monkeypatch):
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)]).returncode != 0:
        pytest.skip("cannot mount tmpfs here")
    try:
        trace = make_trace(
            tmp_path / "t.arrow",
            [
                {"op": "open", "path": "/big", "fd": 3, "flags": CREATE, "ret": 3},
                {"op": "write", "path": "/big", "fd": 3, "offset": 0, "size": 4 << 20, "ret": 4 << 20},
            ],
        )
        module = sys.modules["ckpt_trace.replayer.replay"]  # the package re-exports a function of that name
        monkeypatch.setattr(module, "check_free_space", lambda target, plan, copies=1: None)
        with pytest.raises(ReplayError, match="full"):
            replay(trace, target=small / "t")
    finally:
        subprocess.run(["umount", str(small)])


@pytest.mark.slow
def test_reads_that_met_the_end_of_the_file_replay_under_every_strategy(tmp_path):
    """A program reading a small file in larger chunks asks for more than the file holds (read(2) returns
    less, then 0): the replay meets the end of the file where the program did, and every strategy's run is
    accepted (a read may move less than it asked for; never more)."""
    trace = make_trace(
        tmp_path / "t.arrow",
        [
            {"op": "open", "path": "/etc/small.conf", "fd": 3, "flags": sc.O_RDONLY, "ret": 3},
            {"op": "read", "fd": 3, "offset": 0, "size": 8192, "ret": 92},  # the file position, as tracers record it
            {"op": "read", "fd": 3, "offset": 92, "size": 8192, "ret": 0},
            {"op": "close", "fd": 3, "ret": 0},
        ],
    )
    for strategy in ("posix", "uring-buffered", "aggregated"):
        report = replay(trace, strategy=strategy, target=tmp_path / strategy, repeat=1)
        result = report.results[0]
        assert result.bytes_read == 92, strategy
    assert (tmp_path / "posix" / "etc" / "small.conf").stat().st_size == 92
