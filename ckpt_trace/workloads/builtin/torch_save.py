"""``torch-save``: ``torch.save`` of the model and Adam state to ``checkpoint.pt`` (or, with ``file_per_layer``,
one file per transformer block, as DeepSpeed's pipeline checkpoints write), and ``torch.load`` back, with
``mmap=True`` when asked. Reference: torch.save / torch.load (PyTorch's serialization documentation)."""

from __future__ import annotations

import time
from pathlib import Path

from ckpt_trace.errors import WorkloadError

from ..engines import (
    Workload,
    check_same,
    local_state,
    model_config,
    optimizer_groups,
    require_torch,
    touch_tensors,
)


def _optimizer_entry(torch, local: dict, name: str) -> dict:
    return {"step": torch.tensor(1.0), "exp_avg": local["exp_avg"][name], "exp_avg_sq": local["exp_avg_sq"][name]}


def _torch_save_groups(local: dict, file_per_layer: bool) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name in local["model"]:
        key = f"layer_{int(name.split('.')[1]):03d}" if file_per_layer and name.startswith("h.") else "layer_other"
        groups.setdefault(key if file_per_layer else "checkpoint", []).append(name)
    return groups


def _torch_save_state(torch, local: dict, names: list[str], with_optimizer: bool) -> dict:
    state = {"model": {name: local["model"][name] for name in names}}
    if with_optimizer:
        state["optim"] = {
            "state": {name: _optimizer_entry(torch, local, name) for name in names},
            "param_groups": optimizer_groups(),
        }
    return state


def run_torch_save(
    out: Path,
    model: str,
    with_optimizer: bool,
    file_per_layer: bool = False,
    load: bool = False,
    mmap: bool = False,
    device: str = "cpu",
) -> float:
    """``torch.save`` of the state dict (model and Adam state) to ``out/checkpoint.pt`` (or ``load`` it back
    with ``torch.load``, ``mmap=True`` when ``mmap``, and check it).

    ``file_per_layer`` saves each transformer block (with its Adam state) to
    ``out/layer_NNN.pt`` and the rest to ``out/layer_other.pt``, the way
    DeepSpeed pipeline checkpoints write one file per layer.
    """
    torch = require_torch()
    local = local_state(model_config(model), 0, 1, with_optimizer, device=device)
    io_s = 0.0
    for file_name, names in _torch_save_groups(local, file_per_layer).items():
        state = _torch_save_state(torch, local, names, with_optimizer)
        path = out / f"{file_name}.pt"
        if load and not path.exists():
            raise WorkloadError(f"nothing to load: {path} is missing (run the save first)")
        started = time.perf_counter()
        if load:
            loaded = torch.load(path, mmap=mmap, weights_only=True, map_location=device if device != "cpu" else None)
            if mmap:
                touch_tensors(torch, loaded)  # a mapped load reads on first access: count that in its time
        else:
            torch.save(state, path)
        io_s += time.perf_counter() - started
        if load:
            check_same(torch, loaded, state)
    return io_s


WORKLOAD = Workload(
    "torch-save",
    lambda a: run_torch_save(a.out, a.model, a.with_optimizer, a.file_per_layer, a.load, a.mmap, a.device),
    summary="torch.save / torch.load (mmap=True with mmap)",
    options=frozenset({"file_per_layer", "mmap"}),
    cuda=True,
    order=20,
)
