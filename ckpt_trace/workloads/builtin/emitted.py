"""``emitted``: ``torch.distributed.checkpoint`` from N ranks through an emitted writer module's
``make_writer``/``make_reader`` (``writer``: the file ``ckpt-trace emit`` wrote), or through
``ckpt_trace.writer``'s defaults; a finished save leaves ``ckpt-trace.metadata`` (``engines.run_dcp``)."""

from __future__ import annotations

from ..engines import Workload, WorkloadArgs, run_dcp


def _run(a: WorkloadArgs) -> float:
    return run_dcp(a.out, a.ranks, a.model, a.with_optimizer, "emitted", a.load, a.writer, a.device)


WORKLOAD = Workload(
    "emitted",
    _run,
    summary="DCP through ckpt-trace's emitted writer (or its defaults)",
    options=frozenset({"ranks", "writer"}),
    cuda=True,
    committed="ckpt-trace.metadata",
    order=40,
)
