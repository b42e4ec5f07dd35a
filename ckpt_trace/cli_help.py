"""What ``--help`` shows beyond each command's docstring: a short line per command, examples, and the names
of values (``--target DIR``, not a Python type). Applied by ``cli.main`` to the command tree typer builds.

Sizes follow ``ckpt_trace.units``: IEC units for sizes (4KiB, 4.5MiB, 1TiB), decimal for rates (MB/s).
"""

from __future__ import annotations

from typing import Any

SHORT = {
    "record": "Trace a command's checkpoint I/O (and GPU copies) into a trace.",
    "replay": "Re-execute a trace under I/O strategies and measure them.",
    "summary": "What a trace holds: operations, bytes, sizes, ranks, copies.",
    "merge": "One trace of a job from the traces of its nodes.",
    "filter": "A smaller trace: some ranks, files, operations or a window.",
    "anonymize": "A copy of a trace to share: names hashed, the pattern kept.",
    "upgrade": "Rewrite an older trace in the current format version.",
    "export": "Export a trace for Perfetto or as Parquet by rank.",
    "report": "One self-contained HTML report of a trace and its replays.",
    "diff": "What changed between two recordings.",
    "baseline": "Replay traces on a storage and keep the results.",
    "check": "Replay a baseline's traces; exit 1 on a regression.",
    "emit": "Write a DCP writer/reader tuned from a trace.",
    "workload": "Save (or load and check) a real GPT-2-shaped checkpoint.",
    "synth": "The trace of a DCP save of a model too big to run here.",
    "bench": "Sweep sizes, queue depths, O_DIRECT, aggregation on a storage.",
    "version": "Print the version.",
    "annotate": "Add a checkpoint's layout (which bytes are which tensor) to a trace.",
}

EXAMPLES = {
    "record": [
        "ckpt-trace record -o save.arrow --path-filter /scratch/ckpt/ -- torchrun --nproc-per-node 4 train.py",
        "ckpt-trace record --backend strace --gpu off -o t.arrow -- python save.py",
        "ckpt-trace record --pid 4242 --until-checkpoints 1 --path-filter /scratch/ckpt/ -o one.arrow",
    ],
    "replay": [
        "ckpt-trace replay save.arrow --strategy all --target /scratch/replay --durable -o results.json",
        "ckpt-trace replay save.arrow --strategy aggregated --buffer-size 4MiB --target /nvme/r --dry-run",
        "torchrun --nproc-per-node 8 -m ckpt_trace.cli replay save.arrow --target /lustre/r -o r.json",
        "ckpt-trace replay save4.arrow --ranks 8 --target /scratch/r --durable   # a 4-rank DCP save as 8 ranks",
    ],
    "summary": ["ckpt-trace summary save.arrow", "ckpt-trace summary save.arrow --json | jq .gpu"],
    "merge": [
        "ckpt-trace merge node0.arrow node1.arrow -o job.arrow",
        "ckpt-trace merge n*.arrow -o job.arrow --clock-offset node3=-250000 --json",
    ],
    "upgrade": [
        "ckpt-trace upgrade old-v4.arrow -o save.arrow",
        "ckpt-trace upgrade old.arrow -o save.arrow --force --json",
    ],
    "anonymize": [
        "ckpt-trace anonymize save.arrow -o shared.arrow",
        'ckpt-trace anonymize save.arrow -o shared.arrow --key "$SECRET" --json',
    ],
    "filter": [
        "ckpt-trace filter save.arrow -o rank0.arrow --rank 0",
        "ckpt-trace filter save.arrow -o phase.arrow --time 10s..20s --op write,fsync --path '*/__*_0.distcp'",
    ],
    "export": [
        "ckpt-trace export save.arrow --format perfetto -o save.json",
        "ckpt-trace export save.arrow --format parquet -o save.parquet/",
        "ckpt-trace export big.arrow --format perfetto --rank 0-3 --time 10s..20s -o window.json",
    ],
    "report": [
        "ckpt-trace report save.arrow results.json -o report.html",
        "ckpt-trace report save.arrow -o report.html --rank 7",
    ],
    "diff": ["ckpt-trace diff before.arrow after.arrow"],
    "annotate": [
        "ckpt-trace annotate save.arrow --checkpoint /scratch/ckpt/step100",
        "ckpt-trace annotate save.arrow --checkpoint ckpt/ -o annotated.arrow --json",
    ],
    "baseline": ["ckpt-trace baseline save.arrow --target /scratch/b -o baseline.json --repeat 5"],
    "check": ["ckpt-trace check save.arrow --baseline baseline.json --target /scratch/c --junit check.xml"],
    "emit": ["ckpt-trace emit save.arrow --from-results results.json -o my_writer.py"],
    "workload": [
        "ckpt-trace workload dcp --ranks 4 --model gpt2-small --with-optimizer --out /scratch/ck",
        "ckpt-trace workload dcp --out /scratch/ck --load --drop-caches",
        "ckpt-trace workload dcp --ranks 2 --model gpt2-xl --saves 4 --out /scratch/ck  # 4 checkpoints in a row",
        "ckpt-trace workload torch-save --device cuda --model gpt2-medium --out /scratch/ts",
    ],
    "synth": [
        "ckpt-trace synth --engine dcp --model llama3-8b --ranks 8 --optimizer adam -o llama8b.arrow",
        "ckpt-trace synth --model llama3-405b --ranks 512 --path /lustre/ck -o l405.arrow --json",
    ],
    "bench": [
        "ckpt-trace bench --target /scratch/bench --quick --fio",
        "ckpt-trace bench --target /scratch/bench --quick --direction both -o restore-bench",
    ],
    "version": ["ckpt-trace --version"],
}

