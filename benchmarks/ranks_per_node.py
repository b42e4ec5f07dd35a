"""The emitted writer and reader against DCP's FileSystemWriter/Reader with several ranks on one node.

A training node runs one rank per GPU, each saving its shard at once; the CPU and the device are shared.
Each cell is ``ckpt-trace workload emitted|dcp --ranks N --model M --with-optimizer --json`` (a save, each
rank a spawned gloo process holding DTensor row shards), then the same with ``--load --drop-caches`` (a
cold load, root only; warm otherwise); its ``io_s`` is the save or load barrier to barrier, so the slowest
rank's. Engines, alternated within each round (ABBA), so drift of a shared machine falls on all:

- ``emitted``: the writer module given by ``--writer`` (what ``ckpt-trace emit`` wrote), or
  ``ckpt_trace.writer``'s defaults;
- ``emitted-torch-copies``: the same with ``CKPT_TRACE_WRITER_SINGLE_THREAD_COPIES=0``: the staging
  copies by ``torch.Tensor.copy_`` on torch's OpenMP threads, as before 2026-11-29
  (``writer.staging.copy_bytes``; a load's copies are ``copy_`` in both);
- ``dcp``: torch.distributed.checkpoint's FileSystemWriter/Reader (sync_files on).

The results also keep the CPU seconds of each whole command (its process tree, getrusage(2)
RUSAGE_CHILDREN), start-up and the model's initialisation included, for information. Per rank count: each engine's median and range, and per round DCP's time over the
engine's (higher: the engine is faster) with the median and a distribution-free interval of it
(``stats.median_interval``); "within noise" where the interval includes 1.0 or covers less than 75 %
(fewer than 3 rounds).

    python benchmarks/ranks_per_node.py [--ranks 1,2,4] [--rounds 5] [--model gpt2-small] [--writer FILE]
    python benchmarks/ranks_per_node.py --ranks 4 --rounds 3 --engines emitted,emitted-torch-copies,dcp

What it found (the project's 2-core VM, virtio-blk, GPT-2-small + Adam, 1.39 GiB, 2026-11-29, load
average 0.5-1.5, ad hoc runs of the same commands before this script): with torch's copies the emitted
save from 4 ranks took 2.0-2.9 s, no faster than DCP's 2.2-2.5 s (``make demo`` said 0.99x), while one rank
saved 1.4 GiB in 1.37 s; 4 ranks x 2 OpenMP threads spin-waiting on 2 cores took 2.9 s of CPU in
``write_data`` (timed ad hoc inside the ranks) against 0.55 s with one memmove per copy. This script, 3
rounds, load average about 1: 4 ranks, emitted save 1.55 s (1.51-1.60), with torch's copies 2.59 s
(2.00-2.92), DCP 2.16 s (2.07-2.19): 1.37x DCP (1.34-1.43) against 0.80x (within noise); cold loads
1.03 s, 1.01 s and 2.47 s (the copy-out is a small part of a load). One rank: saves 1.22 s, 1.24 s and
2.89 s; cold loads 0.92, 0.86 and 0.98 s (6 more alternated pairs of the one-rank load: 0.80 s against 0.79
s, within noise). A second run, 5 rounds (a load's copies were memmoves too then): 4 ranks, saves 1.49 s
(1.42-1.55), 2.19 s (2.09-2.57) and 2.08 s (1.98-2.27), 1.41x DCP (1.32-1.60) against 0.95x (within noise),
cold loads 1.10, 1.00 and 2.40 s; 2 ranks, saves 1.27, 1.49 and 1.98 s (1.55x against 1.38x), loads 0.88,
0.90 and 1.14 s; one rank, loads 0.85-0.90 against 0.69-0.87 s. Loads gained nothing in either run, so
their copies went back to ``copy_``.

Prints a table per rank count and writes ``benchmarks/results/ranks_per_node.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import save_result
from rich.console import Console
from rich.table import Table

from ckpt_trace.stats import median_interval

ENGINES = ("emitted", "emitted-torch-copies", "dcp")
PHASES = ("save", "load")
_LEAST_COVERAGE = 0.75  # fewer rounds than 3 give no verdict (stats.median_interval's coverage)


def _command(engine: str, out: Path, ranks: int, model: str, writer: str | None, load: bool) -> list[str]:
    workload = "dcp" if engine == "dcp" else "emitted"
    extra = ["--writer", writer] if writer and workload == "emitted" else []
    if load:
        extra += ["--load", *(["--drop-caches"] if os.geteuid() == 0 else [])]
    return [
        sys.executable,
        "-m",
        "ckpt_trace.cli",
        "workload",
        workload,
        "--out",
        str(out),
        "--ranks",
        str(ranks),
        "--model",
        model,
        "--with-optimizer",
        *extra,
        "--json",
    ]


def _run(engine: str, out: Path, ranks: int, model: str, writer: str | None, load: bool) -> dict:
    """One workload command: its io_s, bytes and the CPU seconds of its process tree. Raises RuntimeError
    with the end of its stderr when it fails."""
    env = dict(os.environ)
    if engine == "emitted-torch-copies":
        env["CKPT_TRACE_WRITER_SINGLE_THREAD_COPIES"] = "0"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        _command(engine, out, ranks, model, writer, load), capture_output=True, text=True, env=env, check=False
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} {'load' if load else 'save'} ({ranks} ranks) failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"io_s": float(result["io_s"]), "bytes": int(result["bytes"]), "cpu_s": round(cpu_s, 3)}


def measure(args: argparse.Namespace, engines: list[str], ranks: int, scratch: Path) -> dict:
    """Every round: each engine's save then its cold load, engines in alternating order."""
    samples: dict[str, dict[str, list[dict]]] = {e: {p: [] for p in PHASES} for e in engines}
    for round_index in range(args.rounds):
        order = engines if round_index % 2 == 0 else engines[::-1]
        line = []
        for engine in order:
            out = scratch / f"{engine}-{ranks}"
            shutil.rmtree(out, ignore_errors=True)
            try:
                for phase in PHASES:
                    sample = _run(engine, out, ranks, args.model, args.writer, phase == "load")
                    samples[engine][phase].append(sample)
                    line.append(f"{engine} {phase} {sample['io_s']:.2f} s")
            finally:
                shutil.rmtree(out, ignore_errors=True)
        print(f"{ranks} ranks, round {round_index + 1}/{args.rounds}: " + ", ".join(line), flush=True)
    cell: dict = {"ranks": ranks, "engines": {}}
    for engine in engines:
        cell["engines"][engine] = {}
        for phase in PHASES:
            times = [s["io_s"] for s in samples[engine][phase]]
            entry = {
                "io_s": times,
                "cpu_s": [s["cpu_s"] for s in samples[engine][phase]],
                "bytes": samples[engine][phase][0]["bytes"],
                "median_s": statistics.median(times),
            }
            if "dcp" in samples and engine != "dcp":
                ratios = [d["io_s"] / s["io_s"] for d, s in zip(samples["dcp"][phase], samples[engine][phase])]
                interval = median_interval(ratios)
                verdict = (
                    "within noise"
                    if interval["low"] <= 1.0 <= interval["high"] or interval["coverage"] < _LEAST_COVERAGE
                    else ("faster" if interval["low"] > 1.0 else "slower")
                )
                entry["vs_dcp"] = {"ratios": ratios, **interval, "verdict": verdict}
            cell["engines"][engine][phase] = entry
    return cell


