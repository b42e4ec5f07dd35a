"""How the commands that read a trace scale: time and peak memory from 1 M rows up (issue: production-size traces).

For each size, ``tracegen.py`` writes a synthetic DCP-like trace (``--mix
dcp``, ``--ranks`` ranks) in bounded memory, then each command runs in its
own process under ``/usr/bin/time`` (wall seconds, peak RSS): ``summary``,
``replay --dry-run`` (planning every strategy's plan; skipped above
``--plan-max`` rows: planning holds the plan of every operation, about
190 bytes per row at its peak, 8.4 GiB at 50 M rows),
``filter`` (one rank), ``export --format parquet``, ``export --format
perfetto`` of one rank (and of the whole trace up to ``--perfetto-max``
rows: a browser opens about a million operations), ``report`` and ``diff``
(the trace against itself).
One run each on a shared machine: read the ratios between sizes (linear
growth is the goal), not the third digit.

    python benchmarks/trace_scale.py [--rows 1000000,10000000,50000000] [--ranks 64] [--dir /tmp/trace-scale]

Prints a table and writes ``benchmarks/results/trace_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"
HERE = Path(__file__).resolve().parent


def timed(args: list[str]) -> dict:
    """Wall seconds and peak RSS (bytes) of ``ckpt-trace ARGS``; ``ok`` False with the last error line."""
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "ckpt_trace.cli", *args], capture_output=True, text=True
    )
    last = proc.stderr.strip().splitlines()[-1].split()
    seconds, kib = float(last[0]), int(last[1])
    error = next((line for line in proc.stderr.splitlines() if "error" in line), "")
    return {"seconds": seconds, "peak_rss_bytes": kib * 1024, "ok": proc.returncode == 0, "error": error[:200]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1000000,10000000")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/trace-scale"))
    parser.add_argument("--plan-max", type=int, default=50_000_000, help="largest trace to plan")
    parser.add_argument("--perfetto-max", type=int, default=1_000_000, help="largest trace for the whole JSON export")
    parser.add_argument("--results", type=Path, default=RESULTS / "trace_scale.json")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    rows_out = []
    for rows in (int(r) for r in args.rows.split(",")):
        trace = args.dir / f"t{rows}.arrow"
        if not trace.exists():
            subprocess.run(
                [
                    sys.executable,
                    str(HERE / "tracegen.py"),
                    str(trace),
                    "--rows",
                    str(rows),
                    "--ranks",
                    str(args.ranks),
                    "--mix",
                    "dcp",
                ],
                check=True,
                capture_output=True,
            )
        entry = {"rows": rows, "bytes_per_row": trace.stat().st_size / rows, "commands": {}}
        work = Path(tempfile.mkdtemp(prefix=f"w{rows}-", dir=args.dir))  # ours alone, removed below
        commands = {"summary": ["summary", str(trace), "--json"]}
        if rows <= args.plan_max:
            commands["plan (dry run, all)"] = [
                "replay",
                str(trace),
                "--strategy",
                "all",
                "--dry-run",
                "--target",
                str(work / "r"),
                "--json",
            ]
        commands.update(
            {
                "filter (1 rank)": ["filter", str(trace), "-o", str(work / "f.arrow"), "--rank", "0"],
                "export parquet": ["export", str(trace), "--format", "parquet", "-o", str(work / "p")],
                "export perfetto (1 rank)": [
                    "export",
                    str(trace),
                    "--format",
                    "perfetto",
                    "--rank",
                    "0",
                    "-o",
                    str(work / "t0.json"),
                ],
            }
        )
        if rows <= args.perfetto_max:
            commands["export perfetto (all)"] = [
                "export",
                str(trace),
                "--format",
                "perfetto",
                "-o",
                str(work / "t.json"),
                "--max-ops",
                str(rows + 1000),
            ]
        commands["report"] = ["report", str(trace), "-o", str(work / "r.html")]
        commands["diff"] = ["diff", str(trace), str(trace), "--json"]
        for name, command in commands.items():
            entry["commands"][name] = timed(command)
        shutil.rmtree(work, ignore_errors=True)
        rows_out.append(entry)
    table = Table(title=f"Trace scale ({args.ranks} ranks, DCP-like mix; one run each)")
    table.add_column("command")
    for entry in rows_out:
        table.add_column(f"{entry['rows'] / 1e6:g} M rows: s, peak", justify="right")
    names = sorted(
        {name for entry in rows_out for name in entry["commands"]},
        key=lambda n: list(rows_out[0]["commands"]).index(n) if n in rows_out[0]["commands"] else 99,
    )
    for name in names:
        cells = []
        for entry in rows_out:
            r = entry["commands"].get(name)
            cells.append(
                "-"
                if r is None
                else (f"{r['seconds']:.1f} s, {r['peak_rss_bytes'] / 2**30:.2f} GiB" + ("" if r["ok"] else " FAILED"))
            )
        table.add_row(name, *cells)
    table.add_row("bytes per row", *(f"{entry['bytes_per_row']:.1f}" for entry in rows_out))
    Console(width=120).print(table)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
