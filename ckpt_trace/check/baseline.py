"""Storage regression checks: ``baseline`` records replay results with the storage they ran on; ``check`` compares.

A baseline is a JSON document::

    {"format": "ckpt-trace-baseline", "version": 1, "created": ISO-8601,
     "creator_version": the release that measured it,
     "environment": {"host", "kernel", "arch", "filesystem", "device", "device_model", "cpu_count", ...},
     "options": {"strategies", "repeat", "min_seconds", "queue_depth", "buffer_bytes", "durable"},
     "traces": [{"name", "path", "sha256",
                 "results": {STRATEGY: {"throughput_bytes_per_s", "p99_latency_ns", "elapsed_s",
                                        "runs_elapsed_s", "runs_p99_latency_ns", "throughput_noise",
                                        "p99_noise", "bytes_written", "bytes_read"}}}]}

Each figure is measured over repeated replays (at least ``repeat`` runs and
until ``min_seconds`` of measured time; defaults ``config.CHECK_MIN_RUNS``
and ``config.CHECK_MIN_SECONDS``, chosen from measurements on this machine:
docs/CHECKS.md): throughput is (bytes written + bytes read) / elapsed_s and
p99 the 99th-percentile latency of data operations, each the median over the
runs. A figure's noise is its run-to-run spread: the interquartile range of
the runs over their median (``stats.relative_spread``).

A figure's status: ``regressed`` when it is worse (throughput lower, p99
higher) by more than the tolerance and by more than the larger of the two
measurements' spreads; otherwise ``noisy`` when that spread is larger than
the tolerance (runs vary more than the change to be detected: a longer
trace, quieter storage or a larger tolerance can judge it); otherwise ``ok``.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ckpt_trace import config
from ckpt_trace.documents import BaselineIn, check_document
from ckpt_trace.errors import RegressionError
from ckpt_trace.formats import sha256_file, write_bytes_atomic
from ckpt_trace.iolayer.host import environment
from ckpt_trace.replayer import replay
from ckpt_trace.replayer.options import DEFAULT_BUFFER_BYTES, DEFAULT_QUEUE_DEPTH
from ckpt_trace.replayer.replay import STRATEGIES
from ckpt_trace.stats import relative_spread
from ckpt_trace.version import __version__

BASELINE_FORMAT = "ckpt-trace-baseline"
BASELINE_VERSION = 1


def parse_tolerance(text: str) -> float:
    """'10%' or '0.1' -> 0.1; raises RegressionError outside [0, 1000]."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise RegressionError(f"bad tolerance {text!r} (use e.g. 10% or 0.1)") from None
    if not 0 <= value <= 1000:
        raise RegressionError(f"tolerance {text!r} out of range")
    return value


def _figures(result) -> dict:
    moved = result.bytes_written + result.bytes_read
    runs = result.runs_elapsed_s or [result.elapsed_s]
    throughputs = [moved / elapsed for elapsed in runs if elapsed > 0]
    p99s = result.runs_p99_latency_ns or [result.latency_ns.get("p99", 0)]
    return {
        "throughput_bytes_per_s": float(np.median(throughputs)) if throughputs else 0.0,
        "p99_latency_ns": float(np.median(p99s)),
        "elapsed_s": result.elapsed_s,
        "runs_elapsed_s": list(runs),
        "runs_p99_latency_ns": list(p99s),
        "throughput_noise": relative_spread(throughputs),
        "p99_noise": relative_spread(p99s),
        "bytes_written": result.bytes_written,
        "bytes_read": result.bytes_read,
    }


