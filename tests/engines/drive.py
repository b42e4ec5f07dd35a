"""Drive one real checkpoint engine through a save or a load of a small model, the way its users call it.

    python tests/engines/drive.py ENGINE save|load DIR REPORT.json

``save`` writes DIR (a checkpoint directory the engine creates); ``load`` reads back what ``save`` wrote
and checks every tensor against the state it saved (regenerated from a fixed seed). REPORT.json receives
the engine's version and, after a save, the files the engine left under DIR with their sizes (walked right
after the engine returned: the engine's own output, not ours). Nothing is printed on success: the engines'
own chatter goes to stderr. The conformance tests (tests/engines/conformance.py) record this program.
"""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata
from pathlib import Path

ENGINES = (
    "torch-save",
    "safetensors",
    "dcp",
    "dcp-async",
    "hf",
    "torchsnapshot",
    "fastsafetensors",
    "runai",
    "memmap",
    "deepspeed",
    "deepspeed-fast",
)
# The distribution each engine needs (its version goes into the report; absent: the test skips).
PACKAGES = {
    "torch-save": "torch",
    "safetensors": "safetensors",
    "dcp": "torch",
    "dcp-async": "torch",
    "hf": "transformers",
    "torchsnapshot": "torchsnapshot",
    "fastsafetensors": "fastsafetensors",
    "runai": "runai-model-streamer",
    "memmap": "numpy",
    "deepspeed": "deepspeed",
    "deepspeed-fast": "deepspeed",
}


def state(torch) -> dict:
    """A small state dict of the sizes a model has: a few large tensors, many small ones (~6 MiB)."""
    gen = torch.Generator().manual_seed(7)
    out = {f"layer.{i}.weight": torch.randn(256, 256, generator=gen) for i in range(16)}
    out.update({f"layer.{i}.bias": torch.randn(256, generator=gen) for i in range(16)})
    out["embed.weight"] = torch.randn(2048, 256, generator=gen)
    return out


def _same(torch, loaded: dict, expected: dict) -> None:
    for key, value in expected.items():
        if not torch.equal(loaded[key].cpu().reshape(value.shape), value):
            raise SystemExit(f"loaded {key} differs from what was saved")


def _tiny_gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(7)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=2048, n_positions=128))


def save(engine: str, out: Path) -> None:
    import torch

    sd = state(torch)
    out.parent.mkdir(parents=True, exist_ok=True)
    if engine == "torch-save":
        out.mkdir()
        torch.save(sd, out / "model.pt")
    elif engine == "safetensors" or engine in ("fastsafetensors", "runai"):
        from safetensors.torch import save_file

        out.mkdir()
        save_file(sd, str(out / "model.safetensors"))
    elif engine == "dcp":
        import torch.distributed.checkpoint as dcp

        dcp.save(sd, checkpoint_id=str(out))
    elif engine == "dcp-async":
        import torch.distributed.checkpoint as dcp

        dcp.async_save(sd, checkpoint_id=str(out)).result()
    elif engine == "hf":
        _tiny_gpt2().save_pretrained(str(out), max_shard_size="1MB")  # sharded: an index and several shards
    elif engine == "torchsnapshot":
        from torchsnapshot import Snapshot, StateDict

        Snapshot.take(path=str(out), app_state={"model": StateDict(**sd)})
    elif engine == "memmap":
        import numpy as np

        out.mkdir()
        flat = np.concatenate([v.numpy().reshape(-1) for v in sd.values()])
        mapped = np.memmap(out / "model.bin", dtype=np.float32, mode="w+", shape=flat.shape)
        mapped[:] = flat
        mapped.flush()  # msync(MS_SYNC)
        del mapped
    elif engine in ("deepspeed", "deepspeed-fast"):
        engine_, _ = _deepspeed(out, fast=engine == "deepspeed-fast")
        engine_.save_checkpoint(str(out), tag="step1")
    else:
        raise SystemExit(f"unknown engine {engine}")


