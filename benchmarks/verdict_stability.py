"""Does ``emit`` choose the same configuration from independent replays of one trace? (issue 34)

Three traces are recorded with the built-in workloads (bcc backend where it
works, as ``record --backend auto`` picks):

- ``dcp-save``: a 2-rank torch.distributed.checkpoint save of GPT-2-small
  with Adam (3 files, 1.5 GB, about 1,900 writes);
- ``dcp-load``: the load of that checkpoint by 2 ranks, from a cold page
  cache (about 5,000 reads);
- ``small-save``: a 1-rank DCP save of ``gpt2-deep-tiny`` (1,024 narrow
  layers: 12,293 objects, 10,243 of them under 64 KiB; 20,537 writes,
  217 MiB), where aggregation into 4 MiB buffers should win clearly.

Each trace is then replayed ``--runs`` times, independently, as a user would:
``ckpt-trace replay TRACE --strategy all --durable --target DIR -o R.json``
(default rounds: 3-20, until every pair is told apart or 60 s of runs), each
followed by ``ckpt-trace emit TRACE --from-results R.json -o M.py``. The
configuration is the emitted ``OPTIONS``; a case is stable when its runs emit
the same one. For ``small-save`` the expected pick is ``aggregated``, from the
verdict (the header's ``Parameters (from the verdict: ...)`` is not "none").
Each replay's medians, spreads and verdicts and each emitted module's header
go into ``benchmarks/results/verdict_stability.json``, with the load average
(1 min) before and after each replay.

    python benchmarks/verdict_stability.py [--scratch DIR] [--runs 3] [--cases dcp-save,dcp-load,small-save]
                                           [--traces DIR] [--budget-s S]

``--traces DIR`` keeps the recorded traces there and reuses those already
there (a load trace needs its save's checkpoint, so both are recorded
together). ``--budget-s S`` sets the replays' budget of runs
(``CKPT_TRACE_REPLAY_BUDGET_S``) and names the results file after it.

Measured 2026-11-28 by the verdict34 helper on main from 6334425 to 8dda468
(the rounds rule and emit's choice unchanged between them): the 2-core VM
shared with about 6 other agents, 1-minute load average 3.9-18 during the
runs, 3 runs per case, default budget:

- dcp-save: 2/3 the same configuration. Runs 1-2 (8 and 5 rounds): no
  strategy clear of the others, the defaults; run 3 (5 rounds): aggregated
  from the verdict (queue depth 32 where the default is 8). Aggregated's
  median speed-up over each other strategy was 1.7-3.0x in all three; the
  60 s budget stopped at 5-8 rounds, where the interval is the range of the
  ratios (docs/verdicts.md).
- dcp-load: 3/3, aggregated from the verdict (6 rounds each;
  ``load_direct_io`` on).
- small-save: 3/3, aggregated from the verdict (20 rounds each, low end of
  its speed-ups 1.26-1.47x).

Again on 2026-11-29 at 78df369, load 0.9-1.9, 3 runs per case: dcp-save 3/3 (the defaults each time: no
strategy clear of the others in 13-14 rounds), dcp-load 3/3 (posix from the verdict, ``load_direct_io``
off; 20 rounds each), small-save 3/3 (aggregated from the verdict, 20 rounds each).

Again on 2026-11-29 at 2ad5bcc (dcp-load) and a809446 (the saves) (``--read-memory malloc`` the default, the
page cache prepared as recorded with its evictions topped up), load 0.4-1.7, 3 runs per case: dcp-load 3/3
(posix from the verdict, ``load_direct_io`` off; 20 rounds each, posix faster than uring-buffered by 1.03x or
more at the interval's low end in run 1), dcp-save 3/3 (the defaults: no strategy clear of the others in 12
rounds each; the fastest median posix once, uring-direct twice), small-save 3/3 (aggregated from the verdict,
15-20 rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import save_result
from rich.console import Console
from rich.table import Table

CLI = [sys.executable, "-m", "ckpt_trace.cli"]
SAVE_ARGS = ["dcp", "--ranks", "2", "--model", "gpt2-small", "--with-optimizer"]
SMALL_ARGS = ["dcp", "--ranks", "1", "--model", "gpt2-deep-tiny"]
#: The strategy each case must pick from a verdict, where one is expected.
EXPECTED = {"small-save": "aggregated"}


def record(trace: Path, checkpoint: Path, workload: list[str]) -> None:
    """Record ``ckpt-trace workload WORKLOAD --out CHECKPOINT`` into ``trace`` (only the checkpoint's files)."""
    subprocess.run(
        [*CLI, "record", "-o", str(trace), "--force", "--path-filter", f"{checkpoint}/", "--"]
        + [*CLI, "workload", *workload[:1], "--out", str(checkpoint), "--force", *workload[1:]],
        check=True,
    )


def ensure_traces(traces: Path, scratch: Path, cases: list[str]) -> dict[str, Path]:
    """The trace of each case, recorded under ``traces`` unless already there."""
    paths = {case: traces / f"{case}.arrow" for case in cases}
    checkpoint = scratch / "checkpoint"
    if ("dcp-save" in cases and not paths["dcp-save"].exists()) or (
        "dcp-load" in cases and not paths["dcp-load"].exists()
    ):
        record(traces / "dcp-save.arrow", checkpoint, SAVE_ARGS)
        record(traces / "dcp-load.arrow", checkpoint, [*SAVE_ARGS, "--load", "--drop-caches"])
        paths.update({"dcp-save": traces / "dcp-save.arrow", "dcp-load": traces / "dcp-load.arrow"})
    if "small-save" in cases and not paths["small-save"].exists():
        record(paths["small-save"], scratch / "small-checkpoint", SMALL_ARGS)
    shutil.rmtree(checkpoint, ignore_errors=True)
    shutil.rmtree(scratch / "small-checkpoint", ignore_errors=True)
    return paths


def emitted(module: Path) -> dict:
    """What an emitted module chose: ``options`` (its ``OPTIONS`` arguments), ``verdict`` (the header's verdict
    line), ``from_verdict`` (the parameters it says came from the verdict) and ``header`` (its docstring)."""
    text = module.read_text()
    header = text.split('"""')[1]
    block = re.search(r"OPTIONS = WriterOptions\((.*?)\n\)", text, re.S)
    assert block is not None, f"{module}: no OPTIONS"
    options = dict(re.findall(r"(\w+)=([^,\n]+),", block.group(1)))
    verdict = re.search(r"verdict: (.*)", header)
    from_verdict = re.search(r"Parameters \(from the verdict: (.*)\):", header)
    return {
        "options": options,
        "verdict": verdict.group(1) if verdict else None,
        "from_verdict": from_verdict.group(1) if from_verdict else None,
        "header": header,
    }


def replay_summary(path: Path) -> dict:
    """Per strategy, from a replay's results: median, min and max elapsed seconds, runs, and each speed-up over
    the others (median, interval, verdict)."""
    document = json.loads(path.read_text())
    strategies = {}
    for entry in document["results"]:
        runs = entry["runs_elapsed_s"]
        strategies[entry["strategy"]] = {
            "elapsed_s": entry["elapsed_s"],
            "min_s": min(runs),
            "max_s": max(runs),
            "runs": len(runs),
            "versus": {
                other: {"median": round(v["median"], 3), "low": round(v["low"], 3), "high": round(v["high"], 3)}
                | {"n": v["n"], "verdict": v["verdict"]}
                for other, v in (entry.get("versus") or {}).items()
            },
        }
    return {"rounds": document["options"].get("rounds"), "strategies": strategies}


def run_once(trace: Path, scratch: Path, label: str, budget_s: int | None) -> dict:
    """One independent replay of ``trace`` (every strategy, durable, default rounds; ``budget_s`` replaces the
    60 s budget of runs where given) and the emit that follows."""
    target, results, module = scratch / f"target-{label}", scratch / f"{label}.json", scratch / f"{label}.py"
    env = dict(os.environ)
    if budget_s is not None:
        env["CKPT_TRACE_REPLAY_BUDGET_S"] = str(budget_s)
    load_before = os.getloadavg()[0]
    subprocess.run(
        [*CLI, "replay", str(trace), "--strategy", "all", "--durable", "--target", str(target), "-o", str(results)],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    load_after = os.getloadavg()[0]
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([*CLI, "emit", str(trace), "--from-results", str(results), "-o", str(module)], check=True)
    return {
        "load_1min": [round(load_before, 2), round(load_after, 2)],
        "replay": replay_summary(results),
        **emitted(module),
    }


def judge(case: str, runs: list[dict]) -> dict:
    """Whether the runs of ``case`` emitted one configuration, and (where one is expected) picked it from a
    verdict every time."""
    configurations = {json.dumps(run["options"], sort_keys=True) for run in runs}
    expected = EXPECTED.get(case)
    picked = sum(
        expected is not None and (run["verdict"] or "").startswith(expected) and run["from_verdict"] != "none"
        for run in runs
    )
    return {
        "same_configuration": f"{max(sum(json.dumps(r['options'], sort_keys=True) == c for r in runs) for c in configurations)}/{len(runs)}",
        "stable": len(configurations) == 1,
        "expected_pick": expected,
        "picked_from_verdict": f"{picked}/{len(runs)}" if expected else None,
    }


def print_table(cases: dict[str, dict]) -> None:
    table = Table(title="emit after independent replays: the same configuration?")
    for column in ("case", "run", "rounds", "load 1 min", "fastest median", "emitted", "from the verdict"):
        table.add_column(column)
    for case, data in cases.items():
        for i, run in enumerate(data["runs"], 1):
            medians = run["replay"]["strategies"]
            fastest = min(medians, key=lambda name: medians[name]["elapsed_s"])
            options = run["options"]
            table.add_row(
                case,
                str(i),
                str(run["replay"]["rounds"]),
                "-".join(f"{v:.1f}" for v in run["load_1min"]),
                f"{fastest} {medians[fastest]['elapsed_s']:.3f} s",
                f"direct_io={options.get('direct_io')} qd={options.get('queue_depth')} "
                f"load_direct_io={options.get('load_direct_io')}",
                run["from_verdict"] or "-",
            )
        verdict = data["verdict"]
        table.add_row(
            case,
            "all",
            "",
            "",
            "",
            f"same: {verdict['same_configuration']}",
            f"picked {verdict['expected_pick']}: {verdict['picked_from_verdict']}" if verdict["expected_pick"] else "",
        )
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path, default=None, help="directory on the storage to measure")
    parser.add_argument("--traces", type=Path, default=None, help="keep (and reuse) the recorded traces here")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default="dcp-save,dcp-load,small-save")
    parser.add_argument("--budget-s", type=int, default=None, help="replay's budget of runs (default: its own)")
    args = parser.parse_args()
    cases = args.cases.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-verdict-stability-", dir=args.scratch))
    try:
        traces = args.traces or scratch / "traces"
        traces.mkdir(parents=True, exist_ok=True)
        paths = ensure_traces(traces, scratch, cases)
        results: dict[str, dict] = {}
        for case in cases:
            runs = [run_once(paths[case], scratch, f"{case}-{i}", args.budget_s) for i in range(1, args.runs + 1)]
            results[case] = {"trace": str(paths[case]), "runs": runs, "verdict": judge(case, runs)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(results)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    name = "verdict_stability" if args.budget_s is None else f"verdict_stability-budget{args.budget_s:g}s"
    save_result(name, {"commit": commit, "budget_s": args.budget_s, "cases": results})


if __name__ == "__main__":
    main()
