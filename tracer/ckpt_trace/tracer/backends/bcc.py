"""The ``bcc`` backend: eBPF programs on the syscall tracepoints (``tracer.bcc_backend``), events drained
from ring buffers while the command runs. Needs root, tracefs and kernel headers; under ``auto``, a
kernel that refuses the program at load time falls back to the next backend."""

from __future__ import annotations

from ckpt_trace.errors import TracerError

from .. import attach as attach_mod
from .. import bcc_backend
from . import Backend, BackendChoice, get, table


def _capture_limits() -> list[str]:
    view = bcc_backend.kernel_view()
    return [reason for reason in (view.uring, view.mapped) if reason]


def load(choice: BackendChoice, path_filters: list[str]) -> tuple[bcc_backend.BccTracer | None, BackendChoice]:
    """Load the BPF program; under ``auto``, a refusal becomes the next backend that can run here (strace),
    with the reason."""
    tracer = bcc_backend.BccTracer(path_filters)
    try:
        tracer.load()
    except TracerError as err:
        following = (
            next(
                (spec.name for spec in table().values() if spec.order > BACKEND.order and spec.problem() is None), None
            )
            if choice.may_fall_back
            else None
        )
        if following is None:
            raise
        return None, BackendChoice(following, f"bcc failed to load: {err}")
    return tracer, choice


def run(choice: BackendChoice, cmd: list[str], env: dict, make_feeder, spool, path_filters: list[str]) -> tuple:
    """Run ``cmd`` under the loaded BPF program, feeding events to a builder (``make_feeder``) as they
    drain; rows go to ``spool``. Returns (builder, extra metadata, the choice that ran: strace's, where the
    program did not load and ``auto`` may fall back)."""
    tracer, choice = load(choice, path_filters)
    if tracer is None:
        return get(choice.name).run(choice, cmd, env, make_feeder, spool, path_filters)
    rec = tracer.run(cmd, env, make_feeder, spool.output.parent)
    builder, extra = rec.finish(spool)
    return builder, extra, choice


BACKEND = Backend(
    name="bcc",
    problem=bcc_backend.probe,
    auto_reason="eBPF syscall tracepoints are available",
    capture_limits=_capture_limits,
    run=run,
    clock="CLOCK_MONOTONIC",  # bpf_ktime_get_ns
    order=0,
    attach=attach_mod.attach_bcc,
)