def load(engine: str, out: Path) -> None:
    import torch

    sd = state(torch)
    if engine == "torch-save":
        _same(torch, torch.load(out / "model.pt", weights_only=True), sd)
    elif engine == "safetensors":
        from safetensors.torch import load_file

        _same(torch, load_file(str(out / "model.safetensors")), sd)
    elif engine in ("dcp", "dcp-async"):
        import torch.distributed.checkpoint as dcp

        target = {k: torch.zeros_like(v) for k, v in sd.items()}
        dcp.load(target, checkpoint_id=str(out))
        _same(torch, target, sd)
    elif engine == "hf":
        from transformers import GPT2LMHeadModel

        loaded = GPT2LMHeadModel.from_pretrained(str(out)).state_dict()
        expected = _tiny_gpt2().state_dict()
        _same(
            torch, {k: loaded[k] for k in expected if k in loaded}, {k: v for k, v in expected.items() if k in loaded}
        )
    elif engine == "torchsnapshot":
        from torchsnapshot import Snapshot, StateDict

        target = StateDict(**{k: torch.zeros_like(v) for k, v in sd.items()})
        Snapshot(path=str(out)).restore(app_state={"model": target})
        _same(torch, dict(target.items()), sd)
    elif engine == "fastsafetensors":
        from fastsafetensors import SafeTensorsFileLoader, SingleGroup

        loader = SafeTensorsFileLoader(SingleGroup(), torch.device("cpu"), nogds=True)
        loader.add_filenames({0: [str(out / "model.safetensors")]})
        buffers = loader.copy_files_to_device()
        _same(torch, {k: buffers.get_tensor(k).clone() for k in sd}, sd)
        buffers.close()
        loader.close()
    elif engine == "runai":
        from runai_model_streamer import SafetensorsStreamer

        with SafetensorsStreamer() as streamer:
            streamer.stream_file(str(out / "model.safetensors"))
            _same(torch, {k: t.clone() for k, t in streamer.get_tensors()}, sd)
    elif engine == "memmap":
        import numpy as np

        flat = np.memmap(out / "model.bin", dtype=np.float32, mode="r")
        expected = np.concatenate([v.numpy().reshape(-1) for v in sd.values()])
        if not np.array_equal(np.asarray(flat), expected):
            raise SystemExit("memmap load differs")
    elif engine in ("deepspeed", "deepspeed-fast"):
        # FastPersist is a writer: DeepSpeed reads its files back with its default (torch) engine, since the
        # fast engine's own load calls torch.load without weights_only=False, which torch 2.6+ refuses.
        engine_, model = _deepspeed(out, seed=99, fast=engine == "deepspeed-fast", writer=False)
        engine_.load_checkpoint(str(out), tag="step1")
        saved = _deepspeed_model(seed=7).state_dict()
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(engine_.module.parameters())):  # ZeRO-3: whole again
            loaded = {k: v.clone() for k, v in engine_.module.state_dict().items()}
        _same(torch, loaded, saved)
    else:
        raise SystemExit(f"unknown engine {engine}")


def _deepspeed_model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))


#: DeepSpeed's FastPersist writer (``deepspeed-fast``): checkpoint files written through its libaio handle
#: (deepspeed/runtime/model_checkpointing/writer_factory.py): O_DIRECT iocbs of ``block_size`` from a double
#: buffer of ``io_buffer_size``, the unaligned tail appended with a buffered write (deepspeed/io/fast_file_writer.py).
FAST_WRITER = {
    "checkpoint": {
        "writer": {"type": "fast", "io_buffer_size": 1 << 20, "io_buffer_double": True, "data_parallel": "replica"}
    },
    "aio": {
        "block_size": 1 << 18,
        "queue_depth": 8,
        "single_submit": False,
        "overlap_events": True,
        "intra_op_parallelism": 1,
    },
}


class _ByteViews:
    """Stands in for DeepSpeed's UtilsBuilder where the accelerator has none: ``load().cast_to_byte_tensor``."""

    def load(self):
        return self

    @staticmethod
    def cast_to_byte_tensor(tensors):
        import torch

        def view(tensor):
            return tensor if tensor.nbytes <= 1 else tensor.reshape(-1).view(torch.uint8)

        return [view(t) for t in tensors] if isinstance(tensors, (list, tuple)) else view(tensors)


def _deepspeed(out: Path, seed: int = 7, fast: bool = False, writer: bool = True):
    """A ZeRO-1 engine on the CPU (gloo, one rank) with a torch Adam optimizer; ``fast``: a ZeRO-3 one whose
    checkpoints (``writer``) the FastPersist writer writes (``FAST_WRITER``)."""
    import deepspeed
    import torch

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    deepspeed.init_distributed(dist_backend="gloo")
    model = _deepspeed_model(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    config = {"train_batch_size": 1, "zero_optimization": {"stage": 1}}
    if fast and not writer:
        config["zero_optimization"] = {"stage": 3}
    elif fast:
        # The writer's data-parallel layout reads the launcher's machine count and rank (deepspeed/constants.py).
        os.environ.setdefault("CROSS_SIZE", "1")
        os.environ.setdefault("CROSS_RANK", "0")
        from deepspeed.accelerator import get_accelerator

        # The writer pins its buffer, which torch refuses without a device; on the CPU accelerator pinning is
        # a no-op anyway (its pin_memory returns the tensor), so the buffer is taken as it is.
        get_accelerator().is_pinned = lambda tensor: True
        # The CPU accelerator has no UtilsBuilder op (deepspeed/ops/op_builder/cpu/no_impl.py); the writer takes
        # only its cast_to_byte_tensor, a byte view of each tensor without a copy (csrc/utils/tensor_cast.cpp:
        # from_blob of its bytes), which torch makes the same way.
        import deepspeed.io.fast_file_writer as fast_file_writer

        fast_file_writer.UtilsBuilder = _ByteViews
        config.update(FAST_WRITER)
        # ZeRO-3: below it the writer names its files "-RANK.WRITERS" (optimize_dp_state), which DeepSpeed
        # 0.19.8's own load_checkpoint does not look for (engine.py _configure_checkpointing).
        config["zero_optimization"] = {"stage": 3}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, model


def main() -> int:
    engine, phase, directory, report = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    package = PACKAGES[engine]
    info = {"engine": engine, "package": package, "version": metadata.version(package)}
    if phase == "save":
        save(engine, directory)
        info["files"] = {
            str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()
        }
    else:
        load(engine, directory)
    report.write_text(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
