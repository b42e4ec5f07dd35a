"""The statistics every measurement of ours reports, defined once.

- ``percentiles_ns``: mean, p50, p90, p99 and max by the nearest-rank method
  (the p-th percentile is the smallest sample with at least p % of the
  samples at or below it), as fio reports completion latencies.
- ``LatencyHistogram``: the same figures in bounded memory, for traces too
  big to keep every sample. Up to ``exact_limit`` samples (65,536 by
  default) it keeps them and answers with ``percentiles_ns`` itself, so the
  replay's table and the report agree to the nanosecond on the same rows;
  past that it answers from buckets of 1/64 octave (bucket ``b`` holds
  ``[2**(b/64), 2**((b+1)/64))`` ns): a percentile is the lower edge of the
  bucket the nearest-rank sample falls in, at most 1.1 % below the exact
  one; mean, min and max stay exact. Memory: 4,096 counters and at most
  ``exact_limit`` samples, whatever the number of samples. Every latency
  percentile the project reports (replay results, bench, summary, report)
  comes from one of these two.
- ``median_index``: which of ``n`` repeated runs is "the median run". A run
  is reported whole (its bytes, latencies and CPU belong together), so for an
  even count it is the faster of the two middle runs, never an average.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentiles_ns(samples: Sequence[int] | np.ndarray) -> dict[str, int]:
    """mean, p50, p90, p99 and max of ``samples`` (nanoseconds), nearest-rank; zeros when empty."""
    values = np.sort(np.asarray(samples, dtype=np.int64))
    count = len(values)
    if not count:
        return {"mean": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0}

    def rank(q: float) -> int:
        return int(values[min(count - 1, max(0, int(np.ceil(q * count)) - 1))])

    return {"mean": int(values.mean()), "p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "max": int(values[-1])}


class LatencyHistogram:
    """Nanosecond durations gathered batch by batch: kept exactly up to ``exact_limit`` samples, always
    counted in 1/64-octave buckets (see the module docstring)."""

    STEPS = 64
    BUCKETS = 64 * STEPS
    EXACT_LIMIT = 1 << 16

    def __init__(self, exact_limit: int = EXACT_LIMIT) -> None:
        self.counts = np.zeros(self.BUCKETS, np.int64)
        self.count = self.total = self.max = 0
        self.min: int | None = None
        self.exact_limit = exact_limit
        self.samples: list[np.ndarray] | None = []  # None once more than exact_limit were added

    def add(self, samples: np.ndarray) -> None:
        values = np.asarray(samples, dtype=np.int64)
        if not len(values):
            return
        self._keep([values])
        buckets = np.floor(np.log2(np.maximum(values, 1)) * self.STEPS).astype(np.int64)
        self.counts += np.bincount(np.clip(buckets, 0, self.BUCKETS - 1), minlength=self.BUCKETS)
        self.count += len(values)
        self.total += int(values.sum())
        self.max = max(self.max, int(values.max()))
        low = int(values.min())
        self.min = low if self.min is None else min(self.min, low)

    def _keep(self, parts: list[np.ndarray] | None) -> None:
        if self.samples is None or parts is None or self.count + sum(len(part) for part in parts) > self.exact_limit:
            self.samples = None
        else:
            self.samples.extend(part.copy() for part in parts)

    def merge(self, other: LatencyHistogram) -> None:
        """Add ``other``'s durations (histograms of several processes make the job's)."""
        self._keep(other.samples)
        self.counts += other.counts
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)
        if other.min is not None:
            self.min = other.min if self.min is None else min(self.min, other.min)

    def percentiles_ns(self) -> dict[str, int]:
        """mean, p50, p90, p99 and max, as ``percentiles_ns`` names them (and equal to its answer while the
        samples are kept); zeros when empty."""
        if self.samples is not None:
            return percentiles_ns(np.concatenate(self.samples) if self.samples else np.zeros(0, np.int64))
        if not self.count:
            return {"mean": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0}
        cumulative = np.cumsum(self.counts)

        def rank(q: float) -> int:
            index = int(np.searchsorted(cumulative, max(1, int(np.ceil(q * self.count)))))
            low = int(np.ceil(2 ** (index / self.STEPS))) if index else 0
            return min(self.max, max(self.min or 0, low))

        return {
            "mean": self.total // self.count,
            "p50": rank(0.50),
            "p90": rank(0.90),
            "p99": rank(0.99),
            "max": self.max,
        }


def median_index(elapsed_s: Sequence[float]) -> int:
    """Index of the median run of ``elapsed_s`` (the lower middle one for an even count: the faster)."""
    order = sorted(range(len(elapsed_s)), key=lambda i: elapsed_s[i])
    return order[(len(order) - 1) // 2]


def spread(elapsed_s: Sequence[float]) -> float:
    """Relative run-to-run spread of repeated measurements: (max - min) / median; 0 for one run."""
    if len(elapsed_s) < 2:
        return 0.0
    median = elapsed_s[median_index(elapsed_s)]
    return (max(elapsed_s) - min(elapsed_s)) / median if median > 0 else 0.0


def relative_spread(values: Sequence[float]) -> float:
    """Run-to-run spread of repeated measurements: the interquartile range over the median (the middle
    half of the runs lies within it). 0 for fewer than two values."""
    data = np.asarray(values, dtype=float)
    if len(data) < 2:
        return 0.0
    median = float(np.median(data))
    q1, q3 = np.percentile(data, [25, 75])
    return float((q3 - q1) / abs(median)) if median else 0.0


def median_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> dict:
    """The median of ``values`` and a distribution-free interval for it: the order statistics
    ``[x_(k), x_(n+1-k)]`` of the sign test, whose coverage is ``1 - 2 * P(Binomial(n, 1/2) <= k - 1)``
    whatever the distribution (Conover, *Practical Nonparametric Statistics*, 3rd ed., section 3.2). ``k``
    is the largest with coverage at least ``confidence``; with too few values for it (fewer than 6 at 95 %),
    ``k = 1`` (the range) and its smaller coverage (75 % at 3 values, 94 % at 5). Returns ``median``,
    ``low``, ``high``, ``coverage`` (0-1) and ``n``; NaNs where ``values`` is empty."""
    from math import comb

    x = np.sort(np.asarray(values, np.float64))
    n = len(x)
    if not n:
        return {"median": float("nan"), "low": float("nan"), "high": float("nan"), "coverage": 0.0, "n": 0}
    cdf = np.cumsum([comb(n, i) for i in range(n + 1)]) / 2.0**n  # P(B <= i)
    k = 1
    for candidate in range(1, n // 2 + 1):
        if 1 - 2 * cdf[candidate - 1] >= confidence:
            k = candidate
    coverage = float(1 - 2 * cdf[k - 1]) if n > 1 else 0.0
    return {
        "median": float(np.median(x)),
        "low": float(x[k - 1]),
        "high": float(x[n - k]),
        "coverage": coverage,
        "n": n,
    }
