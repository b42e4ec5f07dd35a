"""``synth``: the trace of a DCP save of a model too large to run here, from DCP's own planner and writer.

What runs is DCP's code, not a model of it:

1. **Plan** (``torch.distributed.checkpoint``'s ``DefaultSavePlanner``): for each simulated rank, a state dict
   of ``meta``-device DTensors (no memory), row-sharded (``Shard(0)``) over a 1-D mesh of the ranks as the
   ``workload dcp`` state is, under a fake process group (``torch.testing._internal.distributed.fake_pg``'s
   ``FakeStore``: no peers, no network); ``create_local_plan``, the ``FileSystemWriter``'s
   ``prepare_local_plan``, then the coordinator's ``create_global_plan`` (deduplication of replicated
   items, the checkpoint's ``Metadata``) and ``prepare_global_plan`` (one file prefix per rank).
2. **Write**: each rank's ``finish_plan`` and ``FileSystemWriter.write_data`` run for real, on CPU tensors
   of the rank's shapes that are allocated but never touched (``torch.empty``: pages the kernel has not
   mapped), into a file system stand-in (``RecordingFileSystem``) whose files are Python's own
   ``io.BufferedWriter`` over a raw file that counts bytes and logs each call as the raw ``FileIO`` would
   make it (``write`` as write(2), with Linux's 2 GiB - 4 KiB cap per call; ``tell``/``seek`` as lseek(2));
   ``torch.save`` hands the writer memoryviews of the tensors, so no byte is copied, and its CRC-32 is off
   (``torch.serialization.set_crc32_options``) so none is read. ``fsync`` on those files is logged,
   not run. The coordinator's ``finish`` writes ``.metadata`` the same way.

So the trace has the files, sizes and offsets DCP would write at that size, and the op pattern of the
recorded DCP writer (opens, buffered writes, lseeks from ``tell``, an fsync per file, the ``.metadata``
rename). Times are placeholders: each rank's operations 1 us apart, all ranks from 0 (``replay`` runs them as
fast as it can; ``--timing original`` would replay these gaps).

Models: ``llama3-8b``, ``llama3-70b``, ``llama3-405b`` (Llama 3's published configurations, Hugging Face
``LlamaForCausalLM`` names; weights bf16; ``adam``: fp32 ``exp_avg`` and ``exp_avg_sq`` and a ``step``
per parameter, as ``workload dcp --with-optimizer`` saves) and the GPT-2 shapes of ``workload`` (fp32, to
check a synthesised save against a recorded one).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_trace.errors import WorkloadError

from .models import MODELS, parameter_shapes

# Llama 3 (Meta's published params.json; HF LlamaConfig): hidden size, layers, attention heads, key/value
# heads, MLP size, vocabulary. Untied input and output embeddings.
LLAMA3 = {
    "llama3-8b": {"dim": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256},
    "llama3-70b": {"dim": 8192, "layers": 80, "heads": 64, "kv_heads": 8, "ffn": 28672, "vocab": 128256},
    "llama3-405b": {"dim": 16384, "layers": 126, "heads": 128, "kv_heads": 8, "ffn": 53248, "vocab": 128256},
}
MODEL_NAMES = tuple(LLAMA3) + tuple(MODELS)
OPTIMIZERS = ("none", "adam")
MAX_RW_COUNT = 0x7FFFF000  # Linux moves at most this many bytes per read/write call (fs/read_write.c)
OP_GAP_NS = 1000
O_WRONLY, O_CREAT, O_TRUNC, O_CLOEXEC = os.O_WRONLY, os.O_CREAT, os.O_TRUNC, 0o2000000


def llama3_shapes(name: str) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of a Llama 3 model (Hugging Face ``LlamaForCausalLM`` names)."""
    c = LLAMA3[name]
    dim, head_dim = c["dim"], c["dim"] // c["heads"]
    kv = c["kv_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c["vocab"], dim)}
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (dim, dim),
                p + "self_attn.k_proj.weight": (kv, dim),
                p + "self_attn.v_proj.weight": (kv, dim),
                p + "self_attn.o_proj.weight": (dim, dim),
                p + "mlp.gate_proj.weight": (c["ffn"], dim),
                p + "mlp.up_proj.weight": (c["ffn"], dim),
                p + "mlp.down_proj.weight": (dim, c["ffn"]),
                p + "input_layernorm.weight": (dim,),
                p + "post_attention_layernorm.weight": (dim,),
            }
        )
    shapes["model.norm.weight"] = (dim,)
    shapes["lm_head.weight"] = (c["vocab"], dim)
    return shapes


