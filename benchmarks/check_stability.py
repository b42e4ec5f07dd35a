"""Does ``check`` judge the same storage the same way twice? The measurement behind the check defaults.

A baseline of the golden traces (every strategy) is taken on one directory,
then ``check`` runs ``--rounds`` times back to back against it on the same
storage, which did not change: every "regressed" is a false alarm. This is
done for each ``--min-seconds`` value (0: one run per figure, as before the
defaults existed, with ``--repeat 1``), so the table shows how much measured
time per figure makes a verdict stable at the 10 % default tolerance.

    python benchmarks/check_stability.py [--target DIR] [--rounds 4] [--min-seconds 0,1]

Prints a table and writes ``benchmarks/results/check_stability.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ckpt_trace.check.baseline import make_baseline, run_check

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
TRACES = [
    REPO / "traces" / "golden" / "v1-odd-pattern-strace.arrow",
    REPO / "traces" / "golden" / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="directory on the storage to use (default: a temporary one)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--min-seconds", default="0,1", help="comma-separated values to compare")
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-check-stability-", dir=args.target))
    rows = []
    try:
        for min_seconds in (float(v) for v in args.min_seconds.split(",")):
            repeat = 1 if min_seconds == 0 else 5
            started = time.monotonic()
            base = make_baseline(TRACES, target=scratch / "base", repeat=repeat, min_seconds=min_seconds)
            for round_ in range(args.rounds):
                comparisons = run_check(TRACES, base, target=scratch / f"check-{round_}", tolerance=args.tolerance)
                runs = [len(c.new_runs_elapsed_s) for c in comparisons]
                rows.append(
                    {
                        "min_seconds": min_seconds,
                        "repeat": repeat,
                        "round": round_ + 1,
                        "figures": len(comparisons),
                        "regressed": sum(c.status == "regressed" for c in comparisons),
                        "noisy": sum(c.status == "noisy" for c in comparisons),
                        "median_runs": sorted(runs)[len(runs) // 2],
                        "max_noise": max(max(c.old_noise, c.new_noise) for c in comparisons),
                        "max_abs_change": max(abs(c.change) for c in comparisons),
                        "false_alarms": [
                            f"{c.trace} {c.strategy} {c.metric} {c.change:+.1%} "
                            f"(noise ±{max(c.old_noise, c.new_noise):.1%})"
                            for c in comparisons
                            if c.status == "regressed"
                        ],
                    }
                )
            rows[-1]["elapsed_s"] = time.monotonic() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table = Table(
        title=f"check against an unchanged storage, tolerance {args.tolerance:.0%}: every regression is a false alarm"
    )
    for column in (
        "min seconds",
        "round",
        "figures",
        "regressed",
        "too noisy",
        "runs/figure",
        "largest change",
        "largest noise",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            f"{row['min_seconds']:g}" + (" (1 run)" if row["repeat"] == 1 else ""),
            str(row["round"]),
            str(row["figures"]),
            str(row["regressed"]),
            str(row["noisy"]),
            str(row["median_runs"]),
            f"{row['max_abs_change']:.0%}",
            f"±{row['max_noise']:.0%}",
        )
    Console(width=120).print(table)
    for row in rows:
        for alarm in row["false_alarms"]:
            print(f"min_seconds {row['min_seconds']:g}, round {row['round']}: regressed: {alarm}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "check_stability.json"
    out.write_text(json.dumps({"tolerance": args.tolerance, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
