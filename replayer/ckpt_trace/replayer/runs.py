"""What single-node and distributed replays share around their runs: the trace file by its metadata, the
median of a strategy's runs, the paired speed-ups of its rounds, speed-ups over posix, and releasing what a
replay created. Pure helpers and one clean-up; called by ``replay`` and ``distributed``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ckpt_trace.formats import read_metadata
from ckpt_trace.stats import median_index

from .lock import TargetLock
from .ownership import Claim
from .results import ReplayResult
from .verdicts import versus_all


@dataclass(frozen=True)
class TraceFile:
    """A trace file by its path and validated metadata, without its rows (``table`` None): planning reads the
    rows in record batches (``formats.scan``), so the whole trace is never in memory at once."""

    path: Path
    metadata: dict
    table: None = None


def trace_file(path: str | os.PathLike) -> TraceFile:
    """The trace at ``path`` with its metadata read and validated. Raises TraceFormatError."""
    path = Path(path)
    return TraceFile(path=path, metadata=read_metadata(path))


def median_run(runs: list[ReplayResult]) -> ReplayResult:
    """The median run (``stats.median_index``), carrying every run's elapsed time and p99 latency."""
    median = runs[median_index([r.elapsed_s for r in runs])]
    median.runs_elapsed_s = [r.elapsed_s for r in runs]
    median.runs_p99_latency_ns = [r.latency_ns["p99"] for r in runs]
    return median


def add_verdicts(results: list[ReplayResult], elapsed: dict[str, list[float]]) -> None:
    """Each result's paired speed-ups over every other strategy (``versus``, ``verdicts.versus_all``, from
    ``elapsed``: each strategy's elapsed seconds by round) and over posix (``speedup``; posix itself gets the
    reference entry when other strategies ran)."""
    versus = versus_all(elapsed)
    for result in results:
        result.versus = versus.get(result.strategy, {})
        if "posix" in result.versus:
            result.speedup = result.versus["posix"]
        elif result.strategy == "posix" and len(results) > 1:
            result.speedup = {
                "median": 1.0,
                "low": 1.0,
                "high": 1.0,
                "coverage": 1.0,
                "n": len(elapsed["posix"]),
                "verdict": "reference",
            }


#: The phases of ``ReplayResult.phases`` (``RunState.phase_figures``).
PHASES = ("save", "load")


def add_phase_verdicts(results: list[ReplayResult], runs: list[list[ReplayResult]]) -> None:
    """For a trace holding a save and a load, each phase's own verdicts: ``phases[phase]["versus"]`` of each
    result, the paired speed-ups over every other strategy (``verdicts.versus_all``) from the phase's time in
    each round's runs (``runs``: each plan's runs, in round order, plans as ``results``), and
    ``phases[phase]["runs_elapsed_s"]``. Nothing is added where a run lacks either phase: a save or a load
    alone is judged by its whole time (``add_verdicts``)."""
    if len(results) < 2 or not all(r.phases.get(phase) for mine in runs for r in mine for phase in PHASES):
        return
    for phase in PHASES:
        elapsed = {result.strategy: [r.phases[phase]["elapsed_s"] for r in mine] for result, mine in zip(results, runs)}
        versus = versus_all(elapsed)
        for result in results:
            result.phases[phase] = {
                **result.phases[phase],
                "runs_elapsed_s": elapsed[result.strategy],
                "versus": versus.get(result.strategy, {}),
            }


def add_speedups(results: list[ReplayResult]) -> None:
    """``speedup_vs_posix``: the median of the paired rounds' ratios where they were measured, else (a
    distributed replay) posix's elapsed time over this one's."""
    posix = next((r for r in results if r.strategy == "posix"), None)
    if posix is None:
        return
    for result in results:
        if result.speedup:
            result.speedup_vs_posix = result.speedup["median"]
        else:
            result.speedup_vs_posix = posix.elapsed_s / result.elapsed_s if result.elapsed_s > 0 else None


def release(claims: list[Claim], target: Path, made_target: bool, lock: TargetLock | None = None) -> None:
    """Remove what ``claims`` created, release ``lock``, and remove ``target`` if this replay made it and it
    is empty; nothing else."""
    for claim in claims:
        claim.release()
    if lock is not None:
        lock.release()
    if made_target:
        try:
            target.rmdir()
        except OSError:
            pass
