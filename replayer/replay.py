"""``replay``: trace in, results out, for one strategy.

Call order: read and validate the trace, build the strategy's plan (pure),
check the target (empty unless forced, enough free space), let the
executor prepare it, run, then compare final file sizes with the plan.
Called by the CLI's ``replay`` command.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ckpt_trace import config
from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import read_trace

from .paths import TargetRoot
from .plan import ReplayPlan, build_posix_plan
from .posix import PosixExecutor, Progress
from .results import ReplayResult

STRATEGIES = ("posix",)
TIMINGS = ("asap", "original")


@dataclass(frozen=True)
class SizeMismatch:
    """A file whose replayed size differs from its size at the end of the recording."""

    path: str
    expected_bytes: int
    actual_bytes: int | None


@dataclass(frozen=True)
class ReplayReport:
    """Everything one ``replay`` call produced."""

    trace: Path
    target: Path
    plan: ReplayPlan
    results: tuple[ReplayResult, ...]
    size_mismatches: tuple[SizeMismatch, ...]

    def to_json(self) -> dict:
        return {"trace": str(self.trace), "target": str(self.target),
                "results": [result.to_json() for result in self.results]}


def build_plan(table, strategy: str, strip_prefix: str | None = None) -> ReplayPlan:
    """The frozen plan of ``strategy`` for a trace table. Raises ReplayError for an unknown strategy."""
    if strategy not in STRATEGIES:
        raise ReplayError(f"unknown strategy {strategy!r} (available: {', '.join(STRATEGIES)})")
    return build_posix_plan(table, strip_prefix)


def prepare_target(target: Path, force: bool) -> TargetRoot:
    """Create ``target`` if needed; refuse a non-empty one unless ``force``. Raises ReplayError."""
    if target.exists() and not target.is_dir():
        raise ReplayError(f"target {target} exists and is not a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReplayError(f"cannot create target {target}: {err.strerror}") from None
    if not force and any(target.iterdir()):
        raise ReplayError(f"target {target} is not empty (use --force to replay into it)")
    return TargetRoot(target)


def check_free_space(target: Path, plan: ReplayPlan) -> None:
    """Raise ReplayError when ``target``'s file system lacks room for the plan's bytes plus a margin."""
    free = shutil.disk_usage(target).free
    needed = plan.bytes_to_write + config.REPLAY_FREE_SPACE_MARGIN_BYTES
    if free < needed:
        raise ReplayError(f"target {target} has {free / 2**20:.0f} MiB free; the replay needs {needed / 2**20:.0f} MiB")


def size_mismatches(root: TargetRoot, plan: ReplayPlan) -> tuple[SizeMismatch, ...]:
    """Files whose size after the replay differs from the plan's expected final size."""
    found = []
    for rel, expected in sorted(plan.expected_sizes.items()):
        try:
            actual = os.stat(os.path.join(root.root, rel)).st_size
        except OSError:
            actual = None
        if actual != expected:
            found.append(SizeMismatch(rel, expected, actual))
    return tuple(found)


def replay(
    trace_path: str | os.PathLike,
    *,
    target: str | os.PathLike,
    strategy: str = "posix",
    strip_prefix: str | None = None,
    timing: str = "asap",
    force: bool = False,
    progress: Progress | None = None,
) -> ReplayReport:
    """Replay the trace at ``trace_path`` into ``target`` with ``strategy``.

    Raises TraceFormatError for a bad trace and ReplayError for an unknown
    strategy or timing, an unsafe or non-empty target, too little free
    space, or an I/O error during the run.
    """
    if timing not in TIMINGS:
        raise ReplayError(f"unknown timing {timing!r} (choose from {', '.join(TIMINGS)})")
    trace = read_trace(trace_path)
    plan = build_plan(trace.table, strategy, strip_prefix)
    target = Path(target)
    root = prepare_target(target, force)
    check_free_space(target, plan)
    executor = PosixExecutor(root, config.REPLAY_MAX_IO_BYTES)
    executor.prepare(plan)
    result = executor.run(plan, timing=timing, progress=progress)
    return ReplayReport(trace.path, target, plan, (result,), size_mismatches(root, plan))
