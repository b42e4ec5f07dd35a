"""``torchsnapshot``: the model (and Adam state) taken with torchsnapshot's ``Snapshot.take`` and put back with
``Snapshot(path).restore``, the engine's own API; a finished take leaves ``.snapshot_metadata`` (the manifest,
written last). torchsnapshot batches the tensors into files under ``batched/`` and pickles other values
(Adam's ``betas``) one file each; its manifest names every file and each tensor's byte range in it.

The state is wrapped in ``torchsnapshot.StateDict`` objects (``model``; with the optimizer also ``optim``,
shaped as ``torch.optim.Adam.state_dict()`` is, keyed by parameter name), one process, on the CPU. A restore
writes into zeroed tensors of the same shapes and every value is then checked against the regenerated state.
torchsnapshot is imported when the workload runs; without it the workload is one WorkloadError.

Reference: torchsnapshot 0.1.0's documentation (``Snapshot.take``, ``Snapshot.restore``, ``StateDict``).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from ckpt_trace.errors import WorkloadError

from ..engines import Workload, check_same, local_state, model_config, optimizer_groups, require_torch

#: The file a finished ``Snapshot.take`` leaves (torchsnapshot's ``SNAPSHOT_METADATA_FNAME``).
METADATA = ".snapshot_metadata"


def _engine():
    """torchsnapshot, or WorkloadError saying how to install it."""
    try:
        return importlib.import_module("torchsnapshot")
    except ImportError:
        raise WorkloadError(
            "this workload needs torchsnapshot: pip install 'ckpt-trace[engines]' (torchsnapshot==0.1.0)"
        ) from None


def snapshot_state(torch, model: str, with_optimizer: bool, *, empty: bool = False) -> dict:
    """``{"model": {name: tensor}}`` and with ``with_optimizer`` ``"optim"`` (``state``: per parameter
    ``step``, ``exp_avg``, ``exp_avg_sq``; ``param_groups``), drawn from fixed seeds; ``empty``: the same
    shapes zeroed and other values changed, a restore target that matches nothing saved."""
    local = local_state(model_config(model), 0, 1, with_optimizer)
    zero = torch.zeros_like if empty else (lambda tensor: tensor)
    state: dict = {"model": {name: zero(tensor) for name, tensor in local["model"].items()}}
    if with_optimizer:
        groups = optimizer_groups()
        state["optim"] = {
            "state": {
                name: {
                    "step": torch.tensor(0.0 if empty else 1.0),
                    "exp_avg": zero(local["exp_avg"][name]),
                    "exp_avg_sq": zero(local["exp_avg_sq"][name]),
                }
                for name in local["model"]
            },
            "param_groups": [{**group, "lr": 0.0} for group in groups] if empty else groups,
        }
    return state


def run_torchsnapshot(out: Path, model: str, with_optimizer: bool, load: bool = False) -> float:
    """Take a snapshot of the state into ``out`` (or ``load``: restore it into zeroed tensors and check every
    value); returns the seconds of ``take`` or ``restore``. Raises WorkloadError when torchsnapshot is missing
    or a restored value differs from what was saved."""
    torch = require_torch()
    engine = _engine()
    saved = snapshot_state(torch, model, with_optimizer)
    if not load:
        app_state = {key: engine.StateDict(**value) for key, value in saved.items()}
        started = time.perf_counter()
        engine.Snapshot.take(path=str(out), app_state=app_state)
        return time.perf_counter() - started
    target = {
        key: engine.StateDict(**value)
        for key, value in snapshot_state(torch, model, with_optimizer, empty=True).items()
    }
    started = time.perf_counter()
    engine.Snapshot(path=str(out)).restore(app_state=target)
    io_s = time.perf_counter() - started
    check_same(torch, target, saved)
    return io_s


WORKLOAD = Workload(
    "torchsnapshot",
    lambda a: run_torchsnapshot(a.out, a.model, a.with_optimizer, a.load),
    summary="torchsnapshot Snapshot.take / restore of StateDicts",
    committed=METADATA,
    order=70,
)
