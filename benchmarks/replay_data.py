"""What generating the replay's data costs: the generator's speed, and replay time with it.

1. ``iolayer.pattern.fill`` (C ``ckr_fill``) filling 1 MiB (cache-resident)
   and 64 MiB buffers, ``--fill-runs`` times each, against a plain memory copy
   of 64 MiB (numpy) for scale: GB/s as median (min-max).
2. A synthetic DCP-like save (``benchmarks/tracegen.py --mix dcp``: 2 ranks,
   400 rows, 469 MiB of writes of 64 B-16 MiB) replayed ``--runs`` times per
   strategy, the strategies interleaved, each run a fresh target; elapsed as
   median (min-max). By default the data is made before the clock
   (``replayer.data``); ``--as-issued`` makes the executors generate it as
   each write is issued (``CKPT_TRACE_REPLAY_PREGENERATE_BYTES=0``), and then
   the generator's estimated share of elapsed is given (bytes written / the
   64 MiB fill rate / elapsed; an upper bound, since the ring engines fill
   while earlier writes are in flight).

Run the same script with another tree's PYTHONPATH (one without
``pattern.fill``) to get the "before" figures: it then skips part 1.

    python benchmarks/replay_data.py [--trace T.arrow] [--scratch DIR] [--runs 5] [--durable] [--as-issued]

Measured on the development VM (2 vCPUs shared with about six other jobs,
virtio disk, not durable, target on the root file system; 2026-11-27), the
tree before the change (c2fafcd: a 1 MiB table pattern, cache-hot) and after
it, alternating, 7 rounds each, median (min-max) of elapsed:

    fill 1 MiB 2.8-7.3 GB/s, fill 64 MiB 0.9-3.8 GB/s (per-round medians), memcpy 64 MiB 1.6-2.2 GB/s
    made before the clock (default):
      posix           before 1.69 s (0.69-2.54)  after 1.32 s (0.69-1.96)
      uring-buffered  before 0.61 s (0.50-1.38)  after 0.85 s (0.60-1.73)
      aggregated      before 0.32 s (0.28-1.28)  after 0.42 s (0.33-0.66)
    --as-issued (another 7 rounds):
      posix           before 0.92 s (0.76-1.13)  after 1.28 s (1.03-1.79)   fill share 0.10-0.32
      uring-buffered  before 1.54 s (0.57-2.35)  after 1.48 s (0.96-2.24)   fill share 0.08-0.26
      aggregated      before 0.38 s (0.35-0.54)  after 0.75 s (0.58-1.33)   fill share 0.15-0.48

Generated as issued, the data costs about a memory copy per byte: up to a
third of a page-cache replay's time and half of an O_DIRECT one's on this
VM. Made before the clock, what remains is reading 469 MiB of distinct
memory instead of one cache-hot MiB, as the traced program did.
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

import numpy as np

HERE = Path(__file__).resolve().parent


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fill_rates(runs: int) -> dict:
    from ckpt_trace.iolayer import pattern
    from ckpt_trace.iolayer.buffers import AlignedBuffer

    if not hasattr(pattern, "fill"):
        return {}
    out = {}
    with AlignedBuffer(64 << 20) as buf:
        buf.prefault()
        for size in (1 << 20, 64 << 20):
            rates = []
            for i in range(runs):
                t0 = time.perf_counter()
                pattern.fill(buf.ptr, size, 12345, i * size)
                rates.append(size / (time.perf_counter() - t0) / 1e9)
            out[f"fill_{size >> 20}MiB_GBps"] = spread(rates)
    src = np.ones(64 << 20, np.uint8)
    dst = np.empty_like(src)
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        rates.append((64 << 20) / (time.perf_counter() - t0) / 1e9)
    out["memcpy_64MiB_GBps"] = spread(rates)
    return out


def replays(trace: Path, scratch: Path, strategies: list[str], runs: int, durable: bool) -> dict:
    from ckpt_trace.replayer import replay

    elapsed: dict[str, list[float]] = {s: [] for s in strategies}
    written: dict[str, int] = {}
    for i in range(runs):
        order = strategies[i % len(strategies) :] + strategies[: i % len(strategies)]
        for strategy in order:
            target = scratch / f"t-{strategy}-{i}"
            report = replay(trace, target=target, strategy=strategy, durable=durable, repeat=1)
            result = report.results[0]
            elapsed[strategy].append(result.elapsed_s)
            written[strategy] = result.bytes_written
            shutil.rmtree(target)
    return {s: {"elapsed_s": spread(v), "bytes_written": written[s]} for s, v in elapsed.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="a trace to replay (default: tracegen's dcp mix, 2 ranks, 400 rows)")
    parser.add_argument("--scratch", type=Path, default=None, help="where targets go (default: a temporary dir)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fill-runs", type=int, default=15)
    parser.add_argument("--strategies", default="posix,uring-buffered,aggregated")
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--as-issued", action="store_true", help="generate the data as each write is issued")
    args = parser.parse_args()
    if args.as_issued:
        os.environ["CKPT_TRACE_REPLAY_PREGENERATE_BYTES"] = "0"
    scratch = Path(tempfile.mkdtemp(prefix="replay-data-", dir=args.scratch))
    try:
        trace = args.trace
        if trace is None:
            trace = scratch / "dcp.arrow"
            subprocess.run(
                [
                    sys.executable,
                    str(HERE / "tracegen.py"),
                    str(trace),
                    "--rows",
                    "400",
                    "--ranks",
                    "2",
                    "--mix",
                    "dcp",
                ],
                check=True,
                capture_output=True,
            )
        out = {
            "fill": fill_rates(args.fill_runs),
            "replay": replays(trace, scratch, args.strategies.split(","), args.runs, args.durable),
        }
        rate = out["fill"].get("fill_64MiB_GBps", {}).get("median")
        if rate and args.as_issued:
            for figures in out["replay"].values():
                figures["fill_share_estimate"] = (
                    figures["bytes_written"] / (rate * 1e9) / figures["elapsed_s"]["median"]
                )
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
