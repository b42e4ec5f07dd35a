"""Built-in real checkpoint workloads: DCP from N ranks, torch.save, safetensors, and ckpt-trace's own writer.

Each writes a real checkpoint with the engine's own code path, or, with
``load``, reads back the checkpoint it wrote into the same directory and
checks every tensor byte for byte against the state it saved (which is
regenerated from fixed seeds); they are the embedded default input of the
demo and the tests. The loads are the restore paths users have: DCP's
FileSystemReader, ``torch.load`` with and without ``mmap=True``,
safetensors' ``load_file`` (which maps the file), and the emitted reader.
``libaio`` writes and reads the way DeepSpeed's FastPersist does, through
native AIO with O_DIRECT (``iolayer.aio``), without DeepSpeed's JIT build.
``memmap`` writes through a shared file mapping (``numpy.memmap``, then
msync), the way memory-mapped checkpoint writers do, and reads it mapped.
``emitted`` saves and loads through ``torch.distributed.checkpoint`` with an
emitted writer module's ``make_writer``/``make_reader`` (``--writer``), or
with ``ckpt_trace.writer``'s defaults. torch is imported lazily
(``pip install ckpt-trace[torch]``).

DCP ranks are started like torchrun starts them: one spawned process per
rank whose environment carries RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, so a tracer reads each process's rank from its environment.
Each rank holds a 1/N row shard of every tensor as a DTensor over a gloo
device mesh, the way FSDP2 shards parameters, and calls ``dcp.save``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_trace.errors import CkptTraceError, Interrupted, WorkloadError

from .models import MODELS, GPT2Config, parameter_shapes

if TYPE_CHECKING:
    from torch.distributed.checkpoint import StorageReader, StorageWriter

DEVICES = ("cpu", "cuda")


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


def local_state(
    cfg: GPT2Config, rank: int, world: int, with_optimizer: bool, seed: int = 0, device: str = "cpu"
) -> dict:
    """This rank's row shards of the model (and Adam state): {name: local tensor}, plus optimizer groups.

    The values are drawn on the CPU (the same bytes for any ``device``), then moved to ``device``: with
    ``cuda``, this rank's GPU (rank modulo the GPUs present), so a save copies each tensor device-to-host.
    """
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
    state = {"model": model, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if device != "cpu":
        where = _rank_device(torch, rank)
        state = {kind: {name: t.to(where) for name, t in tensors.items()} for kind, tensors in state.items()}
    return state


def _rank_device(torch, rank: int):
    """This rank's GPU: ``cuda:<rank modulo the GPUs present>``."""
    return torch.device("cuda", rank % torch.cuda.device_count())


def tensor_bytes(model: str, with_optimizer: bool) -> list[int]:
    """Bytes of each tensor a one-rank save of ``model`` writes (float32; three per parameter with Adam state)."""
    sizes = [4 * math.prod(shape) for shape in parameter_shapes(model_config(model)).values()]
    return sizes * (3 if with_optimizer else 1)


def _optimizer_groups() -> list[dict]:
    return [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False}]


def _storage_writer(kind: str, out: str, writer: str | None) -> StorageWriter:
    """The DCP storage writer of a rank: FileSystemWriter for ``dcp``, the emitted module's (or the default
    ``ckpt_trace.writer``) for ``emitted``."""
    import torch.distributed.checkpoint as dcp

    if kind == "dcp":
        return dcp.FileSystemWriter(out)
    if writer is None:
        from ckpt_trace.writer.save import CheckpointWriter

        return CheckpointWriter(out)
    return load_writer_module(writer).make_writer(out)


def _storage_reader(kind: str, out: str, writer: str | None) -> StorageReader:
    """The DCP storage reader of a rank, as ``_storage_writer`` chooses the writer."""
    import torch.distributed.checkpoint as dcp

    if kind == "dcp":
        return dcp.FileSystemReader(out)
    if writer is None:
        from ckpt_trace.writer.load import CheckpointReader

        return CheckpointReader(out)
    return load_writer_module(writer).make_reader(out)


