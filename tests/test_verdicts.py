"""Repeats with their spread: rounds interleaved across strategies, paired speed-ups with a sign-test
interval, "within noise" where the interval includes 1.0, and nothing judged on an empty trace."""

from __future__ import annotations

import json

import pytest
from conftest import GOLDEN, cli

from ckpt_trace.errors import ReplayError
from ckpt_trace.replayer import replay
from ckpt_trace.replayer.verdicts import Rounds, paired_interval
from ckpt_trace.stats import median_interval


def test_the_median_interval_is_the_sign_tests_order_statistics():
    assert median_interval([3.0, 1.0, 2.0]) == {"median": 2.0, "low": 1.0, "high": 3.0, "coverage": 0.75, "n": 3}
    ten = median_interval(list(range(1, 11)))  # k = 2: 1 - 2 * P(B(10, 1/2) <= 1) = 1 - 22/1024
    assert (ten["low"], ten["high"]) == (2, 9) and ten["coverage"] == pytest.approx(1 - 22 / 1024)
    six = median_interval(list(range(6)))  # the first count whose range covers 95 %
    assert (six["low"], six["high"], six["coverage"]) == (0, 5, pytest.approx(1 - 2 / 64))


def test_paired_rounds_give_a_verdict_only_beyond_noise():
    posix = [1.0, 1.1, 0.9, 1.2, 1.0, 1.05]
    twice = [x / 2 for x in posix]
    assert paired_interval(posix, twice)["verdict"] == "faster"
    assert paired_interval(twice, posix)["verdict"] == "slower"
    assert paired_interval(posix[:3], twice[:3])["verdict"] == "within noise"  # 3 rounds: 75 % coverage
    mixed = [1.0 / r for r in (0.9, 1.1, 0.95, 1.05, 1.0, 1.02)]
    entry = paired_interval([1.0] * 6, mixed)
    assert entry["low"] < 1.0 < entry["high"] and entry["verdict"] == "within noise"


def test_rounds_stop_at_the_forced_count_or_when_told_apart_or_at_the_cap():
    assert Rounds(forced=2).more({"posix": [1.0]}) and not Rounds(forced=2).more({"posix": [1.0, 1.0]})
    auto = Rounds(budget_s=1e9, min_rounds=3, max_rounds=10)
    assert auto.more({"posix": [1.0] * 2, "aggregated": [0.5] * 2})
    assert not auto.more({"posix": [1.0] * 3})  # nothing to compare: the minimum
    assert auto.more({"posix": [1.0] * 4, "aggregated": [0.5] * 4})  # 4 rounds cover 87.5 %: one more
    assert not auto.more({"posix": [1.0] * 5, "aggregated": [0.5] * 5})  # told apart at 94 %
    same = {"posix": [1.0, 1.1, 0.9] * 4, "aggregated": [1.1, 0.9, 1.0] * 4}
    assert not auto.more({k: v[:10] for k, v in same.items()})  # the cap
    assert not Rounds(budget_s=5, min_rounds=3).more({"posix": [1.0] * 3, "aggregated": [1.0] * 3})  # the budget
    from ckpt_trace import config

    assert (Rounds().min_rounds, Rounds().max_rounds) == (config.REPLAY_MIN_ROUNDS, config.REPLAY_MAX_ROUNDS)


@pytest.mark.slow
def test_all_runs_interleaved_rounds_and_reports_spread_and_intervals(io_uring, tmp_path):
    out = tmp_path / "r.json"
    proc = cli(
        "replay",
        str(GOLDEN / "v4-dcp-gpt2-tiny-2ranks-bcc.arrow"),
        "--strategy",
        "all",
        "--target",
        str(tmp_path / "t"),
        "--repeat",
        "3",
        "-o",
        str(out),
    )
    doc = json.loads(out.read_text())
    assert doc["options"]["rounds"] == 3
    for result in doc["results"]:
        runs = result["runs_elapsed_s"]
        assert len(runs) == 3 and result["elapsed_s"] == sorted(runs)[1]
        spread = result["elapsed_spread_s"]
        assert (spread["min"], spread["max"], spread["runs"]) == (min(runs), max(runs), 3)
        assert result["speedup"]["n"] == 3
        if result["strategy"] != "posix":
            assert result["speedup"]["verdict"] == "within noise"  # 3 rounds never tell strategies apart
            assert set(result["versus"]) == {"posix", "uring-buffered", "uring-direct", "aggregated"} - {
                result["strategy"]
            }
            assert f"{result['strategy']}: " in proc.stdout
    assert "within noise" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("rows", ["none", "ten bytes"])
def test_an_empty_trace_has_nothing_to_judge(tmp_path, rows):
    from helpers.traces import make_trace, too_small_to_judge

    trace = make_trace(tmp_path / "t.arrow", []) if rows == "none" else too_small_to_judge(tmp_path / "t.arrow")
    with pytest.raises(ReplayError, match="nothing to judge"):
        replay(trace, target=tmp_path / "t", strategy="all")
    proc = cli("replay", str(trace), "--strategy", "all", "--target", str(tmp_path / "t2"), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nothing to judge" in proc.stderr
    assert not (tmp_path / "t2").exists()
    proc = cli("emit", str(trace), "-o", str(tmp_path / "w.py"), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nothing to judge" in proc.stderr
    assert not (tmp_path / "w.py").exists()


@pytest.mark.slow
def test_results_say_which_data_ran(tmp_path):
    report = replay(GOLDEN / "v4-odd-pattern-strace.arrow", target=tmp_path / "t")
    assert report.options["data"].startswith("generated: incompressible, unique per 4 KiB block")
