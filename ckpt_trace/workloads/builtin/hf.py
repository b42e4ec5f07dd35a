"""``hf``: the model saved the way Hugging Face users save one, ``transformers``' ``save_pretrained`` of a
``GPT2Model`` holding the drawn weights (``config.json`` and ``model.safetensors``), and read back with
``from_pretrained``; with the optimizer, its Adam state also goes to ``optimizer.pt`` through ``torch.save``,
as the Trainer's checkpoints keep it (``state`` by parameter index, ``param_groups`` listing the indices).

The model is built on the ``meta`` device and given the drawn tensors (``load_state_dict(assign=True)``), so
no weights are initialised and thrown away; one process, on the CPU. A load checks every tensor against the
regenerated state. transformers is imported when the workload runs; without it the workload is one
WorkloadError. Its progress bars and warnings are silenced (the command's own line says what was done).

Reference: transformers' documentation (``PreTrainedModel.save_pretrained``, ``from_pretrained``,
``GPT2Config``; ``Trainer`` saves ``optimizer.pt``).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from ckpt_trace.errors import WorkloadError

from ..engines import Workload, check_same, local_state, model_config, optimizer_groups, require_torch

#: The files ``save_pretrained`` writes for an unsharded model, and the Trainer's optimizer file.
WEIGHTS, CONFIG, OPTIMIZER = "model.safetensors", "config.json", "optimizer.pt"


def _transformers():
    """transformers, quiet, or WorkloadError saying how to install it."""
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise WorkloadError("this workload needs transformers: pip install 'ckpt-trace[engines]'") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


def hf_config(transformers, model: str):
    """The ``transformers.GPT2Config`` of the workloads' GPT-2 shape ``model`` (heads of 64 features)."""
    cfg = model_config(model)
    return transformers.GPT2Config(
        n_layer=cfg.n_layer,
        n_embd=cfg.d_model,
        n_head=max(1, cfg.d_model // 64),
        vocab_size=cfg.vocab,
        n_positions=cfg.n_ctx,
        bos_token_id=cfg.vocab - 1,
        eos_token_id=cfg.vocab - 1,
    )


def optimizer_state(torch, local: dict) -> dict:
    """``local``'s Adam state shaped as ``torch.optim.Adam.state_dict()``: parameters by index, in order."""
    names = list(local["model"])
    return {
        "state": {
            i: {"step": torch.tensor(1.0), "exp_avg": local["exp_avg"][n], "exp_avg_sq": local["exp_avg_sq"][n]}
            for i, n in enumerate(names)
        },
        "param_groups": [{**group, "params": list(range(len(names)))} for group in optimizer_groups()],
    }


def run_hf(out: Path, model: str, with_optimizer: bool, load: bool = False) -> float:
    """``save_pretrained`` the drawn model into ``out`` (and ``torch.save`` its Adam state), or ``load``:
    ``from_pretrained`` it (and ``torch.load`` the optimizer file) and check every value. Returns the seconds
    of the save or load. Raises WorkloadError when transformers is missing, a file to load is missing, or a
    loaded value differs from what was saved."""
    torch = require_torch()
    transformers = _transformers()
    local = local_state(model_config(model), 0, 1, with_optimizer)
    if load:
        for name in (WEIGHTS, *([OPTIMIZER] if with_optimizer else [])):
            if not (out / name).exists():
                raise WorkloadError(f"nothing to load: {out / name} is missing (run the save first)")
        started = time.perf_counter()
        loaded = transformers.GPT2Model.from_pretrained(str(out)).state_dict()
        optimizer = torch.load(out / OPTIMIZER, weights_only=True) if with_optimizer else None
        io_s = time.perf_counter() - started
        check_same(torch, loaded, local["model"])
        if optimizer is not None:
            check_same(torch, optimizer, optimizer_state(torch, local))
        return io_s
    with torch.device("meta"):
        module = transformers.GPT2Model(hf_config(transformers, model))
    module.load_state_dict(local["model"], strict=True, assign=True)
    started = time.perf_counter()
    module.save_pretrained(str(out))
    if with_optimizer:
        torch.save(optimizer_state(torch, local), out / OPTIMIZER)
    return time.perf_counter() - started


WORKLOAD = Workload(
    "hf",
    lambda a: run_hf(a.out, a.model, a.with_optimizer, a.load),
    summary="Hugging Face transformers save_pretrained / from_pretrained (and the Trainer's optimizer.pt)",
    committed=CONFIG,
    order=80,
)
