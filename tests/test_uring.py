"""io_uring strategies: same final files as POSIX, unaligned operations counted, the `all` comparison."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import GOLDEN, cli

from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import build_plan, replay

pytestmark = pytest.mark.io_uring


def files_and_sizes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["uring-buffered", "uring-direct"])
def test_uring_replay_reproduces_every_file_size(io_uring, odd_strace, tmp_path, strategy):
    trace, _, out = odd_strace
    target = tmp_path / "target"
    report = replay(trace, target=target, strategy=strategy, queue_depth=4)
    for path in (p for p in out.rglob("*") if p.is_file()):
        assert (target / str(path).lstrip("/")).stat().st_size == path.stat().st_size, path
    assert report.size_mismatches == ()
    result = report.results[0]
    recorded = read_trace(trace).table.to_pylist()
    assert result.bytes_written == sum(r["ret"] for r in recorded if r["op"] == "write")
    assert result.data_ops == sum(r["op"] in ("read", "write") for r in recorded)
    if strategy == "uring-direct":
        block = os.statvfs(target).f_bsize
        plan = build_plan(read_trace(trace).table, strategy)
        unaligned = sum(
            1
            for w in plan.workers
            for op in w.ops
            if op.kind in ("read", "write") and op.offset is not None and (op.offset % block or (op.size or 0) % block)
        )
        assert unaligned > 0 and result.unaligned_ops == unaligned
    else:
        assert result.unaligned_ops == 0


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["uring-direct", "aggregated"])
def test_a_lone_aligned_write_goes_through_o_direct(io_uring, tmp_path, strategy):
    """A file written by one aligned write: a run of one request, submitted on the O_DIRECT descriptor,
    not counted as unaligned (it once went through the buffered descriptor)."""
    from helpers.traces import CREATE, make_trace

    ops = [
        {"op": "open", "path": "/ck/a.bin", "fd": 3, "flags": CREATE, "ret": 3},
        {"op": "write", "path": "/ck/a.bin", "fd": 3, "offset": 0, "size": 65536, "ret": 65536},
        {"op": "close", "path": "/ck/a.bin", "fd": 3},
    ]
    target = tmp_path / "t"
    report = replay(make_trace(tmp_path / "t.arrow", ops), target=target, strategy=strategy, verify=True)
    result = report.results[0]
    assert (result.unaligned_ops, result.bytes_written, result.verified_files) == (0, 65536, 1)
    assert (target / "ck" / "a.bin").stat().st_size == 65536


@pytest.mark.slow
def test_all_compares_every_strategy_in_its_own_directory(io_uring, tmp_path):
    sizes = json.loads((GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.sizes.json").read_text())
    out = tmp_path / "results.json"
    cli(
        "replay",
        str(GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow"),
        "--strategy",
        "all",
        "--target",
        str(tmp_path / "t"),
        "-o",
        str(out),
        "--queue-depth",
        "8",
        "--repeat",
        "1",
    )
    results = json.loads(out.read_text())["results"]
    assert [r["strategy"] for r in results] == ["posix", "uring-buffered", "uring-direct", "aggregated"]
    posix = results[0]
    assert posix["speedup_vs_posix"] == 1.0
    for result in results:
        assert result["bytes_written"] == posix["bytes_written"]
        if result["strategy"] == "aggregated":
            assert result["data_ops"] < posix["data_ops"]  # coalesced
        else:
            assert result["data_ops"] == posix["data_ops"]
        assert result["speedup_vs_posix"] == pytest.approx(posix["elapsed_s"] / result["elapsed_s"])
        assert "unaligned_ops" in result
        root = tmp_path / "t" / result["strategy"]
        for path, size in sizes.items():
            assert (root / path.lstrip("/")).stat().st_size == size
    assert results[2]["unaligned_ops"] > 0  # DCP's per-tensor headers leave offsets unaligned


@pytest.mark.slow
def test_bad_queue_depth_is_one_line(io_uring, tmp_path):
    proc = cli(
        "replay",
        str(GOLDEN / "v1-odd-pattern-strace.arrow"),
        "--strategy",
        "uring-buffered",
        "--target",
        str(tmp_path / "t"),
        "--queue-depth",
        "0",
        check=False,
    )
    assert proc.returncode == 2 and "queue-depth" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_repeat_reports_the_median_run_and_every_time(io_uring, tmp_path):
    out = tmp_path / "r.json"
    args = [
        "replay",
        str(GOLDEN / "v1-odd-pattern-strace.arrow"),
        "--strategy",
        "aggregated",
        "--target",
        str(tmp_path / "t"),
        "--repeat",
        "3",
        "--durable",
        "-o",
        str(out),
    ]
    if os.geteuid() == 0:
        args.append("--drop-caches")
    cli(*args)
    result = json.loads(out.read_text())["results"][0]
    runs = result["runs_elapsed_s"]
    assert len(runs) == 3 and result["elapsed_s"] == sorted(runs)[1]