def render(cell: dict, console: Console) -> None:
    table = Table(title=f"{cell['ranks']} rank(s) per node", title_justify="left")
    table.add_column("engine")
    table.add_column("phase")
    table.add_column("median s", justify="right")
    table.add_column("range s", justify="right")
    table.add_column("DCP / engine", justify="right")
    for engine, phases in cell["engines"].items():
        for phase, entry in phases.items():
            times = entry["io_s"]
            vs = entry.get("vs_dcp")
            ratio = f"{vs['median']:.2f}x {vs['low']:.2f}-{vs['high']:.2f} {vs['verdict']}" if vs else ""
            table.add_row(
                engine,
                phase,
                f"{entry['median_s']:.2f}",
                f"{min(times):.2f}-{max(times):.2f}",
                ratio,
            )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4", help="rank counts per node (comma-separated)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="gpt2-small", help="the built-in model (with Adam state)")
    parser.add_argument("--writer", default=None, help="an emitted writer module (default: the writer's defaults)")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"from {', '.join(ENGINES)}")
    parser.add_argument("--scratch", type=Path, default=None, help="directory on the storage to measure")
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        parser.error(f"--engines: unknown {', '.join(unknown) or '(none given)'}; from {', '.join(ENGINES)}")
    try:
        rank_counts = [int(r) for r in args.ranks.split(",") if r]
    except ValueError:
        parser.error(f"--ranks must be integers, not {args.ranks!r}")
    if not rank_counts or min(rank_counts) < 1 or args.rounds < 1:
        parser.error("--ranks and --rounds must be at least 1")
    if args.writer and not Path(args.writer).is_file():
        parser.error(f"--writer {args.writer}: no such file")
    if args.scratch is not None and not (args.scratch.is_dir() and os.access(args.scratch, os.W_OK)):
        parser.error(f"--scratch {args.scratch} is not a writable directory")
    if os.geteuid() != 0:
        print("warning: not root, so the page cache cannot be dropped; loads are warm", file=sys.stderr)
    console = Console()
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-ranks-", dir=args.scratch))
    cells = []
    try:
        for ranks in rank_counts:
            cell = measure(args, engines, ranks, scratch)
            cells.append(cell)
            render(cell, console)
    except KeyboardInterrupt:
        sys.exit("ranks_per_node: interrupted")
    except RuntimeError as err:
        sys.exit(f"ranks_per_node: {err}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    save_result(
        "ranks_per_node",
        {
            "model": args.model,
            "writer": args.writer,
            "rounds": args.rounds,
            "cold_loads": os.geteuid() == 0,
            "load_average": os.getloadavg(),
            "cells": cells,
        },
    )


if __name__ == "__main__":
    main()