def model_layout(name: str) -> tuple[dict[str, tuple[int, ...]], str]:
    """(parameter shapes, weight dtype name) of a model. Raises WorkloadError for an unknown model."""
    if name in LLAMA3:
        return llama3_shapes(name), "bfloat16"
    if name in MODELS:
        return parameter_shapes(MODELS[name]), "float32"
    raise WorkloadError(f"unknown model {name!r} (choose from {', '.join(MODEL_NAMES)})")


def arithmetic(name: str, optimizer: str) -> dict[str, Any]:
    """The expected data bytes: parameters x weight dtype bytes (+ 2 x 4 bytes per parameter for Adam's fp32
    moments, + 4 bytes per parameter tensor for its fp32 ``step``, saved once)."""
    shapes, dtype = model_layout(name)
    params = sum(math.prod(s) for s in shapes.values())
    weight_bytes = params * (2 if dtype == "bfloat16" else 4)
    adam_bytes = params * 8 if optimizer == "adam" else 0
    steps = len(shapes) * 4 if optimizer == "adam" else 0
    return {
        "parameters": params,
        "parameter_tensors": len(shapes),
        "weight_dtype": dtype,
        "weight_bytes": weight_bytes,
        "adam_state_bytes": adam_bytes,
        "step_bytes": steps,
        "expected_bytes": weight_bytes + adam_bytes + steps,
        "formula": f"{params:,} parameters x {2 if dtype == 'bfloat16' else 4} B ({dtype})"
        + (
            f" + {params:,} x 2 x 4 B (fp32 exp_avg, exp_avg_sq) + {len(shapes)} x 4 B (step)"
            if optimizer == "adam"
            else ""
        ),
    }


# -- the recording file system ----------------------------------------------------------------------------------

_TOKENS = itertools.count(1 << 20)  # what a recording file's fileno() returns: unique across ranks


class _Log:
    """One rank's operations, in the order they were made: (op, path, offset, size, ret, flags, new_path, fd).
    Descriptors are numbered per rank from 10; ``tokens`` maps a file's ``fileno()`` to (fd, path)."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.tokens: dict[int, tuple[int, str]] = {}
        self._next_fd = 10

    def fd(self, path: str) -> tuple[int, int]:
        """(descriptor, fileno token) of a newly opened ``path``."""
        fd, token = self._next_fd, next(_TOKENS)
        self._next_fd += 1
        self.tokens[token] = (fd, path)
        return fd, token


class LoggedRaw(io.RawIOBase):
    """A raw file whose position calls are logged as ``FileIO`` makes them as system calls (open at
    construction with ``flags``, lseek, close); subclasses add the data calls. ``size()`` is what SEEK_END
    seeks from."""

    def __init__(self, log: _Log, path: str, flags: int) -> None:
        super().__init__()
        self.log, self.path, self.pos = log, path, 0
        self._fd, self._token = log.fd(path)
        log.ops.append(("open", path, None, None, self._fd, flags, None, self._fd))

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size()}[whence]
        self.pos = base + offset
        self.log.ops.append(("lseek", self.path, self.pos, None, self.pos, whence, None, self._fd))
        return self.pos

    def tell(self) -> int:
        return self.seek(0, io.SEEK_CUR)

    def close(self) -> None:
        if not self.closed:
            self.log.ops.append(("close", self.path, None, None, 0, None, None, self._fd))
        super().close()


class _RecordingRaw(LoggedRaw):
    """A raw file that keeps no bytes: its calls are logged as ``FileIO`` makes them as system calls."""

    def __init__(self, log: _Log, path: str) -> None:
        super().__init__(log, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC)

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._token

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        moved = min(size, MAX_RW_COUNT)
        self.log.ops.append(("write", self.path, self.pos, size, moved, None, None, self._fd))
        self.pos += moved
        return moved


def _recording_fs(log: _Log, buffer_bytes: int):
    """A ``FileSystem`` stand-in for DCP's writer: streams are ``io.BufferedWriter``s of ``buffer_bytes``
    (Python's ``open`` takes the file system's st_blksize) over ``_RecordingRaw``."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class RecordingFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path, mode):
            stream = io.BufferedWriter(_RecordingRaw(log, str(path)), buffer_size=buffer_bytes)
            try:
                yield stream
            finally:
                stream.close()

        def mkdir(self, path) -> None:
            log.ops.append(("mkdir", str(path), None, None, 0, 0o777, None, None))

        def rename(self, path, new_path) -> None:
            log.ops.append(("rename", str(path), None, None, 0, None, str(new_path), None))

        def exists(self, path) -> bool:
            return False

        def rm_file(self, path) -> None:
            log.ops.append(("unlink", str(path), None, None, 0, None, None, None))

    return RecordingFileSystem()


