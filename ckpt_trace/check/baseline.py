"""Storage regression checks: ``baseline`` records replay results with the storage they ran on; ``check`` compares.

A baseline is a JSON document::

    {"format": "ckpt-trace-baseline", "version": 1, "created": ISO-8601,
     "environment": {"host", "kernel", "filesystem", "device", "device_model", "cpu_count"},
     "options": {"strategies", "repeat", "queue_depth", "buffer_bytes", "durable"},
     "traces": [{"name", "path", "sha256",
                 "results": {STRATEGY: {"throughput_bytes_per_s", "p99_latency_ns", "elapsed_s",
                                        "runs_elapsed_s", "bytes_written", "bytes_read"}}}]}

Throughput is (bytes written + bytes read) / elapsed_s of the median run of
``repeat``; p99 is the 99th-percentile latency of that run's data operations.
A figure regresses when throughput falls below ``old * (1 - tolerance)`` or
p99 rises above ``old * (1 + tolerance)``.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import sha256_file, write_bytes_atomic
from ckpt_trace.iolayer.host import environment
from ckpt_trace.replayer import replay
from ckpt_trace.replayer.replay import STRATEGIES

BASELINE_FORMAT = "ckpt-trace-baseline"
BASELINE_VERSION = 1


class RegressionError(CkptTraceError):
    """A baseline is missing, corrupt, or does not match the traces and strategies being checked."""


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
    return {"throughput_bytes_per_s": moved / result.elapsed_s if result.elapsed_s > 0 else 0.0,
            "p99_latency_ns": result.latency_ns.get("p99", 0), "elapsed_s": result.elapsed_s,
            "runs_elapsed_s": result.runs_elapsed_s or [result.elapsed_s],
            "bytes_written": result.bytes_written, "bytes_read": result.bytes_read}


def _measure(traces: Sequence[Path], target: Path, strategies: Sequence[str], repeat: int, durable: bool,
             queue_depth: int, buffer_bytes: int, progress=None) -> list[dict]:
    measured = []
    for index, trace in enumerate(traces):
        results = {}
        for strategy in strategies:
            scratch = target / f"trace-{index}-{strategy}"
            try:
                report = replay(trace, target=scratch, strategy=strategy, repeat=repeat, durable=durable,
                                queue_depth=queue_depth, buffer_bytes=buffer_bytes, progress=progress)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            results[strategy] = _figures(report.results[0])
        measured.append({"name": trace.name, "path": str(trace), "sha256": sha256_file(trace), "results": results})
    return measured


def _check_strategies(strategies: Sequence[str]) -> list[str]:
    chosen = list(STRATEGIES) if not strategies or "all" in strategies else list(dict.fromkeys(strategies))
    unknown = [s for s in chosen if s not in STRATEGIES]
    if unknown:
        raise RegressionError(f"unknown strategy {unknown[0]!r} (available: {', '.join(STRATEGIES)}, all)")
    return chosen


def _check_target(target: Path) -> None:
    if target.exists() and any(target.iterdir()):
        raise RegressionError(f"target {target} is not empty; give an empty or new directory")


def make_baseline(traces: Sequence[str | os.PathLike], *, target: str | os.PathLike, strategies: Sequence[str] = (),
                  repeat: int = 1, durable: bool = True, queue_depth: int = 32, buffer_bytes: int = 4 << 20,
                  progress=None) -> dict:
    """Replay each trace under each strategy into ``target`` and return the baseline document (module docstring).

    ``durable`` (default on) fsyncs inside the timed region, so the figures
    describe the storage rather than the page cache. Raises RegressionError,
    TraceFormatError or ReplayError.
    """
    paths = [Path(t) for t in traces]
    target = Path(target)
    chosen = _check_strategies(strategies)
    _check_target(target)
    measured = _measure(paths, target, chosen, repeat, durable, queue_depth, buffer_bytes, progress)
    return {"format": BASELINE_FORMAT, "version": BASELINE_VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "environment": environment(target),
            "options": {"strategies": chosen, "repeat": repeat, "queue_depth": queue_depth,
                        "buffer_bytes": buffer_bytes, "durable": durable},
            "traces": measured}


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
    return data


@dataclass(frozen=True)
class Comparison:
    """One trace x strategy x metric: old and new values, relative change, and whether it regressed."""

    trace: str
    strategy: str
    metric: str
    old: float
    new: float
    change: float
    regressed: bool
    new_runs_elapsed_s: tuple[float, ...]


def _compare(name: str, strategy: str, old: dict, new: dict, tolerance: float) -> list[Comparison]:
    rows = []
    for metric, higher_is_better in (("throughput_bytes_per_s", True), ("p99_latency_ns", False)):
        before, after = float(old[metric]), float(new[metric])
        change = (after - before) / before if before else 0.0
        regressed = after < before * (1 - tolerance) if higher_is_better else after > before * (1 + tolerance)
        rows.append(Comparison(name, strategy, metric, before, after, change, bool(before) and regressed,
                               tuple(new["runs_elapsed_s"])))
    return rows


def _match_traces(baseline: dict, paths: list[Path]) -> list[dict]:
    by_hash = {entry["sha256"]: entry for entry in baseline["traces"]}
    matched = []
    for path in paths:
        digest = sha256_file(path)
        if digest not in by_hash:
            raise RegressionError(f"{path} is not in the baseline (its traces: "
                                  f"{', '.join(e['name'] for e in baseline['traces'])})")
        matched.append(by_hash[digest])
    if len(matched) != len(baseline["traces"]):
        missing = [e["name"] for e in baseline["traces"] if e not in matched]
        raise RegressionError(f"the baseline also holds {', '.join(missing)}; check the same traces")
    return matched


def run_check(traces: Sequence[str | os.PathLike], baseline: dict, *, target: str | os.PathLike,
              tolerance: float = 0.10, repeat: int | None = None, strategies: Sequence[str] = (),
              progress=None) -> list[Comparison]:
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
    measured = _measure(paths, target, chosen, repeat or options["repeat"], options["durable"],
                        options["queue_depth"], options["buffer_bytes"], progress)
    rows = []
    for old, new in zip(matched, measured):
        for strategy in chosen:
            if strategy not in old["results"]:
                raise RegressionError(f"the baseline has no {strategy} result for {old['name']}")
            rows += _compare(old["name"], strategy, old["results"][strategy], new["results"][strategy], tolerance)
    return rows


def write_json(path: str | os.PathLike, data: dict) -> None:
    write_bytes_atomic(path, (json.dumps(data, indent=2) + "\n").encode())
