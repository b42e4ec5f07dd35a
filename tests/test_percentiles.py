"""One percentile function: the replay's table, the summary and the report give the same latency percentiles
for the same durations (issue 39: they once said p99 702 µs and 680 µs for the same writes)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO  # noqa: F401  (the tests' sys.path, as every test module has it)
from helpers.traces import CREATE, trace_of

from ckpt_trace.analysis.profile import profile_file
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.replayer import replay
from ckpt_trace.stats import LatencyHistogram, percentiles_ns

WRITES = 2_000


def _durations() -> np.ndarray:
    """Write latencies with a long tail (log-normal around 40 µs, a few of several ms), distinct enough that
    a bucketed p99 and the exact one differ."""
    rng = np.random.default_rng(39)
    return np.round(rng.lognormal(np.log(40_000), 1.0, WRITES)).astype(np.int64) + 1


def _trace(path, durations: np.ndarray):
    rows = [
        {
            "syscall": "openat",
            "op": "open",
            "fd": 3,
            "flags": CREATE,
            "ret": 3,
            "dur_ns": 1_000,
        }
    ]
    rows += [
        {"syscall": "pwrite64", "op": "write", "fd": 3, "offset": i * 4096, "size": 4096, "ret": 4096, "dur_ns": int(d)}
        for i, d in enumerate(durations)
    ]
    rows.append({"syscall": "close", "op": "close", "fd": 3, "ret": 0, "dur_ns": 1_000})
    return trace_of(path, rows, gap_ns=100_000, path="/ck/shard.bin")


@pytest.mark.slow
def test_the_replay_table_and_the_report_give_the_same_p99_for_the_same_writes(tmp_path, monkeypatch):
    """A trace of 2,000 writes with known durations; the replay of it, its C loop made to report those same
    durations as its latencies; the replay's percentiles, the summary's and the report's are equal, and equal
    to the exact nearest-rank ones."""
    durations = _durations()
    trace = _trace(tmp_path / "t.arrow", durations)
    exact = percentiles_ns(durations)

    report = profile_file(trace)
    write = report["latency"]["write"]
    summary_latency = next(iter(report["summary"]["interfaces"].values()))["latency_ns"]

    given = iter(durations.tolist())
    real_pio_run = rings.pio_run

    def pio_run_reporting_the_recorded_durations(requests, **kwargs):
        results, latencies = real_pio_run(requests, **kwargs)
        return results, np.array([next(given) for _ in range(len(requests))], np.int64)

    monkeypatch.setattr(rings, "pio_run", pio_run_reporting_the_recorded_durations)
    result = replay(trace, target=tmp_path / "target", strip_prefix="/ck").results[0]
    assert next(given, None) is None  # every write went through the C loop, once
    assert result.data_ops == WRITES

    for key in ("p50", "p90", "p99", "max"):
        assert result.latency_ns[key] == write[f"{key}_ns"] == summary_latency[key] == exact[key], key


def test_past_its_sample_limit_the_histogram_stays_within_a_bucket_and_merges_alike():
    """Past ``exact_limit`` the histogram answers from its buckets (at most 1.1 % below the exact percentile),
    and a merge of two halves answers exactly as one histogram of the whole."""
    durations = _durations()
    whole, first, second = (LatencyHistogram(exact_limit=WRITES // 2) for _ in range(3))
    whole.add(durations)
    first.add(durations[: WRITES // 2])
    second.add(durations[WRITES // 2 :])
    assert first.samples is not None  # exactly at the limit: still exact
    first.merge(second)
    assert first.samples is None and first.percentiles_ns() == whole.percentiles_ns()
    exact = percentiles_ns(durations)
    for key in ("p50", "p90", "p99"):
        assert exact[key] / 2 ** (1 / 64) - 1 <= whole.percentiles_ns()[key] <= exact[key]
