"""Tracer overhead: wall time untraced, under bcc, under strace, of the DCP workload and io_uring-heavy ones.

Runs are interleaved (untraced, bcc, strace, untraced, ...) in one process on
the same machine and disk, so drift and noise hit every variant alike; each
variant's median is reported and overheads are ratios to the untraced median.
The checkpoint directory is removed between runs. Two figures per backend:
"record" is the whole ``ckpt-trace record`` command (start-up, BPF compile,
teardown, writing the trace included); "command" is the traced command's own
wall time, from the trace's ``command_elapsed_ns``; each "+" is the overhead
against the untraced median. Goals: bcc adds at most 5 % to the wall time of
the demo's workload (issue 2) and of an io_uring-heavy one (issue 11); 2 % on
the DCP workload (issue 13). Workloads (``--workload``, repeatable):

- ``dcp``: the built-in DCP save (``ckpt-trace workload dcp``);
- ``emitted``: the same save through the emitted writer (io_uring, O_DIRECT);
- ``fio-uring-1m``: fio ``ioengine=io_uring``, 1 MiB sequential writes,
  iodepth 8, O_DIRECT, 2 GiB: a checkpoint's io_uring pattern;
- ``fio-uring-4k``: fio ``ioengine=io_uring``, 4 KiB random writes, iodepth 32,
  O_DIRECT, 512 MiB: the stress case, about 100,000 requests a second here,
  each costing two BPF programs (submission, completion) plus its
  ``io_uring_enter``;
- ``libaio``: ``ckpt-trace workload libaio`` (FastPersist's way: native AIO);
- ``storm``: fio ``ioengine=psync``, 500,000 buffered writes of 512 B from 2
  threads (``--thread --numjobs=2``), the system-call storm of issue 13 (goal:
  no event lost at the default settings, the command at most 3x slower);
- ``true``: ``true(1)``, the recording's fixed cost alone (issue 35).

"start" and "finish" are the recording's fixed costs as ``record --json`` reports them (issue 35):
``start_s``, from the recorder's invocation to its probes being live, and ``finish_s``, from the
command's exit to the trace being complete (medians). "paired rec." is the median of each repeat's
whole-``record`` time over the untraced run just before it.

strace cannot see io_uring requests, so it is measured on ``dcp`` and ``libaio``
only (``--backend bcc`` leaves it out). Lost events (the trace's ``lost_events``)
are reported per run. Besides the ratio of medians, "paired" is the median of
each repeat's own ratio (traced run over the untraced run just before it), which
a slow drift of the machine moves less. "rec. CPU" is the CPU time the recording
process spent while the command ran (the trace's ``recorder_cpu_ns``: reading the
rings), as a fraction of the command's wall time: what the tracer takes from the
job besides its BPF programs; "BPF" is the programs' own run time (``bpf_run_ns``,
counted with sysctl kernel.bpf_stats_enabled=1 during the bcc runs, restored
after), every process they fired for included. Their sum is the CPU the tracer
costs, a figure the machine's noise moves far less than wall times.

    python benchmarks/tracer_overhead.py [--workload dcp --workload fio-uring] [--model gpt2-medium]
        [--ranks 4] [--repeats 3] [--backend bcc] [--out DIR]
    python benchmarks/tracer_overhead.py --probes --workload dcp --repeats 6   # the page probes' own cost

``--probes`` compares bcc with every probe against bcc without the mapped-I/O probes (the tracer before
them: ``CKPT_TRACE_BPF_OMIT_TRACEPOINTS`` set to all of them), in ABBA pairs, and writes
``benchmarks/results/tracer_overhead_probes.json`` (the load average before and after included).

``--start`` compares bcc starting from its cached compile (``tracer.bpfcache``: the cache warmed by one
uncounted run, in a scratch ``CKPT_TRACE_CACHE_DIR``) against bcc compiling with clang
(``CKPT_TRACE_BPF_PROGRAM_CACHE=0``), in ABBA pairs of ``record --backend bcc -- WORKLOAD`` (default
``true``): medians and ranges of ``start_s``, ``finish_s`` and the whole ``record``, the median of the
pairs' start ratios, and the load average before and after; writes
``benchmarks/results/tracer_overhead_start.json``.

    python benchmarks/tracer_overhead.py --start --repeats 10

``--pairs N`` (issue 35's table; N >= 10 for its intervals) runs, per workload and per ``--model`` and
``--ranks`` given (both repeatable: e.g. gpt2-small and gpt2-medium, 2 and 4 ranks; ``hf`` is the Hugging
Face ``save_pretrained`` workload), N pairs of the bare command and each backend in ABBA order, each traced
run paired with the bare run of its pair. Per backend: the median of the paired ratios traced/bare of the whole
``record`` and of the command, each with the distribution-free 95 % interval of that median (the sign test's
order statistics: x(2) and x(9) of 10, 97.9 % coverage); the tracer's CPU over the bare command's CPU (bcc:
the recorder's own CPU, ``record --json``'s ``recorder_cpu_s``, plus the BPF programs' run time; strace: the
traced run's CPU less the bare run's, strace and recorder together; CPU from getrusage RUSAGE_CHILDREN); the
recorder's peak memory (``recorder_peak_rss_bytes``: the ``ckpt-trace record`` process's own ru_maxrss,
children excluded, so strace's own memory is not in it); lost events; and a verdict per goal of issue 35
("met" when the interval's upper end is within the goal, "not met" when its lower end is past it or an event
was lost where none may be, "within noise" when the interval straddles it). Writes
``benchmarks/results/tracer_overhead_pairs.json`` (``--result-name`` to change it) with the load average
before and after and the date.

    python benchmarks/tracer_overhead.py --pairs 10 --workload dcp --workload storm --model gpt2-small \
        --ranks 2 --backend bcc

Measured with that command at 3b0e8fe on 2026-11-28 22:37 UTC (DCP with Adam), on this 2-CPU VM shared by
about 7 agents (load average 1.5 before, 2.0 after; figures this noisy, the intervals say how much):

    workload            bare     record/bare            command/bare          tracer CPU  peak RSS  lost
    dcp gpt2-small 2r   11.10 s  1.159 [1.137, 1.476]   1.028 [1.001, 1.300]        8.1%   530 MiB     0
    storm               0.42 s   9.949 [9.629, 10.310]  1.803 [1.723, 1.915]      829.9%   729 MiB     0

Goals (issue 35): DCP whole ``record`` <= 1.10x: not met (the interval starts at 1.137: ``start_s`` 0.66 s,
``finish_s`` 0.12 s and the CLI's own start on an 11 s save); DCP command <= 1.03x: within noise; storm <= 2x
with 0 lost: not met for the whole ``record`` (the 0.42 s storm records in 4.2 s: ``finish_s`` 2.09 s decoding
its events after the exit, ``start_s`` 0.66 s), met for the command alone (1.80x, upper end 1.92), 0 lost.
"tracer CPU" is the recorder's own CPU plus the BPF run time over the bare command's CPU (18.6 s for DCP,
0.44 s for the storm). Then ``--pairs 10 --workload hf --workload true --model gpt2-small --no-optimizer``
(22:46 UTC, load 1.3 before, 1.1 after; bcc and strace): ``hf`` (save_pretrained, 4.07 s bare) bcc record
1.399 [1.378, 1.446], command 1.040 [1.019, 1.078], 519 MiB, tracer CPU 26.8 %; strace record 2.065
[1.976, 2.127], command 1.558 [1.477, 1.604], 174 MiB (strace's own memory not in it), 0 lost for both.
``true``: the whole ``record`` 1.39 s under bcc (``start_s`` 0.66 s, 506 MiB) and 0.59 s under strace
(137 MiB). Not run: GPT-2-medium, 4 ranks, the io_uring storm, a save of >= 60 s bare.

A save of >= 60 s bare (3b86ff0, 2026-11-30 00:34 UTC, load 1.4 before, 2.5 after): ``--pairs 10 --workload dcp
--model gpt2-xl --ranks 2 --no-optimizer --saves 8 --backend bcc`` (gpt2-xl with Adam does not fit the 23 GiB
machine; 8 saves in a row of 6.2 GB, 63.3 s bare): record 1.072 [1.003, 1.168], command 1.049 [0.982, 1.143],
tracer CPU 6.0 %, ``start_s`` 1.0 s, ``finish_s`` 0.30 s, 540 MiB, 0 lost; the 3 % goal within noise.

After read and write calls became columns (``tracer.datacalls``), at 978c386 on 2026-11-29 01:30 UTC,
``--pairs 10 --workload storm --workload fio-uring-4k --backend bcc`` run twice, one after the other, the
second with ``CKPT_TRACE_RECORD_DATA_COLUMNS=0`` (one Python object per call, the path before; load 1.2-1.7):

    workload       columns: record/bare   command/bare   finish_s  peak     one by one: record/bare  finish_s  peak
    storm          7.067 [6.815, 7.246]   1.809          0.86 s    630 MiB  9.848 [9.568, 9.881]     1.99 s    746 MiB
    fio-uring-4k   3.355 [2.998, 3.459]   1.205          -         657 MiB  3.169 [2.881, 3.486]     -         649 MiB

The storm's whole ``record`` 0.72x of what it was; the command's own ratio is the BPF programs' and the
2 cores' (1.81 against 1.76, within noise). io_uring requests come through the request ring, not this path:
within noise. 0 lost everywhere. Goals still not met: storm <= 2x (whole ``record``), io_uring <= 1.1x.

Then the probes detach as soon as the command exits, in parallel threads (``bpfcache.Attached.detach_soon``
then, see below:
12 detaches took 0.63 s one after the other at the process's exit), and io_uring_enter and request rows are
appended without a dict per row. At 9866963, 02:05 UTC, the same command (load 0.3 before, 2.0 after):
storm 5.589 [5.388, 5.666] (command 1.787, ``finish_s`` 0.84 s, 629 MiB), fio-uring-4k 2.489 [2.260, 2.633]
(command 1.230, 654 MiB), 0 lost. ``--workload dcp --workload true --model gpt2-small --ranks 2`` at
2b49c86 (load 0.9 before, 3.1 after): dcp 1.156 [0.904, 1.255] (within noise of 1.10; command 1.063
[0.818, 1.152]), ``true`` 1.00 s whole (1.39 s before).

From 2026-11-29 04:10 UTC every command runs from Python's bytecode caches (the machine's shell sets
PYTHONDONTWRITEBYTECODE, which made every start compile the modules again: 0.1 s of ``record``'s start),
after one unmeasured warm-up run per variant. With the reader passing over the rings at most every 2 ms and
io_uring traffic as columns (``tracer.ringcalls``), ``--workload storm --workload fio-uring-4k --workload
true --backend bcc`` at fe8af95 (load 1.6 before, 2.4 after): storm 4.519 [4.374, 4.610] (command 1.583,
``finish_s`` 0.61 s, 577 MiB), fio-uring-4k 1.911 [1.820, 2.052] (command 1.184 [1.050, 1.245], ``finish_s``
0.56 s, 571 MiB), ``true`` 0.83 s whole (``start_s`` 0.50 s), 0 lost (``overhead_s10_b.json``);
``--workload dcp --model gpt2-small --ranks 2`` at 78df369 (tests ran beside it; load 1.5 before, 3.0
after): 1.090 [0.945, 1.130], command 1.014 [0.863, 1.054], both within noise of their goals
(``overhead_s10_dcp.json``).

The probes' detach then moved out of the process: each attachment is handed to a child whose exit
waits out the RCU grace periods (``bpfcache.Attached.detach_soon``); a process exits only once its threads
left their close(2), so ``record`` had ended 0.3 s after writing its trace. One run before and one after,
2026-11-29, ``--pairs 10 --workload storm --workload fio-uring-4k --workload true --backend bcc`` (load
0.4-1.6): ``true`` 0.84 -> 0.64 s whole; storm 4.42x -> 4.38x (1.79 s both: its ``finish_s``, 0.55-0.59 s,
outlasts the detaches anyway); fio-uring-4k 1.98x -> 2.11x (within noise; 3.04 -> 3.09 s). One child
holding every attachment (one detach after the other, 0.63 s) made the storm's ``finish_s`` 1.12 s: one
child per attachment, so they detach side by side. A ``true`` child could exit before the recorder had closed
its own copy, which then was the last and waited (``detach_soon`` took 0.12-0.38 s in 2 of 4 runs); the
children are now ``cat`` on a pipe the recorder closes after its own closes (3.4-4.1 ms in 4 runs).

Prints a table and writes ``benchmarks/results/tracer_overhead.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import save_result, storm_fio
from rich.console import Console
from rich.table import Table

from ckpt_trace.formats import read_metadata
from ckpt_trace.tracer import bcc_backend, strace_backend

WORKLOADS = ("dcp", "emitted", "fio-uring-1m", "fio-uring-4k", "hf", "libaio", "storm", "true")
FIO_JOBS = {"fio-uring-1m": ("write", "1m", 8, "2g"), "fio-uring-4k": ("randwrite", "4k", 32, "512m")}
STORM_WRITES, STORM_THREADS = 500_000, 2


def workload_cmd(workload: str, out: Path, args) -> list[str]:
    if workload == "true":
        return ["true"]
    if workload == "storm":
        return storm_fio(out, STORM_WRITES, STORM_THREADS)
    if workload in FIO_JOBS:
        rw, bs, depth, size = FIO_JOBS[workload]
        return [
            "fio",
            "--name=overhead",
            f"--directory={out}",
            "--ioengine=io_uring",
            f"--iodepth={depth}",
            "--direct=1",
            f"--rw={rw}",
            f"--bs={bs}",
            f"--size={size}",
            "--output=/dev/null",
        ]
    cmd = [sys.executable, "-m", "ckpt_trace.cli", "workload", workload, "--out", str(out), "--model", args.model]
    if workload in ("dcp", "emitted"):
        cmd += ["--ranks", str(args.ranks)]
    if workload == "dcp" and args.saves > 1:
        cmd += ["--saves", str(args.saves)]
    return cmd + (["--with-optimizer"] if args.with_optimizer else [])


def children_cpu_s() -> float:
    """User plus system CPU seconds of this process's waited-for children so far (getrusage RUSAGE_CHILDREN:
    a child's own waited-for children, the ranks of a DCP save, included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its children) of one run of ``cmd``."""
    cpu_before, started = children_cpu_s(), time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started, children_cpu_s() - cpu_before


BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


@contextlib.contextmanager
def bpf_stats():
    """The kernel counting BPF programs' run time (the trace's ``bpf_run_ns``) while inside; the sysctl's
    value before is restored. Does nothing where it cannot be set (not root)."""
    try:
        before = BPF_STATS.read_text()
        BPF_STATS.write_text("1\n")
    except OSError:
        yield
        return
    try:
        yield
    finally:
        BPF_STATS.write_text(before)


def run_variant(workload: str, variant: str, scratch: Path, args) -> tuple:
    """(end-to-end seconds, the workload command's own seconds, lost events, the recorder's CPU seconds
    while the command ran, the BPF programs' seconds, start_s, finish_s, the CPU seconds of the whole run (the
    recorder, strace and the command: RUSAGE_CHILDREN), the recorder's own peak RSS in bytes and its own CPU
    seconds from ``record --json``) of one run; None where not known."""
    out = scratch / "ckpt"
    shutil.rmtree(out, ignore_errors=True)  # ours: made under this run's scratch directory
    out.mkdir()
    trace = scratch / f"{variant}.arrow"
    trace.unlink(missing_ok=True)
    cmd = workload_cmd(workload, out, args)
    if workload not in FIO_JOBS and workload not in ("storm", "true"):
        out.rmdir()  # the workloads make their own directory
    if variant == "untraced":
        elapsed, cpu_s = timed(cmd)
        return elapsed, elapsed, 0, None, None, None, None, cpu_s, None, None
    env = dict(os.environ)
    if variant == COMPILED:
        env["CKPT_TRACE_BPF_PROGRAM_CACHE"] = "0"
    if variant == PROBES_BEFORE:  # the tracer before the mapped-I/O probes: bcc with every page probe left out
        env["CKPT_TRACE_BPF_OMIT_TRACEPOINTS"] = bcc_backend.PAGE_PROBES
    backend = "bcc" if variant.startswith("bcc") else variant
    with bpf_stats() if backend == "bcc" else contextlib.nullcontext():
        cpu_before, started = children_cpu_s(), time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ckpt_trace.cli",
                "record",
                "--backend",
                backend,
                "--json",
                "-o",
                str(trace),
                "--path-filter",
                f"{out}/",
                "--",
                *cmd,
            ],
            check=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        elapsed, run_cpu_s = time.monotonic() - started, children_cpu_s() - cpu_before
    summary = json.loads(done.stdout)
    meta = read_metadata(trace)
    cpu_ns, bpf_ns = meta.get("recorder_cpu_ns"), meta.get("bpf_run_ns")
    return (
        elapsed,
        meta["command_elapsed_ns"] / 1e9,
        int(meta["lost_events"]),
        None if cpu_ns is None else cpu_ns / 1e9,
        None if bpf_ns is None else bpf_ns / 1e9,
        summary.get("start_s"),
        summary.get("finish_s"),
        run_cpu_s,
        summary.get("recorder_peak_rss_bytes"),
        summary.get("recorder_cpu_s"),
    )