class _FsyncLogged:
    """``os`` as DCP's filesystem module sees it while synthesising: ``fsync`` of a recording file logged."""

    def __init__(self, logs: dict[int, _Log]) -> None:
        self._logs = logs

    def __getattr__(self, name: str):
        return getattr(os, name)

    def fsync(self, fd: int) -> None:
        for log in self._logs.values():
            if fd in log.tokens:
                own, path = log.tokens[fd]
                log.ops.append(("fsync", path, None, None, 0, None, None, own))
                return
        raise OSError(9, "not a recording file")


@contextlib.contextmanager
def _synthesising(logs: dict[int, _Log]) -> Iterator[None]:
    """torch.save without CRC-32 (no tensor byte is read) and DCP's fsync logged, restored afterwards."""
    import torch
    import torch.distributed.checkpoint.filesystem as dcp_fs

    crc, real_os = torch.serialization.get_crc32_options(), dcp_fs.os
    torch.serialization.set_crc32_options(False)
    dcp_fs.os = _FsyncLogged(logs)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(crc)
        dcp_fs.os = real_os


@contextlib.contextmanager
def _fake_rank(rank: int, world: int):
    """A fake process group of ``world`` in which this process is ``rank``, and its 1-D CPU mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield DeviceMesh("cpu", list(range(world)))
    finally:
        dist.destroy_process_group()


def _state(mesh, shapes: dict, dtype_name: str, optimizer: str, device: str) -> dict:
    """A rank's state dict as ``workload dcp`` builds it (``engines._dcp_state``): row-sharded DTensors of
    ``device`` tensors (``meta``: no memory; ``cpu``: allocated, never touched)."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    from .engines import _shard_rows, optimizer_groups

    rank, world = mesh.get_local_rank(), mesh.size()
    weight_dtype = getattr(torch, dtype_name)

    def dtensor(shape, dtype):
        _, rows = _shard_rows(shape[0], rank, world)
        local = torch.empty((rows,) + tuple(shape[1:]), dtype=dtype, device=device)
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape), stride=stride)

    state: dict[str, Any] = {"model": {name: dtensor(shape, weight_dtype) for name, shape in shapes.items()}}
    if optimizer == "adam":
        state["optim"] = {
            "state": {
                name: {
                    "step": torch.tensor(1.0),
                    "exp_avg": dtensor(shape, torch.float32),
                    "exp_avg_sq": dtensor(shape, torch.float32),
                }
                for name, shape in shapes.items()
            },
            "param_groups": _param_groups(torch, list(shapes), optimizer_groups()[0]),
        }
    return state


def _param_groups(torch, names: list[str], group: dict) -> list[dict]:
    """The ``param_groups`` a training job's ``get_state_dict`` saves for Adam (``workload dcp
    --with-optimizer``: ``torch.optim.Adam(..., foreach=False)``): every option Adam keeps, then the
    parameters' FQNs."""
    probe = torch.optim.Adam(
        [torch.nn.Parameter(torch.zeros(1))],
        lr=group["lr"],
        betas=group["betas"],
        eps=group["eps"],
        weight_decay=group["weight_decay"],
        foreach=False,
    )
    saved = dict(probe.state_dict()["param_groups"][0])
    saved["params"] = list(names)
    return [saved]