def _measure(
    traces: Sequence[Path],
    target: Path,
    strategies: Sequence[str],
    repeat: int,
    min_seconds: float,
    durable: bool,
    queue_depth: int,
    buffer_bytes: int,
    progress=None,
) -> list[dict]:
    measured = []
    for index, trace in enumerate(traces):
        results = {}
        for strategy in strategies:
            scratch = target / f"trace-{index}-{strategy}"
            report = replay(
                trace,
                target=scratch,
                strategy=strategy,
                repeat=repeat,
                min_seconds=min_seconds,
                durable=durable,
                queue_depth=queue_depth,
                buffer_bytes=buffer_bytes,
                progress=progress,
            )
            report.release()  # only what the replay created, its directory included
            results[strategy] = _figures(report.results[0])
        measured.append({"name": trace.name, "path": str(trace), "sha256": sha256_file(trace), "results": results})
    return measured


def _remove_if_made(target: Path, made: bool) -> None:
    if made:
        try:
            target.rmdir()
        except OSError:
            pass


def _check_strategies(strategies: Sequence[str]) -> list[str]:
    chosen = list(STRATEGIES) if not strategies or "all" in strategies else list(dict.fromkeys(strategies))
    unknown = [s for s in chosen if s not in STRATEGIES]
    if unknown:
        raise RegressionError(f"unknown strategy {unknown[0]!r} (available: {', '.join(STRATEGIES)}, all)")
    return chosen


def _check_target(target: Path) -> None:
    if target.exists() and any(target.iterdir()):
        raise RegressionError(f"target {target} is not empty; give an empty or new directory")


def make_baseline(
    traces: Sequence[str | os.PathLike],
    *,
    target: str | os.PathLike,
    strategies: Sequence[str] = (),
    repeat: int = config.CHECK_MIN_RUNS,
    min_seconds: float = config.CHECK_MIN_SECONDS,
    durable: bool = True,
    queue_depth: int = DEFAULT_QUEUE_DEPTH,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    progress=None,
) -> dict:
    """Replay each trace under each strategy into ``target`` and return the baseline document (module docstring).

    ``durable`` (default on) fsyncs inside the timed region, so the figures
    describe the storage rather than the page cache. Raises RegressionError,
    TraceFormatError or ReplayError.
    """
    paths = [Path(t) for t in traces]
    target = Path(target)
    chosen = _check_strategies(strategies)
    _check_target(target)
    made_target = not target.exists()
    try:
        measured = _measure(paths, target, chosen, repeat, min_seconds, durable, queue_depth, buffer_bytes, progress)
    finally:
        _remove_if_made(target, made_target)
    return {
        "format": BASELINE_FORMAT,
        "version": BASELINE_VERSION,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "creator_version": __version__,
        "environment": environment(target),
        "options": {
            "strategies": chosen,
            "repeat": repeat,
            "min_seconds": min_seconds,
            "queue_depth": queue_depth,
            "buffer_bytes": buffer_bytes,
            "durable": durable,
        },
        "traces": measured,
    }


