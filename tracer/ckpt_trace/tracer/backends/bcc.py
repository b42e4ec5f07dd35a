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
        following = next((spec.name for spec in table().values() if spec.order > BACKEND.order
                          and spec.problem() is None), None) if choice.may_fall_back else None
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
    feeder = rec.feeder
    if feeder is None:  # the command never started (BccTracer.run raises then): nothing was fed
        raise TracerError("the bcc recording made no event feeder")
    feeder.finish()
    spool.add(feeder.builder.take_rows())
    extra = {"lost_events": rec.lost_events, **({"lost_reasons": rec.lost_reasons} if rec.lost_reasons else {}),
             "truncated_paths": rec.truncated_paths, "exit_code": rec.exit_code,
             "exit_signal": rec.exit_signal, "command_elapsed_ns": rec.command_elapsed_ns,
             "recorder_cpu_ns": rec.recorder_cpu_ns,
             **({"bpf_run_ns": rec.bpf_run_ns} if rec.bpf_run_ns is not None else {}),
             "unseen": rec.unseen, "io_uring_unrecorded_ops": rec.uring_other_ops,
             "late_events": feeder.late_events, "spilled_raw_bytes": rec.spilled_raw_bytes,
             "released_s": rec.released_s, "exited_s": rec.exited_s}
    if feeder.builder.mapped_uncovered_bytes is not None:
        extra["mapped_uncovered_bytes"] = feeder.builder.mapped_uncovered_bytes
    return feeder.builder, extra, choice


BACKEND = Backend(name="bcc", problem=bcc_backend.probe, auto_reason="eBPF syscall tracepoints are available",
                  capture_limits=_capture_limits, run=run, clock="CLOCK_MONOTONIC",  # bpf_ktime_get_ns
                  order=0, attach=attach_mod.attach_bcc)
