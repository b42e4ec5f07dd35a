"""The ``ckpt-trace`` command line: parse, call the library, render.

Library errors (CkptTraceError) become one red line on stderr and a
non-zero exit; usage errors one line and exit 2.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeElapsedColumn, TransferSpeedColumn

from ckpt_trace.config import CHECK_MIN_RUNS, CHECK_MIN_SECONDS
from ckpt_trace.errors import CkptTraceError, Interrupted
from ckpt_trace.formats import write_bytes_atomic
from ckpt_trace.replayer.options import DEFAULT_BUFFER_BYTES, DEFAULT_QUEUE_DEPTH
from ckpt_trace.replayer.strategies import choices as strategy_choices
from ckpt_trace.replayer.strategies import help_text as strategy_help
from ckpt_trace.tracer.backends import choices as backend_choices
from ckpt_trace.version import __version__
from ckpt_trace.workloads import ENGINES as WORKLOAD_NAMES
from ckpt_trace.workloads.builtin import takers as workload_takers

from .cli_help import decorate

#: ``--buffer-size``'s default, as the flag spells it (``replayer.options.DEFAULT_BUFFER_BYTES``).
DEFAULT_BUFFER_SIZE = f"{DEFAULT_BUFFER_BYTES >> 20}MiB"
#: ``replay --strategy``'s choices: the strategy table's names and ``all`` (``replayer.strategies``), never
#: spelled here; typer reads the Literal of this tuple as a choice.
STRATEGY_CHOICES = strategy_choices()
#: ``workload ENGINE``'s choices: the built-in workloads' table (``workloads.builtin``).
WORKLOAD_CHOICES = WORKLOAD_NAMES
#: ``record --backend``'s choices: auto and the tracer backends' table (``tracer.backends``).
BACKEND_CHOICES = backend_choices()

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Record checkpoint I/O into Arrow traces and replay it under other I/O strategies.",
)
out = Console(width=None if sys.stdout.isatty() else 80)  # piped: plain and 80 columns; --wide for all columns


def _wide(wide: bool) -> None:
    """``--wide``: every table column, however wide (piped output is otherwise 80 columns)."""
    if wide:
        out.width = max(out.width, 250)


err = Console(stderr=True, soft_wrap=True)


def _write_json(path: Path | None, data: dict) -> None:
    """Print ``data`` as JSON on stdout (path '-') or write it atomically to ``path``."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    if path is None or str(path) == "-":
        sys.stdout.write(text)
        return
    write_bytes_atomic(path, text.encode())


def _finite_number(value: float, flag: str, given: Any, positive: bool = False) -> None:
    """Refuse NaN, infinities and negative values (zero too when ``positive``) of a numeric option."""
    import math

    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        need = "a positive number" if positive else "a finite number, 0 or more"
        raise CkptTraceError(f"{flag} takes {need}, not {given!r}")


def _show(data: dict, as_json: bool, render) -> None:
    """Print ``data`` as JSON on stdout, or render it for a person."""
    if as_json:
        _write_json(None, data)
    else:
        render(out, data)


def _said(data: dict, as_json: bool, line: str) -> None:
    """The end of a command that made something: ``data`` as JSON on stdout (``--json``), or ``line`` (what was
    made, in one line) on stderr."""
    if as_json:
        _write_json(None, data)
    else:
        err.print(line, highlight=False)


class _BytesBar:
    """Progress sink for the replayer and bench: ``start(total_bytes, label)`` per run, then ``advance(bytes)``.

    Without a refresh thread (``threaded=False``) the bar redraws on each advance.
    """

    def __init__(self, bar: Progress, verb: str, threaded: bool) -> None:
        self.bar, self.verb, self.threaded, self.task = bar, verb, threaded, None

    def start(self, total_bytes: int, label: str) -> None:
        self.task = self.bar.add_task(f"{self.verb} {label}".strip(), total=max(total_bytes, 1))

    def advance(self, moved_bytes: int) -> None:
        if self.task is not None:
            self.bar.advance(self.task, moved_bytes)
            if not self.threaded:
                self.bar.refresh()


@contextmanager
def _progress(verb: str = "replay", threaded: bool = True) -> Iterator:
    """A rich progress bar of bytes on a terminal; None (plain output) otherwise.

    ``threaded=False`` draws without rich's refresh thread, for callers that fork (``bench``).
    """
    if not out.is_terminal:
        yield None
        return
    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out, transient=True, auto_refresh=threaded) as bar:
        yield _BytesBar(bar, verb, threaded)


