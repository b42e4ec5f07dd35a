"""What the built-in workloads share: their declaration (``Workload``, ``WorkloadArgs``), the model and Adam
state they save (drawn from fixed seeds, so a load regenerates it and checks every byte), DCP's ranks
started as torchrun starts them, and the flat-tensor helpers. Each workload is one module of
``ckpt_trace.workloads.builtin`` (its table, ``run``, and the recipe for adding one: docs/ARCHITECTURE.md).

DCP ranks are started like torchrun starts them: one spawned process per
rank whose environment carries RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT, so a tracer reads each process's rank from its environment.
Each rank holds a 1/N row shard of every tensor as a DTensor over a gloo
device mesh, the way FSDP2 shards parameters, and calls ``dcp.save``
(``run_dcp``: the ``dcp`` workload with FileSystemWriter/Reader, the
``emitted`` one with an emitted writer module's or ``ckpt_trace.writer``'s).
torch is imported lazily (``require_torch``; ``pip install ckpt-trace[torch]``).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_trace.errors import CkptTraceError, WorkloadError

from .models import MODELS, GPT2Config, parameter_shapes

if TYPE_CHECKING:
    from torch.distributed.checkpoint import StorageReader, StorageWriter

DEVICES = ("cpu", "cuda")


def require_torch():
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
    torch = require_torch()
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
        where = rank_device(torch, rank)
        state = {kind: {name: t.to(where) for name, t in tensors.items()} for kind, tensors in state.items()}
    return state


def rank_device(torch, rank: int):
    """This rank's GPU: ``cuda:<rank modulo the GPUs present>``."""
    return torch.device("cuda", rank % torch.cuda.device_count())


def tensor_bytes(model: str, with_optimizer: bool) -> list[int]:
    """Bytes of each tensor a one-rank save of ``model`` writes (float32; three per parameter with Adam state)."""
    sizes = [4 * math.prod(shape) for shape in parameter_shapes(model_config(model)).values()]
    return sizes * (3 if with_optimizer else 1)


def optimizer_groups() -> list[dict]:
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
    group = optimizer_groups()[0]
    optimizer = torch.optim.Adam(
        module.parameters(),
        lr=group["lr"],
        betas=group["betas"],
        eps=group["eps"],
        weight_decay=group["weight_decay"],
        foreach=False,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # every element by this thread: the same bits in every process that computes it
    try:
        optimizer.step()
    finally:
        torch.set_num_threads(threads)
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
            "param_groups": optimizer_groups(),
        }
    return state


def check_same(torch, loaded, saved, where: str = "") -> None:
    """Raise WorkloadError at the first tensor (or value) of ``loaded`` that differs from ``saved``, bitwise."""
    if isinstance(saved, dict):
        for key, value in saved.items():
            check_same(torch, loaded[key], value, f"{where}.{key}" if where else str(key))
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
    saves: int = 1,
) -> None:
    """One rank: build its state (or an empty target), then save (``saves`` times in a row into ``out``, each
    overwriting the one before, as a job that checkpoints every few steps keeping one) or load, then check;
    the saves or the load are timed from a barrier before them to one after them, and rank 0 puts the seconds
    on ``timings``."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import init_device_mesh

    torch = require_torch()
    if device == "cuda":
        torch.cuda.set_device(rank_device(torch, rank))
    dist.init_process_group("cpu:gloo,cuda:nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh(device, (world,))
        cfg = model_config(model)
        # What a load must give back: computed first, as the save computed it, before anything of the load
        # ran in this process (a check computed after the load differed from the saved bytes twice in
        # ~20 runs of the suite, in the first half of a rank's shard of model.wte.weight, cause unknown)
        expected = (
            _dcp_state(torch, mesh, cfg, rank, world, with_optimizer, empty=False, device=device) if load else None
        )
        state = _dcp_state(torch, mesh, cfg, rank, world, with_optimizer, empty=load, device=device)
        reader = _storage_reader(kind, out, writer) if load else None
        storage_writer = None if load else _storage_writer(kind, out, writer)
        dist.barrier()
        started = time.perf_counter()
        if load:
            dcp.load(state, storage_reader=reader)
        else:
            dcp.save(state, storage_writer=storage_writer)
            with warnings.catch_warnings():  # the overwrite is meant: FileSystemWriter's own file names, ours
                warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
                for _ in range(saves - 1):
                    dcp.save(state, storage_writer=_storage_writer(kind, out, writer))
        dist.barrier()
        if rank == 0 and timings is not None:
            timings.put(time.perf_counter() - started)
        if load:
            check_same(torch, state, expected)
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


@contextlib.contextmanager
def _stops_deferred() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block ends, then raise the first that came (its own handler
    runs, as if it came then).

    Two holds, because either alone leaks: the signal mask (pthread_sigmask(2)) of this thread, which the
    ranks started meanwhile inherit across execve(2) (``_rank_main`` unblocks it), does not hold a signal the
    kernel hands to another thread of the process (the TCPStore's threads), whose C handler still marks it
    for Python's handler in this thread (Python's signal module docs, "Execution of Python signal
    handlers"); so, in this thread only, the Python handlers are swapped for one that notes the signal. A
    stop inside ``Process.start()`` otherwise leaves a spawned rank reading a truncated bootstrap (EOFError
    traceback) and in no list to kill (seen in CI once in a few hundred runs).
    """
    noted: list[int] = []
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if handler is not None:  # None: a handler not installed from Python, which cannot be put back
                previous[signum] = handler
                signal.signal(signum, lambda got, _frame: noted.append(got))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # one that came meanwhile is noted here
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        if noted:
            signal.raise_signal(noted[0])


