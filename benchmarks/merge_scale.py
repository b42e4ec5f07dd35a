"""Merging the traces of many nodes: time and peak memory of ``ckpt-trace merge`` (issue 33's goal: 64 traces
of 1 M rows each in under 60 s and 2 GB).

Each node's trace is a synthetic DCP save (``tracegen.py``): ``--ranks-per-trace`` ranks numbered after the
previous node's, its own host, boot id and clock anchors (a monotonic clock with another origin per node,
a few microseconds of anchor uncertainty), so the merge aligns clocks, moves nothing (pids differ) and
interleaves every node's rows. The merge runs as ``ckpt-trace merge`` in a child process; its wall time and
its peak resident memory (``getrusage(RUSAGE_CHILDREN).ru_maxrss``) are measured, and the merged trace's
row count and global order are checked.

    python benchmarks/merge_scale.py --traces 64 --rows 1000000 --dir /scratch/merge-bench [--repeat 3] [--json OUT]

Generating the traces is not timed (they are made once and reused). Each merge runs in a child process:
wall time, CPU time (user + system) and peak RSS from its own rusage (wait4), and the 1-minute load
average before and after, since this machine's 2 cores are shared with other jobs. Prints a table and
writes ``benchmarks/results/merge_scale.json``.

Measured (2 cores shared with other jobs): before the streaming rewrite, 64 x 200k rows took 107 s at
1.82 GB (about 120,000 rows/s; 64 x 1 M extrapolated to 9 minutes: the writer's spool compressed every row
twice and renumbered text in Python). 64 x 1 M rows (64 M rows, 808 MB in, 714 MB out), one run each:
after writing straight into the file, 126 s at 1.95 GB (load about 8); with numpy gathers, prefetching
only the inputs that drain next and a sort on unique keys, 137 s wall and 56 s CPU at 1.16 GB peak RSS
with a load average of 11-12 on the 2 cores; with the rows made on a thread ahead of the writer,
``--repeat 2``: 62.9 s wall, 39.5 s CPU, 1.18 GB (load 5.0 before, 6.2 after) and 118.7 s, 54.5 s CPU,
1.19 GB (load 6.2, 8.8); then ``--repeat 3``: 57.0, 54.7 and 35.7 s wall (median 54.7 s, spread 21.4 s),
41.8, 41.0 and 31.3 s CPU, 1.18, 1.21 and 1.17 GB, load 6.2-7.4: the goal (60 s, 2 GB) met, with a margin
in memory and little in time, which the machine's load decides (contention inflates even the CPU time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tracegen  # noqa: E402

from ckpt_trace.formats import count_rows, scan  # noqa: E402

T0 = 1_750_000_000_000_000_000


def node_metadata(index: int) -> dict:
    """A node's host, boot and anchors: its monotonic clock reads (index + 1) * 1e12 at T0 (+ index us)."""
    clock_at_t0 = (index + 1) * 10**12
    anchors = [
        {"realtime_ns": T0, "clock_ns": clock_at_t0, "uncertainty_ns": 2000},
        {"realtime_ns": T0 + 60 * 10**9, "clock_ns": clock_at_t0 + 60 * 10**9, "uncertainty_ns": 2000},
    ]
    return {
        "host": f"node{index:03d}",
        "boot_id": f"boot-{index}",
        "clock": {"name": "CLOCK_MONOTONIC", "origin_ns": clock_at_t0 + index * 1000, "anchors": anchors},
    }


def _make_one(path: Path, rows: int, ranks: int, index: int) -> None:
    tracegen.generate(path, rows, ranks, seed=index, rank_base=index * ranks, node=node_metadata(index))


def make_traces(directory: Path, traces: int, rows: int, ranks: int, jobs: int = 1) -> tuple[list[Path], float]:
    """The node traces (made once, reused when already there; ``jobs`` processes) and the seconds it took."""
    from concurrent.futures import ProcessPoolExecutor

    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    paths = [directory / f"node{index:03d}-{rows}.arrow" for index in range(traces)]
    missing = [(path, index) for index, path in enumerate(paths) if not path.exists()]
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        for future in [pool.submit(_make_one, path, rows, ranks, index) for path, index in missing]:
            future.result()
    return paths, time.monotonic() - started


def _merge_once(paths: list[Path], out: Path) -> dict:
    """One ``ckpt-trace merge`` in a child process: its wall time, CPU time, peak RSS (its own rusage, from
    wait4) and the 1-minute load average before and after."""
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt_trace.cli", "merge", *map(str, paths), "-o", str(out), "--force", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"merge_scale: merge failed: {stderr.strip()}")
    return {
        "merge_s": round(elapsed, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "rows": json.loads(stdout)["rows"],
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=64)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per trace")
    parser.add_argument("--ranks-per-trace", type=int, default=8)
    parser.add_argument("--dir", type=Path, required=True, help="where the traces and the merge are written")
    parser.add_argument("--repeat", type=int, default=1, help="merges to time (median and spread reported)")
    parser.add_argument(
        "--json",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "merge_scale.json",
        help="write the figures here too",
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes generating the node traces")
    args = parser.parse_args()
    paths, made_s = make_traces(args.dir, args.traces, args.rows, args.ranks_per_trace, args.jobs)  # not timed
    out = args.dir / f"job-{args.traces}x{args.rows}.arrow"
    runs = [_merge_once(paths, out) for _ in range(max(1, args.repeat))]
    rows_in = sum(count_rows(p) for p in paths)
    last, ordered = -1, True
    _, batches = scan(out, ["ts_ns"])
    for batch in batches:
        ts = batch.column("ts_ns").to_numpy()
        ordered &= bool(len(ts) == 0 or (ts[0] >= last and np.all(np.diff(ts) >= 0)))
        last = int(ts[-1]) if len(ts) else last
    seconds = [run["merge_s"] for run in runs]
    median = float(np.median(seconds))
    figures = {
        "traces": args.traces,
        "rows_per_trace": args.rows,
        "rows_in": rows_in,
        "rows_out": runs[-1]["rows"],
        "in_time_order": ordered,
        "merge_s_median": round(median, 2),
        "merge_s_spread": round(max(seconds) - min(seconds), 2),
        "runs": runs,
        "peak_rss_bytes_max": max(run["peak_rss_bytes"] for run in runs),
        "rows_per_s": round(runs[-1]["rows"] / median),
        "input_bytes": sum(p.stat().st_size for p in paths),
        "output_bytes": out.stat().st_size,
        "generate_s": round(made_s, 1),
        "cpus": os.cpu_count(),
        "goal": "64 x 1 M rows in < 60 s, < 2 GB",
    }
    print(f"{'run':>4} {'rows':>11} {'wall s':>8} {'cpu s':>8} {'peak RSS GB':>12} {'load before/after':>18}")
    for i, run in enumerate(runs):
        print(
            f"{i:>4} {run['rows']:>11,} {run['merge_s']:>8.1f} {run['cpu_s']:>8.1f} "
            f"{run['peak_rss_bytes'] / 1e9:>12.2f} {run['load_before']:>8.1f}/{run['load_after']:<8.1f}"
        )
    print(
        f"median {median:.1f} s, spread {figures['merge_s_spread']:.1f} s, in time order: {ordered}, "
        f"{figures['rows_per_s']:,} rows/s on {os.cpu_count()} CPUs"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    out.unlink()


if __name__ == "__main__":
    main()
