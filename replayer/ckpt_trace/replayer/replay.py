"""``replay``: trace in, results out, for one strategy.

Call order: read and validate the trace, build each strategy's plan (pure),
check the target (empty unless forced, enough free space), then per
strategy let its executor prepare the target, run, and compare final file
sizes with the plan.
Called by the CLI's ``replay`` command.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ckpt_trace import config
from ckpt_trace.errors import CkptTraceError, ReplayError
from ckpt_trace.formats import read_trace
from ckpt_trace.iolayer import host
from ckpt_trace.stats import median_index

from .paths import TargetRoot
from .aggregate import alignment_counts, build_aggregated_plan
from .pack import pack_plan
from .plan import ReplayPlan, build_posix_plan
from .posix import PosixExecutor, Progress
from .results import ReplayResult
from .uring import UringExecutor, io_uring_available
from .verify import verify_content

STRATEGIES = ("posix", "uring-buffered", "uring-direct", "aggregated")
CHOICES = STRATEGIES + ("all",)
TIMINGS = ("asap", "original")


@dataclass(frozen=True)
class SizeMismatch:
    """A file whose replayed size differs from its size at the end of the recording."""

    strategy: str
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
    options: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        """trace, target, the replay's options (queue_depth, buffer_bytes, pack_files, ...) and one entry per result."""
        return {"trace": str(self.trace), "target": str(self.target), "options": self.options,
                "results": [result.to_json() for result in self.results]}


def build_plan(table, strategy: str, strip_prefix: str | None = None, *, buffer_bytes: int = 4 << 20,
               block_bytes: int = 4096, pack_files: bool = False, arch: str = "x86_64") -> ReplayPlan:
    """The frozen plan of ``strategy`` for a trace table. Pure.

    posix, uring-buffered and uring-direct replay the recorded operations and
    differ only in how the executor submits them; aggregated coalesces them
    (``replayer.aggregate``) and, with ``pack_files``, packs small files
    (``replayer.pack``). Raises ReplayError for an unknown strategy or a
    buffer size outside 1-64 MiB.
    """
    if strategy not in STRATEGIES:
        raise ReplayError(f"unknown strategy {strategy!r} (available: {', '.join(CHOICES)})")
    return derive_plan(build_posix_plan(table, strip_prefix, arch=arch), strategy, buffer_bytes=buffer_bytes,
                       block_bytes=block_bytes, pack_files=pack_files)


def derive_plan(base: ReplayPlan, strategy: str, *, buffer_bytes: int = 4 << 20, block_bytes: int = 4096,
                pack_files: bool = False) -> ReplayPlan:
    """``strategy``'s plan from the as-recorded plan ``base`` (so ``all`` plans the trace once). Pure."""
    base = dataclasses.replace(base, strategy=strategy)
    if strategy != "aggregated":
        return base
    try:
        plan = build_aggregated_plan(base, buffer_bytes=buffer_bytes, block_bytes=block_bytes)
    except ValueError as err:
        raise ReplayError(f"--buffer-size: {err}") from None
    return pack_plan(plan, block_bytes=block_bytes) if pack_files else plan


def _plans(trace, strategy: str, strip_prefix: str | None, **options) -> list[ReplayPlan]:
    """The plans of ``strategy`` (every strategy for ``all``) for a read ``Trace``, planning it once."""
    if strategy not in CHOICES:
        raise ReplayError(f"unknown strategy {strategy!r} (available: {', '.join(CHOICES)})")
    base = build_posix_plan(trace.table, strip_prefix, arch=trace.metadata["arch"])
    return [derive_plan(base, name, **options) for name in (STRATEGIES if strategy == "all" else (strategy,))]


