"""``record``: run a command under a backend and write its trace.

Call order: ``choose_backend`` (auto-detection, with the reason), then
``record``, which runs the command, builds rows with ``TraceBuilder`` and
writes the trace atomically. Called by the CLI's ``record`` command.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ckpt_trace import config
from ckpt_trace.version import __version__
from ckpt_trace.errors import TracerError
from ckpt_trace.formats import table_from_columns, vocabulary, write_trace
from ckpt_trace.iolayer.host import filesystems_of

from . import bcc_backend, strace_backend
from .state import TraceBuilder, rank_from_environ

BACKENDS = ("auto", "bcc", "strace")


@dataclass(frozen=True)
class BackendChoice:
    """The backend to use and, for ``auto``, why (one line for stderr).

    ``may_fall_back``: an ``auto`` choice of bcc that becomes strace when the
    kernel refuses the BPF program at load time.
    """

    name: str
    reason: str
    may_fall_back: bool = False


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


def choose_backend(requested: str) -> BackendChoice:
    """Resolve ``auto|bcc|strace`` to a backend that can run here.

    Raises TracerError when the requested backend cannot run, with the reason.
    """
    if requested not in BACKENDS:
        raise TracerError(f"unknown backend {requested!r} (choose from {', '.join(BACKENDS)})")
    bcc_problem = bcc_backend.probe() if requested in ("auto", "bcc") else None
    if requested == "bcc":
        if bcc_problem:
            raise TracerError(f"bcc backend unavailable: {bcc_problem}")
        return BackendChoice("bcc", "requested")
    strace_missing = strace_backend.available() is None
    if requested == "strace":
        if strace_missing:
            raise TracerError("strace backend unavailable: strace is not installed")
        return BackendChoice("strace", "requested")
    if bcc_problem is None:
        return BackendChoice("bcc", "eBPF syscall tracepoints are available", may_fall_back=not strace_missing)
    if strace_missing:
        raise TracerError(f"no tracing backend: bcc unavailable ({bcc_problem}) and strace not installed")
    return BackendChoice("strace", f"bcc unavailable: {bcc_problem}")


def _load_bcc(choice: BackendChoice, path_filters: list[str]) -> tuple[bcc_backend.BccTracer | None, BackendChoice]:
    """Load the BPF program; under ``auto``, a refusal becomes strace with the reason."""
    tracer = bcc_backend.BccTracer(path_filters)
    try:
        tracer.load()
    except TracerError as err:
        if not choice.may_fall_back:
            raise
        return None, BackendChoice("strace", f"bcc failed to load: {err}")
    return tracer, choice


def _run_backend(choice: BackendChoice, cmd: list[str], builder_args: dict) -> tuple[TraceBuilder, dict, BackendChoice]:
    env = dict(os.environ)
    builder_args["root_rank"] = rank_from_environ(f"{k}={v}" for k, v in env.items()) or -1
    builder_args["inherited_fds"] = strace_backend.inherited_fds()
    tracer = None
    if choice.name == "bcc":
        tracer, choice = _load_bcc(choice, builder_args["path_filters"])
    if tracer is not None:
        rec = tracer.run(cmd, env)
        builder = TraceBuilder(start_ns=rec.start_ns, root_pid=rec.root_pid, **builder_args)
        builder.feed_all(rec.events)
        extra = {"lost_events": rec.lost_events, "truncated_paths": rec.truncated_paths, "exit_code": rec.exit_code,
                 "command_elapsed_ns": rec.command_elapsed_ns}
        return builder, extra, choice
    with tempfile.TemporaryDirectory(prefix="ckpt-trace-strace-") as scratch:
        log = Path(scratch) / "strace.log"
        start_ns = time.time_ns()
        exit_code = strace_backend.run(cmd, log, env)
        command_elapsed_ns = time.time_ns() - start_ns
        events = strace_backend.parse_log(log) if log.exists() else []
    builder = TraceBuilder(start_ns=start_ns, **builder_args)
    builder.feed_all(events)
    return builder, {"lost_events": 0, "truncated_paths": 0, "exit_code": exit_code,
                     "command_elapsed_ns": command_elapsed_ns}, choice


def check_output(output: str | os.PathLike, overwrite: bool) -> Path:
    """Refuse an existing trace file (unless ``overwrite``) or a missing directory, before anything runs."""
    output = Path(output)
    if output.exists() and not overwrite:
        raise TracerError(f"{output} already exists (use --force to overwrite it)")
    if not output.parent.is_dir():
        raise TracerError(f"directory {output.parent} does not exist")
    return output


def record(
    cmd: list[str],
    output: str | os.PathLike,
    *,
    choice: BackendChoice,
    path_filters: Iterable[str] = (),
    strict: bool = False,
    overwrite: bool = False,
) -> RecordResult:
    """Run ``cmd`` (and every descendant) traced; write the trace to ``output``.

    Returns the command's exit code with the counts. Raises TracerError when
    the command is empty, the backend fails, or ``strict`` and events were
    lost (no trace is written then); CkptTraceError when ``output`` exists
    and ``overwrite`` is false (checked before the command runs).
    """
    if not cmd:
        raise TracerError("no command to record (put it after --)")
    output = check_output(output, overwrite)
    filters = [os.path.abspath(p) if not p.startswith("/") else p for p in path_filters]
    builder_args = {"cwd": os.getcwd(), "path_filters": filters}
    start_wall_ns = time.time_ns()
    started = time.monotonic()
    builder, extra, choice = _run_backend(choice, cmd, builder_args)
    elapsed_s = time.monotonic() - started
    if strict and extra["lost_events"]:
        raise TracerError(f"{extra['lost_events']} events were lost (--strict); no trace written")
    columns = builder.columns()
    metadata = {
        "creator": "ckpt-trace",
        "creator_version": __version__,
        "host": socket.gethostname(),
        "kernel": os.uname().release,
        "arch": vocabulary.host_arch(),
        "command": list(cmd),
        "backend": choice.name,
        "backend_reason": choice.reason,
        "start_wall_time_ns": start_wall_ns,
        "elapsed_ns": int(elapsed_s * 1e9),
        "filesystems": filesystems_of(columns["path"]),
        "path_filters": filters,
        "untracked_fd_ops": builder.untracked_fd_ops,
        **extra,
    }
    table = table_from_columns(columns).sort_by([("ts_ns", "ascending")])
    write_trace(output, table, metadata, overwrite=overwrite,
                batch_rows=config.TRACE_BATCH_ROWS)
    return RecordResult(output, extra["exit_code"], choice.name, choice.reason, builder.num_rows, extra["lost_events"],
                        elapsed_s)