PROBES_BEFORE = "bcc-before"
COMPILED = "bcc-compiled"  # bcc compiling its program at start (the program cache off)


def compare_start(args, workloads: list[str]) -> None:
    """``--start``: bcc from its cached program (A) against bcc compiling it (B, ``COMPILED``), in pairs run
    A B B A ...; per workload the medians and ranges of start_s, finish_s and the whole record, and the
    median of the pairs' start_s ratios A/B."""
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-bench-", dir=args.out))
    previous = os.environ.get("CKPT_TRACE_CACHE_DIR")
    os.environ["CKPT_TRACE_CACHE_DIR"] = str(scratch / "cache")  # run_variant's subprocesses inherit it
    rows = []
    load_before = os.getloadavg()
    try:
        for workload in workloads:
            run_variant(workload, "bcc", scratch, args)  # compiles and fills the cache: not counted
            runs = {"bcc": [], COMPILED: []}
            for pair in range(args.repeats):
                for variant in ("bcc", COMPILED) if pair % 2 == 0 else (COMPILED, "bcc"):
                    runs[variant].append(run_variant(workload, variant, scratch, args))
            row: dict = {"workload": workload, "pairs": args.repeats}
            for variant, name in (("bcc", "cached"), (COMPILED, "compiled")):
                for index, figure in ((5, "start"), (6, "finish"), (0, "record")):
                    values = [r[index] for r in runs[variant]]
                    row[f"{name}_{figure}_runs_s"] = values
                    row[f"{name}_{figure}_median_s"] = statistics.median(values)
            ratios = [a[5] / b[5] for a, b in zip(runs["bcc"], runs[COMPILED])]
            row["start_paired_ratio_median"] = statistics.median(ratios)
            row["start_paired_ratios"] = ratios
            rows.append(row)
    finally:
        if previous is None:
            os.environ.pop("CKPT_TRACE_CACHE_DIR", None)
        else:
            os.environ["CKPT_TRACE_CACHE_DIR"] = previous
        shutil.rmtree(scratch, ignore_errors=True)  # ours: made by mkdtemp above
    load_after = os.getloadavg()
    table = Table(
        title=f"bcc's start: cached program (A) vs compiled (B), {args.repeats} ABBA pairs; "
        f"load {load_before[0]:.1f} before, {load_after[0]:.1f} after (median, min-max)"
    )
    for column in ("workload", "start A", "start B", "A/B paired", "finish A", "finish B", "record A", "record B"):
        table.add_column(column, justify="left" if column == "workload" else "right")

    def spread(row: dict, key: str) -> str:
        values = row[f"{key}_runs_s"]
        return f"{row[f'{key}_median_s']:.2f} ({min(values):.2f}-{max(values):.2f})"

    for row in rows:
        table.add_row(
            row["workload"],
            spread(row, "cached_start"),
            spread(row, "compiled_start"),
            f"{row['start_paired_ratio_median']:.2f}",
            spread(row, "cached_finish"),
            spread(row, "compiled_finish"),
            spread(row, "cached_record"),
            spread(row, "compiled_record"),
        )
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    result = {
        "benchmark": "tracer_overhead_start",
        "workloads": workloads,
        "pairs": args.repeats,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "results": rows,
    }
    save_result("tracer_overhead_start", result)


