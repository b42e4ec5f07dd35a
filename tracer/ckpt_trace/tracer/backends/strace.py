"""The ``strace`` backend: the command under ``strace -f`` (``tracer.strace_backend``), its log parsed after
the command ends. Works wherever strace is installed; sees io_uring_enter calls, not the requests in a
ring, and mmap calls, not the pages touched through a mapping."""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path

from ckpt_trace import config

from .. import attach as attach_mod
from .. import costs, leftovers, strace_backend
from . import Backend, BackendChoice

#: What this backend cannot see, by capture (the trace's ``unseen``).
UNSEEN = {
    "io_uring_requests": "the strace backend sees io_uring_enter calls, not the requests in the ring",
    "mapped_pages": "the strace backend sees mmap calls, not the pages touched through the mapping",
}


def _problem() -> str | None:
    return "strace is not installed" if strace_backend.available() is None else None


def _capture_limits() -> list[str]:
    return [
        "strace sees io_uring_enter calls but not the requests in a ring, and mmap calls but not the "
        "pages touched through a mapping (bcc sees both)"
    ]


def run(choice: BackendChoice, cmd: list[str], env: dict, make_feeder, spool, path_filters: list[str]) -> tuple:
    """Run ``cmd`` under strace, then feed its log's events to a builder (``make_feeder``); rows go to
    ``spool``. Returns (builder, extra metadata, ``choice``)."""
    del path_filters  # filtered by the builder
    costs.prewarm_in_background()  # while strace starts and the command runs
    with tempfile.TemporaryDirectory(prefix=leftovers.scratch_prefix("strace")) as scratch:
        log = Path(scratch) / "strace.log"
        start_ns = time.time_ns()
        status = strace_backend.run(cmd, log, env)
        command_elapsed_ns = time.time_ns() - start_ns
        exited_s = time.monotonic()
        released_s = strace_backend.first_event_monotonic_s(log)
        feeder = make_feeder(None, start_ns)
        if log.exists():
            events = strace_backend.iter_log(log, skip_wrapper=True)
            while chunk := list(itertools.islice(events, max(1, config.RECORD_DECODE_EVENTS))):
                feeder.add(chunk)
    feeder.finish()
    spool.add(feeder.builder.take_rows())
    exit_code, exit_signal = (128 - status, -status) if status < 0 else (status, None)
    return (
        feeder.builder,
        {
            "lost_events": 0,
            "truncated_paths": 0,
            "exit_code": exit_code,
            "exit_signal": exit_signal,
            "command_elapsed_ns": command_elapsed_ns,
            "unseen": dict(UNSEEN),
            "late_events": feeder.late_events,
            "released_s": released_s,
            "exited_s": exited_s,
        },
        choice,
    )


BACKEND = Backend(
    name="strace",
    problem=_problem,
    auto_reason="strace is installed",
    capture_limits=_capture_limits,
    run=run,
    clock="CLOCK_REALTIME",  # strace -ttt times, and the recorder's start
    wrapped=True,
    order=10,
    attach=attach_mod.attach_strace,
)
