"""The storage micro-benchmark (``ckpt-trace bench``) as a benchmark: the paper's effects as ratios of one run.

Runs the full matrix (or ``--quick``) with fio's sequential O_DIRECT write
limit on the scratch directory's storage, then reads named contrasts off
the results: pairs of points that differ in one dimension, everything else
at the baseline (1 MiB aligned writes, io_uring QD 32, O_DIRECT, not
aggregated, fallocate, 1 process) unless the contrast says otherwise.
Reference for the effects: arXiv 2512.24511 (small uncoalesced writes,
aggregation into aligned buffers, O_DIRECT, io_uring).

    python benchmarks/micro_matrix.py [--scratch DIR] [--quick]

Prints a table and writes ``benchmarks/results/micro_matrix.json``, with the
bench's own ``bench.arrow`` and heat maps in ``benchmarks/results/micro_matrix/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from common import RESULTS, save_result
from rich.console import Console
from rich.table import Table

from ckpt_trace.bench import make_matrix, run_bench, write_outputs
from ckpt_trace.bench.matrix import BASELINE, KIB, describe
from ckpt_trace.bench.results import point_of

REPO = Path(__file__).resolve().parent.parent
SMALL = dataclasses.replace(BASELINE, size_bytes=4 * KIB)

CONTRASTS = (  # (name, faster candidate, slower candidate)
    ("aggregation at 4 KiB", dataclasses.replace(SMALL, aggregated=True), SMALL),
    (
        "aggregated 4 KiB io_uring vs 4 KiB POSIX pwrite",
        dataclasses.replace(SMALL, aggregated=True),
        dataclasses.replace(SMALL, engine="posix", queue_depth=1),
    ),
    ("4 KiB aligned vs misaligned by 512 B (O_DIRECT)", SMALL, dataclasses.replace(SMALL, misaligned_bytes=512)),
    ("1 MiB vs 4 KiB requests", BASELINE, SMALL),
    ("queue depth 32 vs 1 at 4 KiB", SMALL, dataclasses.replace(SMALL, queue_depth=1)),
    ("O_DIRECT vs buffered", BASELINE, dataclasses.replace(BASELINE, direct=False)),
    ("fallocate vs none", BASELINE, dataclasses.replace(BASELINE, preallocated=False)),
    ("fallocate vs none at 4 KiB", SMALL, dataclasses.replace(SMALL, preallocated=False)),
    ("io_uring QD 32 vs POSIX pwrite", BASELINE, dataclasses.replace(BASELINE, engine="posix", queue_depth=1)),
)


def contrasts(rows: list[dict]) -> list[dict]:
    speed = {point_of(row): row["throughput_bytes_per_s"] for row in rows}
    found = []
    for name, first, second in CONTRASTS:
        a, b = speed.get(first.canonical()), speed.get(second.canonical())
        found.append(
            {
                "contrast": name,
                "a": describe(first),
                "b": describe(second),
                "a_bytes_per_s": a,
                "b_bytes_per_s": b,
                "ratio": a / b if a and b else None,
            }
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path, default=None, help="directory on the storage to measure")
    parser.add_argument("--quick", action="store_true", help="the quick matrix")
    args = parser.parse_args()
    matrix = make_matrix(quick=args.quick)
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-micro-", dir=args.scratch))
    began = time.monotonic()
    rows, metadata = run_bench(scratch, matrix, fio=True)
    wall_s = time.monotonic() - began
    scratch.rmdir()
    outputs = write_outputs(rows, metadata, matrix, RESULTS / "micro_matrix")
    ranked = sorted((r for r in rows if r["throughput_bytes_per_s"]), key=lambda r: -r["throughput_bytes_per_s"])
    fio = metadata["fio_write_bytes_per_s"]
    found = contrasts(rows)

    table = Table(
        title=f"ckpt-trace bench, {len(rows)} points, {metadata['volume_bytes'] >> 20} MiB each, "
        f"{wall_s:.0f} s; fio write {fio / 1e6:,.0f} MB/s"
    )
    for column in ("contrast", "MB/s", "vs MB/s", "ratio"):
        table.add_column(column, justify="left" if column == "contrast" else "right")
    for c in found:
        table.add_row(
            c["contrast"],
            f"{(c['a_bytes_per_s'] or 0) / 1e6:,.0f}",
            f"{(c['b_bytes_per_s'] or 0) / 1e6:,.0f}",
            f"{c['ratio']:.2f}x" if c["ratio"] else "refused",
        )
    best = ranked[0]
    table.add_row(
        f"best: {describe(point_of(best))} vs fio",
        f"{best['throughput_bytes_per_s'] / 1e6:,.0f}",
        f"{fio / 1e6:,.0f}",
        f"{best['throughput_bytes_per_s'] / fio:.2f}x",
    )
    Console().print(table)
    result = {
        "wall_s": wall_s,
        "points": len(rows),
        "volume_bytes": metadata["volume_bytes"],
        "fio_write_bytes_per_s": fio,
        "environment": metadata["environment"],
        "contrasts": found,
        "best": {"description": describe(point_of(best)), "throughput_bytes_per_s": best["throughput_bytes_per_s"]},
        "outputs": outputs,
    }
    save_result("micro_matrix", result)


if __name__ == "__main__":
    main()
