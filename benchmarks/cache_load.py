"""A DCP load replayed in the page-cache state it was recorded in: read time and bytes from storage.

Saves a DCP checkpoint once (``ckpt-trace workload dcp``), then per round records its load with the bcc
backend twice: cold (every file of the checkpoint fsynced and dropped, ``posix_fadvise(DONTNEED)`` per file)
and warm (every file read once first), in alternating order from round to round. Each trace is replayed with
posix and the default ``--cache recorded``, once per ``replay --read-memory`` mode (malloc, the default,
reused, fresh; the order reversed every other round), in a child process (``tests/helpers/replay_io.py``), not
recorded.

Figures per trace: the recorded read time (the sum of the read rows' ``dur_ns``: time inside read calls,
summed over the ranks' threads), the replayed read time (the run's mean data-operation latency times its
data operations: the same sum, for a load whose data operations are all reads), their ratio; the distinct
bytes the trace read cold (what ``--cache recorded`` drops), the bytes the replaying process read from
storage (``/proc/self/io`` ``read_bytes``) and the device's (``/proc/diskstats``, every process of the
machine). Prints one line per replay, then per state and read memory the median ratio with its range, how
many replays came within 2x of the recorded read time and how many read from the device within 10 % (or
1 MiB, for a warm trace) of the distinct bytes the trace read cold (issue 34's bounds), and the 1-minute load
average before and after; writes ``benchmarks/results/cache_load.json`` (every replay's figures, the ratios
per key and those counts).

    python benchmarks/cache_load.py --dir /scratch/cache-load [--model gpt2-small] [--ranks 2] [--rounds 3]
        [--read-memory malloc|reused|fresh|all]

Measured (GPT-2-small with Adam, 2 ranks, 3 rounds): see docs/verdicts.md ("Page cache").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pyarrow.compute as pc
from common import save_result

from ckpt_trace.formats import read_trace
from ckpt_trace.iolayer.pagecache import evict

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "helpers" / "replay_io.py"
CLI = (sys.executable, "-m", "ckpt_trace.cli")
MEMORIES = ("malloc", "reused", "fresh")
DEVICE_SLACK_BYTES = 1 << 20  # the device bound's floor: diskstats counts every process of the machine


def _bounds(replays: list[dict]) -> dict[str, dict[str, int]]:
    """Per key, of its replays: how many, how many within 2x of the recorded read time, and how many read from
    the device within 10 % (at least ``DEVICE_SLACK_BYTES``) of the distinct bytes the trace read cold."""
    out: dict[str, dict[str, int]] = {}
    for r in replays:
        counts = out.setdefault(r["key"], {"replays": 0, "time_within_2x": 0, "device_within_10_percent": 0})
        counts["replays"] += 1
        counts["time_within_2x"] += 0.5 <= r["ratio"] <= 2.0
        if r["device_read_bytes"] is not None and r["cold_bytes"] is not None:
            slack = max(0.1 * r["cold_bytes"], DEVICE_SLACK_BYTES)
            counts["device_within_10_percent"] += abs(r["device_read_bytes"] - r["cold_bytes"]) <= slack
    return out


def _files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.iterdir() if p.is_file())


def _drop(checkpoint: Path) -> None:
    for path in _files(checkpoint):
        evict(path)


def _warm(checkpoint: Path) -> None:
    for path in _files(checkpoint):
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def _run(*args: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"cache_load: {' '.join(args[:6])} ... failed: {proc.stderr.strip()[-2000:]}")


def _recorded(trace: Path) -> tuple[float, int]:
    """(read time in s, the column's sum) of the trace's read rows."""
    table = read_trace(trace).table
    reads = table.filter(pc.equal(table.column("op"), "read"))
    return (pc.sum(reads.column("dur_ns")).as_py() or 0) / 1e9, pc.sum(reads.column("cold_bytes")).as_py() or 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="scratch directory on a block device")
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-optimizer", action="store_true", help="leave out the Adam state")
    parser.add_argument(
        "--read-memory",
        choices=[*MEMORIES, "all"],
        default="all",
        help="where the replay's reads land (replay --read-memory); all: each trace replayed each way",
    )
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    checkpoint = args.dir / "ck"
    shape = ["--ranks", str(args.ranks), "--model", args.model, *([] if args.no_optimizer else ["--with-optimizer"])]
    if not checkpoint.exists():
        _run(*CLI, "workload", "dcp", "--out", str(checkpoint), *shape)
    size = sum(p.stat().st_size for p in _files(checkpoint))
    load_before = os.getloadavg()[0]
    print(f"checkpoint: {args.model}, {args.ranks} ranks, {size:,} B; load average {load_before:.2f}")
    ratios: dict[str, list[float]] = defaultdict(list)
    replays: list[dict] = []
    for round_ in range(args.rounds):
        for state in ("cold", "warm") if round_ % 2 == 0 else ("warm", "cold"):
            (_drop if state == "cold" else _warm)(checkpoint)
            trace = args.dir / f"load-{state}-{round_}.arrow"
            load = ["workload", "dcp", "--load", "--out", str(checkpoint), *shape]
            _run(
                *CLI,
                "record",
                "--backend",
                "bcc",
                "--path-filter",
                f"{checkpoint}/",
                "-o",
                str(trace),
                "--",
                *CLI,
                *load,
            )
            recorded_s, column = _recorded(trace)
            memories = MEMORIES if round_ % 2 == 0 else MEMORIES[::-1]
            for memory in memories if args.read_memory == "all" else [args.read_memory]:
                with tempfile.TemporaryDirectory(dir=args.dir) as target:
                    out = Path(target) / "figures.json"
                    _run(sys.executable, str(DRIVER), str(trace), str(Path(target) / "t"), str(out), "recorded", memory)
                    figures = json.loads(out.read_text())
                ratio = figures["read_time_s"] / recorded_s if recorded_s else float("nan")
                ratios[f"{state}, {memory} memory"].append(ratio)
                replays.append(
                    {
                        "key": f"{state}, {memory} memory",
                        "round": round_,
                        "recorded_read_s": recorded_s,
                        "replayed_read_s": figures["read_time_s"],
                        "ratio": ratio,
                        "cold_bytes": figures["cold_bytes"],
                        "device_read_bytes": figures["device_read_bytes"],
                        "process_read_bytes": figures["process_read_bytes"],
                    }
                )
                print(
                    f"round {round_} {state}, {memory} memory: read time recorded {recorded_s:.3f} s, replayed "
                    f"{figures['read_time_s']:.3f} s (x{ratio:.2f}); cold: column {column:,} B, distinct "
                    f"{figures['cold_bytes']:,} B; replay read from storage {figures['process_read_bytes']:,} B "
                    f"(device {figures['device_read_bytes'] or 0:,} B); {figures['state']}; "
                    f"load {os.getloadavg()[0]:.2f}"
                )
            trace.unlink()
    summary = {}
    for key, values in ratios.items():
        if values:
            summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
            print(
                f"{key}: replayed / recorded read time median x{statistics.median(values):.2f} "
                f"(range {min(values):.2f}-{max(values):.2f}, {len(values)} rounds)"
            )
    bounds = _bounds(replays)
    for key, counts in bounds.items():
        print(
            f"{key}: within 2x of the recorded read time {counts['time_within_2x']} of {counts['replays']}; "
            f"device read within 10 % of the cold bytes {counts['device_within_10_percent']} of {counts['replays']}"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    save_result(
        "cache_load",
        {
            "model": args.model,
            "ranks": args.ranks,
            "checkpoint_bytes": size,
            "ratios": dict(ratios),
            "summary": summary,
            "bounds": bounds,
            "replays": replays,
            "load_average": [load_before, os.getloadavg()[0]],
        },
    )


if __name__ == "__main__":
    main()