def make_executor(strategy: str, root: TargetRoot, queue_depth: int) -> PosixExecutor:
    """The executor of ``strategy``. Raises ReplayError when io_uring is unavailable for a uring strategy."""
    if strategy == "posix":
        return PosixExecutor(root, config.REPLAY_MAX_IO_BYTES)
    problem = io_uring_available()
    if problem:
        raise ReplayError(f"strategy {strategy} needs io_uring: {problem}")
    return UringExecutor(root, config.REPLAY_MAX_IO_BYTES, queue_depth=queue_depth,
                         direct=strategy in ("uring-direct", "aggregated"), strategy=strategy)


def plan_summaries(trace_path: str | os.PathLike, *, strategy: str, target: str | os.PathLike,
                   strip_prefix: str | None = None, buffer_bytes: int = 4 << 20, pack_files: bool = False) -> list[dict]:
    """What each strategy's plan would do (``--dry-run``): operations by kind, bytes, alignment. No I/O."""
    trace = read_trace(trace_path)
    block = host.block_bytes(target)
    summaries = []
    for plan in _plans(trace, strategy, strip_prefix, buffer_bytes=buffer_bytes, block_bytes=block,
                       pack_files=pack_files):
        data = [op for w in plan.workers for op in w.ops if op.kind in ("read", "write")]
        summaries.append({
            "strategy": plan.strategy, "workers": len(plan.workers), "ops": plan.counts(),
            "write_bytes": sum(op.size or 0 for op in data if op.kind == "write"),
            "read_bytes": sum(op.size or 0 for op in data if op.kind == "read"),
            "largest_op_bytes": max((op.size or 0 for op in data), default=0),
            "block_bytes": block, "alignment": alignment_counts(plan, block),
            "precreate_files": len(plan.precreate_files), "skipped_ops": dict(plan.skipped_ops),
            "packed_files": len(plan.pack_index), "metadata_ops_saved": plan.metadata_ops_saved,
        })
    return summaries


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


def check_free_space(target: Path, plan: ReplayPlan, copies: int = 1) -> None:
    """Raise ReplayError when ``target``'s file system lacks room for ``copies`` of the plan's bytes plus a margin."""
    try:
        host.require_free(target, plan.bytes_to_write * copies + config.REPLAY_FREE_SPACE_MARGIN_BYTES, "the replay")
    except CkptTraceError as err:
        raise ReplayError(str(err)) from None


def size_mismatches(root: TargetRoot, plan: ReplayPlan) -> tuple[SizeMismatch, ...]:
    """Files whose size after the replay differs from the plan's expected final size."""
    found = []
    for rel, expected in sorted(plan.checks.expected_sizes.items()):
        try:
            actual = os.stat(os.path.join(root.root, rel)).st_size
        except OSError:
            actual = None
        if actual != expected:
            found.append(SizeMismatch(plan.strategy, rel, expected, actual))
    for rel, entry in sorted(plan.pack_index.items()):
        try:
            room = os.stat(os.path.join(root.root, entry["pack"])).st_size - entry["offset"]
        except OSError:
            room = None
        if room is None or room < entry["size_bytes"]:
            found.append(SizeMismatch(plan.strategy, f"{rel} (in {entry['pack']})", entry["size_bytes"], room))
    return tuple(found)