@dataclass(frozen=True)
class Synthesis:
    """A synthesised save: per rank its operations (``_Log.ops``), the figures, the seconds it took."""

    logs: dict[int, list[tuple]]
    figures: dict[str, Any]


def synthesize_dcp(
    model: str,
    ranks: int,
    optimizer: str = "none",
    *,
    out: str = "/checkpoint",
    buffer_bytes: int = 4096,
    thread_count: int = 1,
) -> Synthesis:
    """Plan and write (into ``RecordingFileSystem``) a DCP save of ``model`` by ``ranks`` ranks (module
    docstring). ``buffer_bytes``: Python's buffer for each file (the target's st_blksize). Raises
    WorkloadError for an unknown model or optimizer, ranks < 1, or without torch."""
    if optimizer not in OPTIMIZERS:
        raise WorkloadError(f"unknown optimizer {optimizer!r} (choose from {', '.join(OPTIMIZERS)})")
    if ranks < 1:
        raise WorkloadError("--ranks must be at least 1")
    shapes, dtype_name = model_layout(model)
    try:
        import torch.distributed.checkpoint  # noqa: F401
    except ImportError:
        raise WorkloadError("synth needs torch: pip install 'ckpt-trace[torch]'") from None
    started = time.perf_counter()
    logs, results, metadata, planned_s = plan_and_write(
        lambda mesh, device: _state(mesh, shapes, dtype_name, optimizer, device),
        ranks,
        out=out,
        buffer_bytes=buffer_bytes,
        thread_count=thread_count,
    )
    elapsed = time.perf_counter() - started
    data_bytes = sum(r.size_in_bytes for rank_results in results for r in rank_results)
    expected = arithmetic(model, optimizer)
    stored = sum(
        int(np.prod(chunk.sizes)) * _itemsize(md.properties.dtype)
        for md in metadata.state_dict_metadata.values()
        if hasattr(md, "chunks")
        for chunk in md.chunks
    )
    figures = {
        "model": model,
        "ranks": ranks,
        "optimizer": optimizer,
        "out": str(out),
        "buffer_bytes": buffer_bytes,
        "thread_count": thread_count,
        "arithmetic": expected,
        "tensor_bytes": stored,
        "data_bytes": data_bytes,
        "serialisation_overhead_bytes": data_bytes - stored,
        "difference_from_arithmetic": (data_bytes - expected["expected_bytes"]) / expected["expected_bytes"],
        "files": sorted({op[1] for log in logs.values() for op in log.ops if op[0] == "open"}),
        "plan_s": planned_s,
        "elapsed_s": elapsed,
    }
    return Synthesis(logs={rank: log.ops for rank, log in logs.items()}, figures=figures)


def plan_and_write(
    state_of, ranks: int, *, out: str, buffer_bytes: int, thread_count: int = 1, planner=None
) -> tuple[dict[int, _Log], list, Any, float]:
    """Steps 1 and 2 of the module docstring for any state dict: ``state_of(mesh, device)`` is a simulated
    rank's state dict (``device`` ``meta`` to plan, ``cpu`` to write); ``planner`` makes the save planner
    (default ``DefaultSavePlanner``). Returns (each rank's ``_Log``, each rank's ``WriteResult`` list, the
    checkpoint's ``Metadata``, seconds the local plans took)."""
    import torch.distributed.checkpoint as dcp

    planner = planner or dcp.DefaultSavePlanner
    started = time.perf_counter()
    logs = {rank: _Log() for rank in range(ranks)}
    writers, local_plans = [], []
    with _synthesising(logs):
        for rank in range(ranks):  # each rank's local plan, on meta tensors
            with _fake_rank(rank, ranks) as mesh:
                writer = dcp.FileSystemWriter(out, thread_count=thread_count)
                writer.fs = _recording_fs(logs[rank], buffer_bytes)
                rank_planner = planner()
                rank_planner.set_up_planner(
                    state_dict=state_of(mesh, "meta"), storage_meta=writer.storage_meta(), is_coordinator=rank == 0
                )
                writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
                local_plans.append(writer.prepare_local_plan(rank_planner.create_local_plan()))
                writers.append(writer)
                if rank == 0:
                    coordinator = rank_planner
        planned_s = time.perf_counter() - started
        global_plans, metadata = coordinator.create_global_plan(local_plans)
        global_plans = writers[0].prepare_global_plan(global_plans)
        results = []
        for rank in range(ranks):  # each rank's writes, on untouched CPU tensors of its shapes
            with _fake_rank(rank, ranks) as mesh:
                rank_planner = planner()
                rank_planner.set_up_planner(
                    state_dict=state_of(mesh, "cpu"),
                    storage_meta=writers[rank].storage_meta(),
                    is_coordinator=rank == 0,
                )
                final = rank_planner.finish_plan(global_plans[rank])
                results.append(writers[rank].write_data(final, rank_planner).value())
        writers[0].finish(metadata=metadata, results=results)
    return logs, results, metadata, planned_s