@contextmanager
def _steps(command: str) -> Iterator:
    """A progress bar per pass over a trace (``analysis.summary.Progress``) on a terminal; None otherwise."""
    if not out.is_terminal:
        yield None
        return
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        "{task.percentage:>3.0f}%",
        TimeElapsedColumn(),
        console=out,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def step(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(f"{command}: {label}", total=max(total, 1))
            bar.update(tasks[label], completed=done)

        yield step


def no_match_line(path_filters: list[str], backend: str, left_out: int) -> str:
    """The warning for a recording whose rows the path filters all left out. The bcc backend leaves a
    call out in the kernel (a path outside the filters, or a descriptor opened on one), before the count
    of left-out rows sees it, so that count is only what reached user space: it is given as a lower bound
    there, and never as "0 were left out"."""
    filters = ", ".join(path_filters)
    if backend == "bcc":
        return (
            f"no operation matched --path-filter {filters} (the bcc backend leaves the others out in the kernel "
            f"without counting them{f': at least {left_out:,} were left out' if left_out else ''})"
        )
    if left_out:
        return f"no operation matched --path-filter {filters} ({left_out:,} were left out)"
    return f"no operation matched --path-filter {filters}, and the command made no file operation the tracer saw"


class _NoPandas:
    """An import finder that refuses pandas (``_without_pandas``)."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"{name} is kept out of ckpt-trace record's process", name=name)


def _note_leftovers(output: Path) -> None:
    """A note on stderr naming the scratch files a killed recording left beside ``output``, if any."""
    from ckpt_trace.tracer.leftovers import find as find_leftovers

    left = find_leftovers(output)
    if left:
        err.print(
            f"[yellow]ckpt-trace: note: a recording that was killed left {len(left)} scratch file(s) or "
            f"director(ies): {escape(', '.join(map(str, left[:5])))}{' ...' if len(left) > 5 else ''} "
            "(remove them once you do not need them)[/]",
            highlight=False,
        )


def _without_pandas() -> None:
    """Keep pandas out of this process (a record's, which never uses it): pyarrow imports pandas, where it is
    installed, before it builds its first array, from numpy or from lists alike (its pandas shim), 0.3-0.7 s
    of CPU here, taken from the recording's start or finish. The import fails, and pyarrow goes on without
    its pandas integration, in this process only (the recorded command is another). Only the ``record``
    command calls it: the ``ckpt-trace`` process ends with it (run in-process, pyarrow keeps going without
    pandas in that process)."""
    if "pandas" not in sys.modules and not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())  # pyright: ignore[reportArgumentType]


@app.command(context_settings={"allow_interspersed_args": False})
def record(
    cmd: Optional[list[str]] = typer.Argument(
        None, help="The command to trace, after -- (or --pid).", metavar="-- CMD [ARGS]..."
    ),
    output: Path = typer.Option(..., "-o", "--output", help="Trace file to write (.arrow)."),
    backend: Literal[BACKEND_CHOICES] = typer.Option(  # pyright: ignore[reportInvalidTypeForm]
        "auto", help="auto: bcc (eBPF) where the kernel allows, else strace."
    ),
    path_filter: list[str] = typer.Option(
        [], "--path-filter", help="Keep only paths starting with PREFIX (repeatable)."
    ),
    strict: bool = typer.Option(False, help="Fail, writing no trace, if any event was lost."),
    force: bool = typer.Option(False, help="Overwrite an existing trace file."),
    as_json: bool = typer.Option(False, "--json", help="Print the recording's numbers as JSON on stdout."),
    gpu: Literal["auto", "on", "off"] = typer.Option(
        "auto", "--gpu", help="Host<->device copies of CUDA programs (CUPTI): auto (when libcupti is found), on, off."
    ),
    host: Optional[str] = typer.Option(
        None,
        "--host",
        help="Name this node in the trace (default: the host name), for `merge` where nodes share a host name.",
    ),
    no_layout: bool = typer.Option(
        False, "--no-layout", help="Do not add the layout of the checkpoint files the command left (see annotate)."
    ),
    pid: Optional[int] = typer.Option(
        None,
        "--pid",
        metavar="PID",
        help="Trace this running process and its descendants instead of starting CMD; detach when done, leaving it running.",
    ),
    cgroup: Optional[str] = typer.Option(
        None,
        "--cgroup",
        metavar="PATH",
        help="Trace every process of this cgroup v2 directory (and the cgroups below it) instead of starting CMD; detach when done.",
    ),
    duration: Optional[float] = typer.Option(
        None, "--duration", metavar="SECONDS", help="With --pid or --cgroup: stop after SECONDS."
    ),
    until_checkpoints: Optional[int] = typer.Option(
        None,
        "--until-checkpoints",
        metavar="N",
        help="With --pid or --cgroup: stop once N checkpoint files were written (opened for writing after the attach, written, closed).",
    ),
) -> None:
    """Run CMD and every descendant traced; write one Arrow trace; exit with CMD's exit code.

    With --pid PID, trace a job that is already running (its process tree) until --duration, --until-checkpoints,
    its end or Ctrl-C, then detach: the job runs on untouched, and the exit code is 0. With --cgroup PATH, the same
    for every process of a cgroup v2 directory (until it has no process left).

    When the command read or wrote checkpoint files ckpt-trace recognises (DCP, safetensors, torch.save,
    Hugging Face index), their layout (which bytes are which tensor) is added to the trace, within 60 s."""
    _without_pandas()
    from ckpt_trace.iolayer.outputs import check_output_file
    from ckpt_trace.tracer import capture_limits, choose_backend, environment_notes, resolve_command
    from ckpt_trace.tracer import record as record_trace
    from ckpt_trace.tracer.gpu import plan_capture

    attach = None
    if pid is not None or cgroup is not None:
        from ckpt_trace.tracer.attach import AttachPlan, check_plan

        flag = "--pid" if pid is not None else "--cgroup"
        if pid is not None and cgroup is not None:
            raise CkptTraceError("--pid and --cgroup: give one of the two")
        if cmd:
            raise CkptTraceError(f"{flag} traces a running job: give no command after --")
        job = f"cgroup {cgroup}" if cgroup is not None else f"process {pid}"
        attach = AttachPlan(
            pid,
            duration,
            until_checkpoints,
            cgroup=cgroup,
            on_live=lambda: err.print(f"ckpt-trace: attached to {escape(job)}: recording", highlight=False),
        )
        check_plan(attach)
    elif duration is not None or until_checkpoints is not None:
        raise CkptTraceError("--duration and --until-checkpoints go with --pid or --cgroup")
    elif not cmd:
        raise CkptTraceError("no command to record (put it after --)")
    else:
        resolve_command(list(cmd))
    check_output_file(output, force)
    _note_leftovers(output)
    choice = choose_backend(backend)
    gpu_plan = plan_capture("off" if attach is not None else gpu)  # a running job's CUDA is already set up
    err.print(f"ckpt-trace: backend {choice.name} ({choice.reason})", highlight=False)
    if gpu_plan.enabled:
        err.print(f"ckpt-trace: GPU copies: {escape(gpu_plan.reason)}", highlight=False)
    for limit in capture_limits(choice):
        err.print(f"ckpt-trace: note: {escape(limit)}", highlight=False)
    for line in environment_notes():
        err.print(f"ckpt-trace: note: {escape(line)}", highlight=False, soft_wrap=True)
    result = record_trace(
        list(cmd or []),
        output,
        choice=choice,
        path_filters=path_filter,
        strict=strict,
        overwrite=force,
        gpu_plan=gpu_plan,
        host=host,
        attach=attach,
    )
    if result.attached:
        found = result.attached
        err.print(
            f"ckpt-trace: detached from {found.get('cgroup') or found['pid']} ({found['stopped_by']}; "
            f"{len(found['checkpoint_files'])} checkpoint file(s) in the trace)",
            highlight=False,
        )
    for pid, why in (result.gpu.get("errors") or {}).items():
        err.print(
            f"[yellow]ckpt-trace: warning: process {pid}'s GPU copies are not all in the trace: {escape(why)}[/]",
            highlight=False,
        )
    if result.gpu.get("dropped"):
        err.print(
            f"[yellow]ckpt-trace: warning: CUPTI dropped {result.gpu['dropped']:,} copy records[/]", highlight=False
        )
    if result.backend != choice.name:
        err.print(
            f"[yellow]ckpt-trace: warning: fell back to {result.backend} ({escape(result.backend_reason)})[/]",
            highlight=False,
        )
    if result.lost_events:
        err.print(f"[yellow]ckpt-trace: warning: {result.lost_events} events were lost; the trace is incomplete[/]")
    if result.mapped_uncovered_bytes:
        from ckpt_trace.analysis.summary import mapped_uncovered_line

        err.print(
            f"[yellow]ckpt-trace: warning: {escape(mapped_uncovered_line(result.mapped_uncovered_bytes))}[/]",
            highlight=False,
            soft_wrap=True,
        )
    for capture, entry in result.unseen.items():
        what = {
            "io_uring_requests": f"{entry['count']:,} io_uring requests",
            "mapped_pages": f"the pages touched through {entry['count']:,} file mappings",
        }.get(capture, capture)
        err.print(
            f"[yellow]ckpt-trace: warning: {what} are not in the trace: {escape(entry['reason'])}"
            f"{' (try --backend bcc)' if result.backend == 'strace' else ''}[/]",
            highlight=False,
        )
    if path_filter and result.rows == 0:
        err.print(
            f"[yellow]ckpt-trace: warning: {escape(no_match_line(path_filter, result.backend, result.filtered_ops))}[/]",
            highlight=False,
        )
    if result.exit_code != 0:
        err.print(f"[yellow]ckpt-trace: the command {result.ended}; its trace is written[/]", highlight=False)
    if result.interrupted:
        err.print(
            f"[yellow]ckpt-trace: {result.interrupted} cut the recording (the command got it too); the trace "
            "holds what happened until then and says it was interrupted[/]",
            highlight=False,
        )
    layout = _layout_after_record(result.trace_path, no_layout)
    summary = {
        "trace": str(result.trace_path),
        "backend": result.backend,
        "rows": result.rows,
        "lost_events": result.lost_events,
        "exit_code": result.exit_code,
        "exit_signal": result.exit_signal,
        "ended": result.ended,
        "elapsed_s": result.elapsed_s,
        "gpu": result.gpu,
        "layout": layout,
        "interrupted": result.interrupted,
        "start_s": result.start_s,
        **({"bpf_program": result.bpf_program} if result.bpf_program else {}),
        **({"attached": result.attached} if result.attached else {}),
        "finish_s": None if result.exited_s is None else round(time.monotonic() - result.exited_s, 3),
        **_recorder_own_usage(),
    }
    _said(
        summary, as_json, f"ckpt-trace: wrote {result.rows:,} rows to {result.trace_path} in {result.elapsed_s:.1f} s"
    )
    raise typer.Exit(128 + signal.Signals[result.interrupted].value if result.interrupted else result.exit_code)


def _recorder_own_usage() -> dict:
    """The recording process's own resource use, children (the command, strace) excluded, from getrusage(2)
    RUSAGE_SELF: ``recorder_peak_rss_bytes`` (its peak resident memory, ru_maxrss, KiB on Linux, given in bytes)
    and ``recorder_cpu_s`` (its user plus system CPU seconds from start to now: BPF compile or load, reading the
    rings, writing the trace). BPF programs' own run time is charged to the processes they fire in, not here."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "recorder_peak_rss_bytes": usage.ru_maxrss * 1024,
        "recorder_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
    }


@app.command()
def replay(
    trace: Path = typer.Argument(..., help="Trace file to replay."),
    target: Path = typer.Option(..., "--target", help="Directory to replay into; nothing outside it is touched."),
    strategy: Literal[STRATEGY_CHOICES] = typer.Option("posix", help=strategy_help()),  # pyright: ignore[reportInvalidTypeForm]
    queue_depth: int = typer.Option(
        DEFAULT_QUEUE_DEPTH, "--queue-depth", help="io_uring requests in flight per worker."
    ),
    buffer_size: str = typer.Option(
        DEFAULT_BUFFER_SIZE, "--buffer-size", help="aggregated: aligned buffer size, 1-64 MiB (e.g. 4MiB)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print each plan's operation counts, sizes and alignment; do no I/O."
    ),
    repeat: Optional[int] = typer.Option(
        None,
        "--repeat",
        help="Rounds (each strategy once a round, interleaved); default: 3-20 rounds, until the strategies are told apart or 60 s of runs.",
    ),
    drop_caches: bool = typer.Option(False, "--drop-caches", help="Drop the page cache before each run (root)."),
    durable: bool = typer.Option(False, "--durable", help="fsync every written file before the clock stops."),
    verify: bool = typer.Option(False, "--verify", help="Read the files back and check their content pattern."),
    pack_files: bool = typer.Option(
        False, "--pack-files", help="aggregated: pack small files into one per worker, with an index."
    ),
    strip_prefix: Optional[str] = typer.Option(None, "--strip-prefix", help="Remove this prefix from recorded paths."),
    timing: Literal["asap", "original"] = typer.Option(
        "asap", help="asap: as fast as possible; original: keep the recorded gaps."
    ),
    fio: bool = typer.Option(
        False, "--fio", help="Also measure fio's sequential O_DIRECT write limit in TARGET, for reference."
    ),
    gpu_copies: Literal["recorded", "pinned", "skip"] = typer.Option(
        "recorded",
        "--gpu-copies",
        help="Host<->device copy rows: as recorded, with pinned host staging, or skipped (always, without a GPU).",
    ),
    read_memory: Literal["malloc", "reused", "fresh"] = typer.Option(
        "malloc",
        "--read-memory",
        help="Where reads land: malloc, fresh pages for recorded reads of 32 MiB and more, one reused buffer per thread below (as glibc's malloc serves them); reused, that buffer for all (as an allocator that reuses freed memory); or fresh pages for all (as a read into newly mapped memory).",
    ),
    writeback: Literal["system", "recorded"] = typer.Option(
        "system",
        "--writeback",
        help="Dirty-page thresholds: this machine's, or as recorded (root; set for the runs, put back after), so fsyncs flush what they flushed when recorded.",
    ),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Fail if a strategy's named path (io_uring, O_DIRECT) carried under 90 % of the bytes, or if the replay would skip trace rows (an unknown operation, a path naming nothing under the target).",
    ),
    cache: Literal["recorded", "cold", "warm"] = typer.Option(
        "recorded",
        "--cache",
        help="Page cache of the files the trace finds when each run starts: recorded (cold where the trace does not say), cold, warm.",
    ),
    data_mode: Literal["unique", "recorded-ratio"] = typer.Option(
        "unique",
        "--data",
        help="Bytes written: unique (incompressible, unique per 4 KiB block and file) or recorded-ratio (still unique per block, compressible as the recorded command's files were: the trace's data_compressibility).",
    ),
    wide: bool = typer.Option(False, "--wide", help="Show every table column, however wide."),
    placement: Literal["host", "spread"] = typer.Option(
        "host",
        "--placement",
        help="Under torchrun: host keeps each recorded host's ranks on one node (a merged trace); spread cuts the ranks into blocks over all processes.",
    ),
    ranks: Optional[int] = typer.Option(
        None,
        "--ranks",
        help="Rescale: replay the recorded DCP save as this many ranks would write it (DCP's planner on the trace's checkpoint layout).",
    ),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", help="Write the results document (JSON) to this file."
    ),
    force: bool = typer.Option(
        False,
        help="Allow a non-empty target and overwrite an existing -o file (the replay still writes only files it creates).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results document as JSON on stdout."),
) -> None:
    """Re-execute a trace's operations under TARGET and measure them."""
    from ckpt_trace.iolayer.outputs import check_output_file
    from ckpt_trace.replayer import plan_summaries
    from ckpt_trace.replayer import replay as run_replay
    from ckpt_trace.replayer.distributed import launched, replay_distributed
    from ckpt_trace.replayer.options import ReplayOptions

    from .report.render import render_plans, render_results
    from .units import parse_size

    _wide(wide)
    buffer_bytes = parse_size(buffer_size, what="--buffer-size")
    world = launched()  # None unless one of several processes torchrun launched
    speaks = world is None or world.rank == 0  # under torchrun, global rank 0 writes and prints
    if output is not None and speaks:
        check_output_file(output, force, inputs=(trace,))
    rescaled = None
    if ranks is not None:  # the rescaled trace, in a directory of ours removed when the command ends
        trace, rescaled = _rescaled_trace(trace, ranks)
    if dry_run:
        if not speaks:  # rank 0 plans the whole trace and prints the dry run
            return
        plans = {
            "trace": str(trace),
            **({"rescaled": rescaled} if rescaled else {}),
            "plans": plan_summaries(
                trace,
                strategy=strategy,
                target=target,
                strip_prefix=strip_prefix,
                buffer_bytes=buffer_bytes,
                pack_files=pack_files,
            ),
        }
        if output is not None:
            _write_json(output, plans)
        _show(plans, as_json, lambda console, data: render_plans(console, data["plans"], wide))
        return
    options = ReplayOptions(
        strip_prefix=strip_prefix,
        timing=timing,
        force=force,
        queue_depth=queue_depth,
        buffer_bytes=buffer_bytes,
        repeat=repeat,
        drop_caches=drop_caches,
        durable=durable,
        verify=verify,
        pack_files=pack_files,
        fio=fio,
        gpu_copies=gpu_copies,
        read_memory=read_memory,
        writeback=writeback,
        cache=cache,
        strict=strict,
        data=data_mode,
    )
    if world is not None:  # one of the processes torchrun launched: replay this process's share
        if fio or pack_files or writeback != "system":
            flag = "--fio" if fio else "--pack-files" if pack_files else "--writeback recorded"
            raise CkptTraceError(f"{flag} is not available in a replay launched by torchrun; run it without torchrun")
        with _progress() if world.rank == 0 else nullcontext() as progress:
            report = replay_distributed(
                trace,
                world=world,
                target=target,
                strategy=strategy,
                options=options,
                progress=progress,
                protect=(output,) if output is not None else (),
                placement=placement,
            )
        if not speaks:
            return
        job = report.to_json()["distributed"]
        hosts = len({p["host"] for p in job["processes"]})
        slowest = ", ".join(f"{name}: process {index}" for name, index in job["slowest_process"].items())
        err.print(
            f"ckpt-trace: {world.size} processes on {hosts} host{'s' if hosts > 1 else ''} replayed "
            f"{sum(len(p['owners']) for p in job['processes'])} recorded ranks or processes; the job's "
            f"time is its slowest process's ({slowest})",
            highlight=False,
        )
    else:
        with _progress() as progress:
            report = run_replay(
                trace,
                target=target,
                strategy=strategy,
                options=options,
                progress=progress,
                protect=(output,) if output is not None else (),
            )
    data = report.to_json()
    if rescaled:
        data["rescaled"] = rescaled
    if output is not None:
        _write_json(output, data)
    _show(
        data, as_json, lambda console, doc: render_results(console, doc["results"], doc["fio_write_bytes_per_s"], wide)
    )
    for result in report.results:
        for note in result.notes:
            err.print(f"[yellow]ckpt-trace: note: {result.strategy}: {escape(note)}[/]", highlight=False)
    from ckpt_trace.formats import read_metadata

    cut = read_metadata(trace).get("interrupted")
    if cut:
        err.print(
            f"[yellow]ckpt-trace: note: {escape(str(cut))} cut this trace's recording: the replay holds only "
            "what was recorded until then[/]",
            highlight=False,
        )
    for mismatch in report.size_mismatches[:5]:
        actual = "missing" if mismatch.actual_bytes is None else f"{mismatch.actual_bytes:,} B"
        err.print(
            f"[yellow]ckpt-trace: warning: {mismatch.strategy}: {escape(mismatch.path)} is {actual}, "
            f"recorded {mismatch.expected_bytes:,} B[/]",
            highlight=False,
        )


