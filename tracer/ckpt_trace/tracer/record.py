"""``record``: run a command under a backend and write its trace.

Call order: ``choose_backend`` (auto-detection, with the reason), then
``record``, which runs the command, builds rows with ``TraceBuilder`` and
writes the trace atomically. Called by the CLI's ``record`` command.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_trace import config
from ckpt_trace.errors import CommandNotFound, TracerError
from ckpt_trace.formats import reserve_temporary, vocabulary
from ckpt_trace.formats.io import RESERVE_BYTES
from ckpt_trace.iolayer.host import filesystems_of
from ckpt_trace.iolayer.outputs import check_output_file
from ckpt_trace.version import __version__

from . import attach as attach_mod
from . import backends, clock, compressibility, costs, gpu, reclaim, strace_backend, writeback
from .backends import BackendChoice
from .children import forwarding
from .spool import RowSpool
from .state import EffectOrderFeeder, TraceBuilder, rank_from_environ

#: What ``--backend`` accepts: ``auto`` and every backend of the table (``tracer.backends``).
BACKENDS = backends.choices()


@dataclass(frozen=True)
class RecordResult:
    """Outcome of one recording: the command's exit code and what the trace holds."""

    trace_path: Path
    exit_code: int
    backend: str
    backend_reason: str
    rows: int
    lost_events: int
    elapsed_s: float
    exit_signal: int | None = None
    interrupted: str | None = None  # SIGTERM, SIGHUP or SIGINT cut the recording (the command got it too)
    filtered_ops: int = 0
    unseen: dict = field(default_factory=dict)
    gpu: dict = field(default_factory=dict)
    mapped_uncovered_bytes: int | None = None
    start_s: float | None = None  # from this process's start to the probes live (tracer.costs)
    exited_s: float | None = None  # time.monotonic() when the command's exit was seen (finish_s counts from it)
    bpf_program: dict | None = None  # bcc: how its program started, from the cache or compiled (tracer.bpfcache)
    attached: dict | None = None  # record --pid/--cgroup: the job, what stopped the recording, the checkpoint files

    @property
    def ended(self) -> str:
        """How the command ended, in words ('exited with status 3', 'was killed by SIGKILL')."""
        return how_it_ended(self.exit_code, self.exit_signal)


def choose_backend(requested: str) -> BackendChoice:
    """Resolve ``auto`` or a backend's name to a backend that can run here (``backends.choose``).

    Raises TracerError when the requested backend cannot run, with the reason.
    """
    return backends.choose(requested)


def capture_limits(choice: BackendChoice) -> list[str]:
    """What ``choice`` will not capture on this kernel, one line each (empty: everything): said before the
    command starts, so a user knows which rows to expect."""
    return backends.get(choice.name).capture_limits()


def environment_notes() -> list[str]:
    """What on this machine changes what a recording sees, one line each (empty: nothing known): a running
    DAMON reclaim scheme (``tracer.reclaim``). Said before the command starts."""
    line = reclaim.describe(reclaim.schemes())
    return [line] if line else []


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while events are decoded and fed: millions of short-lived
    event objects each trigger collections that walk every object still held (the reorder window, the
    rows): 30 % of the time decoding and feeding a storm of 300,000 writes took, for garbage the
    recorder does not make (its objects hold no cycles; what a cycle leaves is collected once it is back
    on)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run_backend(
    choice: BackendChoice, cmd: list[str], builder_args: dict, spool: RowSpool, capture: gpu.GpuCapture | None = None
) -> tuple[TraceBuilder, dict, BackendChoice]:
    """Run the command under the backend; its rows go to ``spool`` as they accumulate (``RowSpool``),
    the builder keeping at most ``config.RECORD_RUN_ROWS`` of them."""
    with _collector_paused(), forwarding(skip_children=backends.get(choice.name).wrapped) as received:
        builder, extra, choice = _run_traced(choice, cmd, builder_args, spool, capture)
    if received:  # SIGTERM, SIGHUP or SIGINT cut the recording: the command got it, the trace says so
        extra = {**extra, "interrupted": signal.Signals(received[0]).name}
    return builder, extra, choice


