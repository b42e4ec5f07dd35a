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

ENGINES = ("torch-save", "safetensors", "dcp", "dcp-async", "hf", "torchsnapshot", "fastsafetensors", "runai",
           "memmap", "deepspeed")
# The distribution each engine needs (its version goes into the report; absent: the test skips).
PACKAGES = {"torch-save": "torch", "safetensors": "safetensors", "dcp": "torch", "dcp-async": "torch",
            "hf": "transformers", "torchsnapshot": "torchsnapshot", "fastsafetensors": "fastsafetensors",
            "runai": "runai-model-streamer", "memmap": "numpy", "deepspeed": "deepspeed"}


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
    elif engine == "deepspeed":
        engine_, _ = _deepspeed(out)
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
        _same(torch, {k: loaded[k] for k in expected if k in loaded}, {k: v for k, v in expected.items() if k in loaded})
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
    elif engine == "deepspeed":
        engine_, model = _deepspeed(out, seed=99)
        engine_.load_checkpoint(str(out), tag="step1")
        saved = _deepspeed_model(seed=7).state_dict()
        _same(torch, {k: v for k, v in engine_.module.state_dict().items()}, saved)
    else:
        raise SystemExit(f"unknown engine {engine}")


def _deepspeed_model(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))


def _deepspeed(out: Path, seed: int = 7):
    """A ZeRO-1 engine on the CPU (gloo, one rank) with a torch Adam optimizer."""
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
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, model


def main() -> int:
    engine, phase, directory, report = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    package = PACKAGES[engine]
    info = {"engine": engine, "package": package, "version": metadata.version(package)}
    if phase == "save":
        save(engine, directory)
        info["files"] = {str(p.relative_to(directory)): p.stat().st_size
                         for p in sorted(directory.rglob("*")) if p.is_file()}
    else:
        load(engine, directory)
    report.write_text(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
