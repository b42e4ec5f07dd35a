"""Restores of every shape of checkpoint by every loader, cold and warm, against fio's read limit (issue 36).

Shapes (``--shape``, repeatable; all by default), each one process's flat state dict:

- ``large``: few large tensors: 4 float32 tensors of 64 MiB (256 MiB);
- ``many-small``: 10 float32 tensors of 75 MiB with 600 tensors of 1-63 KiB (float32 and bfloat16) between
  them (771 MiB; the issue's example);
- ``hf-sharded``: a Llama-style causal LM in bfloat16 (8 layers, hidden 1024, vocabulary 32,000; 309 MB) as
  Hugging Face's ``save_pretrained`` writes it: ``model-0000i-of-0000n.safetensors`` shards of at most 100 MB
  and ``model.safetensors.index.json`` (transformers when installed, else the same layout written with
  safetensors);
- ``dcp-adam``: a GPT-2 (4 layers, d_model 384, vocabulary 50,257) with its Adam state (exp_avg,
  exp_avg_sq), float32 (322 MB), the state a training job restores.

At these sizes a full run (4 shapes x 2 cache states x 5 rounds x 8 loaders) took 15.8 minutes on the
project's shared 2-core machine at a load average of 12, 3.4 minutes at 2-3. ``--quick``: the same shapes at 32-59 MiB each and 2 rounds, to try it in
a few minutes.

Each shape is saved once (in a child process, every file fsynced) in each format a loader reads: ``emitted``
(``ckpt_trace.writer.CheckpointWriter``, the class the module ``ckpt-trace emit`` writes wraps, with
``WriterOptions``' defaults), ``dcp`` (DCP's FileSystemWriter, thread_count 1, sync_files), ``safetensors``
(``save_file``; the shards for ``hf-sharded``) and ``torch.save`` (one file). Every loader leaves every byte in
the caller's state dict, allocated and zeroed before the clock starts, as a restart does:

- ``emitted``: ``dcp.load`` with ``CheckpointReader`` (default options: buffered for what the page cache
  holds; the cold bytes the way measured faster on the first cold file of the load, O_DIRECT stream or
  buffered, ``ckpt_trace.writer.load``); on request, ``emitted-buffered`` (buffered reads only),
  ``emitted-direct`` (O_DIRECT whatever the cache holds) and ``emitted-nocrc`` (default options, checksums
  not verified: what verifying every item's CRC32C inside the clock costs, which no peer does);
- ``emitted-no-dcp``: ``ckpt_trace.writer.load_state_dict`` (the same reader and options, without
  ``dcp.load``'s planner: one read item per whole tensor, planned by the reader's module);
- ``dcp``: ``dcp.load`` with DCP's FileSystemReader;
- ``safetensors``: ``safetensors.torch.load_file`` per file, then ``copy_`` into the state dict;
- ``torch.load(mmap)``: ``torch.load(mmap=True, weights_only=True)``, then ``copy_``;
- ``fastsafetensors``: ``fastsafe_open(files, device="cpu", nogds=True)``, ``get_tensor``, ``copy_`` (if
  installed);
- ``runai``: the Run:ai model streamer's ``SafetensorsStreamer.stream_files(files, owned=False)``, each
  yielded tensor copied before the next (if installed);
- for information, not the bar (marked ``*``): ``safetensors*`` and ``torch mmap*``, the lazy, mapped
  tensors as ``load_file`` and ``torch.load(mmap=True)`` return them, one byte of every 4 KiB page read inside
  the clock.

Each load's process is forked from the benchmark's (modules imported); it runs one garbage collection
before its clock, so that the pages of the parent's objects a collection writes are copied then, not inside a
load (a restarted process has no parent to copy from). The clock runs from the reader's construction to the
last byte in place; then the child checks every tensor's
CRC32C (``ckpt_trace.writer.checksum``) against the saved state's: a loader that leaves a wrong byte, or
fails, is reported as failed for that cell and left out of its figures.

Cache states (``--cache cold,warm``): ``cold``, sync and drop the page cache (root) before each load;
``warm``, every file of the loader's format read once (buffered) just before its load, nothing dropped. Each
load runs in a fresh process, as a restarted job does. The emitted reader keeps the cold way it measured for
later processes of the same boot (``config.READER_COLD_WAYS``), as on a machine restarting a job: the run gives
it a file of its own, so the first cold emitted load of a run measures and the later ones reuse it
(``cold_way_source`` in the results' reader stats). fio, in each cold round: sequential 4 MiB reads of a
file of the shape's size (laid out once with O_DIRECT, fsynced), after dropping the cache, with O_DIRECT
through io_uring at queue depth 32 and buffered psync.

Each (shape, cache) cell runs ``--runs`` rounds (default 5); each round loads once with every loader, the
order rotated by one each round, so a shared disk's drift falls on every loader alike. Per loader: median,
range (min-max), MB/s of the median; ``of fio`` (cold), the median over rounds of the loader's rate over the
better fio read of that round; ``vs best`` (the emitted rows), the median (min-max) over rounds of the fastest
bar peer's time that round over the emitted reader's: >= 1.00x is the emitted reader at or ahead of every
peer. One run on a shared machine: read the ratios, not the third digit.

On a virtual machine that reports free pages to its host (``page_reporting``, with virtio_balloon), memory the
guest frees, such as the page cache dropped before a cold load, returns to the host after about two seconds
and faults there on its next use; a cold load pays for the memory it fills at that rate (the results say
``free_page_reporting``).

    python benchmarks/restore.py [--quick] [--shape large --shape many-small ...] [--cache cold,warm] [--runs 5]
        [--loaders emitted,dcp,...] [--scratch DIR] [--queue-depth N] [--buffer-size BYTES] [--load-streams N]

Prints a summary and a table per cell (80 columns) and writes ``benchmarks/results/restore.json``
(``restore_quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import NamedTuple

from common import drop_caches, fsync_tree, parse_or_run_child, run_child, save_result
from rich import box
from rich.console import Console
from rich.table import Table

SHAPES = ("large", "many-small", "hf-sharded", "dcp-adam")
CACHES = ("cold", "warm")
MANIFEST = "manifest.json"
PAGE_BYTES = 4096
MIB = 1 << 20


class Loader(NamedTuple):
    format: str  # the directory (format) it reads
    bar: bool  # a peer the emitted reader is held against (False: for information)
    needs: str | None = None  # the module it needs installed


LOADERS = {
    "emitted": Loader("emitted", True),
    "dcp": Loader("dcp", True),
    "safetensors": Loader("safetensors", True),
    "torch.load(mmap)": Loader("torch.save", True),
    "fastsafetensors": Loader("safetensors", True, "fastsafetensors"),
    "runai": Loader("safetensors", True, "runai_model_streamer"),
    "safetensors*": Loader("safetensors", False),
    "torch mmap*": Loader("torch.save", False),
    "emitted-buffered": Loader("emitted", True),
    "emitted-direct": Loader("emitted", True),
    "emitted-nocrc": Loader("emitted", True),
    "emitted-no-dcp": Loader("emitted", True),
}
DEFAULT_LOADERS = [name for name in LOADERS if name not in ("emitted-buffered", "emitted-direct", "emitted-nocrc")]


# ---------------------------------------------------------------------------------------------- the shapes


def _random(shape: tuple[int, ...], dtype, gen):
    import torch

    return (torch.randn(shape, generator=gen) * 0.02).to(dtype)


def _large(quick: bool) -> dict:
    import torch

    gen = torch.Generator().manual_seed(1)
    rows = 512 if quick else 4096  # x 4096 float32 columns: 8 or 64 MiB
    return {f"layers.{i}.weight": _random((rows, 4096), torch.float32, gen) for i in range(4)}


def _many_small(quick: bool) -> dict:
    import torch

    gen = torch.Generator().manual_seed(2)
    large_rows = 256 if quick else 4800  # x 4096 float32 columns: 4 or 75 MiB
    state = {}
    for i in range(10):
        state[f"block.{i}.weight"] = _random((large_rows, 4096), torch.float32, gen)
        for j in range(60):
            size_bytes = int(torch.randint(1, 64, (1,), generator=gen)) * 1024 - 4 * j  # 1-63 KiB, odd sizes too
            dtype = torch.bfloat16 if j % 3 == 0 else torch.float32
            state[f"block.{i}.small.{j}"] = _random((size_bytes // dtype.itemsize,), dtype, gen)
    return state


def _llama_shapes(layers: int, hidden: int, intermediate: int, vocab: int, kv_heads_dim: int) -> dict:
    """Parameter names and shapes of a Llama-style causal LM, as transformers names them."""
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        prefix = f"model.layers.{i}."
        for name, shape in (
            ("self_attn.q_proj", (hidden, hidden)),
            ("self_attn.k_proj", (kv_heads_dim, hidden)),
            ("self_attn.v_proj", (kv_heads_dim, hidden)),
            ("self_attn.o_proj", (hidden, hidden)),
            ("mlp.gate_proj", (intermediate, hidden)),
            ("mlp.up_proj", (intermediate, hidden)),
            ("mlp.down_proj", (hidden, intermediate)),
            ("input_layernorm", (hidden,)),
            ("post_attention_layernorm", (hidden,)),
        ):
            shapes[f"{prefix}{name}.weight"] = shape
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def _write_shards(directory: Path, state: dict, max_shard_bytes: int) -> None:
    """``state`` as ``save_pretrained`` lays it out: shards of at most ``max_shard_bytes`` in order, and the
    index (``metadata.total_size``, ``weight_map``)."""
    from safetensors.torch import save_file

    shards: list[dict] = [{}]
    filled = 0
    for name, tensor in state.items():
        size_bytes = tensor.numel() * tensor.element_size()
        if shards[-1] and filled + size_bytes > max_shard_bytes:
            shards.append({})
            filled = 0
        shards[-1][name] = tensor
        filled += size_bytes
    directory.mkdir(parents=True)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _hf_sharded(quick: bool, directory: Path) -> dict:
    """Writes the shards into ``directory`` (transformers' ``save_pretrained`` where installed) and returns
    the state they hold."""
    import torch

    layers, hidden, intermediate, vocab, heads, kv_heads = (
        (4, 512, 1408, 8192, 8, 2) if quick else (8, 1024, 2816, 32000, 16, 4)
    )
    max_shard_bytes = (15 if quick else 100) * 1_000_000
    if importlib.util.find_spec("transformers") is not None:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(3)
        config = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            vocab_size=vocab,
        )
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(str(directory), max_shard_size=max_shard_bytes)
        del model
    else:
        gen = torch.Generator().manual_seed(3)
        shapes = _llama_shapes(layers, hidden, intermediate, vocab, hidden // heads * kv_heads)
        _write_shards(directory, {n: _random(s, torch.bfloat16, gen) for n, s in shapes.items()}, max_shard_bytes)
    from safetensors.torch import load_file

    state = {}
    for file in _safetensors_files(directory):
        state.update({name: tensor.clone() for name, tensor in load_file(str(file)).items()})
    return state


def _dcp_adam(quick: bool) -> dict:
    from ckpt_trace.workloads.engines import local_state
    from ckpt_trace.workloads.models import GPT2Config

    cfg = GPT2Config(n_layer=2, d_model=256, vocab=8192, n_ctx=256) if quick else GPT2Config(n_layer=4, d_model=384)
    local = local_state(cfg, 0, 1, with_optimizer=True)
    prefixes = {"model": "model", "exp_avg": "optim.exp_avg", "exp_avg_sq": "optim.exp_avg_sq"}
    return {f"{prefixes[kind]}.{name}": tensor for kind in prefixes for name, tensor in local[kind].items()}


# ---------------------------------------------------------------------------------------------- save and load


def _options(args):
    """``WriterOptions``' defaults, with what the command line overrides."""
    from ckpt_trace.writer.options import WriterOptions

    given = {
        "queue_depth": args.queue_depth,
        "buffer_bytes": args.buffer_size,
        "load_streams": args.load_streams,
    }
    return WriterOptions(**{key: value for key, value in given.items() if value is not None})


def _save(fmt: str, state: dict, directory: Path, options) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    if fmt == "emitted":
        from ckpt_trace.writer import CheckpointWriter

        dcp.save(state, storage_writer=CheckpointWriter(directory, options))
    elif fmt == "dcp":
        dcp.save(state, storage_writer=dcp.FileSystemWriter(directory, thread_count=1, sync_files=True))
    elif fmt == "torch.save":
        directory.mkdir(parents=True)
        torch.save(state, directory / "checkpoint.pt")
    elif fmt == "safetensors":
        from safetensors.torch import save_file

        directory.mkdir(parents=True)
        save_file(state, str(directory / "model.safetensors"))
    fsync_tree(directory)


def save_child(args) -> None:
    """Build shape ``args.engine``, save it in every format of ``args.formats`` under ``args.dir`` and write
    the manifest (names, shapes, dtypes, CRC32C, bytes); prints {"bytes": N}."""
    from ckpt_trace.writer import checksum

    directory = Path(args.dir)
    quick = args.quick
    formats = args.formats.split(",")
    if args.engine == "hf-sharded":
        state = _hf_sharded(quick, directory / "safetensors")
    else:
        state = {"large": _large, "many-small": _many_small, "dcp-adam": _dcp_adam}[args.engine](quick)
    for fmt in formats:
        if not (directory / fmt).exists():
            _save(fmt, state, directory / fmt, _options(args))
    tensors = {
        name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "crc": checksum.update(0, t)}
        for name, t in state.items()
    }
    size_bytes = sum(t.numel() * t.element_size() for t in state.values())
    (directory / MANIFEST).write_text(json.dumps({"bytes": size_bytes, "tensors": tensors}))
    print(json.dumps({"bytes": size_bytes, "tensors": len(tensors)}))


