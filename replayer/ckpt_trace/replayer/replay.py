"""``replay``: trace in, results out, for one strategy.

Call order: read and validate the trace, build each strategy's plan (pure),
check the target (empty unless forced, enough free space), then per
strategy let its executor prepare the target, run, and compare final file
sizes with the plan.
Called by the CLI's ``replay`` command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ckpt_trace import config
from ckpt_trace.errors import CkptTraceError, Interrupted, ReplayError
from ckpt_trace.formats import count_rows, scan, sha256_file
from ckpt_trace.iolayer import host, pattern
from ckpt_trace.iolayer.fio import fio_bytes_per_s
from ckpt_trace.ranges import merge_grouped_ranges

from . import strategies
from .aggregate import alignment_counts
from .cache_state import RecordedCache, prepare_recorded, recorded_cache, top_up
from .checks import check_bound_paths, checked_batches, refuse_file_and_directory, refuse_skips, skip_notes
from .data import recorded_ratio
from .engine import MALLOC_MMAP_THRESHOLD_BYTES, Executor, Progress, files_moved
from .lock import TargetLock, is_lock_file, job_id, refuse_held
from .optable import READ, WRITE
from .options import CACHE_STATES, DEFAULT_BUFFER_BYTES, GPU_COPY_MODES, TIMINGS, ReplayOptions
from .ownership import Claim
from .paths import TargetRoot
from .plan import PLAN_COLUMNS, ReplayPlan, build_posix_plan
from .results import ReplayResult, results_document
from .runs import add_phase_verdicts, add_speedups, add_verdicts, median_run, release, trace_file
from .uring import io_uring_available
from .verdicts import Rounds
from .verify import verify_content
from .writeback import writeback_choice

#: What ``all`` replays, the strategies replayed only when named, and what ``strategy=`` accepts: read from
#: the strategy table (``replayer.strategies``), never spelled here.
STRATEGIES = strategies.in_all()
OPTIONAL_STRATEGIES = tuple(name for name in strategies.names() if name not in STRATEGIES)
CHOICES = strategies.choices()
__all__ = [
    "CACHE_STATES",
    "CHOICES",
    "GPU_COPY_MODES",
    "OPTIONAL_STRATEGIES",
    "STRATEGIES",
    "TIMINGS",
    "ReplayOptions",
    "ReplayReport",
    "SizeMismatch",
    "build_plan",
    "derive_plan",
    "make_executor",
    "plan_summaries",
    "replay",
]
#: Which bytes the replay writes (results' ``options["data"]``).
DATA_NOTE = (
    "generated: incompressible, unique per 4 KiB block and per file (iolayer.pattern.fill, a counter-mode "
    "generator keyed by the file's path and the offset), made before the clock where memory allows "
    "(replayer.data; for gds, then copied to GPU memory), else as each write is issued"
)
#: ``options["data"]`` under ``--data recorded-ratio`` (``replayer.data.recorded_ratio``), formatted with its figures.
RECORDED_RATIO_NOTE = (
    "recorded-ratio: unique per 4 KiB block and per file, the first {unique_bytes_per_block} bytes of each block "
    "generated as unique data does and the rest zeros, so that {method} compresses it to {generated_ratio:.3f} of "
    "its size against the {recorded_ratio:.3f} measured at record time (the trace's data_compressibility)"
)


def data_choice(opts: ReplayOptions, metadata: dict) -> tuple[contextlib.AbstractContextManager, dict]:
    """(the context the runs go in, the results' options about the data: ``data``, ``data_mode`` and, for
    ``recorded-ratio``, ``data_ratio``) for ``opts.data``. Raises ReplayError as ``data.recorded_ratio``."""
    if opts.data != "recorded-ratio":
        return contextlib.nullcontext(), {"data": DATA_NOTE, "data_mode": opts.data}
    figures = recorded_ratio(metadata)
    return pattern.compressible(figures["unique_bytes_per_block"]), {
        "data": RECORDED_RATIO_NOTE.format(**figures),
        "data_mode": opts.data,
        "data_ratio": figures,
    }


def read_memory_notes(plans: list[ReplayPlan], read_memory: str) -> list[str | None]:
    """Per plan, a note where ``--read-memory malloc`` lands fewer of its read bytes in fresh pages than the
    first plan does (posix's, the as-recorded one, under ``all``; a single strategy is compared with itself):
    its strategy reads fewer bytes of the recorded reads of ``MALLOC_MMAP_THRESHOLD_BYTES`` and more (it
    merged reads of the same bytes: ``aggregated``), so its reads skip page faults the recorded ones paid. A
    piece a strategy re-planned counts as the recorded read it belongs to (``OpTable.op_sizes``)."""
    if read_memory != "malloc" or not plans:
        return [None] * len(plans)

    def fresh_bytes(plan: ReplayPlan) -> int:
        t = plan.ops
        large = (t.kind == READ) & (t.op_sizes() >= MALLOC_MMAP_THRESHOLD_BYTES)
        return int(t.size[large].sum())

    recorded = fresh_bytes(plans[0])
    notes: list[str | None] = []
    for plan in plans:
        mine = fresh_bytes(plan)
        notes.append(
            None
            if mine >= recorded
            else f"read memory malloc: this strategy reads {recorded - mine:,} B fewer into fresh pages than the "
            f"recorded reads of 32 MiB and more (it merged reads of the same bytes): its reads skip page faults "
            f"the recorded ones paid"
        )
    return notes


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
    trace_sha256: str | None = None
    environment: dict = dataclasses.field(default_factory=dict)
    claims: tuple = dataclasses.field(default=(), repr=False, compare=False)
    made_target: bool = False
    fio_write_bytes_per_s: float | None = None

    def release(self) -> None:
        """Remove what this replay created under the target (its files and the directories it made), nothing
        else: for callers that only measure (``check``, benchmarks)."""
        release(list(self.claims), self.target, self.made_target)

    def to_json(self) -> dict:
        """The results document (``documents.ReplayDoc``): the trace (path and sha256, which ties the results to
        it), the target, where it ran, the options and one entry per result."""
        return results_document(self, self.fio_write_bytes_per_s)


def build_plan(
    table,
    strategy: str,
    strip_prefix: str | None = None,
    *,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    block_bytes: int = 4096,
    pack_files: bool = False,
    arch: str = "x86_64",
) -> ReplayPlan:
    """The frozen plan of ``strategy`` for a trace table. Pure.

    Each strategy derives its plan from the as-recorded one
    (``replayer.strategies``: posix and the uring strategies replay the
    recorded operations, aggregated coalesces them and, with ``pack_files``,
    packs small files). Raises ReplayError for an unknown strategy or a
    buffer size outside 1-64 MiB.
    """
    spec = strategies.get(strategy)
    return spec.plan(
        build_posix_plan(table, strip_prefix, arch=arch),
        buffer_bytes=buffer_bytes,
        block_bytes=block_bytes,
        pack_files=pack_files,
    )


def derive_plan(
    base: ReplayPlan,
    strategy: str,
    *,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    block_bytes: int = 4096,
    pack_files: bool = False,
) -> ReplayPlan:
    """``strategy``'s plan from the as-recorded plan ``base`` (so ``all`` plans the trace once). Pure.
    Raises ReplayError for an unknown strategy."""
    return strategies.get(strategy).plan(
        base, buffer_bytes=buffer_bytes, block_bytes=block_bytes, pack_files=pack_files
    )


def _plans(
    trace, strategy: str, strip_prefix: str | None, *, verify_ranges: bool = True, **options
) -> list[ReplayPlan]:
    """The plans of ``strategy`` (every strategy for ``all``) for a read ``Trace``, planning it once;
    ``verify_ranges``: whether ``--verify`` will check them (``build_posix_plan``)."""
    return list(_each_plan(trace, strategy, strip_prefix, verify_ranges=verify_ranges, **options))


def _each_plan(
    trace, strategy: str, strip_prefix: str | None, *, verify_ranges: bool = True, **options
) -> Iterator[ReplayPlan]:
    """``_plans`` one plan at a time: a caller that lets each go before the next holds two plans at most."""
    names = strategies.expand(strategy)  # ReplayError for an unknown name
    arch = trace.metadata["arch"]
    if trace.table is None:  # a trace file: planned from record batches of the planner's columns only
        _, batches = scan(trace.path, PLAN_COLUMNS)  # (dur_ns among them: also checked, replayer.checks)
        base = build_posix_plan(
            checked_batches(batches),
            strip_prefix,
            arch=arch,
            verify_ranges=verify_ranges,
            num_rows=count_rows(trace.path),
        )
    else:
        for _ in checked_batches(trace.table.to_batches()):
            pass
        base = build_posix_plan(trace.table, strip_prefix, arch=arch, verify_ranges=verify_ranges)
    check_bound_paths(
        base,
        scan(trace.path, ["path"])[1] if trace.table is None else trace.table.select(["path"]).to_batches(),
        strip_prefix,
    )
    for name in names:
        yield derive_plan(base, name, **options)


def make_executor(strategy: str, root: TargetRoot, queue_depth: int) -> Executor:
    """The executor of ``strategy`` (its ``Strategy.executor``). Raises ReplayError for an unknown strategy
    or one this machine cannot run (io_uring unavailable for a uring strategy, no GPU for gds)."""
    return strategies.get(strategy).executor(root, queue_depth)


def plan_summaries(
    trace_path: str | os.PathLike,
    *,
    strategy: str,
    target: str | os.PathLike,
    strip_prefix: str | None = None,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    pack_files: bool = False,
) -> list[dict]:
    """What each strategy's plan would do (``--dry-run``): operations by kind, bytes, alignment. No I/O."""
    trace = trace_file(trace_path)
    block = host.block_bytes(target)
    summaries = []
    figures: dict = {}  # the table's figures, by table: posix and the uring strategies share one table
    for plan in _each_plan(
        trace,
        strategy,
        strip_prefix,
        verify_ranges=False,
        buffer_bytes=buffer_bytes,
        block_bytes=block,
        pack_files=pack_files,
    ):
        ops = plan.ops
        if figures.get("table") is not ops:
            sizes = np.maximum(ops.size, 0)
            writes, reads = ops.kind == WRITE, ops.kind == READ
            figures = {
                "table": ops,
                "ops": plan.counts(),
                "write_bytes": int(sizes[writes].sum()),
                "read_bytes": int(sizes[reads].sum()),
                "largest_op_bytes": int(sizes[writes | reads].max(initial=0)),
                "alignment": alignment_counts(plan, block),
            }
            del sizes, writes, reads
        summaries.append(
            {
                "strategy": plan.strategy,
                "workers": len(plan.workers),
                "ops": figures["ops"],
                "write_bytes": figures["write_bytes"],
                "read_bytes": figures["read_bytes"],
                "largest_op_bytes": figures["largest_op_bytes"],
                "preallocated_files": len(plan.preallocate),
                "block_bytes": block,
                "alignment": figures["alignment"],
                "precreate_files": len(plan.precreate_files),
                "skipped_ops": dict(plan.skipped_ops),
                "packed_files": len(plan.pack_index),
                "metadata_ops_saved": plan.metadata_ops_saved,
            }
        )
        del plan, ops  # before the next plan is derived
    return summaries


def prepare_target(target: Path, force: bool) -> TargetRoot:
    """Create ``target`` if needed; refuse a non-empty one unless ``force``. Raises ReplayError."""
    if target.exists() and not target.is_dir():
        raise ReplayError(f"target {target} exists and is not a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReplayError(f"cannot create target {target}: {err.strerror}") from None
    refuse_held(target, job_id())
    if not force and any(not is_lock_file(p.name) for p in target.iterdir()):
        raise ReplayError(
            f"target {target} is not empty (use {{option}} to replay into it)", option="force", switch=True
        )
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
            actual = root.lstat(rel).st_size
        except OSError:
            actual = None
        if actual != expected:
            found.append(SizeMismatch(plan.strategy, rel, expected, actual))
    for rel, entry in sorted(plan.pack_index.items()):
        try:
            room = root.lstat(entry["pack"]).st_size - entry["offset"]
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
    options: ReplayOptions | None = None,
    progress: Progress | None = None,
    protect: tuple[str | os.PathLike, ...] = (),
    **values,
) -> ReplayReport:
    """Replay the trace at ``trace_path`` into ``target`` with ``strategy`` (or every strategy: ``all``),
    as ``options`` say (``replayer.options.ReplayOptions``; keywords named as its fields override them).

    ``buffer_bytes`` is the aggregated strategy's buffer size (1-64 MiB).
    ``repeat`` runs each strategy that many times, in rounds interleaved
    across strategies (``replayer.verdicts``; what a strategy's previous run
    created is removed before its next, nothing else) and reports the run of
    median elapsed time with every run's time and each speed-up's interval
    from the paired rounds; ``repeat=None`` (the CLI's default) runs 3-20
    rounds until the strategies are told apart or the time budget is spent
    (``verdicts.Rounds``). With ``strategy="all"``, a trace whose reads and
    writes move fewer than ``config.REPLAY_MIN_JUDGE_BYTES`` (and any trace
    without rows) raises NothingToJudge. With ``min_seconds`` a
    strategy keeps running (at least ``repeat`` times, at most ``max_runs``,
    default ``config.REPLAY_MAX_RUNS``) until its runs' measured time adds up
    to ``min_seconds``, so a short trace is measured often enough to compare;
    ``drop_caches`` (root) drops the page cache before each run; ``durable``
    fsyncs every file left behind inside the timed region, so strategies that
    stop at the page cache and those that reach the device compare fairly.
    ``verify`` reads every written file back after each strategy's run and
    raises ReplayError on the first content mismatch, short read or size
    difference from the recording. ``pack_files`` packs
    small files for the aggregated strategy.
    With ``all``, each strategy replays into ``target/<strategy>/`` and each
    result carries ``speedup_vs_posix``.

    ``fio`` first measures fio's sequential O_DIRECT write limit in the
    target (``iolayer.fio``; as much data as the replay writes, at most
    1 GiB, removed afterwards): the results carry it, so each strategy reads
    as a share of what the device gives.

    ``cache`` is the page-cache state of the files that exist before the
    trace (pre-created, so reads find them) when each run's clock starts:
    ``cold`` (each fsynced, then dropped with posix_fadvise(2)
    POSIX_FADV_DONTNEED: reads go to the device), ``warm`` (each read once:
    reads are served from memory) or ``recorded``: as the trace's ``cold_bytes``
    says (bcc, format version 6: ranges read cold dropped, ranges read warm
    read once; ``replayer.cache_state``), and a trace that does not say which
    reads hit the page cache (strace, older versions) replays cold; the
    results' note says which state ran.
    Pre-creation and this preparation are setup, never inside the clock; so
    is ``durable``'s sync of files the run did not write.

    ``data`` says which bytes are written (``options.DATA_MODES``): ``unique`` (default: incompressible,
    unique per 4 KiB block and per file) or ``recorded-ratio`` (unique per block, compressible by the ratio
    ``record`` measured, the trace's ``data_compressibility``: ``replayer.data``; ReplayError for a trace
    without it). The results' ``options`` say which ran (``data``, ``data_mode``, ``data_ratio``).

    ``strict`` makes a replay that did not run as named an error: a
    strategy whose named data path carried under
    ``config.REPLAY_NAMED_PATH_MIN_SHARE`` of the bytes (after its runs;
    the replay's files are removed).

    ``gpu_copies`` says what the trace's host<->device copy rows become:
    ``recorded`` (each copy re-executed with its recorded size, direction
    and host memory kind, before the I/O that followed it), ``pinned`` (the
    same, every host side in pinned memory: the staging a writer can adopt)
    or ``skip``. Where no GPU is, copies are skipped, counted in the
    results' ``gpu_copies`` and named in a note.

    ``read_memory`` says where reads land (``options.READ_MEMORY_MODES``): ``malloc`` (default), fresh for
    recorded operations of at least 32 MiB and reused below, as glibc's malloc serves a loader's buffers
    (``replayer.engine``); ``reused``, one resident buffer per worker, as a loader whose allocator reuses
    what it freed; ``fresh``, pages each read faults in, as a read into newly mapped memory. The results'
    ``options`` say which ran.

    ``writeback`` says whose dirty-page thresholds the runs have: ``system`` (default: this machine's, not
    touched) or ``recorded`` (root: the least the trace's ``writeback`` metadata recorded, set for the runs
    and put back after; ``replayer.writeback``); ReplayError for a trace without them. The results'
    ``options`` and notes say which ran.

    Nothing is lost (``replayer.ownership``): a target that holds the trace,
    or where a file the replay would create already exists or is one of
    ``protect`` (the command's other inputs and outputs), is refused before
    any I/O; ``force`` only allows a non-empty target. A run that fails or is
    interrupted removes what this replay created and says so.

    Raises TraceFormatError for a bad trace; ReplayError for an unknown
    strategy or timing, an unsafe, non-empty or conflicting target, too
    little free space, a queue depth io_uring refuses, or an I/O error during
    a run; Interrupted on Ctrl-C.
    """
    opts = ReplayOptions.of(options, **values)
    opts.check(strategy)
    trace = trace_file(trace_path)
    data_context, data_options = data_choice(opts, trace.metadata)
    writeback_context, writeback_options, writeback_note = writeback_choice(opts.writeback, trace.metadata)
    target = Path(target)
    refuse_target_holding(target, trace.path)
    digest = _digest_soon(trace.path)
    plans = _plans(
        trace,
        strategy,
        opts.strip_prefix,
        verify_ranges=opts.verify,
        buffer_bytes=opts.buffer_bytes,
        block_bytes=host.block_bytes(target),
        pack_files=opts.pack_files,
    )
    trace_sha256 = digest.result()  # before any run: the hashing never shares the CPU with a measured run
    check_judgeable(plans[0], judging=strategy == "all")
    check_same_coverage(plans)
    check_queue_depth(opts.queue_depth, [plan.strategy for plan in plans])
    refuse_file_and_directory(plans[0])
    skips = skip_notes(plans[0].skipped_ops)  # rows the replay leaves out, said (replayer.checks)
    if opts.strict:
        refuse_skips(plans[0].skipped_ops)
    made_target = not target.exists()
    prepare_target(target, opts.force)
    lock = TargetLock.acquire(target)  # one replay job per target (replayer.lock)
    try:
        claims = [
            Claim(target / plan.strategy if strategy == "all" else target, plan, fresh=strategy == "all")
            for plan in plans
        ]
        try:
            for claim in claims:
                claim.refuse_conflicts((trace.path, *protect))
            check_free_space(target, plans[0], copies=len(plans))
        except ReplayError:
            release([], target, made_target, lock)  # nothing was written: only a target this call made goes
            raise
        try:
            fio_limit = _fio_limit(target, plans[0]) if opts.fio else None
            runs = Rounds(opts.repeat, opts.min_seconds, opts.max_runs or config.REPLAY_MAX_RUNS)
            cache_state, cache_note, recorded = resolve_cache(opts.cache, plans[0], trace, opts.strip_prefix)
            with data_context, writeback_context:
                results, mismatches = _run_plans(plans, claims, opts, runs, progress, cache_state, recorded)
            if recorded is not None:  # now with what the preparations could not drop
                cache_note = recorded.note()
        except (ReplayError, KeyboardInterrupt) as err:
            release(claims, target, made_target, lock)
            if isinstance(err, KeyboardInterrupt):
                raise Interrupted(f"interrupted; the replay's files under {target} were removed") from None
            if any(claim.files for claim in claims) and target.exists():
                raise ReplayError(f"{err}; the replay's files under {target} were removed") from None
            raise
        add_speedups(results)
        off_path = [r for r in results if r.off_named_path]
        if opts.strict and off_path:
            release(claims, target, made_target, lock)
            first = off_path[0]
            raise ReplayError(
                f"{{option}}: {first.strategy}'s named path ({first.named_path}) carried "
                f"{first.path_shares()['named_path_bytes_share']:.0%} of the bytes, under "
                f"{config.REPLAY_NAMED_PATH_MIN_SHARE:.0%}; the replay's files under {target} were "
                "removed",
                option="strict",
                switch=True,
            )
        document_options = {
            "queue_depth": opts.queue_depth,
            "buffer_bytes": opts.buffer_bytes,
            "pack_files": opts.pack_files,
            "repeat": opts.repeat,
            "rounds": len(results[0].runs_elapsed_s),
            "rounds_rule": runs.describe(),
            "min_seconds": opts.min_seconds,
            "durable": opts.durable,
            "drop_caches": opts.drop_caches,
            "timing": opts.timing,
            "gpu_copies": opts.gpu_copies,
            "read_memory": opts.read_memory,
            "cache": opts.cache,
            "cache_state": cache_state,
            "strict": opts.strict,
            **data_options,
            **writeback_options,
        }
        memory_notes = read_memory_notes(plans, opts.read_memory)
        for result, memory_note in zip(results, memory_notes):
            result.notes.extend([note for note in (cache_note, writeback_note, memory_note) if note])
            result.notes.extend(skips)
        return ReplayReport(
            trace.path,
            target,
            plans[0],
            tuple(results),
            tuple(mismatches),
            document_options,
            trace_sha256=trace_sha256,
            environment=host.environment(target),
            claims=tuple(claims),
            made_target=made_target,
            fio_write_bytes_per_s=fio_limit,
        )
    finally:
        lock.release()


def _digest_soon(path: Path) -> Future:
    """``sha256_file(path)`` on a helper thread, so hashing the trace (0.44 s for the 121 MB of 10 M rows,
    warm, on the 2-core VM) overlaps its planning: file reads and hashlib's updates release the GIL. The
    caller takes ``result()`` (which re-raises the thread's OSError) before any run starts. A daemon
    thread, not an executor's: a command that fails while planning exits without waiting for the hash."""
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(sha256_file(path))
        except BaseException as err:  # noqa: BLE001 - handed to the caller, who raises it
            future.set_exception(err)

    threading.Thread(target=work, name="ckpt-trace-sha256", daemon=True).start()
    return future


def _run_plans(
    plans,
    claims,
    opts: ReplayOptions,
    count: Rounds,
    progress,
    cache_state: str = "cold",
    recorded: RecordedCache | None = None,
) -> tuple[list[ReplayResult], list[SizeMismatch]]:
    """Run the plans in rounds (``replayer.verdicts``): each round runs every plan once, starting one plan later
    than the round before, releasing that plan's previous run's files first; then each plan's median run, with
    every run's time and its paired speed-ups over the others."""
    runs: list[list[ReplayResult]] = [[] for _ in plans]
    roots: list[TargetRoot | None] = [None] * len(plans)
    names = [plan.strategy for plan in plans]
    while count.more({name: [r.elapsed_s for r in mine] for name, mine in zip(names, runs)}):
        first = len(runs[0]) % len(plans)
        for index in [*range(first, len(plans)), *range(first)]:
            plan, claim = plans[index], claims[index]
            if runs[index]:
                claim.release(keep_directory=True)
            root = roots[index] = claim.root()
            executor = make_executor(plan.strategy, root, opts.queue_depth)
            executor.gpu_copies = opts.gpu_copies
            executor.read_memory = opts.read_memory
            executor.prepare(plan)
            prepare_cache(root, plan, cache_state, recorded)
            if opts.drop_caches:
                drop_page_cache()
            runs[index].append(executor.run(plan, timing=opts.timing, progress=progress, durable=opts.durable))
            check_file_bytes(plan, runs[index][-1])
    results, mismatches = [], []
    for plan, root, mine in zip(plans, roots, runs):
        results.append(median_run(mine))
        # median_run took a run of this plan (it fails on none), and each run sets its plan's root first.
        assert root is not None
        mismatches.extend(size_mismatches(root, plan))
        if opts.verify:
            results[-1].verified_files = _verify(root, plan)
    add_verdicts(results, {name: [r.elapsed_s for r in mine] for name, mine in zip(names, runs)})
    add_phase_verdicts(results, runs)
    return results, mismatches


def resolve_cache(
    cache: str, plan: ReplayPlan, trace=None, strip_prefix: str | None = None
) -> tuple[str, str | None, RecordedCache | None]:
    """The page-cache state a replay prepares (``cold``, ``warm`` or ``recorded``), the note the results carry
    about it, and for ``recorded`` the ranges to prepare (``replayer.cache_state``): a trace whose reads of
    pre-created files all carry ``cold_bytes`` (format version 6, bcc) replays as recorded; one that does not
    say (strace, older traces) replays cold, with a note. Raises TraceFormatError for a corrupt trace."""
    if cache != "recorded":
        return cache, None, None
    t = plan.ops
    if not (bool(((t.kind == READ) & (t.size > 0)).any()) and plan.precreate_files):
        return "cold", None, None
    if trace is None:
        return "cold", RecordedCache(known=False).note(), None
    state = recorded_cache(trace, strip_prefix, [rel for rel, _ in plan.precreate_files])
    if not state.known:
        return "cold", state.note(), None
    return "recorded", state.note(), state


def prepare_cache(root: TargetRoot, plan: ReplayPlan, state: str, recorded: RecordedCache | None = None) -> None:
    """Before the clock: the pre-created files cold (fsync(2), then posix_fadvise(2) POSIX_FADV_DONTNEED,
    which drops clean pages), warm (read once, whole; then what the kernel evicted meanwhile read again:
    ``cache_state.top_up``) or, ``state`` ``recorded``, as ``recorded`` says
    (``cache_state.prepare_recorded``). Raises ReplayError on an I/O error."""
    if state == "recorded" and recorded is not None:
        prepare_recorded(root, [rel for rel, _ in plan.precreate_files], recorded)
        return
    chunk = bytearray(4 << 20)
    warm: dict[str, list[tuple[int, int]]] = {}
    for rel, _size_bytes in plan.precreate_files:
        try:
            fd = root.open(rel, os.O_RDONLY)
        except FileNotFoundError:  # a distributed share's file another process creates
            continue
        except OSError as err:
            raise ReplayError(f"cannot prepare the page cache of {rel}: {err.strerror}") from None
        try:
            if state == "cold":
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.readv(fd, [chunk]) > 0:
                    pass
                warm[rel] = [(0, os.fstat(fd).st_size)]
        except OSError as err:
            raise ReplayError(f"cannot prepare the page cache of {rel}: {err.strerror}") from None
        finally:
            os.close(fd)
    top_up(root, warm, chunk)  # pages evicted while the other files were read (``cache_state``)


class NothingToJudge(ReplayError):
    """The trace moves too few bytes (or has no rows) for strategies to be told apart."""


def data_bytes(plan: ReplayPlan) -> int:
    """The bytes ``plan``'s reads and writes move. Pure."""
    t = plan.ops
    return int(np.maximum(t.size[(t.kind == READ) | (t.kind == WRITE)], 0).sum())


def check_judgeable(plan: ReplayPlan, judging: bool = True) -> None:
    """Raise NothingToJudge for a plan without operations, or (``judging``: strategies are compared) one whose
    reads and writes move fewer than ``config.REPLAY_MIN_JUDGE_BYTES``."""
    moved = data_bytes(plan)
    if len(plan.ops) == 0 or (judging and moved < config.REPLAY_MIN_JUDGE_BYTES):
        ops = int(((plan.ops.kind == READ) | (plan.ops.kind == WRITE)).sum())
        raise NothingToJudge(
            f"nothing to judge: the trace's {ops:,} reads and writes move {moved:,} B, under "
            f"{config.REPLAY_MIN_JUDGE_BYTES:,} B (CKPT_TRACE_REPLAY_MIN_JUDGE_BYTES)"
        )


def planned_file_bytes(plan: ReplayPlan) -> dict[str, tuple[int, int]]:
    """The bytes ``plan`` writes and reads per file path (the sum of its operations' sizes). Pure."""
    t = plan.ops
    size = max(len(t.paths), 1)
    per_path = np.zeros((2, size), np.int64)
    for row, kind in ((0, WRITE), (1, READ)):
        mine = (t.kind == kind) & (t.path >= 0)
        per_path[row] = np.bincount(t.path[mine], weights=np.maximum(t.size[mine], 0), minlength=size)[:size]
    return files_moved(plan, per_path)


def covered_file_bytes(plan: ReplayPlan) -> dict[str, tuple[int, int]]:
    """The distinct bytes ``plan`` writes and reads per file path (the union of its operations' byte ranges:
    an aggregated plan merges overlapping operations, so sums differ where coverage does not). Pure."""
    t = plan.ops
    size = max(len(t.paths), 1)
    per_path = np.zeros((2, size), np.int64)
    for row, kind in ((0, WRITE), (1, READ)):
        mine = (t.kind == kind) & (t.path >= 0) & (t.offset >= 0) & (t.size > 0)
        groups, starts, ends = merge_grouped_ranges(
            t.path[mine].astype(np.int64), t.offset[mine], t.offset[mine] + t.size[mine]
        )
        per_path[row] = np.bincount(groups, weights=ends - starts, minlength=size)[:size]
    return files_moved(plan, per_path)


def check_same_coverage(plans: list[ReplayPlan]) -> None:
    """Refuse plans that would not write and read the same bytes of the same files as the first (the trace as
    recorded): a strategy that moves other bytes cannot be compared with it. Plans with packed files (whose
    bytes live in packs) are left out. Raises ReplayError naming the first file that differs."""
    reference = None
    for plan in plans:
        if plan.pack_index:
            continue
        coverage = covered_file_bytes(plan)
        if reference is None:
            reference = (plan.strategy, coverage)
            continue
        if coverage != reference[1]:
            name = next(
                p
                for p in sorted(set(coverage) | set(reference[1]))
                if coverage.get(p, (0, 0)) != reference[1].get(p, (0, 0))
            )
            ours, theirs = coverage.get(name, (0, 0)), reference[1].get(name, (0, 0))
            raise ReplayError(
                f"the {plan.strategy} plan would write {ours[0]:,} B and read {ours[1]:,} B of {name}, "
                f"{reference[0]} {theirs[0]:,} B and {theirs[1]:,} B: the strategies would not move "
                "the same bytes (a planner bug; please report it)"
            )


def check_file_bytes(plan: ReplayPlan, result: ReplayResult) -> None:
    """After a run: every file got exactly the bytes its plan writes, and no more than the bytes its plan's
    reads ask for (``result.file_bytes``): a read asks for what the recorded read asked for, and one that
    met the end of the file then (``read(2)`` returning less, or 0) meets it again in the replay, since the
    file is laid out as the trace saw it. A short write, a read past what was asked, or an operation that
    reached another file would make the strategies incomparable. Raises ReplayError naming the first file
    that differs."""
    if plan.pack_index:
        return
    expected = planned_file_bytes(plan)
    moved = result.file_bytes
    if moved == expected:
        return
    for name in sorted(set(expected) | set(moved)):
        want, got = expected.get(name, (0, 0)), moved.get(name, (0, 0))
        if want[0] != got[0] or got[1] > want[1]:
            raise ReplayError(
                f"{plan.strategy} wrote {got[0]:,} B and read {got[1]:,} B of {name}, its plan "
                f"{want[0]:,} B and {want[1]:,} B (the rows it replays): the run moved other bytes "
                "than the trace, so its figures cannot be compared"
            )


def _fio_limit(target: Path, plan: ReplayPlan) -> float:
    """fio's sequential O_DIRECT write limit in ``target`` (bytes/s). Raises ReplayError without fio."""
    volume = min(max(plan.bytes_to_write, 64 << 20), 1 << 30)
    try:
        limit = fio_bytes_per_s(target, str(volume))
    except CkptTraceError as err:
        raise ReplayError(str(err)) from None
    if limit is None:
        raise ReplayError("{option} needs fio on PATH (Debian: apt-get install fio)", option="fio", switch=True)
    return limit


def refuse_target_holding(target: Path, trace: Path) -> None:
    """Refuse a target directory that contains the trace being replayed. Raises ReplayError."""
    resolved = Path(os.path.realpath(target))
    if Path(os.path.realpath(trace)).is_relative_to(resolved):
        raise ReplayError(
            f"the target {target} contains the trace being replayed ({trace}); choose a target outside it"
        )


def check_queue_depth(queue_depth: int, names: list[str]) -> None:
    """Probe a ring of ``queue_depth`` before anything runs, when a strategy uses io_uring. Raises ReplayError."""
    if queue_depth < 1:
        raise ReplayError("{option} must be at least 1", option="queue_depth")
    if any(strategies.get(name).uses_queue_depth for name in names):
        problem = io_uring_available(queue_depth)
        if problem:
            raise ReplayError(f"{{option}} {queue_depth}: {problem}", option="queue_depth")


def _verify(root: TargetRoot, plan: ReplayPlan) -> int:
    """Check the content of ``plan``'s files under ``root``; return how many were checked. Raises ReplayError."""
    found = verify_content(root, plan)
    if found:
        first = found[0]
        raise ReplayError(
            f"verification failed for {plan.strategy}: {len(found)} file(s) differ from the pattern, "
            f"first {first.path} at byte {first.offset}"
        )
    sizes = size_mismatches(root, plan)  # an extended or truncated file is wrong even where its ranges hold
    if sizes:
        first = sizes[0]
        raise ReplayError(
            f"verification failed for {plan.strategy}: {len(sizes)} file(s) differ in size from the "
            f"recording, first {first.path}: {size_words(first.actual_bytes)}, recorded "
            f"{first.expected_bytes:,} B"
        )
    return len(plan.checks.verify_ranges)


def size_words(size_bytes: int | None) -> str:
    """A replayed file's size for a message: ``1,024 B``, or ``missing`` (never "None bytes")."""
    return "missing" if size_bytes is None else f"{size_bytes:,} B"


def drop_page_cache() -> None:
    """``iolayer.host.drop_page_cache``, failing as a ReplayError."""
    try:
        host.drop_page_cache()
    except CkptTraceError as err:
        raise ReplayError(str(err)) from None