def leave_process_group() -> None:
    """End this rank's part in the default process group once its work succeeded.

    Under ``spawn_ranks``: wait until every rank got here (a barrier through the parent, not through gloo),
    then leave the process at once (``os._exit(0)``, output flushed) without tearing gloo down: a rank that
    destroys its group or finalizes the interpreter while a peer is still closing its connections may
    abort in gloo's threads ("terminate called without an active exception", SIGABRT; seen about once in
    a few hundred 2-rank runs; pytorch#190489 and the abandoned pytorch#179291 describe the teardown races).
    Elsewhere (torchrun, one process): ``torch.distributed.destroy_process_group()``. A barrier broken by
    a failed peer (which the parent reports) is no error here."""
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
    require_torch()
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
    try:
        # Ctrl-C, SIGTERM and SIGHUP wait while the ranks start: a stop in the middle of a start would leave a
        # half-started rank that is in no list to kill, and that dies with a traceback on its truncated
        # bootstrap.
        with _stops_deferred():
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
    saves: int = 1,
) -> float:
    """Save (``saves`` times in a row, each overwriting the last; or ``load`` and check) with
    torch.distributed.checkpoint from ``ranks`` spawned gloo processes in
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
            _dcp_rank(rank, world, str(out), model, with_optimizer, kind, load, writer, timings, device, saves)
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
        spawn_ranks(_dcp_rank, ranks, (str(out), model, with_optimizer, kind, load, writer, timings, device, saves))
    except WorkloadError as err:
        raise WorkloadError(f"{'load' if load else 'save'} with {kind} failed: {err}") from None
    return timings.get()


def touch_tensors(torch, value) -> None:
    """Read every byte of every tensor in ``value`` (a mapped load's pages fault in here)."""
    if isinstance(value, dict):
        for item in value.values():
            touch_tensors(torch, item)
    elif isinstance(value, torch.Tensor) and value.numel():
        value.reshape(-1).view(torch.uint8).sum()


def flat_tensors(local: dict) -> dict:
    flat = {f"model.{k}": v for k, v in local["model"].items()}
    for kind in ("exp_avg", "exp_avg_sq"):
        flat.update({f"optim.{kind}.{k}": v for k, v in local[kind].items()})
    return flat


def flat_layout(flat: dict, align_bytes: int) -> tuple[dict, int]:
    """({name: (offset, bytes, shape)}, end) of ``flat``'s tensors laid out one after another in one file,
    each starting at a multiple of ``align_bytes``; ``end`` is rounded up to it too."""
    layout, end = {}, 0
    for name, tensor in flat.items():
        nbytes = tensor.numel() * tensor.element_size()
        layout[name] = (end, nbytes, list(tensor.shape))
        end = -(-(end + nbytes) // align_bytes) * align_bytes
    return layout, end


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
    saves: int = 1


#: The engine-specific options a workload may take (``Workload.options``): ``WorkloadArgs``' fields.
OPTIONS = ("ranks", "file_per_layer", "mmap", "writer", "shards", "saves")


@dataclass(frozen=True)
class Workload:
    """One built-in workload's declaration (``WORKLOAD = Workload(...)`` in its module of
    ``ckpt_trace.workloads.builtin``).

    ``run(args)`` saves into ``args.out`` (or with ``args.load`` loads what a save left there and checks every
    tensor) and returns the seconds of the I/O itself; it raises WorkloadError (a missing engine: one line
    saying what to install). ``summary``: one line for listings. ``options``: the engine-specific options it
    takes, of ``OPTIONS`` (``mmap`` with ``load`` only); ``cuda``: its state can live on the GPU;
    ``committed``: the file a finished save leaves, which a load needs first (None: not checked); ``order``:
    its place in the CLI's choices and listings."""

    name: str
    run: Callable[[WorkloadArgs], float]
    summary: str = ""
    options: frozenset[str] = frozenset()
    cuda: bool = False
    committed: str | None = None
    order: int = 100