def _safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        return [directory / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [directory / "model.safetensors"]


def _touch(flat: dict) -> int:
    """Read one byte of every 4 KiB page of every tensor (what a mapping loader has not read yet)."""
    import torch

    return sum(int(t.reshape(-1).view(torch.uint8)[::PAGE_BYTES].sum()) for t in flat.values())


def _load(loader: str, directory: Path, target: dict | None, options) -> tuple[dict, dict | None]:
    """Load with ``loader`` into ``target`` (None for the mapped forms); (the loaded flat state, reader stats)."""
    import torch
    import torch.distributed.checkpoint as dcp

    if loader == "emitted-no-dcp":
        from ckpt_trace.writer import load_state_dict

        return target, load_state_dict(target, directory, options).last_load_stats
    if loader.startswith("emitted"):
        from ckpt_trace.writer import CheckpointReader

        if loader == "emitted-buffered":
            options = dataclasses.replace(options, load_direct_io=False)
        elif loader == "emitted-direct":
            options = dataclasses.replace(options, load_cache_aware=False)
        elif loader == "emitted-nocrc":
            options = dataclasses.replace(options, checksums=False)
        reader = CheckpointReader(directory, options)
        dcp.load(target, storage_reader=reader)
        return target, reader.last_load_stats
    if loader == "dcp":
        dcp.load(target, storage_reader=dcp.FileSystemReader(directory))
        return target, None
    files = [str(file) for file in _safetensors_files(directory)]
    if loader in ("torch.load(mmap)", "torch mmap*"):
        mapped = torch.load(directory / "checkpoint.pt", map_location="cpu", weights_only=True, mmap=True)
        pairs = mapped.items()
    elif loader in ("safetensors", "safetensors*"):
        from safetensors.torch import load_file

        mapped = {}
        for file in files:
            if target is None:
                mapped.update(load_file(file))
            else:
                for name, tensor in load_file(file).items():
                    target[name].copy_(tensor)
        pairs = [] if target is not None else mapped.items()
    elif loader == "fastsafetensors":
        from fastsafetensors import fastsafe_open

        with fastsafe_open(files, framework="pt", device="cpu", nogds=True) as handle:
            names = handle.keys()  # a loader, not a dict
            for name in names:
                target[name].copy_(handle.get_tensor(name))
        return target, None
    else:
        from runai_model_streamer import SafetensorsStreamer

        with SafetensorsStreamer() as streamer:
            streamer.stream_files(files, owned=False)  # views into reused buffers: each copied before the next
            for name, tensor in streamer.get_tensors():
                target[name].copy_(tensor)
        return target, None
    if target is None:
        flat = dict(pairs)
        _touch(flat)
        return flat, None
    for name, tensor in pairs:
        target[name].copy_(tensor)
    return target, None


def _import_for(loaders: list[str]) -> None:
    """Import what ``loaders`` use, once, in the parent before any load: each load's process is forked from it
    with them imported (imports are not part of a load; importing torch took 9 s on the shared machine)."""
    import importlib

    # ckpt_trace.writer imports its reader on first use (PEP 562): named here, or a load would time that import
    modules = ["torch", "torch.distributed.checkpoint", "ckpt_trace.writer.load", "safetensors.torch"]
    modules += [LOADERS[name].needs for name in loaders if LOADERS[name].needs]
    for module in modules:
        importlib.import_module(module)


def _measure(loader: str, directory: Path, args) -> dict:
    """One load: {"load_s", "wrong" (names whose bytes differ from the saved ones, first 5), "wrong_count",
    "stats" (the emitted reader's ``last_load_stats``)}."""
    import torch

    from ckpt_trace.writer import checksum

    manifest = json.loads((directory.parent / MANIFEST).read_text())
    options = _options(args)
    target = None
    if LOADERS[loader].bar:  # the caller's state dict, allocated and zeroed off the clock
        target = {
            name: torch.zeros(t["shape"], dtype=getattr(torch, t["dtype"])) for name, t in manifest["tensors"].items()
        }
    gc.collect()  # here, off the clock: the pages of the parent's objects a collection writes are copied now
    started = time.perf_counter()
    loaded, stats = _load(loader, directory, target, options)
    elapsed = time.perf_counter() - started
    wrong = [
        name
        for name, t in manifest["tensors"].items()
        if name not in loaded or checksum.update(0, loaded[name].contiguous()) != t["crc"]
    ]
    return {"load_s": elapsed, "wrong": wrong[:5], "wrong_count": len(wrong), "stats": stats}


def _fork_load(loader: str, directory: Path, args, cold: bool) -> dict:
    """``_measure`` in a process forked from this one (a fresh address space, the modules imported), after
    dropping the page cache when ``cold``. Raises RuntimeError with the load's error when it fails."""
    if cold:
        drop_caches()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the load's process: report and leave without running the parent's cleanup
        try:
            os.close(read_fd)
            warnings.filterwarnings("ignore")
            try:
                out = _measure(loader, directory, args)
            except BaseException as exc:  # noqa: BLE001 - DCP raises CheckpointException, a BaseException
                out = {"error": f"{type(exc).__name__}: {exc}"}
            with os.fdopen(write_fd, "w") as pipe:
                pipe.write(json.dumps(out, default=str))
        finally:
            os._exit(0)  # never back into the parent's loop
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        raise RuntimeError(f"the load's process died (wait status {status})")
    out = json.loads(text)
    if "error" in out:
        raise RuntimeError(out["error"])
    return out


def child(args) -> None:
    warnings.filterwarnings("ignore")
    save_child(args)


# ---------------------------------------------------------------------------------------------- the parent


def _fio_layout(directory: Path, size_bytes: int) -> Path | None:
    """A file of ``size_bytes`` for fio's reads, written once with O_DIRECT and fsynced (None without fio)."""
    if shutil.which("fio") is None:
        return None
    path = directory / "fio-restore.bin"
    subprocess.run(
        [
            "fio",
            "--name=layout",
            f"--filename={path}",
            "--rw=write",
            "--bs=4M",
            f"--size={size_bytes}",
            "--ioengine=io_uring",
            "--direct=1",
            "--iodepth=32",
            "--end_fsync=1",
            "--output-format=json",
        ],
        check=True,
        capture_output=True,
    )
    return path


FIO_READS = {"fio direct qd32": True, "fio buffered": False}  # O_DIRECT io_uring qd 32; psync


def _fio_read(path: Path, size_bytes: int, direct: bool) -> float:
    """One sequential 4 MiB read of ``path`` by fio from a cold page cache: bytes/s."""
    drop_caches()
    engine = ["--ioengine=io_uring", "--direct=1", "--iodepth=32"] if direct else ["--ioengine=psync", "--direct=0"]
    done = subprocess.run(
        ["fio", "--name=restore", f"--filename={path}", "--rw=read", "--bs=4M", f"--size={size_bytes}", *engine]
        + ["--output-format=json"],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(done.stdout)["jobs"][0]["read"]["bw_bytes"])


def _read_once(directory: Path) -> None:
    """Read every file under ``directory`` once, buffered: its pages then sit in the page cache (warm)."""
    buffer = bytearray(16 * MIB)
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        with open(file, "rb", buffering=0) as handle:
            while handle.readinto(buffer):
                pass


def _child_args(args) -> list[str]:
    extra = ["--quick"] if args.quick else []
    for flag, value in (
        ("--queue-depth", args.queue_depth),
        ("--buffer-size", args.buffer_size),
        ("--load-streams", args.load_streams),
    ):
        if value is not None:
            extra += [flag, str(value)]
    return extra


def _rounds(shape: str, cache: str, directory: Path, loaders: list[str], fio_file: Path | None, args) -> dict:
    """``args.runs`` rounds of one cell: {"times": {loader: [s per round]}, "errors", "stats", "fio"}."""
    times: dict[str, list[float]] = {name: [] for name in loaders}
    errors: dict[str, str] = {}
    stats: dict[str, object] = {}
    fio: dict[str, list[float]] = {}
    size_bytes = json.loads((directory / MANIFEST).read_text())["bytes"]
    for run in range(args.runs):
        live = [name for name in loaders if name in times]
        if not live:
            break
        for name in live[run % len(live) :] + live[: run % len(live)]:  # rotated: no loader always first
            fmt_dir = directory / LOADERS[name].format
            if cache == "warm":
                _read_once(fmt_dir)
            try:
                out = _fork_load(name, fmt_dir, args, cold=cache == "cold")
            except RuntimeError as exc:
                errors[name] = str(exc).strip().splitlines()[-1][:200]
                out = None
            if out is not None and out["wrong_count"]:
                errors[name] = f"{out['wrong_count']} tensors differ from the saved ones, e.g. {out['wrong']}"
            if name in errors:
                print(f"{shape} {cache} {name}: failed: {errors[name]}", file=sys.stderr)
                del times[name]
                continue
            times[name].append(out["load_s"])
            if out["stats"]:
                stats[name] = out["stats"]
        if cache == "cold" and fio_file is not None:
            for fio_name, direct in FIO_READS.items():
                fio.setdefault(fio_name, []).append(_fio_read(fio_file, size_bytes, direct))
        print(
            f"{shape} {cache} round {run + 1}/{args.runs}: "
            + ", ".join(f"{name} {samples[-1]:.2f} s" for name, samples in times.items()),
            file=sys.stderr,
        )
    return {"times": times, "errors": errors, "stats": stats, "fio": fio}


def _figures(shape: str, cache: str, size_bytes: int, measured: dict, runs: int) -> dict:
    """The cell's rows: per loader its samples, median, rate, ``of_fio`` (cold) and, for the emitted reader's
    rows, ``vs_best`` against the fastest bar peer of each round."""
    times = measured["times"]
    round_fio = (
        [max(samples[i] for samples in measured["fio"].values()) for i in range(runs)] if measured["fio"] else []
    )
    peers = [name for name in times if LOADERS[name].bar and not name.startswith("emitted")]
    rows = []
    for name, samples in times.items():
        row: dict = {
            "loader": name,
            "format": LOADERS[name].format,
            "for_information": not LOADERS[name].bar,
            "runs_s": samples,
            "median_s": statistics.median(samples),
            "bytes_per_s": size_bytes / statistics.median(samples),
        }
        if round_fio:
            row["of_fio"] = statistics.median(size_bytes / t / f for t, f in zip(samples, round_fio))
        if name.startswith("emitted") and peers:
            best = [min(peers, key=lambda peer, i=i: times[peer][i]) for i in range(runs)]
            ratios = [times[peer][i] / samples[i] for i, peer in enumerate(best)]
            row["vs_best"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
            row["best_peer_by_round"] = best
        if name in measured["stats"]:
            row["reader_stats_last_round"] = measured["stats"][name]
        rows.append(row)
    fio = {
        name: {"samples": samples, "median_bytes_per_s": statistics.median(samples)}
        for name, samples in measured["fio"].items()
    }
    return {"shape": shape, "cache": cache, "bytes": size_bytes, "rows": rows, "fio": fio, "errors": measured["errors"]}


def _best_peer(cell: dict) -> dict | None:
    peers = [r for r in cell["rows"] if not r["for_information"] and not r["loader"].startswith("emitted")]
    return min(peers, key=lambda r: r["median_s"]) if peers else None


def _summary(cells: list[dict], runs: int) -> str:
    """One line per cell, 78 columns: the emitted reader's median, the best bar peer's, the paired ratio
    (through ``dcp.load``; then, where measured, the same for ``load_state_dict``, ``emitted-no-dcp``)."""
    lines = _summary_lines(cells, runs, "emitted", "Emitted reader (dcp.load)")
    if any(r["loader"] == "emitted-no-dcp" for cell in cells for r in cell["rows"]):
        lines += [""] + _summary_lines(
            cells, runs, "emitted-no-dcp", "Emitted reader (load_state_dict, no DCP planner)"
        )
    return "\n".join(lines)


def _summary_lines(cells: list[dict], runs: int, loader: str, title: str) -> list[str]:
    lines = [
        f"{title} vs the best peer, median of {runs} rounds (s; vs best: median, min-max)",
        f"{'shape':<11}{'cache':<6}{'emitted':>8}  {'best peer':<17}{'':>5}  {'vs best':>17}{'of fio':>8}",
    ]
    for cell in cells:
        emitted = next((r for r in cell["rows"] if r["loader"] == loader), None)
        best = _best_peer(cell)
        vs = emitted.get("vs_best") if emitted else None
        lines.append(
            f"{cell['shape']:<11}{cell['cache']:<6}"
            + (f"{emitted['median_s']:>8.2f}" if emitted else f"{'failed':>8}")
            + f"  {best['loader'] if best else '-':<17}"
            + (f"{best['median_s']:>5.2f}" if best else f"{'':>5}")
            + (f"  {vs['median']:>5.2f}x {vs['min']:.2f}-{vs['max']:.2f}" if vs else f"  {'-':>17}")
            + (f"{emitted['of_fio']:>8.0%}" if emitted and "of_fio" in emitted else "")
        )
    return lines


def _cell_table(cell: dict) -> Table:
    table = Table(
        title=f"{cell['shape']}, {cell['cache']}, {cell['bytes'] / MIB:,.0f} MiB", width=80, box=box.SIMPLE_HEAD
    )
    for column in ("loader", "median", "range", "MB/s", "of fio", "vs best"):
        table.add_column(column, justify="left" if column == "loader" else "right")
    for r in cell["rows"]:
        vs = r.get("vs_best")
        table.add_row(
            r["loader"],
            f"{r['median_s']:.2f} s",
            f"{min(r['runs_s']):.2f}-{max(r['runs_s']):.2f}",
            f"{r['bytes_per_s'] / 1e6:,.0f}",
            f"{r['of_fio']:.0%}" if "of_fio" in r else "",
            f"{vs['median']:.2f}x {vs['min']:.2f}-{vs['max']:.2f}" if vs else "",
        )
    for name, entry in cell["fio"].items():
        table.add_row(name, "", "", f"{entry['median_bytes_per_s'] / 1e6:,.0f}", "", "")
    for name, error in cell["errors"].items():
        table.add_row(name, "failed", "", "", "", "")
        print(f"{cell['shape']} {cell['cache']} {name} failed: {error}", file=sys.stderr)
    return table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", choices=SHAPES, help="repeatable; default: every shape")
    parser.add_argument("--cache", default=",".join(CACHES), help="cold, warm or both (comma-separated)")
    parser.add_argument("--runs", type=int, default=None, help="rounds per cell (default 5; 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="small shapes (32-59 MiB) and 2 rounds")
    parser.add_argument("--loaders", default=",".join(DEFAULT_LOADERS), help=f"from {', '.join(LOADERS)}")
    parser.add_argument("--scratch", type=Path, default=None, help="directory on the storage to measure")
    parser.add_argument("--queue-depth", type=int, default=None, help="the emitted writer/reader's queue depth")
    parser.add_argument("--buffer-size", type=int, default=None, help="the emitted writer/reader's request, bytes")
    parser.add_argument("--load-streams", type=int, default=None, help="the emitted reader's buffered threads")
    parser.add_argument("--formats", help=argparse.SUPPRESS)
    return parser


def _loaders(args) -> tuple[list[str], dict[str, str]]:
    """The loaders to run and those left out (not installed) with why."""
    loaders = [name for name in args.loaders.split(",") if name]
    unknown = [name for name in loaders if name not in LOADERS]
    if unknown:
        sys.exit(f"unknown loader {unknown[0]!r} (choose from {', '.join(LOADERS)})")
    left_out = {
        name: f"{LOADERS[name].needs} is not installed"
        for name in loaders
        if LOADERS[name].needs and importlib.util.find_spec(LOADERS[name].needs) is None
    }
    for name, why in left_out.items():
        print(f"{name}: left out ({why})", file=sys.stderr)
    return [name for name in loaders if name not in left_out], left_out


def main() -> None:
    args = parse_or_run_child(_parser(), child)
    if args is None:
        return
    args.runs = args.runs or (2 if args.quick else 5)
    shapes = args.shape or list(SHAPES)
    caches = [cache for cache in args.cache.split(",") if cache]
    if not caches or set(caches) - set(CACHES):
        sys.exit(f"--cache takes {', '.join(CACHES)}")
    if args.scratch is not None and not (args.scratch.is_dir() and os.access(args.scratch, os.W_OK | os.X_OK)):
        sys.exit(f"restore: --scratch {args.scratch} is not a writable directory")
    loaders, left_out = _loaders(args)
    formats = sorted({LOADERS[name].format for name in loaders})
    _import_for(loaders)
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-restore-", dir=args.scratch))
    from ckpt_trace import config

    # The reader keeps the cold way it measured for later processes of the boot; this run's own file, so that
    # its first cold load measures, whatever earlier runs measured (the loads' processes are forked: inherited)
    config.READER_COLD_WAYS = str(scratch / "reader-cold-ways.json")
    cells: list[dict] = []
    started = time.monotonic()
    result = {
        "benchmark": "restore",
        "quick": args.quick,
        "runs": args.runs,
        "complete": False,
        "free_page_reporting": Path("/sys/module/page_reporting").exists(),
        "emitted_options": dataclasses.asdict(_options(args)),
        "left_out": left_out,
        "cells": cells,
    }
    name = "restore_quick" if args.quick else "restore"
    try:
        for shape in shapes:
            directory = scratch / shape
            saved = run_child(__file__, "save", shape, directory, "--formats", ",".join(formats), *_child_args(args))
            fio_file = _fio_layout(directory, saved["bytes"]) if "cold" in caches else None
            for cache in caches:
                measured = _rounds(shape, cache, directory, loaders, fio_file, args)
                cells.append(_figures(shape, cache, saved["bytes"], measured, args.runs))
                result.update(elapsed_s=time.monotonic() - started, load_average=os.getloadavg())
                save_result(name, result)  # after every cell: a run cut short keeps what it measured
            shutil.rmtree(directory)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    console = Console(width=80)
    print(_summary(cells, args.runs))
    for cell in cells:
        console.print(_cell_table(cell))
    console.print("* for information: the lazy, mapped tensors, one byte per 4 KiB page read; not the bar")
    result["complete"] = True
    save_result(name, result)


if __name__ == "__main__":
    main()
