"""``safetensors``: ``safetensors.torch.save_file`` of the flat tensors, in one file or split over ``shards``
files with an index as Hugging Face's sharded checkpoints are, and ``load_file`` back (which maps each file,
so ``mmap`` does not apply). Reference: the safetensors documentation (``save_file``, ``load_file``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ckpt_trace.errors import WorkloadError

from ..engines import (
    Workload,
    check_same,
    flat_tensors,
    local_state,
    model_config,
    rank_device,
    require_torch,
    touch_tensors,
)


def _shard_names(flat: dict, shards: int) -> list[list[str]]:
    """The tensor names of each of ``shards`` files, split by bytes the way ``save_pretrained`` shards."""
    total = sum(t.numel() * t.element_size() for t in flat.values())
    limit, groups, size = -(-total // shards), [[]], 0
    for name, tensor in flat.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > limit and len(groups) < shards:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def run_safetensors(
    out: Path, model: str, with_optimizer: bool, load: bool = False, shards: int = 1, device: str = "cpu"
) -> float:
    """``safetensors.torch.save_file`` of the flat tensors to ``out/model.safetensors`` (or, with ``shards``
    above 1, to ``out/model-0000K-of-0000N.safetensors`` and ``model.safetensors.index.json`` as Hugging
    Face's sharded checkpoints are), or ``load_file`` them back, which maps each file, and check them."""
    torch = require_torch()
    try:
        from safetensors.torch import load_file, save_file
    except ImportError:
        raise WorkloadError("this workload needs safetensors: pip install 'ckpt-trace[torch]'") from None
    flat = flat_tensors(local_state(model_config(model), 0, 1, with_optimizer, device=device))
    groups = _shard_names(flat, shards)
    names = (
        ["model.safetensors"]
        if shards == 1
        else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    )
    for name in names:
        if load and not (out / name).exists():
            raise WorkloadError(f"nothing to load: {out / name} is missing (run the save first)")
    started, loaded = time.perf_counter(), {}
    for name, group in zip(names, groups):
        if load:
            part = load_file(str(out / name), device=str(rank_device(torch, 0)) if device == "cuda" else "cpu")
            touch_tensors(torch, part)  # load_file maps the file: its pages are read on first access
            loaded.update(part)
        else:
            save_file({key: flat[key] for key in group}, str(out / name))
    if not load and shards > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in flat.values())},
            "weight_map": {key: name for name, group in zip(names, groups) for key in group},
        }
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    io_s = time.perf_counter() - started
    if load:
        check_same(torch, loaded, flat)
    return io_s


WORKLOAD = Workload(
    "safetensors",
    lambda a: run_safetensors(a.out, a.model, a.with_optimizer, a.load, a.shards, a.device),
    summary="safetensors save_file / load_file, in one file or shards",
    options=frozenset({"shards"}),
    cuda=True,
    order=30,
)
