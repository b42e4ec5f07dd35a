"""Save a GPU state dict to storage and load it back to the GPU, end to end, with every engine (run on a GPU
machine; issue "GPU to storage and back").

State: the built-in GPT-2 shape (``--model``, default gpt2-large) with Adam state (three float32 tensors per
parameter), drawn on the GPU. Each round saves it with every engine and loads it back into preallocated GPU
tensors (every byte in the caller's state dict, as a restart needs), after ``sync`` and dropping the page
cache (root), each engine's checkpoint deleted before the next engine runs (the machine's disk holds one):

- ``emitted``: ``ckpt_trace.writer`` through ``dcp.save``/``dcp.load`` (page-locked staging kept between saves,
  device-to-host copies on their own stream overlapping the O_DIRECT writes; the reader's host-to-device
  copies overlapping its O_DIRECT reads); ``emitted async``: ``dcp.async_save`` with it (``return s``: until
  the call returns and training may go on; the save's total beside);
- ``dcp t1``/``dcp t4``: DCP's FileSystemWriter (thread_count 1 and 4; its reader for the load);
  ``dcp async``: ``dcp.async_save`` with FileSystemWriter (DCP's default staging);
- ``torch.save``: ``torch.save`` + fsync / ``torch.load(map_location=cuda)`` copied into the state;
- ``safetensors``: ``save_file`` + fsync / ``load_file(device=cuda)`` copied into the state;
- ``kvikio``: one file, each tensor written and read by KvikIO's ``CuFile`` at a 4 KiB-aligned offset
  (GPUDirect Storage where the machine has it, else KvikIO's compatibility mode: the results say which).

Beside them, to separate copy time from I/O time: ``d2h copy``/``h2d copy`` (every tensor between the GPU and
page-locked host memory, timed with CUDA events), and ``emitted, host state`` (the emitted writer and
reader on a host copy of the state: the I/O alone). ``overlap s`` of the emitted rows = copy + I/O alone
- end to end (what overlapping saved). ``dd`` gives the disk's sequential O_DIRECT rate at queue depth 1
(fio is not on the GPU machine).

    python benchmarks/gpu_end_to_end.py [--model gpt2-large] [--dir /tmp/e2e] [--rounds 3] [--budget-s 330]

Rounds stop early when ``--budget-s`` is spent (the rounds run are said). Prints a table; writes
``--json`` (default ``benchmarks/results/gpu_end_to_end.json``) after every measurement, so a cut run keeps
what it measured. Medians over rounds; one run on a shared machine: read ratios, not the third digit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import drop_caches, fsync_tree  # noqa: E402 - benchmarks/ is the script's folder

RESULTS = Path(__file__).resolve().parent / "results"


def gpu_state(torch, model: str) -> dict:
    from ckpt_trace.workloads.engines import model_config
    from ckpt_trace.workloads.models import parameter_shapes

    gen = torch.Generator(device="cuda").manual_seed(0)
    state = {}
    for kind in ("model", "exp_avg", "exp_avg_sq"):
        for name, shape in parameter_shapes(model_config(model)).items():
            state[f"{kind}.{name}"] = torch.randn(shape, device="cuda", generator=gen)
    torch.cuda.synchronize()
    return state


class Engines:
    """Each engine's save(state, path) and load(target, path), on one GPU; ``notes`` says what ran."""

    def __init__(self, torch, dcp) -> None:
        self.torch, self.dcp = torch, dcp
        self.notes: dict[str, str] = {}
        self.async_writer = None

    def save(self, name: str, state: dict, path: Path) -> dict:
        torch, dcp = self.torch, self.dcp
        from torch.distributed.checkpoint import FileSystemWriter

        from ckpt_trace.writer import CheckpointWriter

        out: dict = {}
        started = time.perf_counter()
        if name in ("emitted", "emitted, host state"):
            dcp.save(state, storage_writer=CheckpointWriter(path))
        elif name == "emitted async":
            if self.async_writer is None:
                self.async_writer = CheckpointWriter(path)
            future = dcp.async_save(state, storage_writer=self.async_writer, checkpoint_id=str(path))
            out["return_s"] = time.perf_counter() - started
            future.result()
        elif name in ("dcp t1", "dcp t4"):
            dcp.save(state, storage_writer=FileSystemWriter(path, thread_count=int(name[-1])))
        elif name == "dcp async":
            future = dcp.async_save(state, storage_writer=FileSystemWriter(path))
            out["return_s"] = time.perf_counter() - started
            future.result()
        elif name == "torch.save":
            torch.save(state, path)
            fsync_tree(path)
        elif name == "safetensors":
            from safetensors.torch import save_file

            save_file(state, str(path))
            fsync_tree(path)
        elif name == "kvikio":
            self._kvikio_save(state, path)
        torch.cuda.synchronize()
        out["elapsed_s"] = time.perf_counter() - started
        return out

    def load(self, name: str, target: dict, path: Path) -> dict:
        torch, dcp = self.torch, self.dcp
        from torch.distributed.checkpoint import FileSystemReader

        from ckpt_trace.writer import CheckpointReader

        started = time.perf_counter()
        if name.startswith("emitted"):
            dcp.load(target, storage_reader=CheckpointReader(path))
        elif name.startswith("dcp"):
            dcp.load(target, storage_reader=FileSystemReader(path))
        elif name == "torch.save":
            loaded = torch.load(path, map_location="cuda", weights_only=True)
            for key, value in loaded.items():
                target[key].copy_(value)
            del loaded
        elif name == "safetensors":
            from safetensors.torch import load_file

            loaded = load_file(str(path), device="cuda")
            for key, value in loaded.items():
                target[key].copy_(value)
            del loaded
        elif name == "kvikio":
            self._kvikio_load(target, path)
        torch.cuda.synchronize()
        return {"elapsed_s": time.perf_counter() - started}

    @staticmethod
    def _offsets(state: dict) -> dict:
        offsets, position = {}, 0
        for key, value in state.items():
            offsets[key] = position
            position += -(-value.numel() * value.element_size() // 4096) * 4096
        return offsets

    def _kvikio_save(self, state: dict, path: Path) -> None:
        self._kvikio(state, path, write=True)
        fsync_tree(path)

    def _kvikio_load(self, target: dict, path: Path) -> None:
        self._kvikio(target, path, write=False)

    def _kvikio(self, tensors: dict, path: Path, *, write: bool) -> None:
        """Write ``tensors`` to ``path`` (or read them back from it) with kvikio, each at its 4 KiB-aligned
        offset (``_offsets``), all in flight at once."""
        import kvikio

        offsets = self._offsets(tensors)
        f = kvikio.CuFile(path, "w" if write else "r")
        try:
            move = f.pwrite if write else f.pread
            futures = [
                move(value.reshape(-1).view(self.torch.uint8), file_offset=offsets[key])
                for key, value in tensors.items()
            ]
            for future in futures:
                future.get()
        finally:
            f.close()


def copy_times(torch, state: dict, host: dict) -> tuple[float, float]:
    """(device-to-host, host-to-device) seconds of every tensor between the GPU and page-locked memory."""
    results = []
    for d2h in (True, False):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for key, value in state.items():
            (host[key].copy_(value, non_blocking=True) if d2h else value.copy_(host[key], non_blocking=True))
        end.record()
        end.synchronize()
        results.append(start.elapsed_time(end) / 1e3)
    return results[0], results[1]


def dd_rate(directory: Path, size_bytes: int) -> dict:
    path = directory / "dd.bin"
    count = size_bytes // (4 << 20)
    out = {}
    for label, args in (
        ("write", ["if=/dev/zero", f"of={path}", "oflag=direct", "conv=fsync"]),
        ("read", [f"if={path}", "of=/dev/null", "iflag=direct"]),
    ):
        drop_caches()
        started = time.perf_counter()
        proc = subprocess.run(["dd", "bs=4M", f"count={count}", *args], capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        out[f"{label}_bytes_per_s"] = count * (4 << 20) / elapsed if proc.returncode == 0 else None
    path.unlink(missing_ok=True)
    return out


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-large")
    parser.add_argument("--dir", default="/tmp/gpu-e2e")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=330.0)
    parser.add_argument("--json", default=str(RESULTS / "gpu_end_to_end.json"))
    parser.add_argument(
        "--engines",
        default="emitted,emitted async,dcp t1,dcp t4,dcp async,torch.save,safetensors,kvikio,emitted, host state",
    )
    return parser.parse_args()


def _engine_names(engines: str) -> tuple[list[str], str]:
    """The engines asked for (kvikio dropped where it is not installed) and KvikIO's mode."""
    names = [n.strip() for n in engines.replace("emitted, host state", "emitted@host").split(",")]
    names = [n.replace("emitted@host", "emitted, host state") for n in names]
    try:
        import kvikio  # noqa: F401

        from ckpt_trace.replayer.gds import probe

        _, mode = probe()
        return names, mode.label if mode else "unknown"
    except ImportError:
        return [n for n in names if n != "kvikio"], "not installed"


def _one_engine(torch, engines: Engines, name: str, source: dict, dest: dict, path: Path) -> dict:
    """Save ``source`` with engine ``name`` at ``path``, load it into ``dest`` cold, compare, clean up."""
    try:
        saved = engines.save(name, source, path)
        drop_caches()
        loaded = engines.load(name, dest, path)
        same = all(torch.equal(dest[k].to(source[k].device), source[k]) for k in list(source)[:4] + list(source)[-4:])
        return {"save": saved, "load": loaded, "identical": same}
    except Exception as err:  # noqa: BLE001 - a failing engine is reported, the others still run
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
    finally:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        for value in dest.values():
            value.zero_()


def main() -> int:
    args = _parse_args()
    import torch
    import torch.distributed.checkpoint as dcp

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    names, kvikio_mode = _engine_names(args.engines)
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    work = base / f"run-{os.getpid()}"  # ours alone: nothing of the user's is touched
    work.mkdir()
    json_path = Path(args.json)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    state = gpu_state(torch, args.model)
    total_bytes = sum(v.numel() * v.element_size() for v in state.values())
    target = {k: torch.empty_like(v) for k, v in state.items()}
    host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}
    host_target = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in state.items()}
    engines = Engines(torch, dcp)
    report = {
        "model": args.model,
        "bytes": total_bytes,
        "tensors": len(state),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "kvikio": kvikio_mode,
        "dropped_caches": drop_caches(),
        "rounds": [],
        "dd": dd_rate(work, min(total_bytes, 8 << 30)),
    }
    print(
        f"{args.model} + Adam: {total_bytes / 1e9:.2f} GB in {len(state)} tensors on {report['device']}; "
        f"kvikio: {kvikio_mode}",
        flush=True,
    )
    started = time.perf_counter()
    for round_index in range(args.rounds):
        if round_index and time.perf_counter() - started > args.budget_s:
            print(f"budget spent after {round_index} rounds", flush=True)
            break
        entry: dict = {}
        d2h, h2d = copy_times(torch, state, host)
        entry["d2h copy"], entry["h2d copy"] = {"save": {"elapsed_s": d2h}}, {"load": {"elapsed_s": h2d}}
        order = names[round_index % len(names) :] + names[: round_index % len(names)]  # rotated: drift hits all
        for name in order:
            path = work / name.replace(" ", "_").replace(",", "")
            source, dest = (host, host_target) if name == "emitted, host state" else (state, target)
            entry[name] = _one_engine(torch, engines, name, source, dest, path)
            print(f"round {round_index + 1} {name}: {json.dumps(entry[name])}", flush=True)
            report["rounds"] = report["rounds"][:round_index] + [entry]
            json_path.write_text(json.dumps(report, indent=1))
    if engines.async_writer is not None:
        engines.async_writer.release_staging()
    shutil.rmtree(work, ignore_errors=True)
    summarize(report)
    json_path.write_text(json.dumps(report, indent=1))
    return 0