def load_writer_module(path: str):
    """Import an emitted writer module (``ckpt-trace emit -o PATH``) from its file. Raises WorkloadError."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None or not Path(path).is_file():
        raise WorkloadError(f"--writer {path}: not a Python module file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not all(hasattr(module, name) for name in ("make_writer", "make_reader")):
        raise WorkloadError(f"--writer {path}: has no make_writer/make_reader (write it with ckpt-trace emit)")
    return module


def _module(torch, names: list[str]):
    """An ``nn.Module`` whose submodules spell ``names`` (``h.0.attn.c_attn.weight``...), parameters unset."""
    root = torch.nn.Module()
    for name in names:
        *path, _ = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
    return root


def _adam_state(torch, mesh, cfg, rank: int, world: int, device: str = "cpu") -> dict:
    """This rank's ``{"model": ..., "optim": ...}`` after one real ``torch.optim.Adam`` step: a module of the
    model's DTensor row shards (the drawn weights), gradients the drawn ``exp_avg`` values, one step, then
    ``torch.distributed.checkpoint.state_dict.get_state_dict`` (FQN-keyed model and optimizer state, the
    optimizer's ``step``, ``exp_avg``, ``exp_avg_sq`` and ``param_groups``), as a training job saves."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor, Shard

    shapes = parameter_shapes(cfg)
    local = local_state(cfg, rank, world, True, device=device)
    module = _module(torch, list(shapes))

    def dtensor(name, tensor):
        shape = shapes[name]
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(tensor, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=stride)

    for name in shapes:
        *path, leaf = name.split(".")
        owner = module.get_submodule(".".join(path)) if path else module
        parameter = torch.nn.Parameter(dtensor(name, local["model"][name]))
        parameter.grad = dtensor(name, local["exp_avg"][name])
        owner.register_parameter(leaf, parameter)
    group = _optimizer_groups()[0]
    optimizer = torch.optim.Adam(
        module.parameters(),
        lr=group["lr"],
        betas=group["betas"],
        eps=group["eps"],
        weight_decay=group["weight_decay"],
        foreach=False,
    )
    optimizer.step()
    model_state, optim_state = get_state_dict(module, optimizer)
    return {"model": model_state, "optim": optim_state}


def _zeros_like(torch, value):
    """``value`` with every tensor zeroed (same type, shape, sharding): a load target."""
    if isinstance(value, dict):
        return {key: _zeros_like(torch, item) for key, item in value.items()}
    if isinstance(value, list):
        return [_zeros_like(torch, item) for item in value]
    return torch.zeros_like(value) if isinstance(value, torch.Tensor) else value


def _dcp_state(torch, mesh, cfg, rank: int, world: int, with_optimizer: bool, empty: bool, device: str = "cpu") -> dict:
    """This rank's state dict of DTensor row shards (zeros of the same shapes when ``empty``, a load target);
    with ``with_optimizer``, the model and a real Adam state after one step (``_adam_state``)."""
    from torch.distributed.tensor import DTensor, Shard

    if with_optimizer:
        state = _adam_state(torch, mesh, cfg, rank, world, device)
        return {key: _zeros_like(torch, item) for key, item in state.items()} if empty else state
    shapes = parameter_shapes(cfg)
    local = local_state(cfg, rank, world, with_optimizer, device=device)
    if empty:
        local = {kind: {name: torch.zeros_like(t) for name, t in tensors.items()} for kind, tensors in local.items()}

    def dtensor(name, tensor):
        shape = shapes[name]
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(tensor, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=stride)

    state = {"model": {name: dtensor(name, t) for name, t in local["model"].items()}}
    if with_optimizer:
        state["optim"] = {
            "state": {
                name: {
                    "step": torch.tensor(0.0 if empty else 1.0),
                    "exp_avg": dtensor(name, local["exp_avg"][name]),
                    "exp_avg_sq": dtensor(name, local["exp_avg_sq"][name]),
                }
                for name in shapes
            },
            "param_groups": _optimizer_groups(),
        }
    return state


def _same(torch, loaded, saved, where: str = "") -> None:
    """Raise WorkloadError at the first tensor (or value) of ``loaded`` that differs from ``saved``, bitwise."""
    if isinstance(saved, dict):
        for key, value in saved.items():
            _same(torch, loaded[key], value, f"{where}.{key}" if where else str(key))
        return
    if isinstance(saved, torch.Tensor):
        a = loaded.to_local() if hasattr(loaded, "to_local") else loaded
        b = saved.to_local() if hasattr(saved, "to_local") else saved
        if a.dtype != b.dtype or a.shape != b.shape:
            raise WorkloadError(
                f"loaded {where} differs from what was saved: {a.dtype} {tuple(a.shape)} against "
                f"{b.dtype} {tuple(b.shape)} (saved with the same model and optimizer state?)"
            )
        bytes_a, bytes_b = a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(bytes_a, bytes_b):
            wrong = (bytes_a.cpu() != bytes_b.cpu()).nonzero().reshape(-1)
            raise WorkloadError(
                f"loaded {where} differs from what was saved: {wrong.numel():,} of "
                f"{bytes_a.numel():,} bytes, the first at byte {int(wrong[0]):,}, the last at "
                f"{int(wrong[-1]):,} (saved with the same model and optimizer state?)"
            )
    elif loaded != saved:
        raise WorkloadError(f"loaded {where} differs from what was saved")


def _dcp_rank(
    rank: int,
    world: int,
    out: str,
    model: str,
    with_optimizer: bool,
    kind: str = "dcp",
    load: bool = False,
    writer: str | None = None,
    timings=None,
    device: str = "cpu",
) -> None:
    """One rank: build its state (or an empty target), then save (or load, then check); the save or load is
    timed from a barrier before it to one after it, and rank 0 puts the seconds on ``timings``."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import init_device_mesh

    torch = _torch()
    if device == "cuda":
        torch.cuda.set_device(_rank_device(torch, rank))
    dist.init_process_group("cpu:gloo,cuda:nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh(device, (world,))
        cfg = model_config(model)
        state = _dcp_state(torch, mesh, cfg, rank, world, with_optimizer, empty=load, device=device)
        reader = _storage_reader(kind, out, writer) if load else None
        storage_writer = None if load else _storage_writer(kind, out, writer)
        dist.barrier()
        started = time.perf_counter()
        if load:
            dcp.load(state, storage_reader=reader)
        else:
            dcp.save(state, storage_writer=storage_writer)
        dist.barrier()
        if rank == 0 and timings is not None:
            timings.put(time.perf_counter() - started)
        if load:
            _same(torch, state, _dcp_state(torch, mesh, cfg, rank, world, with_optimizer, empty=False, device=device))
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_process_group()


_EXIT_GATE = None  # in a rank that ``spawn_ranks`` started: the barrier every rank passes before it exits
_STORE_TIMEOUT_S = 1800  # torch.distributed's default for gloo groups
_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
# Seconds the other ranks get to end on their own once one failed; then they are killed (a peer blocked in the
# rendezvous or a collective would otherwise wait out the store's 30 minutes).
_PEER_GRACE_S = 10.0


def leave_process_group() -> None:
    """End this rank's part in the default process group once its work succeeded.

    Under ``spawn_ranks``: wait until every rank got here (a barrier through the parent, not through gloo),
    then leave the process at once (``os._exit(0)``, output flushed) without tearing gloo down: a rank that
    destroys its group or finalizes the interpreter while a peer is still closing its connections may
    abort in gloo's threads ("terminate called without an active exception", SIGABRT; seen about once in
    a few hundred 2-rank runs; pytorch#190489 and the abandoned pytorch#179291 describe the teardown races).
    Elsewhere (torchrun, one process): ``torch.distributed.destroy_process_group()``. A barrier broken by
    a failed peer (which the parent reports) is no error here."""
    import threading

    import torch.distributed as dist

    if _EXIT_GATE is None:
        dist.destroy_process_group()
        return
    try:
        _EXIT_GATE.wait()
    except threading.BrokenBarrierError:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _rank_main(target, errors, gate, rank: int, ranks: int, *args) -> None:
    """A rank process: Ctrl-C ends it quietly (SIGINT's default action, no traceback); a ckpt-trace error is
    handed to the parent (``errors``), which reports it in one line; ``gate`` is the exit barrier of
    ``leave_process_group``."""
    import logging

    global _EXIT_GATE
    _EXIT_GATE = gate

    from ckpt_trace.tracer.children import set_parent_death_signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    set_parent_death_signal()  # a workload killed outright takes its ranks with it (SIGTERM: the parent kills them)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # blocked by the parent while it started us
    logging.getLogger("torch.distributed.checkpoint").setLevel(logging.CRITICAL)  # its tracebacks: ours to report
    try:
        target(rank, ranks, *args)
    except CkptTraceError as err:
        errors.put((rank, str(err)))
        sys.exit(2)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: BLE001 - torch's own errors; DCP's CheckpointException is a BaseException
        errors.put((rank, _last_line(err)))
        sys.exit(2)


def _last_line(err: BaseException) -> str:
    """One line for a torch error, whose message may hold each rank's traceback: its last non-empty line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[-1] if lines else type(err).__name__)[:400]


def spawn_ranks(target, ranks: int, args: tuple = ()) -> None:
    """Run ``target(rank, ranks, *args)`` in ``ranks`` spawned processes, as torchrun starts them.

    Each process's environment carries RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT (the port of a TCPStore this process holds
    for the job's life). ``target`` must be importable by module path. Its
    ``init_process_group()`` (env://) meets the others in that store, as
    under torchrun, whose agent holds it (``TORCHELASTIC_USE_AGENT_STORE``);
    a target that joins a process group ends it with
    ``leave_process_group()`` once its work succeeded (the ranks then leave
    together). Once a rank fails, the others get ``_PEER_GRACE_S`` seconds
    to end, then are killed. Raises WorkloadError naming the ranks that
    exited non-zero; on Ctrl-C every rank is stopped before
    KeyboardInterrupt propagates.
    """
    _torch()
    from multiprocessing.connection import wait as wait_for

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    gate = ctx.Barrier(ranks)
    import datetime

    import torch.distributed as dist

    # The job's rendezvous store, held here for the job's life: its port (chosen by the kernel at bind) is
    # never free between its choice and the ranks' use of it, so two jobs on one host cannot meet in it.
    store = dist.TCPStore(
        "127.0.0.1", 0, ranks, True, timeout=datetime.timedelta(seconds=_STORE_TIMEOUT_S), wait_for_workers=False
    )
    saved_env = {
        key: os.environ.get(key)
        for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", _AGENT_STORE)
    }
    # Every rank a client of that store, as under torchrun, whose agent holds it (torch.distributed's env://
    # rendezvous reads TORCHELASTIC_USE_AGENT_STORE).
    os.environ.update(
        WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), **{_AGENT_STORE: "True"}
    )
    procs = []
    # Ctrl-C, SIGTERM and SIGHUP wait while the ranks start: a stop in the middle of a start would leave a
    # half-started rank that is in no list to kill, and that dies with a traceback on its truncated
    # bootstrap (``_rank_main`` unblocks them in each rank).
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        try:
            for rank in range(ranks):
                os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
                proc = ctx.Process(target=_rank_main, args=(target, errors, gate, rank, ranks, *args))
                proc.start()
                procs.append(proc)
        finally:
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a stop that came meanwhile is raised here
        running = {proc.sentinel: proc for proc in procs}
        failed_at, killed = None, False
        while running:
            timeout = None if failed_at is None or killed else max(0.0, failed_at + _PEER_GRACE_S - time.monotonic())
            ready = wait_for(list(running), timeout)
            if not ready:  # a rank failed and its peers are still waiting for it (a rendezvous, a collective)
                for proc in running.values():
                    proc.kill()
                killed = True
                continue
            for sentinel in ready:
                proc = running.pop(sentinel)
                proc.join()
                if proc.exitcode != 0:
                    gate.abort()  # the ranks waiting to exit together go now (the parent reports the failure)
                    failed_at = time.monotonic() if failed_at is None else failed_at
    except KeyboardInterrupt:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.join()
        raise
    failed = [rank for rank, proc in enumerate(procs) if proc.exitcode != 0]
    if failed:
        reasons = {}
        while not errors.empty():
            rank, message = errors.get()
            reasons.setdefault(rank, message)
        first = min(reasons) if reasons else failed[0]
        why = reasons.get(first, f"exited with code {procs[first].exitcode}")
        others = f" (and rank(s) {', '.join(str(r) for r in failed if r != first)})" if len(failed) > 1 else ""
        raise WorkloadError(f"rank {first}: {why}{others}")


def torchrun_rank(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) when this process is one rank of a job torchrun launched (torchrun's agent sets
    ``TORCHELASTIC_RUN_ID`` with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``), else None."""
    found = os.environ if env is None else env
    if not found.get("TORCHELASTIC_RUN_ID") or "RANK" not in found or "WORLD_SIZE" not in found:
        return None
    try:
        return int(found["RANK"]), int(found["WORLD_SIZE"])
    except ValueError:
        raise WorkloadError("torchrun's RANK or WORLD_SIZE is not a number") from None


class _Timings:
    """``_dcp_rank``'s timing sink in this process (rank 0 puts its seconds; other ranks time nothing)."""

    seconds = 0.0

    def put(self, seconds: float) -> None:
        self.seconds = seconds


def run_dcp(
    out: Path,
    ranks: int,
    model: str,
    with_optimizer: bool,
    kind: str = "dcp",
    load: bool = False,
    writer: str | None = None,
    device: str = "cpu",
) -> float:
    """Save (or ``load`` and check) with torch.distributed.checkpoint from ``ranks`` spawned gloo processes in
    ``out`` (under torchrun, ``torchrun_rank``: as this one rank of the launched job, which is what
    ``ckpt-trace record -- torchrun ... -m ckpt_trace.cli workload dcp`` records on each node); ``kind`` dcp uses FileSystemWriter/Reader, emitted the emitted writer (``writer``: its module).
    Returns the seconds of the save or load itself (barrier to barrier)."""
    import torch.multiprocessing as mp

    launched = torchrun_rank()
    if launched is not None:  # one rank of a job torchrun launched (on this node or another): this process
        rank, world = launched
        if ranks not in (1, world):
            raise WorkloadError(
                f"--ranks {ranks}: under torchrun the job has WORLD_SIZE={world} ranks (one per "
                "process); leave --ranks out"
            )
        timings = _Timings()
        try:
            _dcp_rank(rank, world, str(out), model, with_optimizer, kind, load, writer, timings, device)
        except WorkloadError:
            raise
        except BaseException as err:  # noqa: BLE001 - torch's own errors, as _rank_main reports them
            if isinstance(err, (KeyboardInterrupt, SystemExit)):
                raise
            raise WorkloadError(
                f"{'load' if load else 'save'} with {kind} failed: rank {rank}: {_last_line(err)}"
            ) from None
        return timings.seconds
    timings = mp.get_context("spawn").SimpleQueue()
    try:
        spawn_ranks(_dcp_rank, ranks, (str(out), model, with_optimizer, kind, load, writer, timings, device))
    except WorkloadError as err:
        raise WorkloadError(f"{'load' if load else 'save'} with {kind} failed: {err}") from None
    return timings.get()


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
            "param_groups": _optimizer_groups(),
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
    torch = _torch()
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
                _touch(torch, loaded)  # a mapped load reads on first access: count that in its time
        else:
            torch.save(state, path)
        io_s += time.perf_counter() - started
        if load:
            _same(torch, loaded, state)
    return io_s


def _touch(torch, value) -> None:
    """Read every byte of every tensor in ``value`` (a mapped load's pages fault in here)."""
    if isinstance(value, dict):
        for item in value.values():
            _touch(torch, item)
    elif isinstance(value, torch.Tensor) and value.numel():
        value.reshape(-1).view(torch.uint8).sum()


def _flat_safetensors(local: dict) -> dict:
    flat = {f"model.{k}": v for k, v in local["model"].items()}
    for kind in ("exp_avg", "exp_avg_sq"):
        flat.update({f"optim.{kind}.{k}": v for k, v in local[kind].items()})
    return flat


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
    torch = _torch()
    try:
        from safetensors.torch import load_file, save_file
    except ImportError:
        raise WorkloadError("this workload needs safetensors: pip install 'ckpt-trace[torch]'") from None
    flat = _flat_safetensors(local_state(model_config(model), 0, 1, with_optimizer, device=device))
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
            part = load_file(str(out / name), device=str(_rank_device(torch, 0)) if device == "cuda" else "cpu")
            _touch(torch, part)  # load_file maps the file: its pages are read on first access
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
        _same(torch, loaded, flat)
    return io_s


AIO_CHUNK_BYTES = 1 << 20  # FastPersist's default io_block_size (DeepSpeed docs, "aio" config): 1 MiB
AIO_QUEUE_DEPTH = 8  # and its queue_depth


def _flat_layout(flat: dict, align_bytes: int) -> tuple[dict, int]:
    """({name: (offset, bytes, shape)}, end) of ``flat``'s tensors laid out one after another in one file,
    each starting at a multiple of ``align_bytes``; ``end`` is rounded up to it too."""
    layout, end = {}, 0
    for name, tensor in flat.items():
        nbytes = tensor.numel() * tensor.element_size()
        layout[name] = (end, nbytes, list(tensor.shape))
        end = -(-(end + nbytes) // align_bytes) * align_bytes
    return layout, end


def run_libaio(out: Path, model: str, with_optimizer: bool, load: bool = False) -> float:
    """Write the flat tensors to ``out/model.aio.bin`` through native AIO with O_DIRECT, as DeepSpeed's
    FastPersist does: tensors copied into one page-aligned buffer (each at a 4 KiB-aligned offset), written
    in 1 MiB requests with 8 in flight, the file then cut to its exact size; ``model.aio.json`` indexes
    the tensors. ``load`` reads the file back the same way and checks every tensor."""
    torch = _torch()
    from ckpt_trace.iolayer import files
    from ckpt_trace.iolayer.aio import AioContext
    from ckpt_trace.iolayer.buffers import AlignedBuffer

    flat = _flat_safetensors(local_state(model_config(model), 0, 1, with_optimizer))
    path, index_path = out / "model.aio.bin", out / "model.aio.json"
    layout, end = _flat_layout(flat, align_bytes=4096)
    padded = max(4096, end)
    if load and not (path.exists() and index_path.exists()):
        raise WorkloadError(f"nothing to load: {path} or {index_path.name} is missing (run the save first)")
    buf = AlignedBuffer(padded)
    view = buf.view()
    try:
        if not load:
            for name, (offset, nbytes, _) in layout.items():
                view[offset : offset + nbytes] = flat[name].contiguous().view(torch.uint8).numpy().tobytes()
        started = time.perf_counter()
        opened = files.open_file(path, os.O_RDONLY if load else os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct=True)
        try:
            with AioContext(AIO_QUEUE_DEPTH) as ctx:
                sizes = {}
                for tag, offset in enumerate(range(0, padded, AIO_CHUNK_BYTES)):
                    if ctx.in_flight == AIO_QUEUE_DEPTH:
                        _aio_check(ctx.reap(1), sizes, load)
                    sizes[tag] = min(AIO_CHUNK_BYTES, padded - offset)
                    ctx.submit("read" if load else "write", opened.fd, buf.ptr + offset, sizes[tag], offset, tag)
                while ctx.in_flight:
                    _aio_check(ctx.reap(ctx.in_flight), sizes, load)
                if not load:
                    os.ftruncate(opened.fd, end)
                    os.fsync(opened.fd)
        finally:
            os.close(opened.fd)
        if not load:
            index_path.write_text(json.dumps({name: list(entry) for name, entry in layout.items()}))
        io_s = time.perf_counter() - started
        if load:
            loaded = {
                name: torch.frombuffer(bytearray(view[offset : offset + nbytes]), dtype=flat[name].dtype).reshape(shape)
                for name, (offset, nbytes, shape) in layout.items()
            }
            _same(torch, loaded, flat)
    finally:
        view.release()
        buf.close()
    return io_s


def run_memmap(out: Path, model: str, with_optimizer: bool, load: bool = False) -> float:
    """Write the flat tensors into ``out/model.mmap.bin`` through a shared mapping (``numpy.memmap`` mode
    ``w+``: the file is sized, mapped, filled, msynced by ``flush``, unmapped) and index them in
    ``model.mmap.json``; ``load`` maps the file read-only, copies every tensor out and checks it."""
    torch = _torch()
    import numpy as np

    flat = _flat_safetensors(local_state(model_config(model), 0, 1, with_optimizer))
    path, index_path = out / "model.mmap.bin", out / "model.mmap.json"
    layout, end = _flat_layout(flat, align_bytes=1)
    if load and not (path.exists() and index_path.exists()):
        raise WorkloadError(f"nothing to load: {path} or {index_path.name} is missing (run the save first)")
    started = time.perf_counter()
    mapped = np.memmap(path, dtype=np.uint8, mode="r" if load else "w+", shape=(max(1, end),))
    try:
        if load:
            loaded = {
                name: torch.from_numpy(np.array(mapped[offset : offset + nbytes])).view(flat[name].dtype).reshape(shape)
                for name, (offset, nbytes, shape) in layout.items()
            }
        else:
            for name, (offset, nbytes, _) in layout.items():
                mapped[offset : offset + nbytes] = flat[name].contiguous().view(torch.uint8).reshape(-1).numpy()
            mapped.flush()
    finally:
        # munmap now, not at garbage collection; numpy's stubs do not declare memmap's _mmap (the mmap.mmap)
        mapped._mmap.close()  # pyright: ignore[reportAttributeAccessIssue]
        del mapped
    if not load:
        index_path.write_text(json.dumps({name: list(entry) for name, entry in layout.items()}))
    io_s = time.perf_counter() - started
    if load:
        _same(torch, loaded, flat)
    return io_s


def _aio_check(done, sizes: dict, load: bool) -> None:
    """Raise WorkloadError for a failed request or a short write (a read may end at the end of the file)."""
    for completion in done:
        if completion.res < 0 or (not load and completion.res != sizes[completion.tag]):
            detail = os.strerror(-completion.res) if completion.res < 0 else f"{completion.res} B written"
            raise WorkloadError(f"a native AIO {'read' if load else 'write'} failed: {detail}")


@dataclass(frozen=True)
class WorkloadArgs:
    """What ``run`` was asked for, handed to a workload's function (each takes what applies to it)."""

    out: Path
    ranks: int = 1
    model: str = "gpt2-small"
    with_optimizer: bool = False
    file_per_layer: bool = False
    load: bool = False
    mmap: bool = False
    writer: str | None = None
    shards: int = 1
    device: str = "cpu"


@dataclass(frozen=True)
class Workload:
    """One built-in workload: ``run(args)`` saves (or with ``args.load`` loads and checks) and returns the
    seconds of the I/O itself. ``options``: the engine-specific options it takes, of ``ranks``,
    ``file_per_layer``, ``mmap`` (with ``load`` only), ``writer`` and ``shards``; ``cuda``: its state can live
    on the GPU; ``committed``: the file a finished save leaves, which a load needs first (None: not checked)."""

    name: str
    run: Callable[[WorkloadArgs], float]
    options: frozenset[str] = frozenset()
    cuda: bool = False
    committed: str | None = None


#: Every built-in workload by name, in the CLI's order: the one table ``run``, the CLI's choices and the
#: messages read (an unknown name is an error, never a default). A new workload is one more entry (its
#: function may live in its own module).
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "dcp",
            lambda a: run_dcp(a.out, a.ranks, a.model, a.with_optimizer, "dcp", a.load, a.writer, a.device),
            frozenset({"ranks"}),
            cuda=True,
            committed=".metadata",
        ),
        Workload(
            "torch-save",
            lambda a: run_torch_save(a.out, a.model, a.with_optimizer, a.file_per_layer, a.load, a.mmap, a.device),
            frozenset({"file_per_layer", "mmap"}),
            cuda=True,
        ),
        Workload(
            "safetensors",
            lambda a: run_safetensors(a.out, a.model, a.with_optimizer, a.load, a.shards, a.device),
            frozenset({"shards"}),
            cuda=True,
        ),
        Workload(
            "emitted",
            lambda a: run_dcp(a.out, a.ranks, a.model, a.with_optimizer, "emitted", a.load, a.writer, a.device),
            frozenset({"ranks", "writer"}),
            cuda=True,
            committed="ckpt-trace.metadata",
        ),
        Workload("libaio", lambda a: run_libaio(a.out, a.model, a.with_optimizer, a.load)),
        Workload("memmap", lambda a: run_memmap(a.out, a.model, a.with_optimizer, a.load)),
    )
}
ENGINES = tuple(WORKLOADS)
#: The workloads that take --ranks (DCP's) and those whose state can live on the GPU: read from the table.
DCP_ENGINES = tuple(name for name, w in WORKLOADS.items() if "ranks" in w.options)
CUDA_ENGINES = tuple(name for name, w in WORKLOADS.items() if w.cuda)


