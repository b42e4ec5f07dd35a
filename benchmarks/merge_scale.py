"""Merging the traces of many nodes: time and peak memory of ``ckpt-trace merge`` (issue 33's goal: 64 traces
of 1 M rows each in under 60 s and 2 GB).

Each node's trace is a synthetic DCP save (``tracegen.py``): ``--ranks-per-trace`` ranks numbered after the
previous node's, its own host, boot id and clock anchors (a monotonic clock with another origin per node,
a few microseconds of anchor uncertainty), so the merge aligns clocks, moves nothing (pids differ) and
interleaves every node's rows. The merge runs as ``ckpt-trace merge`` in a child process; its wall time and
its peak resident memory (``getrusage(RUSAGE_CHILDREN).ru_maxrss``) are measured, and the merged trace's
row count and global order are checked.

    python benchmarks/merge_scale.py --traces 64 --rows 1000000 --dir /scratch/merge-bench [--json OUT]

Measured (2 cores shared with other jobs, one run each): 8 x 200k rows, 1.6 M rows in 22.4 s at 0.58 GB
before text stayed dictionary-encoded, 5.2 s after (in-process, profiled); 64 x 50k rows, 3.2 M rows in
24.3 s at 1.29 GB; 64 x 200k rows, 12.8 M rows in 103 s at 2.43 GB, then 107 s at 1.82 GB once at most a
batch goes out at a time (about 120,000 rows/s). Memory is bounded by the inputs' held batches (one each,
and one the scan reads ahead: 65,536 rows), not their length, so 64 x 1 M rows should stay near 1.8 GB;
its time, about 64 M / 120,000 rows/s = 9 minutes here, misses the 60 s goal (not run here: the writer's
compression and the per-batch sort are single-threaded).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
    anchors = [{"realtime_ns": T0, "clock_ns": clock_at_t0, "uncertainty_ns": 2000},
               {"realtime_ns": T0 + 60 * 10**9, "clock_ns": clock_at_t0 + 60 * 10**9, "uncertainty_ns": 2000}]
    return {"host": f"node{index:03d}", "boot_id": f"boot-{index}",
            "clock": {"name": "CLOCK_MONOTONIC", "origin_ns": clock_at_t0 + index * 1000, "anchors": anchors}}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=64)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per trace")
    parser.add_argument("--ranks-per-trace", type=int, default=8)
    parser.add_argument("--dir", type=Path, required=True, help="where the traces and the merge are written")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--jobs", type=int, default=1, help="processes generating the node traces")
    args = parser.parse_args()
    paths, made_s = make_traces(args.dir, args.traces, args.rows, args.ranks_per_trace, args.jobs)
    out = args.dir / f"job-{args.traces}x{args.rows}.arrow"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ckpt_trace.cli", "merge", *map(str, paths), "-o", str(out),
                           "--force", "--json"], capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if proc.returncode:
        sys.exit(f"merge_scale: merge failed: {proc.stderr.strip()}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    merged = json.loads(proc.stdout)
    rows_in = sum(count_rows(p) for p in paths)
    last, ordered = -1, True
    _, batches = scan(out, ["ts_ns"])
    for batch in batches:
        ts = batch.column("ts_ns").to_numpy()
        ordered &= bool(len(ts) == 0 or (ts[0] >= last and np.all(np.diff(ts) >= 0)))
        last = int(ts[-1]) if len(ts) else last
    figures = {"traces": args.traces, "rows_per_trace": args.rows, "rows_in": rows_in, "rows_out": merged["rows"],
               "in_time_order": ordered, "merge_s": round(elapsed, 2), "peak_rss_bytes": peak,
               "rows_per_s": round(merged["rows"] / elapsed), "input_bytes": sum(p.stat().st_size for p in paths),
               "output_bytes": out.stat().st_size, "generate_s": round(made_s, 1), "cpus": os.cpu_count(),
               "goal": "64 x 1 M rows in < 60 s, < 2 GB"}
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    out.unlink()


if __name__ == "__main__":
    main()
