"""Recording in bounded memory: peak RSS and time of ``ckpt-trace record`` over a storm of small writes.

fio writes ``--writes`` blocks of 512 B (``ioengine=psync``, one file on a
tmpfs, so the storage is not what is measured) under ``ckpt-trace record
--backend bcc``, twice, alternately, ``--repeats`` times each:

- ``bounded``: the defaults (raw BPF records decoded live past
  ``CKPT_TRACE_RECORD_RAW_BYTES``, rows spilled as sorted runs of
  ``CKPT_TRACE_RECORD_RUN_ROWS`` and merged into the trace);
- ``held``: both limits set past the recording's size, which is what the
  recorder did before (every raw record, every decoded event and every row
  in memory until the command exits).

Each run reports the recorder's peak RSS (``/usr/bin/time``; the traced fio
is a child, not counted), wall seconds, rows, lost events, spilled runs and
late events; the table shows medians. Goal (issue 13): memory bounded by the
limits, not by the recording's length.

    python benchmarks/record_scale.py [--writes 2000000] [--dir /dev/shm] [--repeats 2]

Prints a table and writes ``benchmarks/results/record_scale.json``.
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
from pathlib import Path

from common import storm_fio
from rich.console import Console
from rich.table import Table

from ckpt_trace.formats import read_metadata

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = {
    "bounded": {},
    "held": {"CKPT_TRACE_RECORD_RAW_BYTES": str(1 << 62), "CKPT_TRACE_RECORD_RUN_ROWS": str(1 << 62)},
}


def run(variant: str, writes: int, scratch: Path) -> dict:
    out, trace = scratch / "out", scratch / f"{variant}.arrow"
    shutil.rmtree(out, ignore_errors=True)  # ours: under this run's scratch directory
    out.mkdir()
    trace.unlink(missing_ok=True)
    fio = storm_fio(out, writes)
    env = {**os.environ, **VARIANTS[variant]}
    proc = subprocess.run(
        [
            "/usr/bin/time",
            "-f",
            "%e %M",
            sys.executable,
            "-m",
            "ckpt_trace.cli",
            "record",
            "--backend",
            "bcc",
            "-o",
            str(trace),
            "--path-filter",
            f"{out}/",
            "--",
            *fio,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(f"record failed: {proc.stderr.strip().splitlines()[-2:]}")
    seconds, kib = proc.stderr.strip().splitlines()[-1].split()
    meta = read_metadata(trace)
    import pyarrow.ipc as ipc

    rows = ipc.open_file(str(trace)).count_rows()
    result = {
        "variant": variant,
        "seconds": float(seconds),
        "peak_rss_bytes": int(kib) * 1024,
        "rows": rows,
        "lost_events": meta["lost_events"],
        "spilled_runs": meta.get("spilled_runs", 0),
        "late_events": meta.get("late_events", 0),
        "trace_bytes": trace.stat().st_size,
    }
    shutil.rmtree(out, ignore_errors=True)
    trace.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: bounded,held")
    parser.add_argument("--results", type=Path, default=RESULTS / "record_scale.json")
    args = parser.parse_args()
    if shutil.which("fio") is None:
        raise SystemExit("fio is needed (Debian: apt install fio)")
    scratch = Path(tempfile.mkdtemp(prefix="record-scale-", dir=args.dir))
    try:
        chosen = [v for v in args.variants.split(",") if v in VARIANTS]
        runs = [run(variant, args.writes, scratch) for _ in range(args.repeats) for variant in chosen]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table = Table(title=f"Recording {args.writes:,} writes of 512 B under bcc (medians of {args.repeats})")
    for column in ("variant", "peak RSS", "seconds", "rows", "lost", "runs", "late"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    summary = []
    for variant in chosen:
        mine = [r for r in runs if r["variant"] == variant]
        entry = {
            key: statistics.median(r[key] for r in mine)
            for key in ("seconds", "peak_rss_bytes", "rows", "lost_events", "spilled_runs", "late_events")
        }
        summary.append({"variant": variant, **entry})
        table.add_row(
            variant,
            f"{entry['peak_rss_bytes'] / 2**30:.2f} GiB",
            f"{entry['seconds']:.1f}",
            f"{entry['rows']:,.0f}",
            f"{entry['lost_events']:,.0f}",
            f"{entry['spilled_runs']:.0f}",
            f"{entry['late_events']:.0f}",
        )
    Console().print(table)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(
        json.dumps(
            {
                "benchmark": "record_scale",
                "writes": args.writes,
                "runs": runs,
                "medians": summary,
                "host": os.uname().nodename,
                "kernel": os.uname().release,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