def _median(report: dict, name: str, phase: str, key: str = "elapsed_s") -> float | None:
    values = [r[name][phase][key] for r in report["rounds"] if name in r and phase in r[name] and key in r[name][phase]]
    return statistics.median(values) if values else None


def summarize(report: dict) -> None:
    names = [n for n in report["rounds"][0] if n not in ("d2h copy", "h2d copy")] if report["rounds"] else []
    gb = report["bytes"] / 1e9
    summary = {}
    copy = {"save": _median(report, "d2h copy", "save"), "load": _median(report, "h2d copy", "load")}
    io_only = {phase: _median(report, "emitted, host state", phase) for phase in ("save", "load")}
    print(
        f"\n{report['model']} + Adam, {gb:.2f} GB, medians of {len(report['rounds'])} rounds "
        f"({report['device']}; dd O_DIRECT QD1: write "
        f"{(report['dd'].get('write_bytes_per_s') or 0) / 1e9:.2f} GB/s, read "
        f"{(report['dd'].get('read_bytes_per_s') or 0) / 1e9:.2f} GB/s)"
    )
    print(f"{'engine':<22}{'save s':>8}{'GB/s':>7}{'return s':>9}{'load s':>8}{'GB/s':>7}{'same':>6}")
    for name in names:
        save, load = _median(report, name, "save"), _median(report, name, "load")
        ret = _median(report, name, "save", "return_s")
        same = all(r.get(name, {}).get("identical", False) for r in report["rounds"])
        errors = {r[name]["error"] for r in report["rounds"] if "error" in r.get(name, {})}
        summary[name] = {"save_s": save, "load_s": load, "return_s": ret, "identical": same, "errors": sorted(errors)}
        if errors:
            print(f"{name:<22} error: {sorted(errors)[0][:50]}")
            continue
        print(
            f"{name:<22}{save:>8.2f}{gb / save:>7.2f}{(f'{ret:.2f}' if ret else '-'):>9}{load:>8.2f}"
            f"{gb / load:>7.2f}{('yes' if same else 'NO'):>6}"
        )
    print(
        f"{'d2h / h2d copy':<22}{copy['save'] or 0:>8.2f}{gb / (copy['save'] or 1):>7.2f}{'':>9}"
        f"{copy['load'] or 0:>8.2f}{gb / (copy['load'] or 1):>7.2f}"
    )
    emitted = summary.get("emitted", {})
    overlap = {
        phase: (copy[phase] + io_only[phase] - emitted[f"{phase}_s"])
        if copy[phase] and io_only[phase] and emitted.get(f"{phase}_s")
        else None
        for phase in ("save", "load")
    }
    peers = {n: s for n, s in summary.items() if not n.startswith("emitted") and not s["errors"]}
    best = {
        phase: min(peers.items(), key=lambda kv: kv[1][f"{phase}_s"]) if peers else None for phase in ("save", "load")
    }
    for phase in ("save", "load"):
        if best[phase] and emitted.get(f"{phase}_s"):
            name, figures = best[phase]
            print(
                f"{phase}: emitted {emitted[f'{phase}_s']:.2f} s vs best peer {name} {figures[f'{phase}_s']:.2f} s "
                f"= {figures[f'{phase}_s'] / emitted[f'{phase}_s']:.2f}x; copy {copy[phase]:.2f} s + I/O alone "
                f"{io_only[phase]:.2f} s, overlapped {overlap[phase]:.2f} s"
            )
    report["summary"] = {
        "engines": summary,
        "copy_s": copy,
        "io_only_s": io_only,
        "overlap_s": overlap,
        "best_peer": {p: (b[0] if b else None) for p, b in best.items()},
    }


if __name__ == "__main__":
    sys.exit(main())
