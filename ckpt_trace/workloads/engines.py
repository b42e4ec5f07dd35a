"""Built-in real checkpoint workloads: DCP from N ranks, torch.save, safetensors.

Each writes a real checkpoint with the engine's own code path; they are the
embedded default input of the demo and the tests. torch is imported lazily
(``pip install ckpt-trace[torch]``).

DCP ranks are started like torchrun starts them: one spawned process per
rank whose environment carries RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, so a tracer reads each process's rank from its environment.
Each rank holds a 1/N row shard of every tensor as a DTensor over a gloo
device mesh, the way FSDP2 shards parameters, and calls ``dcp.save``.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from ckpt_trace.errors import Interrupted, WorkloadError

from .models import MODELS, GPT2Config, parameter_shapes

ENGINES = ("dcp", "torch-save", "safetensors")


def _torch():
    try:
        import torch
    except ImportError:
        raise WorkloadError("this workload needs torch: pip install 'ckpt-trace[torch]'") from None
    return torch


def model_config(name: str) -> GPT2Config:
    if name not in MODELS:
        raise WorkloadError(f"unknown model {name!r} (choose from {', '.join(MODELS)})")
    return MODELS[name]


def _shard_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """(start, length) of ``rank``'s part of ``rows`` when split like torch.chunk."""
    per = -(-rows // world)
    start = min(rows, rank * per)
    return start, max(0, min(rows, start + per) - start)


def local_state(cfg: GPT2Config, rank: int, world: int, with_optimizer: bool, seed: int = 0) -> dict:
    """This rank's row shards of the model (and Adam state): {name: local tensor}, plus optimizer groups."""
    torch = _torch()
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    model, exp_avg, exp_avg_sq = {}, {}, {}
    for name, shape in parameter_shapes(cfg).items():
        _, rows = _shard_rows(shape[0], rank, world)
        local = (rows,) + shape[1:]
        model[name] = torch.randn(local, generator=gen) * 0.02
        if with_optimizer:
            exp_avg[name] = torch.randn(local, generator=gen) * 1e-3
            exp_avg_sq[name] = torch.rand(local, generator=gen) * 1e-6
    return {"model": model, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


def _optimizer_groups() -> list[dict]:
    return [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False}]


def _dcp_rank(rank: int, world: int, out: str, model: str, with_optimizer: bool) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    torch = _torch()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        cfg = model_config(model)
        shapes = parameter_shapes(cfg)
        local = local_state(cfg, rank, world, with_optimizer)

        def dtensor(name, tensor):
            shape = shapes[name]
            stride = torch.empty(shape, device="meta").stride()
            return DTensor.from_local(tensor, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=stride)

        state = {"model": {name: dtensor(name, t) for name, t in local["model"].items()}}
        if with_optimizer:
            state["optim"] = {
                "state": {name: {"step": torch.tensor(1.0), "exp_avg": dtensor(name, local["exp_avg"][name]),
                                 "exp_avg_sq": dtensor(name, local["exp_avg_sq"][name])}
                          for name in shapes},
                "param_groups": _optimizer_groups(),
            }
        dcp.save(state, checkpoint_id=out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(target, rank: int, ranks: int, *args) -> None:
    """A rank process: Ctrl-C ends it quietly (SIGINT's default action, no traceback); the parent reports."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    target(rank, ranks, *args)


def spawn_ranks(target, ranks: int, args: tuple = ()) -> None:
    """Run ``target(rank, ranks, *args)`` in ``ranks`` spawned processes, as torchrun starts them.

    Each process's environment carries RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT (a free local port). ``target`` must be
    importable by module path. Raises WorkloadError naming the ranks that
    exited non-zero; on Ctrl-C every rank is stopped before KeyboardInterrupt
    propagates.
    """
    _torch()
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    saved_env = {key: os.environ.get(key) for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    os.environ.update(WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    procs = []
    try:
        for rank in range(ranks):
            os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
            proc = ctx.Process(target=_rank_main, args=(target, rank, ranks, *args))
            proc.start()
            procs.append(proc)
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        for proc in procs:
            proc.join()
    except KeyboardInterrupt:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.join()
        raise
    failed = [rank for rank, proc in enumerate(procs) if proc.exitcode != 0]
    if failed:
        raise WorkloadError(f"rank(s) {', '.join(map(str, failed))} failed")


def run_dcp(out: Path, ranks: int, model: str, with_optimizer: bool) -> None:
    """Save with torch.distributed.checkpoint from ``ranks`` spawned gloo processes into ``out``."""
    try:
        spawn_ranks(_dcp_rank, ranks, (str(out), model, with_optimizer))
    except WorkloadError as err:
        raise WorkloadError(f"DCP save failed: {err}") from None


def _optimizer_entry(torch, local: dict, name: str) -> dict:
    return {"step": torch.tensor(1.0), "exp_avg": local["exp_avg"][name], "exp_avg_sq": local["exp_avg_sq"][name]}


def run_torch_save(out: Path, model: str, with_optimizer: bool, file_per_layer: bool = False) -> None:
    """``torch.save`` of the state dict (model and Adam state) to ``out/checkpoint.pt``.

    ``file_per_layer`` saves each transformer block (with its Adam state) to
    ``out/layer_NNN.pt`` and the rest to ``out/layer_other.pt``, the way
    DeepSpeed pipeline checkpoints write one file per layer.
    """
    torch = _torch()
    local = local_state(model_config(model), 0, 1, with_optimizer)
    groups: dict[str, list[str]] = {}
    for name in local["model"]:
        key = f"layer_{int(name.split('.')[1]):03d}" if file_per_layer and name.startswith("h.") else "layer_other"
        groups.setdefault(key if file_per_layer else "checkpoint", []).append(name)
    for file_name, names in groups.items():
        state = {"model": {name: local["model"][name] for name in names}}
        if with_optimizer:
            state["optim"] = {"state": {name: _optimizer_entry(torch, local, name) for name in names},
                              "param_groups": _optimizer_groups()}
        torch.save(state, out / f"{file_name}.pt")


def run_safetensors(out: Path, model: str, with_optimizer: bool) -> None:
    """``safetensors.torch.save_file`` of the flat tensors to ``out/model.safetensors``."""
    _torch()
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise WorkloadError("this workload needs safetensors: pip install 'ckpt-trace[torch]'") from None
    local = local_state(model_config(model), 0, 1, with_optimizer)
    flat = {f"model.{k}": v for k, v in local["model"].items()}
    for kind in ("exp_avg", "exp_avg_sq"):
        flat.update({f"optim.{kind}.{k}": v for k, v in local[kind].items()})
    save_file(flat, str(out / "model.safetensors"))


def run(engine: str, out: Path, *, ranks: int = 1, model: str = "gpt2-small", with_optimizer: bool = False,
        file_per_layer: bool = False) -> Path:
    """Run a built-in workload; returns the checkpoint directory.

    Raises WorkloadError for an unknown engine or model, ranks < 1, a file
    per layer asked of another engine than torch-save, or a failed save.
    """
    if file_per_layer and engine != "torch-save":
        raise WorkloadError("--file-per-layer applies to the torch-save workload only")
    if engine not in ENGINES:
        raise WorkloadError(f"unknown workload {engine!r} (choose from {', '.join(ENGINES)})")
    if ranks < 1:
        raise WorkloadError("--ranks must be at least 1")
    model_config(model)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if engine == "dcp":
            run_dcp(out, ranks, model, with_optimizer)
        elif engine == "torch-save":
            run_torch_save(out, model, with_optimizer, file_per_layer)
        else:
            run_safetensors(out, model, with_optimizer)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; a partial checkpoint may remain in {out}") from None
    return out
