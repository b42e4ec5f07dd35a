"""benchmarks/tracer_overhead.py --pairs (issue 35): the 95 % interval of the median of paired ratios, the
verdict against a goal, and a tiny real run writing its JSON with the recorder's peak memory and CPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parent.parent


def test_median_interval_is_the_sign_test_order_statistics():
    bench = load_benchmark("tracer_overhead")
    values = [7.0, 1.0, 9.0, 3.0, 5.0, 10.0, 2.0, 8.0, 4.0, 6.0]
    low, high, coverage = bench.median_interval(values)
    # n = 10: P(B <= 1) = 11/1024 <= 0.025 < P(B <= 2) = 56/1024, so x(2) and x(9).
    assert (low, high) == (2.0, 9.0)
    assert coverage == pytest.approx(1 - 22 / 1024)
    low, high, coverage = bench.median_interval(list(range(20)))
    assert (low, high) == (5, 14)  # n = 20: x(6), x(15), P(B <= 5) = 0.0207
    assert coverage == pytest.approx(0.9586, abs=1e-4)
    assert bench.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0, 0.75)
    with pytest.raises(ValueError):
        bench.median_interval([])


def test_verdict_says_met_not_met_or_within_noise():
    bench = load_benchmark("tracer_overhead")
    assert bench.verdict(upper=1.08, lower=1.01, limit=1.10, lost_events=0, lost_matters=True) == "met"
    assert bench.verdict(upper=1.20, lower=1.12, limit=1.10, lost_events=0, lost_matters=False) == "not met"
    assert bench.verdict(upper=1.12, lower=1.05, limit=1.10, lost_events=0, lost_matters=False) == "within noise"
    assert bench.verdict(upper=1.01, lower=1.00, limit=1.10, lost_events=3, lost_matters=True) == "not met"
    row = {"variant": "bcc", "workload": "dcp", "model": "gpt2-small", "ranks": 2, "bare_median_s": 20.0}
    row |= {"record_ratio_interval": [1.05, 1.30], "command_ratio_interval": [1.00, 1.02], "lost_events": 0}
    assert [(g["figure"], g["verdict"]) for g in bench.goal_verdicts(row)] == [
        ("record", "within noise"),
        ("command", "met"),
    ]


@pytest.mark.slow
def test_pairs_mode_writes_ratios_intervals_memory_and_cpu(tmp_path, monkeypatch, bcc_backend, strace_backend):
    bench = load_benchmark("tracer_overhead")
    monkeypatch.setattr(sys.modules["common"], "RESULTS", tmp_path / "results")
    args = bench.parse_args(["--pairs", "2", "--workload", "true", "--out", str(tmp_path), "--result-name", "tiny"])
    bench.run_pairs(args, ["true"], ["bcc", "strace"])
    result = json.loads((tmp_path / "results" / "tiny.json").read_text())
    assert result["pairs"] == 2 and len(result["loadavg_before"]) == 3
    rows = {row["variant"]: row for row in result["results"]}
    assert set(rows) == {"bcc", "strace"}
    for row in rows.values():
        assert len(row["record_paired_ratios"]) == len(row["command_paired_ratios"]) == 2
        low, high = row["record_ratio_interval"]
        assert low <= row["record_ratio_median"] <= high
        # Recording `true` (a Python CLI starting a tracer) takes longer than `true` alone.
        assert row["record_ratio_median"] > 1.0
        # The recorder is a Python process with pyarrow loaded: tens of MiB at least, far under the machine.
        assert 20 * 2**20 < row["recorder_peak_rss_bytes_max"] < 64 * 2**30
        assert row["lost_events"] == 0 and row["goals"] == []
    assert rows["bcc"]["tracer_cpu_ratio_median"] > 0  # the recorder's own CPU at least
    assert not list(tmp_path.glob("ckpt-trace-bench-*"))  # the scratch directory is removed