def load_baseline(path: str | os.PathLike) -> dict:
    """Read and validate a baseline file; raises RegressionError naming the problem."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RegressionError(f"baseline not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RegressionError(f"{path} is not a baseline file: {err}") from None
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
        raise RegressionError(f"{path} is not a ckpt-trace baseline (missing key 'format')")
    if data.get("version") != BASELINE_VERSION:
        raise RegressionError(f"{path} has baseline version {data.get('version')}; supported: {BASELINE_VERSION}")
    for key in ("environment", "options", "traces"):
        if key not in data:
            raise RegressionError(f"{path} is missing key {key!r}")
    check_document(data, BaselineIn, str(path), RegressionError)  # one line naming the key, never a crash later
    options = data["options"]
    for key in ("repeat", "queue_depth", "buffer_bytes"):
        if options[key] < 1:
            raise RegressionError(f"{path}: options.{key}: {options[key]!r} is not positive")
    if options.get("min_seconds", 0) < 0:
        raise RegressionError(f"{path}: options.min_seconds: {options['min_seconds']!r} is negative")
    return data


@dataclass(frozen=True)
class Comparison:
    """One trace x strategy x metric: old and new values, relative change, each measurement's noise, and
    the verdict: ``status`` ok, regressed or noisy (module docstring); ``regressed`` is status == regressed."""

    trace: str
    strategy: str
    metric: str
    old: float
    new: float
    change: float
    regressed: bool
    new_runs_elapsed_s: tuple[float, ...]
    old_noise: float = 0.0
    new_noise: float = 0.0
    status: str = "ok"


def verdict(change_worse: float, tolerance: float, noise: float) -> str:
    """ok, regressed or noisy for a figure that got worse by ``change_worse`` (a fraction; negative when it
    improved), given the tolerance and the larger run-to-run spread of the two measurements (module docstring)."""
    if change_worse > tolerance and change_worse > noise:
        return "regressed"
    if noise > tolerance:
        return "noisy"
    return "ok"


def _compare(name: str, strategy: str, old: dict, new: dict, tolerance: float) -> list[Comparison]:
    rows = []
    for metric, noise_key, higher_is_better in (
        ("throughput_bytes_per_s", "throughput_noise", True),
        ("p99_latency_ns", "p99_noise", False),
    ):
        before, after = float(old[metric]), float(new[metric])
        change = (after - before) / before if before else 0.0
        old_noise, new_noise = float(old.get(noise_key, 0.0)), float(new.get(noise_key, 0.0))
        status = (
            verdict(-change if higher_is_better else change, tolerance, max(old_noise, new_noise)) if before else "ok"
        )
        rows.append(
            Comparison(
                name,
                strategy,
                metric,
                before,
                after,
                change,
                status == "regressed",
                tuple(new["runs_elapsed_s"]),
                old_noise,
                new_noise,
                status,
            )
        )
    return rows


def _match_traces(baseline: dict, paths: list[Path]) -> list[dict]:
    by_hash = {entry["sha256"]: entry for entry in baseline["traces"]}
    matched = []
    for path in paths:
        digest = sha256_file(path)
        if digest not in by_hash:
            raise RegressionError(
                f"{path} is not in the baseline (its traces: {', '.join(e['name'] for e in baseline['traces'])})"
            )
        matched.append(by_hash[digest])
    if len(matched) != len(baseline["traces"]):
        missing = [e["name"] for e in baseline["traces"] if e not in matched]
        raise RegressionError(f"the baseline also holds {', '.join(missing)}; check the same traces")
    return matched


def run_check(
    traces: Sequence[str | os.PathLike],
    baseline: dict,
    *,
    target: str | os.PathLike,
    tolerance: float = 0.10,
    repeat: int | None = None,
    min_seconds: float | None = None,
    strategies: Sequence[str] = (),
    progress=None,
) -> list[Comparison]:
    """Replay the baseline's traces and strategies on ``target``; return one Comparison per figure.

    Raises RegressionError when the traces (by content hash) or strategies
    differ from the baseline's.
    """
    paths = [Path(t) for t in traces]
    target = Path(target)
    options = baseline["options"]
    chosen = list(options["strategies"])
    if strategies and set(_check_strategies(strategies)) != set(chosen):
        raise RegressionError(f"the baseline measured strategies {', '.join(chosen)}; check those")
    matched = _match_traces(baseline, paths)
    _check_target(target)
    made_target = not target.exists()
    try:
        measured = _measure(
            paths,
            target,
            chosen,
            repeat or options["repeat"],
            options.get("min_seconds", config.CHECK_MIN_SECONDS) if min_seconds is None else min_seconds,
            options["durable"],
            options["queue_depth"],
            options["buffer_bytes"],
            progress,
        )
    finally:
        _remove_if_made(target, made_target)
    rows = []
    for old, new in zip(matched, measured):
        for strategy in chosen:
            if strategy not in old["results"]:
                raise RegressionError(f"the baseline has no {strategy} result for {old['name']}")
            rows += _compare(old["name"], strategy, old["results"][strategy], new["results"][strategy], tolerance)
    return rows


def write_json(path: str | os.PathLike, data: dict) -> None:
    write_bytes_atomic(path, (json.dumps(data, indent=2) + "\n").encode())