def workload(name: str) -> Workload:
    """The built-in workload called ``name``. Raises WorkloadError for an unknown name."""
    spec = WORKLOADS.get(name)
    if spec is None:
        raise WorkloadError(f"unknown workload {name!r} (choose from {', '.join(ENGINES)})")
    return spec


def _takers(option: str, *, bare: bool = False) -> str:
    """The workloads that take ``option``, for a message: 'the dcp and emitted workloads only' (``bare``:
    'dcp and emitted')."""
    names = " and ".join(name for name, w in WORKLOADS.items() if option in w.options)
    return names if bare else f"the {names} workload{'s' if ' and ' in names else ''} only"


def _check_cuda(engine: str, ranks: int) -> None:
    """Raise WorkloadError unless ``--device cuda`` can run ``engine`` with ``ranks`` here."""
    if engine not in CUDA_ENGINES:
        raise WorkloadError(f"--device cuda applies to the {', '.join(CUDA_ENGINES)} workloads")
    torch = _torch()
    if not torch.cuda.is_available():
        raise WorkloadError("--device cuda: no CUDA GPU here (torch.cuda.is_available() is false)")
    if ranks > torch.cuda.device_count():
        raise WorkloadError(
            f"--device cuda: {ranks} ranks need {ranks} GPUs (NCCL), this machine has {torch.cuda.device_count()}"
        )