def _run_traced(
    choice: BackendChoice, cmd: list[str], builder_args: dict, spool: RowSpool, capture: gpu.GpuCapture | None
) -> tuple[TraceBuilder, dict, BackendChoice]:
    env = dict(os.environ)
    if capture is not None:
        env.update(capture.env())
    builder_args["root_rank"] = rank_from_environ(f"{k}={v}" for k, v in env.items()) or -1
    builder_args["inherited_fds"] = strace_backend.inherited_fds()

    def spill(builder: TraceBuilder) -> None:
        if builder.num_rows >= config.RECORD_RUN_ROWS:
            spool.add(builder.take_rows())

    def make_feeder(root_pid: int | None, start_ns: int) -> EffectOrderFeeder:
        builder = TraceBuilder(start_ns=start_ns, root_pid=root_pid, **builder_args)
        return EffectOrderFeeder(
            builder, slack_ns=config.RECORD_REORDER_SLACK_NS, on_rows=spill, release_every=config.RECORD_RELEASE_EVERY
        )

    return backends.get(choice.name).run(choice, cmd, env, make_feeder, spool, builder_args["path_filters"])


def resolve_command(cmd: list[str]) -> str:
    """The executable ``cmd[0]`` names (PATH lookup, as execvp does). Raises CommandNotFound (exit 127)."""
    name = cmd[0]
    if "/" in name:
        if not os.path.exists(name):
            raise CommandNotFound(f"cannot run {name}: no such file")
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise CommandNotFound(f"cannot run {name}: not an executable file")
        return name
    found = shutil.which(name)
    if found is None:
        raise CommandNotFound(f"cannot run {name}: command not found")
    return found


def how_it_ended(exit_code: int, exit_signal: int | None) -> str:
    """'exited with status 0', 'exited with status 3', 'was killed by SIGKILL'."""
    if exit_signal:
        try:
            name = signal.Signals(exit_signal).name
        except ValueError:
            name = f"signal {exit_signal}"
        return f"was killed by {name}"
    return f"exited with status {exit_code}"


