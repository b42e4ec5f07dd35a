"""Tracer overhead on the built-in DCP workload: wall time untraced, under bcc, under strace.

Runs are interleaved (untraced, bcc, strace, untraced, ...) in one process on
the same machine and disk, so drift and noise hit every variant alike; each
variant's median is reported and overheads are ratios to the untraced median.
The checkpoint directory is removed between runs. Two figures per backend:
"record end-to-end" is the whole ``ckpt-trace record`` command (start-up, BPF
compile, teardown, writing the trace included); "workload under trace" is the
traced command's own wall time, from the trace's ``command_elapsed_ns``.
Goal (issue 2): bcc adds at most 5 % to the wall time of the demo's workload.

    python benchmarks/tracer_overhead.py [--model gpt2-medium] [--ranks 4] [--repeats 3] [--out DIR]

Prints a table and writes ``benchmarks/results/tracer_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckpt_trace.formats import read_metadata
from ckpt_trace.tracer import bcc_backend, strace_backend
from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"


def workload_cmd(out: Path, args) -> list[str]:
    cmd = [sys.executable, "-m", "ckpt_trace.cli", "workload", "dcp", "--out", str(out), "--ranks", str(args.ranks),
           "--model", args.model]
    return cmd + (["--with-optimizer"] if args.with_optimizer else [])


def timed(cmd: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def run_variant(variant: str, scratch: Path, args) -> tuple[float, float]:
    """(end-to-end seconds, the workload command's own seconds) of one run."""
    out = scratch / "ckpt"
    shutil.rmtree(out, ignore_errors=True)
    trace = scratch / f"{variant}.arrow"
    trace.unlink(missing_ok=True)
    cmd = workload_cmd(out, args)
    if variant == "untraced":
        elapsed = timed(cmd)
        return elapsed, elapsed
    elapsed = timed([sys.executable, "-m", "ckpt_trace.cli", "record", "--backend", variant, "-o", str(trace),
                     "--path-filter", f"{out}/", "--", *cmd])
    return elapsed, read_metadata(trace)["command_elapsed_ns"] / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-medium")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-optimizer", dest="with_optimizer", action="store_false")
    parser.add_argument("--out", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()

    variants = ["untraced"]
    skipped = {}
    for name, problem in (("bcc", bcc_backend.probe()),
                          ("strace", None if strace_backend.available() else "strace not installed")):
        if problem:
            skipped[name] = problem
        else:
            variants.append(name)
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-bench-", dir=args.out))
    times: dict[str, list[float]] = {v: [] for v in variants}
    command_times: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for _ in range(args.repeats):
            for variant in variants:
                total, command = run_variant(variant, scratch, args)
                times[variant].append(total)
                command_times[variant].append(command)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    base = statistics.median(times["untraced"])
    rows = []
    for variant in variants:
        median = statistics.median(times[variant])
        command = statistics.median(command_times[variant])
        rows.append({"variant": variant, "median_s": median, "min_s": min(times[variant]),
                     "max_s": max(times[variant]), "runs_s": times[variant], "overhead_ratio": median / base - 1.0,
                     "command_median_s": command, "command_runs_s": command_times[variant],
                     "command_overhead_ratio": command / base - 1.0})
    table = Table(title=f"Tracer overhead: dcp {args.model}, {args.ranks} ranks, "
                        f"{'with' if args.with_optimizer else 'without'} Adam, median of {args.repeats}")
    for column in ("variant", "record end-to-end", "min", "max", "overhead", "workload under trace", "overhead "):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for row in rows:
        untraced = row["variant"] == "untraced"
        table.add_row(row["variant"], f"{row['median_s']:.2f} s", f"{row['min_s']:.2f} s", f"{row['max_s']:.2f} s",
                      "-" if untraced else f"{row['overhead_ratio']:+.1%}", f"{row['command_median_s']:.2f} s",
                      "-" if untraced else f"{row['command_overhead_ratio']:+.1%}")
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    for name, problem in skipped.items():
        print(f"{name}: skipped ({problem})")
    RESULTS.mkdir(exist_ok=True)
    result = {"benchmark": "tracer_overhead", "model": args.model, "ranks": args.ranks,
              "with_optimizer": args.with_optimizer, "repeats": args.repeats, "host": os.uname().nodename,
              "kernel": os.uname().release, "results": rows, "skipped": skipped}
    (RESULTS / "tracer_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {RESULTS / 'tracer_overhead.json'}")


if __name__ == "__main__":
    main()
