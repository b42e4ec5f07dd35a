"""State dicts for the writer tests, built deterministically so any process can rebuild the expected values.

Also the rank entry points the multi-rank tests spawn (they must be importable by module path).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

from ckpt_trace.workloads.engines import leave_process_group


def objects_equal_bitwise(a, b) -> bool:
    """True when two (nested) states hold the same objects, tensors compared byte for byte with dtype and shape."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if hasattr(a, "to_local"):
            a, b = a.to_local(), b.to_local()
        return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(objects_equal_bitwise(a[k], b[k]) for k in a)
    return a == b


def plain_state(seed: int = 0) -> dict:
    """Every dtype the issue names, 0-d and empty tensors, non-contiguous views, nested dicts with objects."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(48, 40, generator=gen)
    return {
        "f32": torch.randn(300, 257, generator=gen),
        "bf16": torch.randn(129, 31, generator=gen).to(torch.bfloat16),
        "f16": torch.randn(1001, generator=gen).to(torch.float16),
        "i8": torch.randint(-128, 128, (77, 3), generator=gen, dtype=torch.int8),
        "i64": torch.randint(-(2**62), 2**62, (513,), generator=gen, dtype=torch.int64),
        "bool": torch.rand(333, generator=gen) > 0.5,
        "scalar": torch.tensor(2.5),
        "scalar_i64": torch.tensor(-7, dtype=torch.int64),
        "empty": torch.empty(0, 5),
        "view_strided": base[:, ::3],
        "view_transposed": base.t(),
        "nested": {
            "layer": {"weight": torch.randn(17, 9, generator=gen), "name": "block.0", "sizes": [17, 9]},
            "step": 1234,
            "lr": 3e-4,
            "betas": (0.9, 0.95),
            "note": None,
        },
    }


def zeros_like_state(state):
    """The same structure with zeroed tensors and placeholder objects, as a target for dcp.load."""
    if isinstance(state, torch.Tensor):
        return torch.zeros(state.shape, dtype=state.dtype)
    if isinstance(state, dict):
        return {k: zeros_like_state(v) for k, v in state.items()}
    return "placeholder"


def _sharded_state(rank: int, world: int):
    """plain_state (replicated) plus row-sharded DTensors of float32 and bfloat16, as FSDP2 shards."""
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(99)
    full = {"w_f32": torch.randn(37, 19, generator=gen), "w_bf16": torch.randn(64, 8, generator=gen).to(torch.bfloat16)}
    state = plain_state()
    for name, tensor in full.items():
        local = torch.chunk(tensor, world)[rank].clone() if rank < len(torch.chunk(tensor, world)) else tensor[:0]
        state[name] = DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=tensor.shape, stride=tensor.stride()
        )
    return state


def save_and_load_rank(rank: int, world: int, path: str, buffer_bytes: int, queue_depth: int) -> None:
    """One rank of the multi-rank test: dcp.save with CheckpointWriter, then dcp.load with CheckpointReader."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor

    from ckpt_trace.writer import CheckpointReader, CheckpointWriter, WriterOptions

    options = WriterOptions(buffer_bytes=buffer_bytes, queue_depth=queue_depth)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        state = _sharded_state(rank, world)
        dcp.save(state, storage_writer=CheckpointWriter(path, options))
        dist.barrier()
        target = {}
        for name, value in state.items():
            if isinstance(value, DTensor):
                target[name] = DTensor.from_local(
                    torch.zeros_like(value.to_local()),
                    value.device_mesh,
                    value.placements,
                    run_check=False,
                    shape=value.shape,
                    stride=value.stride(),
                )
            else:
                target[name] = zeros_like_state(value)
        dcp.load(target, storage_reader=CheckpointReader(path, options))
        if not objects_equal_bitwise(state, target):
            raise SystemExit(f"rank {rank}: loaded state differs from the saved one")
        Path(path, f"ok-{rank}").write_text("ok")
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_process_group()


def _kill_after(planner_cls, calls: int):
    class KillingPlanner(planner_cls):
        count = 0

        def resolve_data(self, write_item):
            KillingPlanner.count += 1
            if KillingPlanner.count > calls:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().resolve_data(write_item)

    return KillingPlanner()


def killed_save_main(path: str, calls: int) -> None:
    """Save a different state into ``path`` and SIGKILL this process after ``calls`` items were resolved."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    from ckpt_trace.writer import CheckpointWriter, WriterOptions

    dcp.save(
        plain_state(seed=1),
        storage_writer=CheckpointWriter(path, WriterOptions(buffer_bytes=64 << 10)),
        planner=_kill_after(DefaultSavePlanner, calls),
    )


if __name__ == "__main__":
    killed_save_main(sys.argv[1], int(sys.argv[2]))


def fail_or_wait_rank(rank: int, world: int) -> None:
    """Rank 0 fails at once; the others wait in the rendezvous for it (they would wait out the store's timeout)."""
    import torch.distributed as dist

    from ckpt_trace.errors import WorkloadError

    if rank == 0:
        raise WorkloadError("rank 0 gave up before the rendezvous")
    dist.init_process_group("gloo", rank=rank, world_size=world)


def many_small_state(seed: int = 0, small: int = 600, large: int = 4, large_elements: int = 1 << 20) -> dict:
    """``small`` float32 tensors of 1 to 16,000 elements (under 64 KiB each, odd sizes, so items are not
    page aligned) beside ``large`` float32 tensors of ``large_elements``, in that order: a model's norms,
    biases and embeddings of small vocabularies next to its big matrices."""
    gen = torch.Generator().manual_seed(seed)
    state = {f"small.{i:03d}": torch.randn(1 + (i * 7919) % 16_000, generator=gen) for i in range(small)}
    state.update({f"large.{i}": torch.randn(large_elements, generator=gen) for i in range(large)})
    return state


def load_many_small(path: str, policy: str) -> None:
    """Child entry point: load ``many_small_state()`` saved at ``path`` with the emitted reader and that
    load policy; print one JSON line: whether every byte matches, and the reader's stats."""
    import json

    import torch.distributed.checkpoint as dcp

    from ckpt_trace.writer import CheckpointReader, WriterOptions

    state = many_small_state()
    target = zeros_like_state(state)
    reader = CheckpointReader(path, WriterOptions(**WriterOptions.load_flags(policy)))
    dcp.load(target, storage_reader=reader)
    print(json.dumps({"equal": objects_equal_bitwise(state, target), "stats": reader.last_load_stats}))
