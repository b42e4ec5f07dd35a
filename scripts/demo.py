"""``make demo``: the whole loop on the built-in workload, with each result's place said at the end.

1. record a torch.distributed.checkpoint save (RANKS gloo ranks, MODEL + Adam) and print its summary;
2. replay the trace under every strategy, durable, side by side, against fio's limit when fio is installed;
3. emit the tuned writer from the trace and the replay, then save and load the same state dict with it and
   with DCP's FileSystemWriter/Reader, timed in this run (cold loads when root can drop the page cache);
4. write the HTML report with the replay results;
5. list the trace, the results, the emitted module and the report, and what to open next.

Idempotent: everything lives in DIR (replaced on each run, it is the demo's own) and TRACE (overwritten,
the demo's own trace). ``--model gpt2-tiny --ranks 2`` is what the test suite runs.

    python scripts/demo.py [--dir .scratch/demo] [--trace traces/demo-dcp.arrow] [--model gpt2-small] [--ranks 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "ckpt_trace.cli"]


def step(number: int, title: str) -> None:
    print(f"\n== {number}. {title} ==", flush=True)


def run(*args: str, capture: bool = False) -> str:
    """Run ``ckpt-trace ARGS``; its own output goes to the terminal (or is returned with ``capture``)."""
    done = subprocess.run([*CLI, *args], check=False, text=True, stdout=subprocess.PIPE if capture else None)
    if done.returncode != 0:
        sys.exit(f"demo: `ckpt-trace {' '.join(args)}` exited with {done.returncode}")
    return done.stdout or ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".scratch/demo", help="the demo's scratch directory (replaced)")
    parser.add_argument("--trace", default="traces/demo-dcp.arrow", help="where the demo's trace goes (replaced)")
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--ranks", default="4")
    args = parser.parse_args()
    started = time.monotonic()
    work, trace = Path(args.dir).resolve(), Path(args.trace).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    trace.parent.mkdir(parents=True, exist_ok=True)
    ckpt, results, writer, report = work / "ckpt", work / "replay.json", work / "demo_writer.py", work / "report.html"
    model = ["--model", args.model, "--with-optimizer"]

    step(1, f"record a {args.ranks}-rank torch.distributed.checkpoint save of {args.model} + Adam")
    run(
        "record",
        "--force",
        "-o",
        str(trace),
        "--path-filter",
        f"{ckpt}/",
        "--",
        *CLI,
        "workload",
        "dcp",
        "--out",
        str(ckpt),
        "--ranks",
        args.ranks,
        *model,
    )
    run("summary", str(trace))
    shutil.rmtree(ckpt)

    step(2, "replay it under every strategy, durable (each file fsynced inside the clock)")
    fio = ["--fio"] if shutil.which("fio") else []
    if not fio:
        print("(fio is not installed: no device limit to compare with)")
    run(
        "replay",
        str(trace),
        "--strategy",
        "all",
        "--durable",
        "--target",
        str(work / "replay"),
        "-o",
        str(results),
        *fio,
    )
    shutil.rmtree(work / "replay")

    step(3, "emit the tuned writer, then save and load with it and with DCP's FileSystemWriter/Reader")
    run("emit", str(trace), "--from-results", str(results), "-o", str(writer))
    cold = ["--drop-caches"] if os.geteuid() == 0 else []
    timings = {}
    for engine, extra in (("emitted", ["--writer", str(writer)]), ("dcp", [])):
        out = work / f"save-{engine}"
        common = ["--out", str(out), "--ranks", args.ranks, *model, *extra, "--json"]
        saved = json.loads(run("workload", engine, *common, capture=True))
        loaded = json.loads(run("workload", engine, *common, "--load", *cold, capture=True))
        timings[engine] = (saved["io_s"], loaded["io_s"], saved["bytes"])
        shutil.rmtree(out)
    size = timings["dcp"][2]
    print(
        f"{'':<28}{'save s':>9}{'load s':>9}   ({size / 2**30:.2f} GiB, {args.ranks} ranks, "
        f"{'cold' if cold else 'warm'} loads)"
    )
    for engine, label in (("emitted", "emitted writer/reader"), ("dcp", "DCP FileSystemWriter/Reader")):
        save_s, load_s, _ = timings[engine]
        print(f"{label:<28}{save_s:>9.2f}{load_s:>9.2f}")
    print(
        f"{'emitted vs DCP':<28}{timings['dcp'][0] / timings['emitted'][0]:>8.2f}x"
        f"{timings['dcp'][1] / timings['emitted'][1]:>8.2f}x   (higher is faster)"
    )

    step(4, "write the report")
    run("report", str(trace), str(results), "-o", str(report))

    step(5, f"done in {time.monotonic() - started:.0f} s; what to open next")
    print(
        f"  trace          {trace}\n"
        f"                 ckpt-trace summary {trace}: every syscall of the save, per rank\n"
        f"  replay results {results}\n"
        f"                 the strategies side by side, with the options and machine they ran on\n"
        f"  writer module  {writer}\n"
        f"                 drop-in DCP storage_writer/storage_reader; its docstring says why each option\n"
        f"  report         {report}\n"
        f"                 open it in a browser: job, calls, ranks, storage, advice"
    )


if __name__ == "__main__":
    main()