def record(
    cmd: list[str],
    output: str | os.PathLike,
    *,
    choice: BackendChoice,
    path_filters: Iterable[str] = (),
    strict: bool = False,
    overwrite: bool = False,
    gpu_plan: gpu.GpuPlan | None = None,
    host: str | None = None,
    attach: attach_mod.AttachPlan | None = None,
) -> RecordResult:
    """Run ``cmd`` (and every descendant) traced; write the trace to ``output``.

    Before the command starts: the command must exist (CommandNotFound, exit
    127, no trace), ``output`` must be new (or ``overwrite``) and writable,
    and the trace's temporary file is created beside it, so nothing the
    command does is recorded only to be lost. A command that fails or is
    killed still gets its trace; the result says how it ended.

    ``gpu_plan`` (``gpu.plan_capture``): when enabled, every process that
    initialises CUDA loads the CUPTI subscriber and its host<->device copies
    become rows of the trace (interface ``cuda``), on the trace's clock.

    ``host``: the name stored as the trace's host (default: the host name); the trace also carries the boot
    id, the clock anchors and the job id (``clock``), so the traces of a job's nodes merge.

    Returns the command's exit code with the counts. Raises TracerError when
    the command is empty, the backend fails, or ``strict`` and events were
    lost (no trace is written then); CkptTraceError for an unusable output.

    ``attach`` (``tracer.attach``): trace the running job it names instead of starting ``cmd`` (which is
    then ignored: the trace's command is the job's); the job is left running when the recording ends.
    """
    if attach is not None:
        attach_mod.check_plan(attach)
        cmd, gpu_plan = attach_mod.job_command(attach_mod.job_root(attach)), None
    elif not cmd:
        raise TracerError("no command to record (put it after --)")
    else:
        resolve_command(cmd)
    output = check_output_file(output, overwrite)
    filters = [normalize_filter(p) for p in path_filters]
    builder_args = {"cwd": os.getcwd(), "path_filters": filters}
    reserved = reserve_temporary(output, RESERVE_BYTES)  # a full file system is refused now, not after the job
    capture = gpu.GpuCapture(gpu_plan) if gpu_plan is not None and gpu_plan.enabled else None
    spool = RowSpool(output, run_rows=config.RECORD_RUN_ROWS)
    try:
        start_wall_ns = time.time_ns()
        started = time.monotonic()
        anchors = {name: clock.anchor(name) for name in clock.CLOCK_IDS}  # the backend is known only after
        sampler = writeback.WritebackSampler().start()
        evicting = reclaim.schemes()
        try:
            if attach is not None:
                costs.prewarm_in_background()  # while the probes attach and the job runs
                with _collector_paused():
                    builder, extra, choice = attach_mod.run_attached(choice, attach, builder_args, spool)
            else:
                builder, extra, choice = _run_backend(choice, cmd, builder_args, spool, capture)
        finally:
            sampler.stop()
        if (thresholds := sampler.metadata()) is not None:
            extra["writeback"] = thresholds
        if evicting:
            extra["proactive_reclaim"] = evicting
        released_s, exited_s = extra.pop("released_s", None), extra.pop("exited_s", None)
        if released_s is not None:
            extra["start_s"] = round(costs.since_invocation_s(released_s), 3)
        tracer_clock = backends.get(choice.name).clock
        extra = {
            **extra,
            "host": clock.host_label(host),
            "boot_id": clock.boot_id(),
            "clock": clock.clock_metadata(
                tracer_clock, builder.start_ns, anchors[tracer_clock], clock.anchor(tracer_clock)
            ),
            **({"job": job} if (job := clock.job_of(os.environ, cmd)) else {}),
        }
        copies = _copies(capture, builder, choice) if capture is not None else None
        elapsed_s = time.monotonic() - started
        measured = compressibility.measure(compressibility.written_paths(spool.written, spool.renames))
        if measured is not None:  # after the clock: sampling the written files is not the command's time
            extra["data_compressibility"] = measured
        if strict and extra["lost_events"]:
            raise TracerError(
                f"{extra['lost_events']} events were lost ({{option}}); no trace written", option="strict", switch=True
            )
        if strict and extra.get("mapped_uncovered_bytes"):
            raise TracerError(
                f"{extra['mapped_uncovered_bytes']:,} bytes mapped from files are covered by no row "
                "({option}); no trace written",
                option="strict",
                switch=True,
            )
        result = _write(
            output,
            cmd,
            choice,
            builder,
            spool,
            extra,
            filters,
            start_wall_ns,
            elapsed_s,
            overwrite,
            copies,
            gpu_plan,
            temporary=reserved,
            exited_s=exited_s,
        )
    except BaseException:
        reserved.unlink(missing_ok=True)
        raise
    finally:
        spool.close()
        if capture is not None:
            capture.close()
    return result


def _copies(capture: gpu.GpuCapture, builder: TraceBuilder, choice: BackendChoice) -> tuple[dict, dict]:
    """(copy rows, summary) of the subscriber's records, on the backend's clock: bcc's is CLOCK_MONOTONIC
    like the records; strace's is CLOCK_REALTIME, reached through the subscriber's clock pair."""
    records, summary = capture.collect()
    pairs = list(summary["clock_pairs"].values())
    offset = None if backends.get(choice.name).clock == "CLOCK_MONOTONIC" or not pairs else pairs[0][1] - pairs[0][0]
    ranks = {pid: proc.rank for pid, proc in builder.procs.items()}
    comms = {pid: proc.comm for pid, proc in builder.procs.items()}
    rows = gpu.copy_columns(records, start_ns=builder.start_ns, realtime_offset_ns=offset, ranks=ranks, comms=comms)
    summary = {key: value for key, value in summary.items() if key != "clock_pairs"}
    return rows, summary


