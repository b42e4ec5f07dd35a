"""Replay strategies against the device limit, in one process, on the same disk and bytes.

1. fio sequential write, 4 MiB blocks, io_uring, O_DIRECT, queue depth 32,
   with a final fsync: the device limit is the best of ``--fio-runs`` runs
   (fio(1), --output-format=json), since one sample on a shared disk varies.
2. The demo's DCP trace (4 ranks, GPT-2-medium + Adam) under every strategy.
3. A small-operation-heavy trace recorded from a real workload: torch.save of
   a 1,024-layer narrow GPT-2 with Adam state, one file per layer (as DeepSpeed
   pipeline checkpoints do): ~18k writes of 64 B to 256 KiB, 94 % at unaligned
   offsets, over 1,025 files.

A second device limit is measured for each trace, the same way at the
trace's own write volume (column ``same bytes``): on this virtual disk a
short burst runs faster than the 2 GiB reference, so a replay of a few
hundred MB is compared with fio writing as many bytes.

Each trace is replayed under ``all`` and then under ``aggregated --pack-files``
(compared with the ``all`` run's posix). Every replay is ``--durable`` (each written file fsynced inside the timed
region, so page-cache and O_DIRECT strategies compare on stable storage) and,
as root, drops the page cache first. Ratios are taken within this one run.
Traces missing under the given paths are recorded first (bcc or strace).

    python benchmarks/replay_strategies.py [--scratch DIR] [--fio-size 2G] [--repeat 1]

Prints a table and writes ``benchmarks/results/replay_strategies.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import best_fio, save_result
from rich.console import Console
from rich.table import Table

from ckpt_trace.replayer import replay, strategies

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
WORKLOADS = {
    "dcp": ["dcp", "--ranks", "4", "--model", "gpt2-medium", "--with-optimizer"],
    "small-ops": ["torch-save", "--model", "gpt2-deep-tiny", "--with-optimizer", "--file-per-layer"],
}


def ensure_trace(name: str, trace: Path, scratch: Path) -> Path:
    if trace.exists():
        return trace
    out = scratch / f"record-{name}"
    trace.parent.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "ckpt_trace.cli"]
    subprocess.run(
        [
            *cli,
            "record",
            "-o",
            str(trace),
            "--path-filter",
            f"{out}/",
            "--",
            *cli,
            "workload",
            *WORKLOADS[name][:1],
            "--out",
            str(out),
            *WORKLOADS[name][1:],
        ],
        check=True,
    )
    shutil.rmtree(out, ignore_errors=True)
    return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path, default=None, help="directory on the storage to measure")
    parser.add_argument("--dcp-trace", type=Path, default=REPO / "traces" / "demo-dcp.arrow")
    parser.add_argument("--small-trace", type=Path, default=RESULTS / "small-ops.arrow")
    parser.add_argument("--fio-size", default="2G")
    parser.add_argument("--fio-runs", type=int, default=3, help="the device limit is the best of these fio runs")
    parser.add_argument("--queue-depth", type=int, default=32)
    parser.add_argument("--buffer-mib", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    RESULTS.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-strategies-", dir=args.scratch))
    rows, samples, limit, same = [], [], None, {}
    try:
        traces = {
            "dcp": ensure_trace("dcp", args.dcp_trace, scratch),
            "small-ops": ensure_trace("small-ops", args.small_trace, scratch),
        }
        limit, samples = best_fio(scratch, args.fio_size, args.fio_runs)
        for name, trace in traces.items():
            target = scratch / f"replay-{name}"
            report = replay(
                trace,
                target=target,
                strategy="all",
                queue_depth=args.queue_depth,
                buffer_bytes=args.buffer_mib << 20,
                repeat=args.repeat,
                durable=True,
                drop_caches=os.geteuid() == 0,
            )
            shutil.rmtree(target, ignore_errors=True)
            packer = next(name for name, spec in strategies.table().items() if spec.packs_files)
            packed = replay(
                trace,
                target=target,
                strategy=packer,
                pack_files=True,
                queue_depth=args.queue_depth,
                buffer_bytes=args.buffer_mib << 20,
                repeat=args.repeat,
                durable=True,
                drop_caches=os.geteuid() == 0,
            ).results[0]
            packed.strategy = f"{packer}+pack-files"
            posix = report.results[0]
            packed.speedup_vs_posix = posix.elapsed_s / packed.elapsed_s
            same_bytes = -(-posix.bytes_written // (4 << 20)) * (4 << 20)  # whole 4 MiB blocks, as fio writes
            limit_same, samples_same = best_fio(scratch, str(same_bytes), args.fio_runs)
            same[name] = {
                "size_bytes": same_bytes,
                "fio_write_bytes_per_s": limit_same,
                "fio_samples_bytes_per_s": samples_same,
            }
            for result in (*report.results, packed):
                row = {"trace": name, **result.to_json()}
                row["fraction_of_fio"] = result.write_throughput_bytes_per_s / limit if limit else None
                row["fraction_of_fio_same_bytes"] = (
                    result.write_throughput_bytes_per_s / limit_same if limit_same else None
                )
                rows.append(row)
            shutil.rmtree(target, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    table = Table(
        title=f"Replay strategies (durable, queue depth {args.queue_depth}, {args.buffer_mib} MiB buffers); "
        f"fio limit {limit / 1e6:,.0f} MB/s"
        if limit
        else "fio not installed"
    )
    for column in (
        "trace",
        "strategy",
        "elapsed",
        "write MB/s",
        "of fio",
        "same bytes",
        "vs posix",
        "data ops",
        "meta ops",
        "unaligned",
        "cpu sys",
    ):
        table.add_column(column, justify="left" if column in ("trace", "strategy") else "right")
    for row in rows:
        table.add_row(
            row["trace"],
            row["strategy"],
            f"{row['elapsed_s']:.3f} s",
            f"{row['write_throughput_bytes_per_s'] / 1e6:,.0f}",
            f"{row['fraction_of_fio']:.0%}" if row["fraction_of_fio"] is not None else "-",
            f"{row['fraction_of_fio_same_bytes']:.0%}" if row["fraction_of_fio_same_bytes"] is not None else "-",
            f"{row['speedup_vs_posix']:.2f}x",
            f"{row['data_ops']:,}",
            f"{row['metadata_ops']:,}",
            f"{row['unaligned_ops']:,}",
            f"{row['cpu_sys_s']:.2f} s",
        )
    Console(width=None if sys.stdout.isatty() else 170).print(table)
    for name, entry in same.items():
        if entry["fio_write_bytes_per_s"]:
            print(
                f"fio at {name}'s volume ({entry['size_bytes'] / 1e6:,.0f} MB): "
                f"{entry['fio_write_bytes_per_s'] / 1e6:,.0f} MB/s (samples "
                + ", ".join(f"{v / 1e6:,.0f}" for v in entry["fio_samples_bytes_per_s"])
                + ")"
            )
    result = {
        "benchmark": "replay_strategies",
        "fio_write_bytes_per_s": limit,
        "fio_samples_bytes_per_s": samples,
        "queue_depth": args.queue_depth,
        "buffer_bytes": args.buffer_mib << 20,
        "repeat": args.repeat,
        "fio_at_trace_volume": same,
        "results": rows,
    }
    save_result("replay_strategies", result)


if __name__ == "__main__":
    main()