def replay(
    trace_path: str | os.PathLike,
    *,
    target: str | os.PathLike,
    strategy: str = "posix",
    strip_prefix: str | None = None,
    timing: str = "asap",
    force: bool = False,
    queue_depth: int = 32,
    buffer_bytes: int = 4 << 20,
    repeat: int = 1,
    drop_caches: bool = False,
    durable: bool = False,
    verify: bool = False,
    pack_files: bool = False,
    progress: Progress | None = None,
) -> ReplayReport:
    """Replay the trace at ``trace_path`` into ``target`` with ``strategy`` (or every strategy: ``all``).

    ``buffer_bytes`` is the aggregated strategy's buffer size (1-64 MiB).
    ``repeat`` runs each strategy that many times (the target emptied between
    runs) and reports the run of median elapsed time with every run's time;
    ``drop_caches`` (root) drops the page cache before each run; ``durable``
    fsyncs every file left behind inside the timed region, so strategies that
    stop at the page cache and those that reach the device compare fairly.
    ``verify`` reads every written file back after each strategy's run and
    raises ReplayError on the first content mismatch. ``pack_files`` packs
    small files for the aggregated strategy.
    With ``all``, each strategy replays into ``target/<strategy>/`` and each
    result carries ``speedup_vs_posix``. Raises TraceFormatError for a bad
    trace and ReplayError for an unknown strategy or timing, an unsafe or
    non-empty target, too little free space, io_uring missing for a uring
    strategy, or an I/O error during a run.
    """
    if timing not in TIMINGS:
        raise ReplayError(f"unknown timing {timing!r} (choose from {', '.join(TIMINGS)})")
    if strategy not in CHOICES:
        raise ReplayError(f"unknown strategy {strategy!r} (available: {', '.join(CHOICES)})")
    if repeat < 1:
        raise ReplayError("--repeat must be at least 1")
    if drop_caches and os.geteuid() != 0:
        raise ReplayError("--drop-caches needs root (it writes /proc/sys/vm/drop_caches)")
    trace = read_trace(trace_path)
    target = Path(target)
    plans = _plans(trace, strategy, strip_prefix, buffer_bytes=buffer_bytes, block_bytes=host.block_bytes(target),
                   pack_files=pack_files)
    prepare_target(target, force)
    check_free_space(target, plans[0], copies=len(plans))
    results, mismatches = [], []
    for plan in plans:
        directory = target / plan.strategy if strategy == "all" else target
        runs = []
        for attempt in range(repeat):
            if attempt:
                _empty(directory)
            root = prepare_target(directory, force) if strategy == "all" else TargetRoot(target)
            executor = make_executor(plan.strategy, root, queue_depth)
            executor.prepare(plan)
            if drop_caches:
                drop_page_cache()
            runs.append(executor.run(plan, timing=timing, progress=progress, durable=durable))
        results.append(_median_run(runs))
        mismatches.extend(size_mismatches(root, plan))
        if verify:
            results[-1].verified_files = _verify(root, plan)
    _add_speedups(results)
    options = {"queue_depth": queue_depth, "buffer_bytes": buffer_bytes, "pack_files": pack_files, "repeat": repeat,
               "durable": durable, "drop_caches": drop_caches, "timing": timing}
    return ReplayReport(trace.path, target, plans[0], tuple(results), tuple(mismatches), options)


def _verify(root: TargetRoot, plan: ReplayPlan) -> int:
    """Check the content of ``plan``'s files under ``root``; return how many were checked. Raises ReplayError."""
    found = verify_content(root, plan)
    if found:
        first = found[0]
        raise ReplayError(f"verification failed for {plan.strategy}: {len(found)} file(s) differ from the pattern, "
                          f"first {first.path} at byte {first.offset}")
    return len(plan.checks.verify_ranges)


def drop_page_cache() -> None:
    """``iolayer.host.drop_page_cache``, failing as a ReplayError."""
    try:
        host.drop_page_cache()
    except CkptTraceError as err:
        raise ReplayError(str(err)) from None


def _empty(directory: Path) -> None:
    """Remove what a previous repeat left under ``directory`` (inside the target only)."""
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _median_run(runs: list[ReplayResult]) -> ReplayResult:
    """The median run (``stats.median_index``), carrying every run's elapsed time."""
    median = runs[median_index([r.elapsed_s for r in runs])]
    median.runs_elapsed_s = [r.elapsed_s for r in runs]
    return median


def _add_speedups(results: list[ReplayResult]) -> None:
    posix = next((r for r in results if r.strategy == "posix"), None)
    if posix is None:
        return
    for result in results:
        result.speedup_vs_posix = posix.elapsed_s / result.elapsed_s if result.elapsed_s > 0 else None