# Value names by parameter name (per command where they differ): what the user types, not a Python type.
METAVARS = {
    "trace": "TRACE",
    "traces": "TRACE...",
    "trace_a": "TRACE_A",
    "trace_b": "TRACE_B",
    "results": "[RESULTS.json]...",
    "target": "DIR",
    "out_dir": "DIR",
    "baseline_file": "FILE",
    "junit": "FILE",
    "writer": "MODULE.py",
    "from_results": "FILE",
    "tolerance": "PERCENT",
    "buffer_size": "SIZE",
    "aggregate_size": "SIZE",
    "volume": "SIZE",
    "sizes": "SIZE,...",
    "queue_depths": "N,...",
    "fio_limit": "MB/S",
    "strip_prefix": "PREFIX",
    "path_filter": "PREFIX",
    "queue_depth": "N",
    "repeat": "N",
    "ranks": "N",
    "shards": "N",
    "max_processes": "N",
    "min_seconds": "SECONDS",
    "strategy": "STRATEGY",
    "rank": "RANKS",
    "pid": "PIDS",
    "path": "GLOB",
    "op": "OPS",
    "time_window": "START..END",
    "engine": "ENGINE",
    "max_ops": "N",
    "chosen_rank": "RANK",
    "direction": "write|read|both",
    "host": "LABEL",
    "clock_offset": "HOST=NS",
    "model": "MODEL",
    "ckpt_path": "DIR",
}
OUTPUT_METAVARS = {
    "record": "TRACE",
    "replay": "FILE",
    "export": "PATH",
    "report": "FILE",
    "baseline": "FILE",
    "emit": "FILE",
    "bench": "DIR",
    "filter": "TRACE",
    "merge": "TRACE",
    "synth": "TRACE",
    "upgrade": "TRACE",
}

EPILOG_NOTE = (
    "Sizes: IEC units (4KiB, 4.5MiB, 1TiB; K, M, G, T the same), or decimal ones (4MB = 4,000,000 "
    "bytes); rates in decimal MB/s."
)
TAKES_SIZES = {"replay", "baseline", "bench"}


def decorate(group: Any) -> Any:
    """Set short help, examples and value names on ``group``'s commands (typer's click command tree)."""
    for name, command in group.commands.items():
        command.short_help = SHORT.get(name, command.short_help)
        examples = EXAMPLES.get(name, [])
        lines = ["\b", "Examples:", *(f"  {example}" for example in examples)]
        command.epilog = "\n".join(lines) + (f"\n\n{EPILOG_NOTE}" if name in TAKES_SIZES else "")
        for param in command.params:
            if getattr(param, "param_type_name", "") == "argument":
                if param.metavar is None and param.name in METAVARS:
                    param.metavar = METAVARS[param.name]
                _plain_argument(param)
                continue
            descriptor = getattr(param, "type_descriptor", None)
            if (
                getattr(param, "is_flag", False)
                or getattr(param, "metavar", None)
                or (descriptor is not None and descriptor.is_choice)  # typer 0.29
                or getattr(getattr(param, "type", None), "choices", None)  # typer 0.28: a Choice type
            ):
                continue
            if param.name == "output":
                param.metavar = OUTPUT_METAVARS.get(name, "FILE")
            elif param.name == "cmd":
                param.metavar = "-- CMD [ARGS]..."
            elif param.name in METAVARS:
                param.metavar = METAVARS[param.name]
    return group


def _plain_argument(param: Any) -> None:
    """An argument shown as its value name alone (``TRACE``, ``[RESULTS]...``): typer would add the Python
    type (``<path>``, ``<list[str]>``) in the help and braces in the usage line. Set on the instance."""
    name = param.metavar or param.name.upper()
    usage = name if param.required or name.startswith(("[", "--")) else f"[{name}]"
    param.display_type_rich = lambda ctx=None: None  # typer 0.29
    param._usage_display_name = lambda: usage
    param.get_usage_pieces = lambda ctx: [usage]  # typer 0.28 (braces around a required argument)