def run(
    engine: str,
    out: Path,
    *,
    ranks: int = 1,
    model: str = "gpt2-small",
    with_optimizer: bool = False,
    file_per_layer: bool = False,
    load: bool = False,
    mmap: bool = False,
    writer: str | None = None,
    shards: int = 1,
    device: str = "cpu",
) -> tuple[Path, float]:
    """Run a built-in workload (a save, or with ``load`` a checked load of that save); returns the checkpoint
    directory and the seconds of the save or load itself (for DCP, barrier to barrier; for torch.load and
    load_file, until every tensor's bytes were read).

    Raises WorkloadError for an unknown engine or model, ranks < 1, options of
    another engine (``--file-per-layer`` and ``--mmap`` are torch-save's,
    ``--writer`` emitted's, ``--ranks`` the DCP engines'), a failed save, or a
    load that finds a tensor different from what was saved.
    """
    spec = workload(engine)
    if file_per_layer and "file_per_layer" not in spec.options:
        raise WorkloadError(f"--file-per-layer applies to {_takers('file_per_layer')}")
    if mmap and ("mmap" not in spec.options or not load):
        raise WorkloadError(
            f"--mmap applies to {_takers('mmap', bare=True)} --load only (safetensors maps its file anyway)"
        )
    if writer is not None and "writer" not in spec.options:
        raise WorkloadError(f"--writer applies to {_takers('writer')}")
    if ranks < 1:
        raise WorkloadError("--ranks must be at least 1")
    if device not in DEVICES:
        raise WorkloadError(f"unknown --device {device!r} (choose from {', '.join(DEVICES)})")
    if device == "cuda":
        _check_cuda(engine, ranks)
    if shards < 1:
        raise WorkloadError("--shards must be at least 1")
    if shards != 1 and "shards" not in spec.options:
        raise WorkloadError(f"--shards applies to {_takers('shards')}")
    if ranks != 1 and "ranks" not in spec.options:
        raise WorkloadError(f"--ranks applies to {_takers('ranks')}")
    model_config(model)
    if writer is not None:
        load_writer_module(writer)
    out = Path(out)
    if load and spec.committed is not None:
        committed = out / spec.committed
        if not committed.exists():
            raise WorkloadError(
                f"nothing to load: {out} holds no {engine} checkpoint ({committed.name} is missing; run the save first)"
            )
    out.mkdir(parents=True, exist_ok=True)
    try:
        io_s = spec.run(
            WorkloadArgs(out, ranks, model, with_optimizer, file_per_layer, load, mmap, writer, shards, device)
        )
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; a partial checkpoint may remain in {out}") from None
    return out, io_s