def unseen_counts(counts: dict, reasons: dict) -> dict:
    """What the trace holds without its bytes, by capture the backend could not do: the io_uring requests
    its io_uring_enter rows submitted (``size`` holds to_submit) and the file mappings its mmap rows made
    (``counts``, as ``RowSpool.counts`` adds them up). {capture: {"reason", "count"}}, only for captures
    that missed something."""
    return {
        capture: {"reason": reason, "count": counts[capture]}
        for capture, reason in reasons.items()
        if counts.get(capture)
    }


def _filter_counts(builder: TraceBuilder, filters: list[str]) -> dict:
    """What the path filters left out (``filtered_rows``) and kept by following renames
    (``rename_followed_rows``; ``tracer.renames``), with the rows past its bound (``rename_held_rows_dropped``)."""
    if not filters:
        return {}
    follow = builder.follow
    return {
        "filtered_rows": builder.filtered_rows,
        "rename_followed_rows": follow.followed if follow else 0,
        "rename_held_rows_dropped": follow.dropped if follow else 0,
    }


def normalize_filter(prefix: str) -> str:
    """An absolute path filter: relative ones are resolved against the current directory; a trailing
    slash (a directory, not a name prefix) is kept."""
    absolute = os.path.abspath(prefix)
    return absolute + "/" if prefix.endswith("/") and absolute != "/" else absolute


def _write(
    output: Path,
    cmd: list[str],
    choice: BackendChoice,
    builder: TraceBuilder,
    spool: RowSpool,
    extra: dict,
    filters: list[str],
    start_wall_ns: int,
    elapsed_s: float,
    overwrite: bool,
    copies: tuple[dict, dict] | None = None,
    gpu_plan: gpu.GpuPlan | None = None,
    temporary: Path | None = None,
    exited_s: float | None = None,
) -> RecordResult:
    gpu_summary = {"captured": False, "reason": gpu_plan.reason if gpu_plan else "not asked"}
    if copies is not None:
        assert gpu_plan is not None  # record makes copies only from a capture, which it makes only from a plan
        rows, summary = copies
        spool.add(rows)  # after every traced row: ties in start time keep that order
        captured = summary["processes"] > len(summary["errors"])
        reason = (
            gpu_plan.reason
            if captured
            else (
                "no process of the command initialised CUDA"
                if not summary["processes"]
                else "every process that initialised CUDA refused the subscriber (see errors)"
            )
        )
        gpu_summary = {"captured": captured, "reason": reason, **summary}
    extra = {**extra, "unseen": unseen_counts(spool.counts, extra.get("unseen", {}))}
    metadata = {
        "creator": "ckpt-trace",
        "creator_version": __version__,
        "host": extra.get("host") or socket.gethostname(),
        "kernel": os.uname().release,
        "arch": vocabulary.host_arch(),
        "command": list(cmd),
        "backend": choice.name,
        "backend_reason": choice.reason,
        "start_wall_time_ns": start_wall_ns,
        "elapsed_ns": int(elapsed_s * 1e9),
        "filesystems": filesystems_of(spool.paths),
        "path_filters": filters,
        **_filter_counts(builder, filters),
        "untracked_fd_ops": builder.untracked_fd_ops,
        "unattributed": builder.unattributed,
        "unreaped_requests": builder.unreaped_requests,
        "gpu": gpu_summary,
        "spilled_runs": spool.spilled_runs,
        **extra,
    }
    rows = spool.write(output, metadata, overwrite=overwrite, batch_rows=config.TRACE_BATCH_ROWS, temporary=temporary)
    return RecordResult(
        output,
        extra["exit_code"],
        choice.name,
        choice.reason,
        rows,
        extra["lost_events"],
        elapsed_s,
        exit_signal=extra.get("exit_signal"),
        interrupted=extra.get("interrupted"),
        filtered_ops=builder.filtered_rows,
        unseen=extra["unseen"],
        gpu=gpu_summary,
        mapped_uncovered_bytes=extra.get("mapped_uncovered_bytes"),
        start_s=extra.get("start_s"),
        exited_s=exited_s,
        attached=extra.get("attached"),
        bpf_program=extra.get("bpf_program"),
    )
