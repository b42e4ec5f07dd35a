"""The GPU hop of real checkpoints, measured from their own traces (run on a GPU machine).

For each engine (DCP FileSystemWriter, the emitted writer through DCP, torch.save, safetensors) the state
dict of ``--model`` lives on the GPU (``ckpt-trace workload ENGINE --device
cuda``); the save is recorded with ``ckpt-trace record --gpu on``, so the
device-to-host copies and the writes are rows of one trace. From each trace:
copies (both directions: the state is built on the CPU and moved to the GPU
first) and device-to-host bytes, the device-to-host copy time (summed), the write time
(summed over write calls), how much of the copy time overlapped writes, and
the share of copied bytes staged in pinned memory. Each trace is then
replayed with ``--gpu-copies recorded`` and ``--gpu-copies pinned`` (posix
strategy, into ``--target``): the replay's copy seconds and elapsed time
compare the recorded host memory kind with pinned staging.

    python benchmarks/gpu_checkpoint.py [--model gpt2-medium] [--target /tmp/gpu-bench] [--backend strace]

Prints a table and writes ``benchmarks/results/gpu_checkpoint.json``. The
closing note of the GPU-hop issue quotes it. fio is used for the disk's
sequential O_DIRECT write limit where installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ckpt_trace.analysis.gpu import copy_summary
from ckpt_trace.formats import read_trace

RESULTS = Path(__file__).resolve().parent / "results"
ENGINES = ("dcp", "emitted", "torch-save", "safetensors")


def cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "ckpt_trace.cli", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ckpt-trace {' '.join(args[:3])} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return proc


def measure(engine: str, model: str, target: Path, backend: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"{engine}-", dir=target))  # ours alone: nothing of the user's is touched
    trace = work / "save.arrow"
    started = time.perf_counter()
    cli(
        "record",
        "--backend",
        backend,
        "--gpu",
        "on",
        "--path-filter",
        f"{work / 'ckpt'}/",
        "-o",
        str(trace),
        "--",
        sys.executable,
        "-m",
        "ckpt_trace.cli",
        "workload",
        engine,
        "--device",
        "cuda",
        "--model",
        model,
        "--with-optimizer",
        "--out",
        str(work / "ckpt"),
    )
    recorded_s = time.perf_counter() - started
    table = read_trace(trace).table
    gpu = copy_summary(table)
    ranks = gpu.get("ranks", {})
    entry = next(iter(ranks.values())) if ranks else {}
    row = {
        "engine": engine,
        "model": model,
        "recorded_s": recorded_s,
        "copies": gpu.get("copies", 0),
        "d2h_bytes": entry.get("d2h", {}).get("bytes", 0),
        "d2h_pinned_share": entry.get("d2h", {}).get("pinned_share", 0.0),
        "d2h_time_s": entry.get("d2h", {}).get("time_s", 0.0),
        "copy_wall_s": entry.get("copy_wall_s", 0.0),
        "write_time_s": entry.get("write_time_s", 0.0),
        "copy_io_overlap_s": entry.get("copy_io_overlap_s", 0.0),
    }
    for mode in ("recorded", "pinned"):
        out = work / f"replay-{mode}.json"
        cli(
            "replay",
            str(trace),
            "--target",
            str(work / f"replay-{mode}"),
            "--strategy",
            "posix",
            "--durable",
            "--gpu-copies",
            mode,
            "-o",
            str(out),
        )
        result = json.loads(out.read_text())["results"][0]
        copies = result.get("gpu_copies") or {}
        row[f"replay_{mode}_elapsed_s"] = result["elapsed_s"]
        row[f"replay_{mode}_copy_s"] = copies.get("elapsed_s", 0.0)
        shutil.rmtree(work / f"replay-{mode}", ignore_errors=True)
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    return row


def fio_limit(target: Path) -> float | None:
    if shutil.which("fio") is None:
        return None
    proc = subprocess.run(
        [
            "fio",
            "--name=w",
            f"--directory={target}",
            "--rw=write",
            "--bs=4m",
            "--size=1g",
            "--direct=1",
            "--ioengine=io_uring",
            "--iodepth=8",
            "--output-format=json",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)["jobs"][0]["write"]["bw_bytes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-medium")
    parser.add_argument("--target", type=Path, default=Path("/tmp/gpu-bench"))
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--results", type=Path, default=RESULTS / "gpu_checkpoint.json")
    args = parser.parse_args()
    args.target.mkdir(parents=True, exist_ok=True)
    rows = [measure(engine, args.model, args.target, args.backend) for engine in args.engines.split(",")]
    fio = fio_limit(args.target)
    table = Table(title=f"GPU-to-storage saves of {args.model} + Adam (one run; times from the traces)")
    for column in (
        "engine",
        "copies",
        "d2h GB",
        "pinned",
        "d2h s",
        "write s",
        "overlap s",
        "replay rec s",
        "replay pinned s",
        "copy rec/pinned",
    ):
        table.add_column(column, justify="left" if column == "engine" else "right")
    for r in rows:
        ratio = r["replay_recorded_copy_s"] / r["replay_pinned_copy_s"] if r["replay_pinned_copy_s"] else 0.0
        table.add_row(
            r["engine"],
            f"{r['copies']:,}",
            f"{r['d2h_bytes'] / 1e9:.2f}",
            f"{r['d2h_pinned_share']:.0%}",
            f"{r.get('d2h_time_s', 0.0):.3f}",
            f"{r['write_time_s']:.3f}",
            f"{r['copy_io_overlap_s']:.3f}",
            f"{r['replay_recorded_elapsed_s']:.3f}",
            f"{r['replay_pinned_elapsed_s']:.3f}",
            f"{ratio:.2f}x",
        )
    Console(width=140).print(table)
    if fio:
        print(f"fio sequential O_DIRECT write limit in {args.target}: {fio / 1e9:.2f} GB/s")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(
        json.dumps({"rows": rows, "fio_write_bytes_per_s": fio, "host": os.uname().nodename}, indent=1)
    )


if __name__ == "__main__":
    main()
