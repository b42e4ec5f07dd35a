"""A strategy runs what its name says, or says what it ran: data paths per result, the flag in the table, and the
check that every strategy moves the bytes of the rows it replays."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from conftest import CKPT_TRACE, GOLDEN, cli, record

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import build_plan, replay
from ckpt_trace.replayer.optable import WRITE
from ckpt_trace.replayer.replay import check_file_bytes, check_same_coverage, covered_file_bytes, planned_file_bytes

DCP = GOLDEN / "v4-dcp-gpt2-tiny-2ranks-bcc.arrow"
pytestmark = pytest.mark.io_uring


def moved(result) -> int:
    return sum(entry["bytes"] for entry in result.data_paths.values())


@pytest.mark.slow
def test_uring_direct_on_a_dcp_save_says_its_unaligned_writes_went_through_io_uring_buffered(io_uring, tmp_path):
    """DCP's per-tensor headers leave every write unaligned: uring-direct still submits them all through
    io_uring (buffered, not a pwrite on a second descriptor) and its result says that none went with O_DIRECT."""
    report = replay(DCP, target=tmp_path / "t", strategy="all", queue_depth=8)
    by_name = {r.strategy: r for r in report.results}
    for result in report.results:
        assert moved(result) == result.bytes_written + result.bytes_read
        ops = sum(entry["ops"] for entry in result.data_paths.values())
        assert ops == result.data_ops
    posix = by_name["posix"].to_json()
    assert posix["io_uring_bytes_share"] == 0 and posix["named_path"] is None and not posix["off_named_path"]
    buffered = by_name["uring-buffered"].to_json()
    assert buffered["io_uring_bytes_share"] == 1.0 and not buffered["off_named_path"]
    direct = by_name["uring-direct"].to_json()
    writes = sum(1 for r in read_trace(DCP).table.to_pylist() if r["op"] == "write")
    assert direct["data_paths"]["io_uring_buffered"] == {"ops": writes, "bytes": direct["bytes_written"]}
    assert direct["data_paths"]["syscall_buffered"]["ops"] == 0
    assert (direct["io_uring_bytes_share"], direct["o_direct_bytes_share"]) == (1.0, 0.0)
    assert direct["off_named_path"] and direct["unaligned_ops"] == writes
    aggregated = by_name["aggregated"].to_json()  # coalesced into aligned buffers: O_DIRECT carries the bulk
    assert aggregated["named_path_bytes_share"] > 0.99 and not aggregated["off_named_path"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["uring-direct", "aggregated"])
def test_an_aligned_write_is_counted_as_io_uring_with_o_direct(io_uring, tmp_path, strategy):
    from helpers.traces import CREATE, make_trace

    ops = [
        {"op": "open", "path": "/ck/a.bin", "fd": 3, "flags": CREATE, "ret": 3},
        {"op": "write", "path": "/ck/a.bin", "fd": 3, "offset": 0, "size": 65536, "ret": 65536},
        {"op": "write", "path": "/ck/a.bin", "fd": 3, "offset": 65536, "size": 100, "ret": 100},
        {"op": "close", "path": "/ck/a.bin", "fd": 3},
    ]
    target = tmp_path / "t"
    result = replay(make_trace(tmp_path / "t.arrow", ops), target=target, strategy=strategy, verify=True).results[0]
    assert result.data_paths["io_uring_direct"] == {"ops": 1, "bytes": 65536}
    assert result.data_paths["io_uring_buffered"] == {"ops": 1, "bytes": 100}  # the unaligned tail
    assert result.unaligned_ops == 1 and result.verified_files == 1
    assert (target / "ck" / "a.bin").stat().st_size == 65536 + 100


@pytest.mark.slow
def test_a_write_at_the_file_position_goes_through_the_ring_at_that_position(io_uring, tmp_path):
    from helpers.traces import CREATE, make_trace

    ops = [
        {"op": "open", "path": "/ck/b.bin", "fd": 3, "flags": CREATE, "ret": 3},
        {"op": "write", "path": "/ck/b.bin", "fd": 3, "size": 1000, "ret": 1000, "offset_source": "unknown"},
        {"op": "write", "path": "/ck/b.bin", "fd": 3, "size": 24, "ret": 24, "offset_source": "unknown"},
        {"op": "close", "path": "/ck/b.bin", "fd": 3},
    ]
    target = tmp_path / "t"
    result = replay(make_trace(tmp_path / "t.arrow", ops), target=target, strategy="uring-buffered").results[0]
    assert result.data_paths["io_uring_buffered"] == {"ops": 2, "bytes": 1024}
    assert (target / "ck" / "b.bin").stat().st_size == 1024  # the second write went after the first


@pytest.mark.slow
def test_the_table_flags_a_strategy_off_its_named_path_at_80_columns(io_uring, tmp_path):
    proc = cli("replay", str(DCP), "--strategy", "uring-direct", "--target", str(tmp_path / "t"), "--queue-depth", "8")
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.split("|")[1].strip() == "uring-direct*" for line in lines if line.count("|") > 2)
    at = next(i for i, line in enumerate(lines) if line.startswith("* uring-direct:"))
    assert "io_uring+O_DIRECT carried 0% of the bytes (322 ops unaligned)" in lines[at]
    assert lines[at + 1] == "  they went by io_uring buffered 100%"


def test_plans_that_would_move_other_bytes_are_refused():
    table = read_trace(GOLDEN / "v4-odd-pattern-strace.arrow").table
    posix, aggregated = build_plan(table, "posix"), build_plan(table, "aggregated")
    assert covered_file_bytes(posix) == covered_file_bytes(aggregated)  # merged overlaps: same distinct bytes
    check_same_coverage([posix, aggregated])
    ops = aggregated.ops
    size = ops.size.copy()
    size[int((ops.kind == WRITE).nonzero()[0][0])] -= 1  # one write a byte short
    short = dataclasses.replace(aggregated, ops=dataclasses.replace(ops, size=size))
    with pytest.raises(ReplayError, match="would not move the same bytes"):
        check_same_coverage([posix, short])


@pytest.mark.slow
def test_a_run_that_moved_other_bytes_than_its_plan_is_an_error(io_uring, tmp_path):
    report = replay(GOLDEN / "v4-odd-pattern-strace.arrow", target=tmp_path / "t", strategy="uring-direct")
    plan, result = report.plan, report.results[0]
    assert result.file_bytes == planned_file_bytes(plan)
    name, (written, read) = next(iter(result.file_bytes.items()))
    lost = dataclasses.replace(result, file_bytes={**result.file_bytes, name: (written - 1, read)})
    with pytest.raises(ReplayError, match="moved other bytes than the trace"):
        check_file_bytes(plan, lost)


@pytest.mark.slow
def test_results_json_carries_the_shares(io_uring, tmp_path):
    out = tmp_path / "r.json"
    cli("replay", str(DCP), "--strategy", "aggregated", "--target", str(tmp_path / "t"), "-o", str(out))
    result = json.loads(out.read_text())["results"][0]
    for key in (
        "data_paths",
        "io_uring_ops_share",
        "io_uring_bytes_share",
        "o_direct_ops_share",
        "o_direct_bytes_share",
        "named_path",
        "named_path_bytes_share",
        "off_named_path",
    ):
        assert key in result
    assert "file_bytes" not in result
    assert os.path.exists(out)


@pytest.mark.slow
def test_strict_makes_a_strategy_off_its_named_path_an_error(io_uring, tmp_path):
    target = tmp_path / "t"
    proc = cli("replay", str(DCP), "--strategy", "uring-direct", "--target", str(target), "--strict", check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--strict: uring-direct's named path (io_uring+O_DIRECT) carried 0% of the bytes" in proc.stderr
    assert not target.exists()  # the replay's files (and the target it made) were removed
    cli("replay", str(DCP), "--strategy", "uring-buffered", "--target", str(tmp_path / "b"), "--strict")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["uring-direct", "aggregated"])
def test_a_bcc_recording_of_the_replay_agrees_with_its_data_paths(io_uring, bcc_backend, tmp_path, strategy):
    """The replay of a recorded DCP save, itself recorded by the bcc backend: the io_uring requests the kernel
    saw, split by the O_DIRECT flag of the descriptor each went to (its open row), move the bytes the result
    says went through io_uring with and without O_DIRECT; and no read or write went by a system call."""
    work = tmp_path / "w"
    work.mkdir()
    out = tmp_path / "results.json"
    trace = tmp_path / "replay.arrow"
    replay_args = ("replay", str(DCP), "--strategy", strategy, "--target", str(work / "t"), "--repeat", "1")
    record(bcc_backend, trace, work, *CKPT_TRACE, *replay_args, "-o", str(out))
    paths = json.loads(out.read_text())["results"][0]["data_paths"]
    flags_of: dict[tuple[int, int], int] = {}
    seen = {"io_uring_direct": 0, "io_uring_buffered": 0, "syscall": 0}
    for row in read_trace(trace).table.sort_by("ts_ns").to_pylist():
        if row["op"] == "open" and row["ret"] >= 0:
            flags_of[(row["pid"], row["ret"])] = row["flags"]
        elif row["op"] in ("read", "write") and "/ck/" in (row["path"] or "") and row["ret"] > 0:  # the trace's files
            if row["interface"] != "io_uring":
                seen["syscall"] += row["ret"]
                continue
            direct = flags_of[(row["pid"], row["fd"])] & os.O_DIRECT
            seen["io_uring_direct" if direct else "io_uring_buffered"] += row["ret"]
    assert seen == {
        "io_uring_direct": paths["io_uring_direct"]["bytes"],
        "io_uring_buffered": paths["io_uring_buffered"]["bytes"],
        "syscall": paths["syscall_buffered"]["bytes"] + paths["syscall_direct"]["bytes"],
    }
    assert seen["io_uring_direct" if strategy == "aggregated" else "io_uring_buffered"] > 0
