"""Does the replay engine outrun the applications it replays? Operations per second against fio, on a tmpfs.

A trace of N recorded 4 KiB sequential writes into one file (``tracegen.py
--mix 4k``, default 200,000) is replayed under every strategy on a tmpfs
(memory speed, so the engine is what is measured), and fio runs the same
writes in the same file system, interleaved run by run (this machine is
shared and noisy; medians of ``--repeats``):

| strategy | fio counterpart (4 KiB writes, one new file, not preallocated) |
|---|---|
| posix | ``ioengine=psync`` |
| uring-buffered | ``ioengine=io_uring --iodepth=Q`` |
| uring-direct | ``ioengine=io_uring --iodepth=Q --direct=1`` |
| aggregated | ``ioengine=io_uring --iodepth=Q --direct=1 --bs=4M``, preallocated (bytes per second: aggregation turns the 4 KiB writes into 4 MiB ones, and it preallocates) |

Like for like with aggregated: fio preallocates while it lays the file out,
before its clock starts, whereas the aggregated replay's fallocate(2) runs
inside the replay's clock (the strategy pays for it, as an application
would). So the aggregated row's fio figure counts fio's layout in: fio's
runtime plus the time of the same fallocate(2) of a new file of the same
size, timed here on the same file system (``layout s``). fio without
preallocation (``--fallocate=none``) runs too, as a cross-check: on a tmpfs,
where fallocate(2) allocates and zeroes the pages that the writes would
otherwise allocate, its runtime should come close to the preallocated
runtime plus the layout.

Goal (issue 14): every strategy at least 0.80x its fio counterpart, and the
time around the replay (the ``replay`` call less the replay's own elapsed
time: reading and planning the trace, checking and preparing the target,
start-up and the results) under 20 % of the replay itself. Removing the
replay's files afterwards (``release``: on a tmpfs, freeing the pages, which
fio's own figure leaves out too) is its own column. The replays run in this
process, with the allocator settings the ``ckpt-trace`` command sets
(``cli.keep_freed_batches``); without them, glibc's adaptive thresholds
made the planning after an aggregated replay fault its memory in again
(about 40 ms more in one check). The first replay of a process also faults
in the planner's memory for the first time; the medians leave that out.

    python benchmarks/engine_rate.py [--ops 200000] [--target /dev/shm] [--queue-depth 32] [--repeats 5]

Prints a table and writes ``benchmarks/results/engine_rate.json``.
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

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save_result  # noqa: E402
from tracegen import generate  # noqa: E402

from ckpt_trace.cli import keep_freed_batches  # noqa: E402
from ckpt_trace.formats import read_trace  # noqa: E402
from ckpt_trace.replayer import (
    replay,  # noqa: E402
    strategies,  # noqa: E402
)
from ckpt_trace.replayer.replay import _plans  # noqa: E402

#: Every strategy that declares the fio job doing its I/O (``Strategy.fio_args``), in the table's order.
STRATEGIES = tuple(name for name, spec in strategies.table().items() if spec.fio_args)


def fio_run(directory: Path, strategy: str, ops: int, depth: int, preallocate: bool = True) -> dict:
    """fio's counterpart of ``strategy``: {"iops", "bytes_per_s", "runtime_s"} as fio reports them (its
    clock starts once the file is laid out)."""
    size = ops * 4096
    args = [arg.format(depth=depth) for arg in strategies.get(strategy).fio_args]
    if not preallocate:
        args = [*args, "--fallocate=none"]
    work = directory / "fio"
    work.mkdir()
    try:
        out = subprocess.run(
            [
                "fio",
                "--name=rate",
                f"--directory={work}",
                "--rw=write",
                f"--size={size}",
                "--output-format=json",
                *args,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        shutil.rmtree(work)  # ours: made just above
    job = json.loads(out)["jobs"][0]["write"]
    return {"iops": job["iops"], "bytes_per_s": job["bw_bytes"], "runtime_s": job["runtime"] / 1e3}


def layout_s(directory: Path, size: int) -> float:
    """Seconds of fallocate(2) (mode 0, what fio's default ``fallocate=native`` lays a file out with) of a
    new file of ``size`` bytes in ``directory``."""
    path = directory / "layout"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        started = time.perf_counter()
        os.posix_fallocate(fd, 0, size)
        return time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()  # ours: created just above (O_EXCL)


def replay_run(trace: Path, directory: Path, strategy: str, depth: int) -> dict:
    started = time.monotonic()
    report = replay(trace, target=directory / "replay", strategy=strategy, queue_depth=depth)
    total = time.monotonic() - started
    started = time.monotonic()
    report.release()
    release_s = time.monotonic() - started
    result = report.results[0]
    return {
        "iops": result.data_ops / result.elapsed_s,
        "bytes_per_s": result.write_throughput_bytes_per_s,
        "elapsed_s": result.elapsed_s,
        "around_s": total - result.elapsed_s,
        "release_s": release_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--target", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--queue-depth", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    keep_freed_batches()  # the allocator settings the ckpt-trace command runs with (its main sets them)
    if shutil.which("fio") is None:
        sys.exit("engine_rate.py: fio is not installed")
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-rate-", dir=args.target))
    trace = Path(tempfile.mkdtemp(prefix="ckpt-trace-rate-trace-")) / "writes.arrow"
    generate(trace, args.ops + 3, 1, mix="4k")
    started = time.monotonic()
    loaded = read_trace(trace)
    read_s = time.monotonic() - started
    started = time.monotonic()
    _plans(loaded, "posix", None)
    plan_s = time.monotonic() - started
    rows = []
    try:
        for strategy in STRATEGIES:
            ours, theirs = [], []
            for _ in range(args.repeats):  # interleaved, so drift hits both alike
                ours.append(replay_run(trace, scratch, strategy, args.queue_depth))
                theirs.append(fio_run(scratch, strategy, args.ops, args.queue_depth))
                if strategies.get(strategy).uses_buffer_bytes:  # fio's layout counted in (see the module docstring)
                    theirs[-1]["layout_s"] = layout_s(scratch, args.ops * 4096)
                    theirs[-1]["unpreallocated_bytes_per_s"] = fio_run(
                        scratch, strategy, args.ops, args.queue_depth, preallocate=False
                    )["bytes_per_s"]
                    theirs[-1]["reported_bytes_per_s"] = theirs[-1]["bytes_per_s"]
                    theirs[-1]["bytes_per_s"] = args.ops * 4096 / (theirs[-1]["runtime_s"] + theirs[-1]["layout_s"])
            figure = "bytes_per_s" if strategies.get(strategy).uses_buffer_bytes else "iops"
            ratio = [o[figure] / t[figure] for o, t in zip(ours, theirs)]
            extra = {}
            if strategies.get(strategy).uses_buffer_bytes:
                extra = {
                    key: statistics.median(t[key] for t in theirs)
                    for key in ("layout_s", "reported_bytes_per_s", "unpreallocated_bytes_per_s")
                }
                extra["ratio_to_reported"] = statistics.median(
                    o[figure] / t["reported_bytes_per_s"] for o, t in zip(ours, theirs)
                )
            rows.append(
                {
                    "strategy": strategy,
                    "figure": figure,
                    "replay": statistics.median(o[figure] for o in ours),
                    "fio": statistics.median(t[figure] for t in theirs),
                    "ratio": statistics.median(ratio),
                    "ratios": ratio,
                    **extra,
                    "elapsed_s": statistics.median(o["elapsed_s"] for o in ours),
                    "around_s": statistics.median(o["around_s"] for o in ours),
                    "around_share": statistics.median(o["around_s"] / o["elapsed_s"] for o in ours),
                    "release_s": statistics.median(o["release_s"] for o in ours),
                }
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # ours: made by mkdtemp above
        shutil.rmtree(trace.parent, ignore_errors=True)
    table = Table(title=f"Engine rate: {args.ops:,} writes of 4 KiB on {args.target} (median of {args.repeats})")
    for column in ("strategy", "replay", "fio", "ratio", "replay s", "around s", "around/replay", "release s"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in rows:
        unit = (lambda x: f"{x / 1e6:,.0f} MB/s") if row["figure"] == "bytes_per_s" else (lambda x: f"{x:,.0f} op/s")
        table.add_row(
            row["strategy"],
            unit(row["replay"]),
            unit(row["fio"]),
            f"{row['ratio']:.2f}x",
            f"{row['elapsed_s']:.2f}",
            f"{row['around_s']:.2f}",
            f"{row['around_share']:.0%}",
            f"{row['release_s']:.2f}",
        )
    Console(width=None if sys.stdout.isatty() else 120).print(table)
    print(f"reading the trace {read_s:.3f} s, planning it {plan_s:.3f} s ({plan_s / (args.ops + 3) * 1e6:.2f} us/row)")
    for row in rows:
        if strategies.get(row["strategy"]).uses_buffer_bytes:
            print(
                f"aggregated's fio: {row['reported_bytes_per_s'] / 1e6:,.0f} MB/s as fio reports it (its layout, "
                f"a {row['layout_s']:.3f} s fallocate, before its clock: {row['ratio_to_reported']:.2f}x); "
                f"{row['unpreallocated_bytes_per_s'] / 1e6:,.0f} MB/s with --fallocate=none"
            )
    result = {
        "benchmark": "engine_rate",
        "ops": args.ops,
        "target": str(args.target),
        "queue_depth": args.queue_depth,
        "repeats": args.repeats,
        "read_s": read_s,
        "plan_s": plan_s,
        "results": rows,
    }
    save_result("engine_rate", result)


if __name__ == "__main__":
    main()