def compare_probes(args, workloads: list[str]) -> None:
    """``--probes``: bcc with every probe (A) against bcc without the mapped-I/O probes (B, ``PROBES_BEFORE``:
    filemap, writeback, rss_stat, page_fault_user left out), in pairs run A B B A A B ... so that a drift of the
    machine hits both alike; per workload the medians of the traced command's wall time and of the BPF
    programs' run time, and the median of each pair's ratio A/B."""
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-bench-", dir=args.out))
    load_before = os.getloadavg()
    rows = []
    try:
        for workload in workloads:
            runs = {"bcc": [], PROBES_BEFORE: []}
            for pair in range(args.repeats):
                order = ("bcc", PROBES_BEFORE) if pair % 2 == 0 else (PROBES_BEFORE, "bcc")
                for variant in order:
                    runs[variant].append(run_variant(workload, variant, scratch, args))
            after, before = runs["bcc"], runs[PROBES_BEFORE]
            ratios = [a[1] / b[1] for a, b in zip(after, before)]
            bpf_ratios = [a[4] / b[4] for a, b in zip(after, before) if a[4] and b[4]]
            rows.append(
                {
                    "workload": workload,
                    "pairs": args.repeats,
                    "command_median_s": statistics.median(r[1] for r in after),
                    "command_median_before_s": statistics.median(r[1] for r in before),
                    "command_runs_s": [r[1] for r in after],
                    "command_runs_before_s": [r[1] for r in before],
                    "command_median_ratio": statistics.median(r[1] for r in after)
                    / statistics.median(r[1] for r in before),
                    "paired_ratios": ratios,
                    "paired_ratio_median": statistics.median(ratios),
                    "bpf_run_s": [r[4] for r in after],
                    "bpf_run_before_s": [r[4] for r in before],
                    "bpf_run_median_s": statistics.median(r[4] for r in after if r[4] is not None)
                    if any(r[4] is not None for r in after)
                    else None,
                    "bpf_run_median_before_s": statistics.median(r[4] for r in before if r[4] is not None)
                    if any(r[4] is not None for r in before)
                    else None,
                    "bpf_paired_ratio_median": statistics.median(bpf_ratios) if bpf_ratios else None,
                    "lost_events": sum(r[2] for r in after) + sum(r[2] for r in before),
                }
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # ours: made by mkdtemp above
    load_after = os.getloadavg()
    table = Table(
        title=f"New probes' overhead: bcc with every probe (A) vs without the mapped-I/O probes (B), "
        f"{args.repeats} ABBA pairs; load {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    for column in ("workload", "command A", "command B", "A/B medians", "A/B paired", "BPF A", "BPF B", "lost"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for row in rows:
        bpf = (row["bpf_run_median_s"], row["bpf_run_median_before_s"])
        table.add_row(
            row["workload"],
            f"{row['command_median_s']:.2f} s",
            f"{row['command_median_before_s']:.2f} s",
            f"{row['command_median_ratio'] - 1:+.1%}",
            f"{row['paired_ratio_median'] - 1:+.1%}",
            "-" if bpf[0] is None else f"{bpf[0]:.2f} s",
            "-" if bpf[1] is None else f"{bpf[1]:.2f} s",
            f"{row['lost_events']:,}",
        )
    Console(width=None if sys.stdout.isatty() else 140).print(table)
    result = {
        "benchmark": "tracer_overhead_probes",
        "workloads": workloads,
        "model": args.model,
        "ranks": args.ranks,
        "with_optimizer": args.with_optimizer,
        "pairs": args.repeats,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "results": rows,
    }
    save_result("tracer_overhead_probes", result)


#: The issue 35 goals, as the upper limit of a paired ratio traced/bare: (workload, which ratio, limit, whether no
#: event may be lost, which runs it applies to: a (model, ranks) or "60s" for a save that runs >= 60 s bare).
GOALS = (
    ("dcp", "record", 1.10, False, ("gpt2-small", 2)),
    ("dcp", "command", 1.03, False, ("gpt2-small", 2)),
    ("dcp", "record", 1.03, False, "60s"),
    ("storm", "record", 2.0, True, None),
    ("fio-uring-4k", "record", 1.10, True, None),
)
MODEL_WORKLOADS, RANK_WORKLOADS = ("dcp", "emitted", "hf", "libaio"), ("dcp", "emitted")


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(low, high, coverage) of the distribution-free interval of the median of ``values``: the order statistics
    x(k) and x(n+1-k), k the largest for which 2 P(Binomial(n, 1/2) < k) <= 1 - level; ``coverage`` is that
    interval's exact probability of holding the median, 1 - 2 P(B < k) (>= ``level``; with n = 10, x(2) and x(9),
    97.9 %). Below 6 values no such k exists: (min, max) and its coverage, 1 - 2^(1-n). Raises ValueError when
    ``values`` is empty. Source: the sign-test interval (e.g. Conover, Practical Nonparametric Statistics, 3.2)."""
    if not values:
        raise ValueError("no values")
    ordered, n = sorted(values), len(values)
    below = [math.comb(n, i) / 2**n for i in range(n + 1)]
    k, tail = 1, below[0]  # tail: P(B < k)
    while 2 * (tail + below[k]) <= 1 - level:
        tail += below[k]
        k += 1
    return ordered[k - 1], ordered[n - k], 1 - 2 * tail


def verdict(upper: float, lower: float, limit: float, lost_events: int, lost_matters: bool) -> str:
    """ "met" when the interval's upper end is within ``limit`` (and no event lost where that matters), "not met"
    when its lower end is past it or events were lost, "within noise" when the interval straddles it."""
    if lost_matters and lost_events:
        return "not met"
    if upper <= limit:
        return "met"
    return "not met" if lower > limit else "within noise"


def pair_configs(workload: str, args) -> list[tuple[str | None, int | None]]:
    """The (model, ranks) runs of ``workload`` in ``--pairs`` mode: every model and rank count given for a
    save with ranks, every model for the other model workloads, (None, None) for fio and true."""
    if workload in RANK_WORKLOADS:
        return list(itertools.product(args.models, args.rank_counts))
    if workload in MODEL_WORKLOADS:
        return [(model, None) for model in args.models]
    return [(None, None)]


def pair_row(workload: str, config: tuple, variant: str, runs: list[tuple], bare: list[tuple]) -> dict:
    """One variant's figures over its pairs: the paired ratios traced/bare of the whole record and of the command
    with their medians and 95 % intervals, lost events, peak recorder memory, start/finish, and the tracer's CPU
    over the bare command's CPU (bcc: the recorder's own CPU plus the BPF programs' run time; strace: the traced
    run's CPU, strace and the recorder included, less the bare run's)."""
    record = [r[0] / b[0] for r, b in zip(runs, bare)]
    command = [r[1] / b[0] for r, b in zip(runs, bare)]
    if variant == "bcc":
        cpu = [((r[9] or 0.0) + (r[4] or 0.0)) / b[7] for r, b in zip(runs, bare) if r[9] is not None and b[7]]
    else:
        cpu = [(r[7] - b[7]) / b[7] for r, b in zip(runs, bare) if b[7]]
    rss = [r[8] for r in runs if r[8] is not None]
    row: dict = {"workload": workload, "model": config[0], "ranks": config[1], "variant": variant}
    row["pairs"] = len(runs)
    row["bare_median_s"] = statistics.median(b[0] for b in bare)
    row["bare_cpu_median_s"] = statistics.median(b[7] for b in bare)
    row["record_median_s"] = statistics.median(r[0] for r in runs)
    row["command_median_s"] = statistics.median(r[1] for r in runs)
    for name, ratios in (("record", record), ("command", command)):
        low, high, coverage = median_interval(ratios)
        row[f"{name}_paired_ratios"] = ratios
        row[f"{name}_ratio_median"] = statistics.median(ratios)
        row[f"{name}_ratio_interval"] = [low, high]
        row["interval_coverage"] = coverage
    row["tracer_cpu_ratio_median"] = statistics.median(cpu) if cpu else None
    row["tracer_cpu_ratios"] = cpu
    row["recorder_peak_rss_bytes_max"] = max(rss) if rss else None
    row["lost_events"] = sum(r[2] for r in runs)
    starts, finishes = [r[5] for r in runs if r[5] is not None], [r[6] for r in runs if r[6] is not None]
    row["start_median_s"] = statistics.median(starts) if starts else None
    row["finish_median_s"] = statistics.median(finishes) if finishes else None
    return row


def goal_verdicts(row: dict) -> list[dict]:
    """The goals of GOALS that ``row`` (bcc only: the goals are the project's tracer's) is measured against, each
    with its verdict."""
    found = []
    for workload, figure, limit, lost_matters, applies in GOALS:
        if row["variant"] != "bcc" or row["workload"] != workload:
            continue
        if applies == "60s" and row["bare_median_s"] < 60:
            continue
        if isinstance(applies, tuple) and applies != (row["model"], row["ranks"]):
            continue
        low, high = row[f"{figure}_ratio_interval"]
        found.append(
            {
                "figure": figure,
                "limit": limit,
                "zero_lost": lost_matters,
                "verdict": verdict(high, low, limit, row["lost_events"], lost_matters),
            }
        )
    return found


def run_pairs(args, workloads: list[str], backends: list[str]) -> None:
    """``--pairs N``: per workload (and model, ranks), N pairs of the bare command and each backend, in the order
    bare, backends... then backends reversed, bare (ABBA), so that a drift hits both sides alike; each traced
    run is paired with the bare run of its pair. Writes ``tracer_overhead_pairs.json`` and prints the table with
    a verdict per goal."""
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-bench-", dir=args.out))
    load_before, started = os.getloadavg(), time.time()
    rows = []
    try:
        for workload in workloads:
            variants = ["untraced"] + [b for b in backends if b == "bcc" or workload in ("dcp", "hf", "libaio", "true")]
            for model, ranks in pair_configs(workload, args):
                config = argparse.Namespace(**{**vars(args), "model": model or args.model, "ranks": ranks or 1})
                runs = {v: [] for v in variants}
                for variant in variants:  # warm_up: bytecode caches, the BPF program cache; not measured
                    run_variant(workload, variant, scratch, config)
                for pair in range(args.pairs):
                    for variant in variants if pair % 2 == 0 else variants[::-1]:
                        runs[variant].append(run_variant(workload, variant, scratch, config))
                for variant in variants[1:]:
                    row = pair_row(workload, (model, ranks), variant, runs[variant], runs["untraced"])
                    row["goals"] = goal_verdicts(row)
                    rows.append(row)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # ours: made by mkdtemp above
    load_after = os.getloadavg()
    print_pairs(rows, args, load_before, load_after)
    result = {
        "benchmark": "tracer_overhead_pairs",
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "workloads": workloads,
        "with_optimizer": args.with_optimizer,
        "saves": args.saves,
        "pairs": args.pairs,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "cpus": os.cpu_count(),
        "bytecode_cache": "PYTHONDONTWRITEBYTECODE" not in os.environ,  # in the measured commands
        "warm_up_runs": 1,
        "results": rows,
    }
    save_result(args.result_name, result)


def print_pairs(rows: list[dict], args, load_before, load_after) -> None:
    """The ``--pairs`` table: one line per workload, configuration and backend."""
    coverage = rows[0]["interval_coverage"] if rows else 0.95
    table = Table(
        title=f"Tracer overhead, {args.pairs} ABBA pairs each (paired ratio traced/bare: median "
        f"[{coverage:.1%} interval]); load {load_before[0]:.1f} before, {load_after[0]:.1f} after, "
        f"{os.cpu_count()} CPUs shared"
    )
    columns = ("workload", "variant", "bare", "record/bare", "command/bare", "tracer CPU", "peak RSS", "lost")
    for column in (*columns, "goals"):
        table.add_column(column, justify="left" if column in ("workload", "variant", "goals") else "right")

    def ratio(row: dict, name: str) -> str:
        low, high = row[f"{name}_ratio_interval"]
        return f"{row[f'{name}_ratio_median']:.3f} [{low:.3f}, {high:.3f}]"

    for row in rows:
        config = "".join(f" {v}" for v in (row["model"], row["ranks"] and f"{row['ranks']}r") if v)
        goals = "; ".join(f"{g['figure']} <= {g['limit']:g}x: {g['verdict']}" for g in row["goals"])
        rss = row["recorder_peak_rss_bytes_max"]
        cpu = row["tracer_cpu_ratio_median"]
        table.add_row(
            row["workload"] + config,
            row["variant"],
            f"{row['bare_median_s']:.2f} s",
            ratio(row, "record"),
            ratio(row, "command"),
            "-" if cpu is None else f"{cpu:.1%}",
            "-" if rss is None else f"{rss / 2**20:.0f} MiB",
            f"{row['lost_events']:,}",
            goals or "-",
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``models`` and ``rank_counts`` hold every --model and --ranks given, ``model`` and
    ``ranks`` the first (what the modes other than --pairs use)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="repeatable (default: all)")
    parser.add_argument(
        "--model", action="append", help="repeatable in --pairs mode (default gpt2-medium; else the first one)"
    )
    parser.add_argument("--ranks", type=int, action="append", help="repeatable in --pairs mode (default 4)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pairs", type=int, default=0, help="N ABBA pairs of bare and traced runs, 95 %% intervals and verdicts"
    )
    parser.add_argument(
        "--result-name", default="tracer_overhead_pairs", help="--pairs: the results file's name (no .json)"
    )
    parser.add_argument("--no-optimizer", dest="with_optimizer", action="store_false")
    parser.add_argument(
        "--saves", type=int, default=1, help="dcp: saves in a row per run (a job checkpointing N times; >= 60 s bare)"
    )
    parser.add_argument(
        "--backend", action="append", choices=("bcc", "strace"), help="repeatable (default: both where available)"
    )
    parser.add_argument("--out", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument(
        "--probes",
        action="store_true",
        help="compare bcc with and without the mapped-I/O probes in ABBA pairs (--repeats pairs)",
    )
    parser.add_argument(
        "--start",
        action="store_true",
        help="compare bcc's start from its cached program with a compile in ABBA pairs (--repeats pairs)",
    )
    args = parser.parse_args(argv)
    args.models, args.rank_counts = args.model or ["gpt2-medium"], args.ranks or [4]
    args.model, args.ranks = args.models[0], args.rank_counts[0]
    if args.pairs and args.pairs < 2:
        parser.error("--pairs needs at least 2 pairs (10 for the issue's intervals)")
    if args.out is not None:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--out {args.out}: {err.strerror}")
    return args


def main() -> None:
    args = parse_args()
    # As installed, a package runs from its bytecode caches (pip compiles them): a shell that forbids writing
    # them (PYTHONDONTWRITEBYTECODE, set on the project's machine) would time compiling the recorder's and
    # the workloads' modules on every start (0.1 s of ``record``'s start, measured here). The first run of
    # each variant (``warm_up``) writes them.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    workloads = args.workload or list(WORKLOADS)
    if args.start:
        problem = bcc_backend.probe()
        if problem:
            raise SystemExit(f"--start needs bcc: {problem}")
        compare_start(args, args.workload or ["true"])
        return
    if args.probes:
        problem = bcc_backend.probe()
        if problem:
            raise SystemExit(f"--probes needs bcc: {problem}")
        compare_probes(args, args.workload or ["dcp"])
        return

    backends, skipped = [], {}
    for name, problem in (
        ("bcc", bcc_backend.probe()),
        ("strace", None if strace_backend.available() else "strace not installed"),
    ):
        if problem:
            skipped[name] = problem
        elif args.backend is None or name in args.backend:
            backends.append(name)
    if shutil.which("fio") is None:
        for name in set(workloads) & {*FIO_JOBS, "storm"}:
            skipped[name] = "fio not installed"
            workloads.remove(name)
    if args.pairs:
        run_pairs(args, workloads, backends)
        for name, problem in skipped.items():
            print(f"{name}: skipped ({problem})")
        return
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-bench-", dir=args.out))
    rows = []
    try:
        for workload in workloads:
            variants = ["untraced"] + [b for b in backends if b == "bcc" or workload in ("dcp", "libaio", "true")]
            runs = {v: [] for v in variants}
            for _ in range(args.repeats):  # interleaved: drift hits every variant alike
                for variant in variants:
                    runs[variant].append(run_variant(workload, variant, scratch, args))
            base = statistics.median(r[0] for r in runs["untraced"])
            for variant in variants:
                total = [r[0] for r in runs[variant]]
                command = [r[1] for r in runs[variant]]
                paired = [c / u[0] - 1.0 for c, u in zip(command, runs["untraced"])]
                cpu = [r[3] / r[1] for r in runs[variant] if r[3] is not None]
                bpf = [r[4] / r[1] for r in runs[variant] if r[4] is not None]
                starts = [r[5] for r in runs[variant] if r[5] is not None]
                finishes = [r[6] for r in runs[variant] if r[6] is not None]
                paired_record = [r[0] / u[0] - 1.0 for r, u in zip(runs[variant], runs["untraced"])]
                rows.append(
                    {
                        "workload": workload,
                        "variant": variant,
                        "median_s": statistics.median(total),
                        "min_s": min(total),
                        "max_s": max(total),
                        "runs_s": total,
                        "overhead_ratio": statistics.median(total) / base - 1.0,
                        "command_median_s": statistics.median(command),
                        "command_runs_s": command,
                        "command_overhead_ratio": statistics.median(command) / base - 1.0,
                        "command_paired_overhead_ratio": statistics.median(paired),
                        "command_paired_overhead_runs": paired,
                        "recorder_cpu_ratio": statistics.median(cpu) if cpu else None,
                        "bpf_run_ratio": statistics.median(bpf) if bpf else None,
                        "lost_events": sum(r[2] for r in runs[variant]),
                        "start_median_s": statistics.median(starts) if starts else None,
                        "start_runs_s": starts,
                        "finish_median_s": statistics.median(finishes) if finishes else None,
                        "finish_runs_s": finishes,
                        "record_paired_overhead_ratio": statistics.median(paired_record),
                    }
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # ours: made by mkdtemp above

    table = Table(
        title=f"Tracer overhead (model {args.model}, {args.ranks} ranks, "
        f"{'with' if args.with_optimizer else 'without'} Adam; median of {args.repeats})"
    )
    for column in (
        "workload",
        "variant",
        "record",
        "+",
        "paired rec.",
        "start",
        "finish",
        "command",
        "+ ",
        "paired",
        "rec. CPU",
        "BPF",
        "lost",
    ):
        table.add_column(column, justify="left" if column in ("workload", "variant") else "right")
    for row in rows:
        untraced = row["variant"] == "untraced"
        table.add_row(
            row["workload"],
            row["variant"],
            f"{row['median_s']:.2f} s",
            "-" if untraced else f"{row['overhead_ratio']:+.1%}",
            "-" if untraced else f"{row['record_paired_overhead_ratio']:+.1%}",
            "-" if row["start_median_s"] is None else f"{row['start_median_s']:.2f} s",
            "-" if row["finish_median_s"] is None else f"{row['finish_median_s']:.2f} s",
            f"{row['command_median_s']:.2f} s",
            "-" if untraced else f"{row['command_overhead_ratio']:+.1%}",
            "-" if untraced else f"{row['command_paired_overhead_ratio']:+.1%}",
            "-" if row["recorder_cpu_ratio"] is None else f"{row['recorder_cpu_ratio']:.1%}",
            "-" if row["bpf_run_ratio"] is None else f"{row['bpf_run_ratio']:.1%}",
            "-" if untraced else f"{row['lost_events']:,}",
        )
    Console(width=None if sys.stdout.isatty() else 140).print(table)
    for name, problem in skipped.items():
        print(f"{name}: skipped ({problem})")
    result = {
        "benchmark": "tracer_overhead",
        "workloads": workloads,
        "model": args.model,
        "ranks": args.ranks,
        "with_optimizer": args.with_optimizer,
        "repeats": args.repeats,
        "results": rows,
        "skipped": skipped,
    }
    save_result("tracer_overhead", result)


if __name__ == "__main__":
    main()
