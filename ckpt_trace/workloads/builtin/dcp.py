"""``dcp``: ``torch.distributed.checkpoint`` from N ranks with its FileSystemWriter (and FileSystemReader for
a load), each rank a spawned process holding DTensor row shards (``engines.run_dcp``); a finished save
leaves ``.metadata``; ``--saves N`` saves N times in a row, each overwriting the last (FileSystemWriter's
``overwrite``). Reference: torch.distributed.checkpoint's documentation (``save``, ``load``)."""

from __future__ import annotations

from ..engines import Workload, WorkloadArgs, run_dcp


def _run(a: WorkloadArgs) -> float:
    return run_dcp(a.out, a.ranks, a.model, a.with_optimizer, "dcp", a.load, a.writer, a.device, a.saves)


WORKLOAD = Workload(
    "dcp",
    _run,
    summary="torch.distributed.checkpoint from N gloo ranks (FileSystemWriter)",
    options=frozenset({"ranks", "saves"}),
    cuda=True,
    committed=".metadata",
    order=10,
)