def _rescaled_trace(trace: Path, ranks: int) -> tuple[Path, dict]:
    """(path, figures) of ``trace``'s DCP save rescaled to ``ranks`` (``workloads.rescale``), written in a
    temporary directory that is removed when the process exits."""
    import atexit
    import shutil
    import tempfile

    from ckpt_trace.workloads.rescale import write_rescaled

    scratch = tempfile.mkdtemp(prefix="ckpt-trace-rescale-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    figures = write_rescaled(trace, ranks, Path(scratch) / "rescaled.arrow")
    if figures["direction"] == "load":
        err.print(
            f"ckpt-trace: rescaled the recorded DCP load to {ranks} ranks: they read "
            f"{figures['data_bytes_read']:,} bytes of the {figures['checkpoint_ranks']}-rank checkpoint "
            f"(DCP's load planner and reader) in {figures['elapsed_s']:.1f} s",
            highlight=False,
        )
    else:
        err.print(
            f"ckpt-trace: rescaled the recorded {figures['recorded_ranks']}-rank DCP save to {ranks} ranks: "
            f"{len(figures['data_files'])} data files, {figures['data_bytes']:,} data bytes (DCP's planner; "
            f"the recorded save reproduced at {figures['recorded_ranks']} ranks) in {figures['elapsed_s']:.1f} s",
            highlight=False,
        )
    return Path(scratch) / "rescaled.arrow", figures


@app.command()
def summary(
    trace: Path = typer.Argument(..., help="Trace file."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Operations, bytes, files, ranks, request sizes and alignment of a trace."""
    from .analysis.summary import summarize_file
    from .report.render import render_summary

    with _steps("summary") as progress:
        data = summarize_file(trace, progress=progress)
    _show(data, as_json, render_summary)


@app.command()
def merge(
    traces: list[Path] = typer.Argument(..., help="The traces of the job's nodes (one `record` per node)."),
    output: Path = typer.Option(..., "-o", "--output", help="The job's trace to write (.arrow)."),
    clock_offset: list[str] = typer.Option(
        [], "--clock-offset", help="HOST=NS: add NS nanoseconds to HOST's realtime clock (a known error; repeatable)."
    ),
    force: bool = typer.Option(False, help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print what was merged as JSON."),
) -> None:
    """One trace of a job from its nodes' traces: rows in global time order, a host column, ranks as recorded."""
    from .analysis.merge import merge_traces, parse_clock_offsets

    offsets = parse_clock_offsets(clock_offset)
    with _steps("merge") as progress:
        data = merge_traces(traces, output, clock_offsets=offsets, overwrite=force, progress=progress)
    bound = data["alignment_error_ns"]
    _said(
        data,
        as_json,
        f"ckpt-trace: merged {data['traces']} traces ({len(data['hosts'])} hosts, {len(data['ranks'])} "
        f"ranks) into {data['rows']:,} rows in {output}; clocks aligned within "
        f"{'an unknown bound (a trace without anchors)' if bound is None else f'{bound / 1e3:,.1f} us'}",
    )


@app.command()
def export(
    trace: Path = typer.Argument(..., help="Trace file."),
    fmt: Literal["perfetto", "parquet"] = typer.Option(
        "perfetto", "--format", help="perfetto: Chrome trace-event JSON; parquet: a directory, by rank."
    ),
    output: Path = typer.Option(..., "-o", "--output", help="JSON file (perfetto) or directory (parquet)."),
    rank: Optional[str] = typer.Option(None, "--rank", help="Only these ranks: 0-7,12 (-1: rows without a rank)."),
    pid: Optional[str] = typer.Option(None, "--pid", help="Only these processes: 1234,1240."),
    path: Optional[str] = typer.Option(None, "--path", help="Only paths matching this shell glob (* crosses /)."),
    op: Optional[str] = typer.Option(None, "--op", help="Only these operations: write,fsync."),
    time_window: Optional[str] = typer.Option(
        None, "--time", help="Only this window since the trace started: 10s..20s."
    ),
    max_ops: int = typer.Option(
        1_000_000, "--max-ops", help="perfetto: refuse a selection of more operations (a browser holds the JSON)."
    ),
    force: bool = typer.Option(False, help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Export a trace, or the rows of chosen ranks, processes, files, ops and time, for Perfetto or as Parquet."""
    from .analysis.filter import Conditions
    from .report.export import FORMATS, export_parquet, export_perfetto

    if fmt not in FORMATS:
        raise CkptTraceError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    conditions = Conditions(ranks=rank, pids=pid, path_glob=path, ops=op, time=time_window)
    with _steps("export") as progress:
        if fmt == "perfetto":
            count = export_perfetto(
                trace, output, conditions=conditions, max_ops=max_ops, overwrite=force, progress=progress
            )
        else:
            count = export_parquet(trace, output, conditions=conditions, overwrite=force, progress=progress)
    unit = "events" if fmt == "perfetto" else "rows"
    if as_json:
        _write_json(
            None,
            {
                "trace": str(trace),
                "format": fmt,
                "output": str(output),
                unit: count,
                "conditions": conditions.to_json(),
            },
        )
    else:
        err.print(f"ckpt-trace: wrote {count:,} {unit} to {output}", highlight=False)


@app.command()
def report(
    trace: Path = typer.Argument(..., help="Trace file."),
    results: list[Path] = typer.Argument(None, help="replay -o results (or benchmark) files to compare strategies."),
    output: Path = typer.Option(..., "-o", "--output", help="HTML file to write."),
    fio_limit: Optional[str] = typer.Option(None, "--fio-limit", help="Device limit to draw, in MB/s (e.g. 2100)."),
    chosen_rank: Optional[int] = typer.Option(
        None, "--rank", help="Rank shown beside the slowest one (default: the first)."
    ),
    force: bool = typer.Option(False, help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """One self-contained HTML page: the job, GPU copies, calls and requests, ranks over time, storage, advice."""
    from .report.html import write_report

    limit = None
    if fio_limit is not None:
        try:
            limit = float(fio_limit) * 1e6
        except ValueError:
            raise CkptTraceError(f"--fio-limit takes MB/s, not {fio_limit!r}") from None
        _finite_number(limit, "--fio-limit", fio_limit, positive=True)
    with _steps("report") as progress:
        data = write_report(
            trace,
            output,
            results_paths=results or [],
            fio_limit_bytes_per_s=limit,
            rank=chosen_rank,
            overwrite=force,
            progress=progress,
        )
    slowest = f"slowest: {data['slowest']}" if data["slowest"] else "no rank moved data"
    _said(data, as_json, f"ckpt-trace: wrote {output} ({data['figures']} figures, {data['bytes']:,} bytes; {slowest})")


@app.command()
def diff(
    trace_a: Path = typer.Argument(..., help="The earlier recording."),
    trace_b: Path = typer.Argument(..., help="The later recording."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """What changed between two recordings: operations, bytes, request sizes, files, timing."""

    from .analysis.diff import diff_files
    from .report.render import render_diff

    with _steps("diff") as progress:
        data = diff_files(trace_a, trace_b, progress=progress)
    _show(data, as_json, render_diff)


@app.command()
def baseline(
    traces: list[Path] = typer.Argument(..., help="Trace files to replay."),
    target: Path = typer.Option(..., "--target", help="Empty directory on the storage to measure."),
    output: Path = typer.Option(..., "-o", "--output", help="Baseline JSON to write."),
    strategy: list[str] = typer.Option([], "--strategy", help="Strategy to measure (repeatable; default: all)."),
    repeat: int = typer.Option(CHECK_MIN_RUNS, "--repeat", help="Fewest runs per trace and strategy."),
    min_seconds: float = typer.Option(
        CHECK_MIN_SECONDS, "--min-seconds", help="Keep running each until its runs add up to this much measured time."
    ),
    queue_depth: int = typer.Option(
        DEFAULT_QUEUE_DEPTH, "--queue-depth", help="io_uring requests in flight per worker."
    ),
    buffer_size: str = typer.Option(DEFAULT_BUFFER_SIZE, "--buffer-size", help="aggregated: aligned buffer size."),
    force: bool = typer.Option(False, help="Overwrite an existing baseline file."),
) -> None:
    """Replay traces on this storage and record the results, with host, kernel, file system and device."""
    from ckpt_trace.iolayer.outputs import check_output_file

    from .check.baseline import make_baseline, write_json
    from .units import parse_size

    check_output_file(output, force, inputs=traces)
    _finite_number(min_seconds, "--min-seconds", min_seconds)
    buffer_bytes = parse_size(buffer_size, what="--buffer-size")
    with _progress() as progress:
        data = make_baseline(
            traces,
            target=target,
            strategies=strategy,
            repeat=repeat,
            min_seconds=min_seconds,
            queue_depth=queue_depth,
            buffer_bytes=buffer_bytes,
            progress=progress,
        )
    write_json(output, data)
    env = data["environment"]
    err.print(
        f"ckpt-trace: baseline of {len(traces)} trace(s) x {len(data['options']['strategies'])} strategies on "
        f"{env['filesystem']} ({env['device']}) written to {output}",
        highlight=False,
    )


@app.command()
def check(
    traces: list[Path] = typer.Argument(..., help="The baseline's trace files."),
    baseline_file: Path = typer.Option(..., "--baseline", help="Baseline JSON from `ckpt-trace baseline`."),
    target: Path = typer.Option(..., "--target", help="Empty directory on the storage under test."),
    tolerance: str = typer.Option("10%", "--tolerance", help="Allowed loss of throughput or rise of p99 latency."),
    repeat: Optional[int] = typer.Option(None, "--repeat", help="Fewest runs per figure (default: the baseline's)."),
    min_seconds: Optional[float] = typer.Option(
        None, "--min-seconds", help="Measured time per figure (default: the baseline's)."
    ),
    strategy: list[str] = typer.Option([], "--strategy", help="Must match the baseline's strategies if given."),
    junit: Optional[Path] = typer.Option(
        None, "--junit", help="Write JUnit XML: one test case per trace and strategy."
    ),
    force: bool = typer.Option(False, help="Overwrite an existing --junit file."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    wide: bool = typer.Option(False, "--wide", help="Show every table column, however wide."),
) -> None:
    """Replay a baseline's traces on the storage under test; exit 1 if any figure regressed beyond the tolerance.

    A figure regresses only when the change exceeds both the tolerance and the
    measurements' noise; one too noisy to judge is reported as such.
    """
    import dataclasses

    from ckpt_trace.iolayer.outputs import check_output_file

    from .check.baseline import load_baseline, parse_tolerance, run_check
    from .check.junit import junit_xml
    from .report.render import render_check

    _wide(wide)
    if min_seconds is not None:
        _finite_number(min_seconds, "--min-seconds", min_seconds)
    allowed = parse_tolerance(tolerance)
    if junit is not None:
        check_output_file(junit, force, inputs=(*traces, baseline_file))
    data = load_baseline(baseline_file)
    with _progress() as progress:
        rows = run_check(
            traces,
            data,
            target=target,
            tolerance=allowed,
            repeat=repeat,
            min_seconds=min_seconds,
            strategies=strategy,
            progress=progress,
        )
    if junit is not None:
        write_bytes_atomic(junit, junit_xml(rows, allowed))
    as_dicts = [dataclasses.asdict(row) for row in rows]
    regressed = sum(row.regressed for row in rows)
    noisy = sum(row.status == "noisy" for row in rows)
    _show(
        {"tolerance": allowed, "regressed": regressed, "noisy": noisy, "comparisons": as_dicts},
        as_json,
        lambda console, _: render_check(console, as_dicts, allowed, wide),
    )
    if noisy:
        err.print(
            f"[yellow]ckpt-trace: {noisy} figure(s) too noisy to judge at {allowed:.0%}: raise --min-seconds "
            "or the tolerance[/]",
            highlight=False,
        )
    if regressed:
        err.print(f"[red]ckpt-trace: {regressed} figure(s) regressed beyond {allowed:.0%}[/]", highlight=False)
        raise typer.Exit(1)


@app.command()
def emit(
    trace: Path = typer.Argument(..., help="Trace file the writer is tuned for."),
    output: Path = typer.Option(..., "-o", "--output", help="Python module to write (e.g. my_writer.py)."),
    from_results: Optional[Path] = typer.Option(None, "--from-results", help="replay -o results to tune from."),
    force: bool = typer.Option(False, help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print the chosen parameters as JSON."),
) -> None:
    """Write a drop-in torch.distributed.checkpoint writer/reader module tuned from a trace and replay results."""
    from ckpt_trace.writer.emit import emit as run_emit

    choice = run_emit(trace, output, results_path=from_results, force=force)
    data = {
        "output": str(output),
        "options": choice.options.to_json(),
        "reasons": choice.reasons,
        "fastest_strategy": choice.winner,
    }
    chosen = ", ".join(f"{k}={v}" for k, v in data["options"].items() if k in choice.reasons)
    _said(data, as_json, f"ckpt-trace: wrote {output} ({chosen})")


@app.command()
def workload(
    engine: Literal[WORKLOAD_CHOICES] = typer.Argument(  # pyright: ignore[reportInvalidTypeForm]
        ..., help=f"The checkpoint engine: {', '.join(WORKLOAD_CHOICES[:-1])} or {WORKLOAD_CHOICES[-1]}."
    ),
    out_dir: Path = typer.Option(..., "--out", help="Checkpoint directory to write (or, with --load, to read)."),
    ranks: int = typer.Option(1, help=f"Processes ({workload_takers('ranks', bare=True)})."),
    model: Literal["gpt2-tiny", "gpt2-deep-tiny", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"] = typer.Option(
        "gpt2-small", help="GPT-2 shape (parameters: 0.5 M to 1.6 G)."
    ),
    with_optimizer: bool = typer.Option(
        False,
        "--with-optimizer",
        help="Add Adam state (exp_avg, exp_avg_sq; dcp and emitted: a real torch.optim.Adam after one step, through get_state_dict).",
    ),
    file_per_layer: bool = typer.Option(
        False,
        "--file-per-layer",
        help=f"{workload_takers('file_per_layer', bare=True)}: one file per transformer block.",
    ),
    load: bool = typer.Option(
        False, "--load", help="Load the checkpoint this workload saved in --out and check every tensor."
    ),
    mmap: bool = typer.Option(
        False, "--mmap", help=f"{workload_takers('mmap', bare=True)} --load: map the checkpoint instead of reading it."
    ),
    writer: Optional[Path] = typer.Option(
        None,
        "--writer",
        help=f"{workload_takers('writer', bare=True)}: the module `ckpt-trace emit` wrote (default: ckpt_trace.writer's defaults).",
    ),
    shards: int = typer.Option(
        1,
        "--shards",
        help=f"{workload_takers('shards', bare=True)}: split the tensors over this many files, as Hugging Face shards.",
    ),
    drop_caches: bool = typer.Option(
        False, "--drop-caches", help="--load: drop the page cache first, for a cold load (root)."
    ),
    device: Literal["cpu", "cuda"] = typer.Option(
        "cpu",
        "--device",
        help=f"Where the state dict lives (cuda: {workload_takers('cuda', bare=True)}; a save copies each tensor to the host).",
    ),
    force: bool = typer.Option(
        False, help="Save into a non-empty --out directory (the engine may overwrite its own file names there)."
    ),
    saves: int = typer.Option(
        1,
        "--saves",
        min=1,
        help=f"{workload_takers('saves', bare=True)}: save this many times in a row, each overwriting the last "
        "(a job that checkpoints every few steps); the I/O time counts them all.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what was written or read as JSON."),
) -> None:
    """Write (or load and check) a real checkpoint of a GPT-2-shaped model with a real engine."""
    from ckpt_trace.iolayer.host import drop_page_cache
    from ckpt_trace.iolayer.outputs import check_output_dir
    from ckpt_trace.workloads import run

    made = not load and not out_dir.exists()
    if load:
        if not out_dir.is_dir():
            raise CkptTraceError(f"nothing to load: {out_dir} is not a directory (run the save first)")
        if drop_caches:
            drop_page_cache()
    else:
        if drop_caches:
            raise CkptTraceError("--drop-caches applies to --load")
        check_output_dir(out_dir, force)
    started = time.monotonic()
    try:
        path, io_s = run(
            engine,
            out_dir,
            ranks=ranks,
            model=model,
            with_optimizer=with_optimizer,
            file_per_layer=file_per_layer,
            load=load,
            mmap=mmap,
            writer=str(writer) if writer else None,
            shards=shards,
            device=device,
            saves=saves,
        )
    except BaseException:
        if made:  # the directory this run made, if the workload left nothing in it
            try:
                out_dir.rmdir()
            except OSError:
                pass
        raise
    elapsed_s = time.monotonic() - started
    files = [p for p in path.rglob("*") if p.is_file()]
    data = {
        "engine": engine,
        "phase": "load" if load else "save",
        "saves": 1 if load else saves,
        "out": str(path),
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "elapsed_s": elapsed_s,
        "io_s": io_s,
    }
    verb = "loaded and checked" if load else "wrote"
    _said(
        data,
        as_json,
        f"ckpt-trace: {engine} {verb} {data['files']} files, {data['bytes']:,} bytes in {path}: "
        f"{io_s:.2f} s of I/O, {elapsed_s:.1f} s in all",
    )


@app.command()
def synth(
    engine: Literal["dcp"] = typer.Option(
        "dcp", "--engine", help="The checkpoint engine whose save is synthesised: dcp (FileSystemWriter)."
    ),
    model: str = typer.Option(
        ...,
        "--model",
        help="llama3-8b, llama3-70b, llama3-405b, or a GPT-2 shape of `workload` (gpt2-tiny ... gpt2-xl).",
    ),
    ranks: int = typer.Option(..., "--ranks", help="Ranks of the simulated job."),
    optimizer: Literal["none", "adam"] = typer.Option(
        "none", "--optimizer", help="adam: add fp32 exp_avg, exp_avg_sq and step per parameter."
    ),
    ckpt_path: Path = typer.Option(
        Path("/checkpoint"),
        "--path",
        help="The checkpoint directory the trace's files are in (replay maps it under --target).",
    ),
    output: Path = typer.Option(..., "-o", "--output", help="Trace file to write (.arrow)."),
    force: bool = typer.Option(False, help="Overwrite an existing trace file."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures and the arithmetic as JSON."),
) -> None:
    """The trace of a DCP save of a model too large to run here, from DCP's own planner and writer."""
    from ckpt_trace.iolayer.outputs import check_output_file
    from ckpt_trace.workloads.synth import buffer_bytes_at, synthesize_dcp, write_synthesis

    if engine != "dcp":
        raise CkptTraceError(f"synth knows the dcp engine only, not {engine!r}")
    check_output_file(output, force)
    result = synthesize_dcp(
        model, ranks, optimizer, out=str(ckpt_path.absolute()), buffer_bytes=buffer_bytes_at(ckpt_path)
    )
    rows = write_synthesis(
        result,
        output,
        command=["ckpt-trace", "synth", "--model", model, "--ranks", str(ranks), "--optimizer", optimizer],
        overwrite=force,
    )
    figures = {**result.figures, "trace": str(output), "rows": rows}
    if as_json:
        _write_json(None, figures)
        return
    a = figures["arithmetic"]
    err.print(
        f"ckpt-trace: synthesised {model} saved by {ranks} ranks: {len(figures['files'])} files, "
        f"{figures['data_bytes']:,} data bytes in {rows:,} rows to {output} ({figures['elapsed_s']:.1f} s)",
        highlight=False,
    )
    err.print(
        f"ckpt-trace: arithmetic: {a['formula']} = {a['expected_bytes']:,} B; tensors {figures['tensor_bytes']:,} B"
        f" + torch.save framing {figures['serialisation_overhead_bytes']:,} B "
        f"({figures['difference_from_arithmetic']:+.4%} vs the arithmetic)",
        highlight=False,
    )


@app.command()
def bench(
    target: Path = typer.Option(
        ...,
        "--target",
        help="Directory on the storage to measure; only a scratch directory made there is written, then removed.",
    ),
    quick: bool = typer.Option(
        False, "--quick", help="The small matrix: 4 sizes, queue depths 1/8/32, 256 MiB per point (about a minute)."
    ),
    output: Path = typer.Option(
        Path("ckpt-trace-bench"), "-o", "--output", help="Directory for bench.arrow and the heat maps."
    ),
    volume: Optional[str] = typer.Option(
        None, "--volume", help="Bytes written per point, over all processes (default 1GiB; --quick 256MiB)."
    ),
    sizes: Optional[str] = typer.Option(
        None, "--sizes", help="Request sizes to sweep, comma-separated (e.g. 4KiB,1MiB,16MiB)."
    ),
    queue_depths: Optional[str] = typer.Option(
        None, "--queue-depths", help="io_uring queue depths to sweep, comma-separated (e.g. 1,8,32)."
    ),
    max_processes: Optional[int] = typer.Option(
        None, "--max-processes", help="Most concurrent writer processes (default: CPUs, at least 4)."
    ),
    aggregate_size: str = typer.Option("4MiB", "--aggregate-size", help="Staging buffer of aggregated points."),
    repeat: int = typer.Option(1, "--repeat", help="Runs per point; the median run is kept."),
    direction: str = typer.Option(
        "write",
        "--direction",
        help="What to sweep: write, read (a restore: each point reads back a file written and dropped from the page cache first) or both.",
    ),
    fio: bool = typer.Option(
        False, "--fio", help="Also measure fio's sequential O_DIRECT write (read) limit for reference."
    ),
    force: bool = typer.Option(False, help="Overwrite the results in a non-empty output directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the best configuration and the fastest points as JSON."),
) -> None:
    """Sweep request size, alignment, queue depth, processes, O_DIRECT, io_uring, aggregation and preallocation,
    for writes, reads or both."""
    from .bench import check_output, make_matrix, run_bench, write_outputs
    from .bench.results import summarize, to_table
    from .config import BENCH_NEAR_BEST_PERCENT, BENCH_TOP_ROWS
    from .report.render import render_bench
    from .units import parse_size

    def listed(text: Optional[str], parse) -> tuple | None:
        return tuple(parse(item) for item in text.split(",") if item.strip()) if text else None

    def depth(item: str) -> int:
        if not item.strip().isdigit():
            raise CkptTraceError(f"not a queue depth: {item!r}")
        return int(item)

    directions = {"write": ("write",), "read": ("read",), "both": ("write", "read")}.get(direction)
    if directions is None:
        raise CkptTraceError(f"--direction must be write, read or both, not {direction!r}")
    try:
        matrix = make_matrix(
            quick=quick,
            max_processes=max_processes,
            directions=directions,
            volume_bytes=parse_size(volume) if volume else None,
            sizes=listed(sizes, parse_size),
            queue_depths=listed(queue_depths, depth),
            aggregate_bytes=parse_size(aggregate_size),
        )
    except ValueError as error:
        raise CkptTraceError(str(error)) from None
    check_output(output, force)
    with _progress("", threaded=False) as progress:
        rows, metadata = run_bench(target, matrix, repeat=repeat, fio=fio, progress=progress)
    written = write_outputs(rows, metadata, matrix, output)
    data = {
        **summarize(to_table(rows, metadata), metadata, matrix, BENCH_TOP_ROWS, BENCH_NEAR_BEST_PERCENT / 100),
        **written,
    }
    _show(data, as_json, render_bench)
    if not as_json:
        err.print(
            f"ckpt-trace: wrote {written['table']} and {len(written['heatmaps'])} heat maps in "
            f"{metadata['elapsed_s']:.0f} s",
            highlight=False,
        )


def _layout_after_record(trace: Path, skip: bool) -> dict | None:
    """``record``'s layout step: the layout of the checkpoint files the command touched, added to the trace;
    a failure is a warning (the trace is already whole)."""
    if skip:
        return None
    from .analysis.layout import annotate_recording
    from .config import LAYOUT_TIME_LIMIT_S

    try:
        done = annotate_recording(trace, time_limit_s=LAYOUT_TIME_LIMIT_S)
    except (CkptTraceError, OSError) as error:  # a file gone or unreadable since the command touched it
        err.print(f"[yellow]ckpt-trace: warning: no layout added: {escape(str(error))}[/]", highlight=False)
        return None
    if done["stored"]:
        formats = ", ".join(sorted(set(done["files"].values())))
        err.print(
            f"ckpt-trace: layout: {done['objects']:,} objects in {done['covered_files']} files "
            f"({formats}) in {done['elapsed_s']:.2f} s"
            f"{'' if done['complete'] else f' (stopped at the {LAYOUT_TIME_LIMIT_S:g} s bound)'}",
            highlight=False,
        )
    else:
        err.print(f"ckpt-trace: layout: no checkpoint file recognised ({done['elapsed_s']:.2f} s)", highlight=False)
    return done


@app.command()
def annotate(
    trace: Path = typer.Argument(..., help="Trace file."),
    checkpoint: list[Path] = typer.Option(..., "--checkpoint", help="Checkpoint directory or file (repeatable)."),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", help="Write the annotated trace here (default: replace TRACE)."
    ),
    force: bool = typer.Option(False, help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print what was added as JSON."),
) -> None:
    """Add the layout of a checkpoint (which byte ranges hold which tensor, of which kind) to a trace.

    Read from the checkpoint's own index data (DCP .metadata, safetensors headers, torch.save's data.pkl,
    Hugging Face *.index.json) without running code from it; other files are listed as unknown."""
    from .analysis.layout import annotate as annotate_trace
    from .config import LAYOUT_TIME_LIMIT_S

    data = annotate_trace(trace, checkpoint, output, overwrite=force, time_limit_s=LAYOUT_TIME_LIMIT_S)
    if as_json:
        _write_json(None, data)
    else:
        formats = ", ".join(sorted(set(data["files"].values()))) or "none recognised"
        err.print(
            f"ckpt-trace: wrote {data['trace']}: {data['objects']:,} objects in {data['covered_files']} files "
            f"({formats}), {len(data['unknown'])} unknown, in {data['elapsed_s']:.2f} s",
            highlight=False,
        )
        for why in data["errors"].values():
            err.print(f"[yellow]ckpt-trace: warning: {escape(why)}[/]", highlight=False)


@app.command()
def upgrade(
    trace: Path = typer.Argument(..., help="Trace file of an older format version (1 to 4)."),
    output: Path = typer.Option(..., "-o", "--output", help="Trace file to write, in the current version."),
    force: bool = typer.Option(False, help="Overwrite an existing output (never the input)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Rewrite TRACE in the current trace format version (every column plain), metadata kept and the original's
    version and sha256 added (``upgraded_from``); TRACE itself is never changed."""
    from ckpt_trace.formats.convert import upgrade_trace

    with _steps("upgrade") as progress:
        result = upgrade_trace(
            trace,
            output,
            overwrite=force,
            on_batch=None if progress is None else lambda done, count: progress("rows", done, count),
        )
    _said(
        result,
        as_json,
        f"ckpt-trace: wrote {result['rows']:,} rows of {trace} (version {result['from_version']}) to "
        f"{output} as version {result['to_version']} ({result['input_bytes']:,} -> "
        f"{result['output_bytes']:,} bytes)",
    )


@app.command()
def anonymize(
    trace: Path = typer.Argument(..., help="Trace file to anonymize."),
    output: Path = typer.Option(..., "-o", "--output", help="Trace file to write."),
    key: Optional[str] = typer.Option(
        None,
        "--key",
        help="Secret for the hashes: the same key gives the same names across traces (default: random, not stored).",
    ),
    force: bool = typer.Option(False, help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print what was replaced and kept as JSON."),
) -> None:
    """Write a copy of TRACE that can be shared: paths, command line, process, host and user names replaced
    by stable hashes (the I/O pattern, sizes and times kept)."""
    from .analysis.anonymize import anonymize_trace

    with _steps("anonymize") as progress:
        result = anonymize_trace(trace, output, key=key, overwrite=force, progress=progress)
    _said(
        result,
        as_json,
        f"ckpt-trace: wrote {result['rows']:,} rows to {output}: replaced {', '.join(result['replaced'])}; "
        f"kept {', '.join(result['kept'])}",
    )


@app.command(name="filter")
def filter_cmd(
    trace: Path = typer.Argument(..., help="Trace file to filter."),
    output: Path = typer.Option(..., "-o", "--output", help="Trace file to write."),
    rank: Optional[str] = typer.Option(None, "--rank", help="Ranks to keep: 0-7,12 (-1: rows without a rank)."),
    pid: Optional[str] = typer.Option(None, "--pid", help="Processes to keep: 1234,1240."),
    path: Optional[str] = typer.Option(None, "--path", help="Shell glob on the file path (* crosses /)."),
    op: Optional[str] = typer.Option(None, "--op", help="Operations to keep: write,fsync,copy_d2h."),
    time_window: Optional[str] = typer.Option(
        None, "--time", help="Window since the trace started: 10s..20s, ..5s, 1.5min.."
    ),
    force: bool = typer.Option(False, help="Overwrite an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write the rows of TRACE that meet every condition to a smaller, valid trace (metadata kept, provenance added)."""
    from ckpt_trace.iolayer.outputs import check_output_file

    from .analysis.filter import Conditions, filter_trace

    conditions = Conditions(ranks=rank, pids=pid, path_glob=path, ops=op, time=time_window)
    check_output_file(output, force, inputs=(trace,))
    with _steps("filter") as progress:
        result = filter_trace(trace, output, conditions, overwrite=force, progress=progress)
    _said(result, as_json, f"ckpt-trace: kept {result['rows_out']:,} of {result['rows_in']:,} rows in {output}")


def _print_version(value: bool) -> None:
    if value:
        out.print(f"ckpt-trace {__version__}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Record checkpoint I/O (and the GPU copies before it) into Arrow traces; replay it under other I/O
    strategies; report, check and emit the best writer."""


@app.command()
def version() -> None:
    """Print the version."""
    out.print(__version__)


INTERNAL_ERROR_EXIT = 70  # EX_SOFTWARE (sysexits.h)


#: glibc mallopt(3) parameters and the values ``keep_freed_batches`` sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20
MALLOC_TRIM_THRESHOLD_BYTES = 64 << 20


def keep_freed_batches() -> None:
    """Let glibc's malloc keep and reuse the memory of a record batch's freed temporaries.

    Commands that read a trace allocate and free the same few arrays of a batch's size (0.5 MiB per
    int64 column of 65,536 rows) for every batch. Under glibc's defaults (mallopt(3)) such blocks may
    come from mmap(2) and go back with munmap(2), or be trimmed from the heap, so each batch faults its
    pages in and the kernel zeroes them again: ``summary`` over 10 M rows spent 0.6 s of its 3.4 s of
    CPU time in the kernel, 0.2 s with this. Blocks under 32 MiB (``M_MMAP_THRESHOLD``) now come from the heap, and up to 64 MiB of
    free memory at its top stays there (``M_TRIM_THRESHOLD``). No-op where the C library is not glibc."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES)


#: Keyword arguments of the library whose flag is not the keyword with dashes (CkptTraceError.option -> flag).
_FLAGS = {
    "buffer_bytes": "--buffer-size",
    "overwrite": "--force",
    "clock_offsets": "--clock-offset",
    "queue_depths": "--queue-depths",
    "duration_s": "--duration",
}


def flag_of(option: str) -> str:
    """The command-line flag of a library call's keyword argument ``option`` (an error's ``option``): the CLI,
    not the library, names flags in error lines."""
    return _FLAGS.get(option, "--" + option.replace("_", "-"))


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turning errors into one line and an exit code."""
    keep_freed_batches()
    interrupted = []

    def on_sigint(signum, frame):  # Python's own behaviour, remembered: typer turns it into a silent exit 130
        interrupted.append(signum)
        signal.default_int_handler(signum, frame)

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGTERM, SIGHUP: as Ctrl-C, cleanup included
            signal.signal(signum, on_sigint)
    try:
        args = sys.argv[1:] if argv is None else argv
        command = decorate(typer.main.get_command(app))
        if not args:  # bare ckpt-trace: the help, not an error
            with command.make_context("ckpt-trace", ["--help"], resilient_parsing=True) as ctx:
                out.print(command.get_help(ctx), highlight=False, markup=False)
            sys.exit(0)
        code = command.main(args=args, prog_name="ckpt-trace", standalone_mode=False)
        if interrupted:
            raise KeyboardInterrupt
    except typer.Abort:
        err.print("[red]ckpt-trace: interrupted[/]")
        sys.exit(128 + (interrupted[0] if interrupted else signal.SIGINT))
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except Interrupted as error:
        err.print(f"[red]ckpt-trace: {escape(error.render(flag_of))}[/]", highlight=False)
        sys.exit(128 + interrupted[0] if interrupted else error.exit_code)  # 143 for SIGTERM, 129 for SIGHUP
    except CkptTraceError as error:
        err.print(f"[red]ckpt-trace: error: {escape(error.render(flag_of))}[/]", highlight=False)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        err.print("[red]ckpt-trace: interrupted[/]")
        sys.exit(128 + (interrupted[0] if interrupted else signal.SIGINT))
    except OSError as error:
        where = f" ({error.filename})" if error.filename else ""
        err.print(f"[red]ckpt-trace: error: {escape(str(error.strerror or error) + where)}[/]", highlight=False)
        sys.exit(1)
    except Exception as error:  # noqa: BLE001 - the one place every failure becomes one line
        # click's usage errors, read by attribute (Exception declares neither)
        format_message, exit_code = getattr(error, "format_message", None), getattr(error, "exit_code", None)
        if format_message is not None and exit_code is not None:
            err.print(f"[red]ckpt-trace: error: {escape(format_message())}[/] (see --help)", highlight=False)
            sys.exit(exit_code)
        if os.environ.get("CKPT_TRACE_DEBUG"):
            raise
        detail = str(error).splitlines()[0] if str(error) else ""
        err.print(
            f"[red]ckpt-trace: internal error: {type(error).__name__}: {escape(detail)}[/] "
            "(a bug: please report it; CKPT_TRACE_DEBUG=1 shows the traceback)",
            highlight=False,
        )
        sys.exit(INTERNAL_ERROR_EXIT)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