def _itemsize(dtype) -> int:
    import torch

    return torch.empty(0, dtype=dtype).element_size()


def synthesis_columns(synthesis: Synthesis) -> dict[str, np.ndarray | list]:
    """The trace's rows: each rank's operations in order, ``OP_GAP_NS`` apart from 0, all ranks
    interleaved by time (ties by rank); pid 1000 + rank, tid = pid, comm ``python``."""
    names = ("ts_ns", "rank", "op", "path", "offset", "size", "ret", "flags", "new_path", "fd")
    parts: dict[str, list] = {name: [] for name in names}
    for rank, ops in synthesis.logs.items():
        for index, (op, path, offset, size, ret, flags, new_path, fd) in enumerate(ops):
            for name, value in zip(names, (index * OP_GAP_NS, rank, op, path, offset, size, ret, flags, new_path, fd)):
                parts[name].append(value)
    order = np.lexsort((np.asarray(parts["rank"]), np.asarray(parts["ts_ns"])))
    out: dict[str, np.ndarray | list] = {name: [values[i] for i in order] for name, values in parts.items()}
    syscalls = {
        "open": "openat",
        "write": "write",
        "read": "read",
        "lseek": "lseek",
        "close": "close",
        "fsync": "fsync",
        "mkdir": "mkdir",
        "rename": "rename",
        "unlink": "unlink",
    }
    n = len(order)
    out["pid"] = [1000 + r for r in out["rank"]]
    out["tid"] = out["pid"]
    out["dur_ns"] = [0] * n
    out["comm"] = ["python"] * n
    out["syscall"] = [syscalls[op] for op in out["op"]]
    out["offset_source"] = ["position" if op in ("write", "read", "lseek") else None for op in out["op"]]
    out["iov_count"] = [None] * n
    return out


def buffer_bytes_at(path: str | os.PathLike) -> int:
    """The buffer Python's ``open`` gives a file written under ``path``: st_blksize of its nearest existing
    ancestor (``io.open``; 8192 where the file system says 0 or 1)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    size = os.stat(probe).st_blksize
    return size if size > 1 else io.DEFAULT_BUFFER_SIZE


def write_synthesis(
    synthesis: Synthesis, output: str | os.PathLike, *, command: list[str], overwrite: bool = False
) -> int:
    """Write the synthesised save as a trace (backend ``synth``; the figures under the metadata key
    ``synth``). Returns the rows written. Raises CkptTraceError for an existing output (without
    ``overwrite``) or a failed write."""
    import platform
    import socket

    from ckpt_trace.formats import table_from_columns, vocabulary, write_trace
    from ckpt_trace.version import __version__

    columns = synthesis_columns(synthesis)
    meta = {
        "creator": "ckpt-trace",
        "creator_version": __version__,
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "arch": vocabulary.host_arch(),
        "command": list(command),
        "backend": "synth",
        "backend_reason": "synthesised from DCP's planner and writer (ckpt-trace synth)",
        "start_wall_time_ns": time.time_ns(),
        "filesystems": {},
        "lost_events": 0,
        "synth": synthesis.figures,
    }
    write_trace(output, table_from_columns(columns), meta, overwrite=overwrite)
    return len(columns["ts_ns"])
