"""Verdicts from repeated runs: how many rounds, each strategy's spread, and paired speed-ups with intervals.

A replay that compares strategies runs them in *rounds*: each round runs
every strategy once, in an order rotated by one each round, so drift on a
shared machine (other jobs, page-cache writeback, a device warming up) hits
every strategy alike, and the runs of one round form a *pair* for any two
strategies. The speed-up of A over B is the median of the per-round ratios
``elapsed_B / elapsed_A``, with the sign test's distribution-free interval
for that median (``stats.median_interval``: order statistics, at least 95 %
where the rounds allow it, the range of the ratios below 6 rounds, with its
smaller coverage). The verdict is ``faster`` or ``slower`` when the
interval lies wholly above or below 1.0 and covers at least
``config.REPLAY_VERDICT_MIN_COVERAGE`` (90 %: 5 rounds or more), and
``within noise`` otherwise: three rounds (75 %) cannot tell strategies apart.

By default (``Rounds.forced`` None) a replay runs at least
``config.REPLAY_MIN_ROUNDS`` rounds and stops when every pair of strategies
has a verdict other than "within noise", when ``config.REPLAY_MAX_ROUNDS``
rounds ran, or when the runs' measured time reached
``config.REPLAY_BUDGET_S``; ``--repeat N`` forces N rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_trace import config
from ckpt_trace.stats import median_interval

FASTER, SLOWER, NOISE = "faster", "slower", "within noise"


def paired_interval(reference_s: list[float], candidate_s: list[float]) -> dict:
    """The speed-up of a candidate over a reference from their paired rounds (elapsed seconds, round by round):
    ``median``, ``low``, ``high``, ``coverage``, ``n`` (``stats.median_interval`` of ``reference / candidate``)
    and ``verdict`` (faster, slower, within noise; see the module docstring)."""
    ratios = [r / c for r, c in zip(reference_s, candidate_s) if r > 0 and c > 0]
    interval = median_interval(ratios)
    verdict = NOISE
    if interval["n"] and interval["coverage"] >= config.REPLAY_VERDICT_MIN_COVERAGE:
        if interval["low"] > 1.0:
            verdict = FASTER
        elif interval["high"] < 1.0:
            verdict = SLOWER
    return {**interval, "verdict": verdict}


def versus_all(elapsed: dict[str, list[float]]) -> dict[str, dict[str, dict]]:
    """For each strategy, its speed-up over every other (``paired_interval``), from each one's elapsed seconds
    by round."""
    return {
        name: {other: paired_interval(elapsed[other], mine) for other in elapsed if other != name}
        for name, mine in elapsed.items()
    }


def decided(elapsed: dict[str, list[float]]) -> bool:
    """Whether every pair of strategies has a verdict other than "within noise"."""
    return all(entry["verdict"] != NOISE for row in versus_all(elapsed).values() for entry in row.values())


@dataclass(frozen=True)
class Rounds:
    """How many rounds a replay runs: ``forced`` (``--repeat N``) exactly that many (more while a strategy's
    measured time is under ``min_seconds``, at most ``max_runs``); otherwise as the module docstring says."""

    forced: int | None = None
    min_seconds: float = 0.0
    max_runs: int = 200
    min_rounds: int = config.REPLAY_MIN_ROUNDS
    max_rounds: int = config.REPLAY_MAX_ROUNDS
    budget_s: float = config.REPLAY_BUDGET_S

    def more(self, elapsed: dict[str, list[float]]) -> bool:
        """Whether another round runs, after the rounds whose elapsed seconds are ``elapsed`` (by strategy)."""
        done = min((len(runs) for runs in elapsed.values()), default=0)
        short = any(sum(runs) < self.min_seconds for runs in elapsed.values())
        if self.forced is not None:
            return done < self.forced or (short and done < max(self.max_runs, self.forced))
        if done < self.min_rounds:
            return True
        if short and done < max(self.max_runs, self.min_rounds):
            return True
        if done >= self.max_rounds or sum(sum(runs) for runs in elapsed.values()) >= self.budget_s:
            return False
        return len(elapsed) > 1 and not decided(elapsed)

    def describe(self) -> str:
        if self.forced is not None:
            return f"{self.forced} round(s) (--repeat)"
        return (
            f"{self.min_rounds}-{self.max_rounds} rounds until every pair of strategies is told apart or "
            f"{self.budget_s:g} s of runs"
        )
