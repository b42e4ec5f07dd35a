"""The emitted checkpoint writer/reader against the engines users have, on one state dict and one disk.

State: the built-in GPT-2-medium with Adam state (354.8 M parameters x 3
float32 tensors, 4.26 GB), one process. Engines:

- ``emitted``: the module ``ckpt-trace emit`` writes for the demo DCP trace,
  tuned from a ``replay --strategy all --durable`` of it (from the golden
  2-rank trace without results when the demo trace is missing);
- ``emitted-nocrc``: the same module with ``checksums=False`` (no CRC32C per
  item on save, none checked on load): the checksums' cost is ``emitted``
  against it (``checksum_cost`` in the results; issue 38 asks under 5 % of
  save throughput);
- ``dcp-t1`` / ``dcp-t4``: torch.distributed.checkpoint FileSystemWriter
  (thread_count 1, DCP's default, and 4; sync_files on) and FileSystemReader;
- ``torch.save`` / ``torch.load`` of the nested state dict, file fsynced;
- ``safetensors`` save_file / load_file of the flat tensors, file fsynced;
- ``torchsnapshot`` Snapshot.take / restore, every file fsynced (if installed).

Each save runs in a fresh process after the page cache is dropped ("cold"),
then again into a new directory in the same process ("warm"); each load
runs in a fresh process after dropping the cache (engines that load in
place get their target state allocated before the clock starts). fsync is inside every
timed region. Loads are checked against a fingerprint of the saved state.
The device limits are the best of several fio runs (4 MiB, io_uring,
O_DIRECT, queue depth 32). Ratios are taken within this one run.

    python benchmarks/emitted_writer.py [--scratch DIR] [--engines emitted,dcp-t1,...]
    python benchmarks/emitted_writer.py --pairs 5 --model gpt2-small --fio-runs 0
    python benchmarks/emitted_writer.py --repeated 8    # every save of a job against fio beside it

``--repeated N`` (issue 36: every save of a job at the device limit): N saves of the state by one process,
each into a new directory that is removed after its measurement (a job keeping one checkpoint), each beside
a fio write of the same bytes run just before or just after it, alternately; the device's write requests
during each save and their mean size (/sys/dev/block/MAJ:MIN/stat) are shown beside.

What it found (the project's VM, virtio-blk, ``max_segments`` 254): the later saves were slower than the first
(gpt2-small + Adam, 2026-11-28: saves 2-8 at 63-80 % of fio, the first 91 %) because their 4 MiB O_DIRECT
writes were split into 4-5 device requests. A fresh process's first staging buffers get physically
contiguous pages (370 requests of 3.9 MiB for 1.49 GB); once it has freed memory, its new 4 KiB pages are
scattered (548-1,764 requests of 0.8-2.7 MiB for the same save). Fresh processes were fast every time
(1.19-1.24 s, 4 runs) while the same process's later saves took 1.40-1.70 s; removing the checkpoints
(online ``discard``) or pausing between saves made no difference. The I/O layer's buffers now ask for
transparent huge pages (``iolayer.buffers``). One run each way, gpt2-medium + Adam (4.26 GB), 2026-11-29,
load average about 1: before, saves 2-8 at 84 % of fio (median; 69-100 %, 98 % interval), the first
105 %; after, 102 % (92-142 %), the first 100 %.

Prints a table and writes ``benchmarks/results/emitted_writer.json``. ``--pairs N`` measures only the
checksums' cost: N pairs of ``emitted`` and ``emitted-nocrc`` (each a save child and a load child, as
above), alternating which goes first (ABBA), so drift of a shared machine falls on both; per pair the cost
is checked / unchecked - 1 of the cold save, the warm save and the load; the result is each cost's median,
its spread (min..max) and a distribution-free confidence interval of the median (order statistics, at
least 90 %), with the verdict "within noise" where the interval includes 0 (``checksum_pairs`` in the
JSON; ``benchmarks/results/emitted_writer_pairs.json``). On the project's 2-core machine under a load
average of 16-26, 6 pairs of gpt2-small + Adam (1.49 GB) spread -55..+64 %: every verdict "within noise";
``checksum_overlap.py`` counts the checksums' time on the critical path instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from common import best_fio, fsync_tree, parse_or_run_child, run_child, save_result
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
ENGINES = ("emitted", "emitted-nocrc", "dcp-t1", "dcp-t4", "torch.save", "safetensors", "torchsnapshot")
MODEL = os.environ.get("CKPT_TRACE_BENCH_MODEL", "gpt2-medium")  # a smaller one for a quick look


def _state():
    from ckpt_trace.workloads.engines import local_state, model_config

    local = local_state(model_config(MODEL), 0, 1, with_optimizer=True)
    return {"model": local["model"], "optim": {"exp_avg": local["exp_avg"], "exp_avg_sq": local["exp_avg_sq"]}}


def _flat(state: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _zeros(state: dict) -> dict:
    import torch

    return {k: _zeros(v) if isinstance(v, dict) else torch.zeros_like(v) for k, v in state.items()}


def _fingerprint(flat: dict) -> float:
    return float(sum(t.reshape(-1)[::4099].double().sum() for t in flat.values()))


def _save(engine: str, state: dict, path: Path, module) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    if engine == "emitted":
        dcp.save(state, storage_writer=module.make_writer(path))
    elif engine == "emitted-nocrc":
        dcp.save(state, storage_writer=_unchecked(module, "CheckpointWriter", path))
    elif engine.startswith("dcp-t"):
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path, thread_count=int(engine[5:]), sync_files=True))
    elif engine == "torch.save":
        path.mkdir(parents=True)
        with open(path / "checkpoint.pt", "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
    elif engine == "safetensors":
        from safetensors.torch import save_file

        path.mkdir(parents=True)
        save_file(_flat(state), str(path / "model.safetensors"))
        fsync_tree(path)
    else:
        from torchsnapshot import Snapshot, StateDict

        Snapshot.take(str(path), {"state": StateDict(**_flat(state))})
        fsync_tree(path)


def _unchecked(module, kind: str, path: Path):
    """The emitted module's writer or reader with ``checksums=False``."""
    import dataclasses

    import ckpt_trace.writer as writer

    return getattr(writer, kind)(path, dataclasses.replace(module.OPTIONS, checksums=False))


def _load_target(engine: str):
    """The state a load fills in place (DCP, torchsnapshot), allocated and touched before the clock starts."""
    if engine.startswith("emitted") or engine.startswith("dcp-t"):
        return _zeros(_state_shapes())
    if engine == "torchsnapshot":
        from torchsnapshot import StateDict

        return StateDict(**_flat(_zeros(_state_shapes())))
    return None


def _load(engine: str, path: Path, module, target) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    if engine.startswith("emitted") or engine.startswith("dcp-t"):
        reader = (
            module.make_reader(path)
            if engine == "emitted"
            else _unchecked(module, "CheckpointReader", path)
            if engine == "emitted-nocrc"
            else dcp.FileSystemReader(path)
        )
        dcp.load(target, storage_reader=reader)
        return _flat(target)
    if engine == "torch.save":
        return _flat(torch.load(path / "checkpoint.pt", map_location="cpu", weights_only=True))
    if engine == "safetensors":
        from safetensors.torch import load_file

        return load_file(str(path / "model.safetensors"))
    from torchsnapshot import Snapshot

    Snapshot(str(path)).restore({"state": target})
    return dict(target)


def _state_shapes() -> dict:
    import torch

    from ckpt_trace.workloads.models import MODELS, parameter_shapes

    shapes = parameter_shapes(MODELS[MODEL])
    empty = {name: torch.empty(shape) for name, shape in shapes.items()}
    return {"model": empty, "optim": {"exp_avg": dict(empty), "exp_avg_sq": dict(empty)}}


def _import_module(path: str | None):
    if path is None:
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child(args) -> None:
    """One measurement in this fresh process; prints one JSON line."""
    warnings.filterwarnings("ignore")
    module = _import_module(args.module)
    directory = Path(args.dir)
    if args.child == "repeated":
        print(json.dumps(_repeated_saves(args.engine, directory, module, int(os.environ["CKPT_TRACE_BENCH_ROUNDS"]))))
        return
    if args.child == "save":
        state = _state()
        flat = _flat(state)
        size_bytes = sum(t.numel() * t.element_size() for t in flat.values())
        times = {}
        for run in ("cold", "warm"):
            started = time.perf_counter()
            _save(args.engine, state, directory / run, module)
            times[f"{run}_save_s"] = time.perf_counter() - started
        print(json.dumps({**times, "bytes": size_bytes, "fingerprint": _fingerprint(flat)}))
    else:
        target = _load_target(args.engine)
        started = time.perf_counter()
        loaded = _load(args.engine, directory, module, target)
        elapsed = time.perf_counter() - started
        print(json.dumps({"load_s": elapsed, "fingerprint": _fingerprint(loaded)}))


def _repeated_saves(engine: str, directory: Path, module, rounds: int) -> dict:
    """``rounds`` saves of one state by one process (a training job saving every N steps), each into a new
    directory, fsync inside the clock, each beside a fio write of the same bytes (``fio_bytes_per_s``: 4 MiB,
    io_uring, O_DIRECT, queue depth 32, end_fsync) run just before or just after it, alternately (ABBA), so
    the device's drift and its burst-then-sustained behaviour fall on both alike. Each save's directory and
    fio's file are removed after their measurement."""
    from ckpt_trace.iolayer.fio import fio_bytes_per_s

    state = _state()
    size_bytes = sum(t.numel() * t.element_size() for t in _flat(state).values())
    out = []
    directory.mkdir(parents=True, exist_ok=True)
    for number in range(rounds):
        fio_first = number % 2 == 1
        fio = fio_bytes_per_s(directory, str(size_bytes), "write") if fio_first else None
        path = directory / f"save-{number}"
        before = _device_writes(directory)
        started = time.perf_counter()
        _save(engine, state, path, module)
        save_s = time.perf_counter() - started
        after = _device_writes(directory)
        shutil.rmtree(path)
        if not fio_first:
            fio = fio_bytes_per_s(directory, str(size_bytes), "write")
        requests = after[0] - before[0] if before and after else None
        out.append(
            {
                "save_s": save_s,
                "save_bytes_per_s": size_bytes / save_s,
                "fio_bytes_per_s": fio,
                "fio_first": fio_first,
                "device_write_requests": requests,
                "device_write_bytes": after[1] - before[1] if before and after else None,
            }
        )
    return {"bytes": size_bytes, "rounds": out}


def _device_writes(directory: Path) -> tuple[int, int] | None:
    """(write requests completed, bytes written) by the block device holding ``directory``, from its
    /sys/dev/block/MAJ:MIN/stat (Documentation/block/stat.rst: fields 5 and 7, sectors of 512 B); None where
    there is no such file (a network or overlay file system). Other writers of the device count too."""
    device = os.stat(directory).st_dev
    try:
        fields = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat").read_text().split()
        return int(fields[4]), int(fields[6]) * 512
    except (OSError, IndexError, ValueError):
        return None


def _requests(row: dict) -> str:
    """'370 x 3.9 MiB': the device's write requests during a save and their mean size."""
    count, size = row.get("device_write_requests"), row.get("device_write_bytes")
    if not count or size is None:
        return "-"
    return f"{count:,} x {size / count / 2**20:.1f} MiB"


def main_repeated(args) -> None:
    """``--repeated N``: every save of a job, not only the first (issue 36: repeated saves >= 0.95x fio's
    write rate). Prints a table per save and the median (distribution-free interval) of the later saves' ratio
    to the fio write beside each; writes ``benchmarks/results/emitted_writer_repeated.json``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    os.environ["CKPT_TRACE_BENCH_ROUNDS"] = str(args.repeated)
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-writer-", dir=args.scratch))
    load_before = os.getloadavg()
    try:
        module, tuned_from = _emit_module(scratch)
        result = _run_child("repeated", "emitted", scratch / "emitted", module)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = result["rounds"]
    table = Table(title=f"{MODEL} + Adam, {result['bytes'] / 1e9:.2f} GB, {len(rows)} saves by one process")
    for column in ("save", "save MB/s", "fio MB/s", "of fio", "fio ran", "device writes"):
        table.add_column(column, justify="right")
    ratios = []
    for number, row in enumerate(rows):
        ratio = row["save_bytes_per_s"] / row["fio_bytes_per_s"] if row["fio_bytes_per_s"] else None
        row["of_fio"] = ratio
        if ratio is not None and number:
            ratios.append(ratio)
        table.add_row(
            str(number + 1),
            f"{row['save_bytes_per_s'] / 1e6:,.0f}",
            f"{row['fio_bytes_per_s'] / 1e6:,.0f}" if row["fio_bytes_per_s"] else "-",
            f"{ratio:.0%}" if ratio is not None else "-",
            "before" if row["fio_first"] else "after",
            _requests(row),
        )
    Console(width=None if sys.stdout.isatty() else 100).print(table)
    summary = None
    if len(ratios) >= 2:
        mid, low, high, coverage = median_interval(ratios)
        goal = "met" if low >= 0.95 else "not met" if high < 0.95 else "within noise"
        summary = {"median": mid, "low": low, "high": high, "coverage": coverage, "goal_0_95": goal}
        print(
            f"saves 2-{len(rows)}: {mid:.0%} of fio (median; {low:.0%}-{high:.0%}, {coverage:.0%} interval); "
            f"goal >= 95 %: {goal}; load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}"
        )
    save_result(
        "emitted_writer_repeated",
        {
            "benchmark": "emitted_writer_repeated",
            "model": MODEL,
            "emitted_from": tuned_from,
            "bytes": result["bytes"],
            "rounds": rows,
            "later_saves_of_fio": summary,
            "load_average": [load_before[0], os.getloadavg()[0]],
        },
    )


def _run_child(mode: str, engine: str, directory: Path, module: Path) -> dict:
    return run_child(__file__, mode, engine, directory, "--module", str(module))


def _emit_module(scratch: Path) -> tuple[Path, str]:
    cli = [sys.executable, "-m", "ckpt_trace.cli"]
    module = scratch / "emitted_writer_module.py"
    demo = REPO / "traces" / "demo-dcp.arrow"
    if demo.exists():
        results = scratch / "replay.json"
        subprocess.run(
            [
                *cli,
                "replay",
                str(demo),
                "--target",
                str(scratch / "replay"),
                "--strategy",
                "all",
                "--durable",
                "-o",
                str(results),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        shutil.rmtree(scratch / "replay")
        subprocess.run([*cli, "emit", str(demo), "--from-results", str(results), "-o", str(module)], check=True)
        return module, f"{demo.name} + replay --strategy all --durable"
    golden = REPO / "traces" / "golden" / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow"
    subprocess.run([*cli, "emit", str(golden), "-o", str(module)], check=True)
    return module, f"{golden.name} (no replay results)"


def _available(engine: str) -> bool:
    if engine != "torchsnapshot":
        return True
    try:
        import torchsnapshot  # noqa: F401
    except ImportError:
        print("torchsnapshot is not installed (pip install torchsnapshot); left out", file=sys.stderr)
        return False
    return True


def _table(rows: list[dict], fio_write: float | None, fio_read: float | None) -> Table:
    title = (
        f"{MODEL} + Adam, {rows[0]['bytes'] / 1e9:.2f} GB; fio write {fio_write / 1e6:,.0f} MB/s, "
        f"read {fio_read / 1e6:,.0f} MB/s"
        if fio_write and fio_read
        else f"{MODEL} + Adam"
    )
    table = Table(title=title)
    for column in (
        "engine",
        "cold save",
        "MB/s",
        "warm save",
        "MB/s ",
        "cold vs dcp-t1",
        "warm of fio",
        "cold load",
        "MB/s  ",
        "load vs dcp-t1",
        "load of fio read",
    ):
        table.add_column(column, justify="left" if column == "engine" else "right")
    for r in rows:
        table.add_row(
            r["engine"],
            f"{r['cold_save_s']:.2f} s",
            f"{r['cold_save_mb_s']:,.0f}",
            f"{r['warm_save_s']:.2f} s",
            f"{r['warm_save_mb_s']:,.0f}",
            f"{r['cold_save_vs_dcp_t1']:.2f}x",
            f"{r['warm_save_of_fio']:.0%}" if r["warm_save_of_fio"] else "-",
            f"{r['load_s']:.2f} s",
            f"{r['load_mb_s']:,.0f}",
            f"{r['load_vs_dcp_t1']:.2f}x",
            f"{r['load_of_fio']:.0%}" if r["load_of_fio"] else "-",
        )
    return table


def _ratios(rows: list[dict], fio_write: float | None, fio_read: float | None) -> None:
    base = next((r for r in rows if r["engine"] == "dcp-t1"), rows[0])
    for r in rows:
        r["cold_save_mb_s"] = r["bytes"] / r["cold_save_s"] / 1e6
        r["warm_save_mb_s"] = r["bytes"] / r["warm_save_s"] / 1e6
        r["load_mb_s"] = r["bytes"] / r["load_s"] / 1e6
        r["cold_save_vs_dcp_t1"] = base["cold_save_s"] / r["cold_save_s"]
        r["warm_save_vs_dcp_t1"] = base["warm_save_s"] / r["warm_save_s"]
        r["load_vs_dcp_t1"] = base["load_s"] / r["load_s"]
        r["cold_save_of_fio"] = r["cold_save_mb_s"] * 1e6 / fio_write if fio_write else None
        r["warm_save_of_fio"] = r["warm_save_mb_s"] * 1e6 / fio_write if fio_write else None
        r["load_of_fio"] = r["load_mb_s"] * 1e6 / fio_read if fio_read else None
    checked = next((r for r in rows if r["engine"] == "emitted"), None)
    unchecked = next((r for r in rows if r["engine"] == "emitted-nocrc"), None)
    if checked and unchecked:  # the checksums' share of save and load time (negative: within the noise)
        for key in ("cold_save_s", "warm_save_s", "load_s"):
            checked[f"checksum_cost_{key.removesuffix('_s')}"] = checked[key] / unchecked[key] - 1
        print(
            "checksum cost: "
            + ", ".join(
                f"{key.removeprefix('checksum_cost_')} {value:+.1%}"
                for key, value in checked.items()
                if key.startswith("checksum_cost")
            ),
            file=sys.stderr,
        )


def median_interval(values: list[float], coverage: float = 0.9) -> tuple[float, float, float, float]:
    """(median, low, high, coverage) of ``values``: the distribution-free confidence interval of the median
    between the order statistics x(k) and x(n+1-k), the narrowest with at least ``coverage``
    (P = 1 - 2 * P(Binomial(n, 1/2) < k)); with fewer than 5 values it is the range, whatever its coverage."""
    from math import comb
    from statistics import median

    ordered = sorted(values)
    n = len(ordered)
    best = (ordered[0], ordered[-1], 1 - 2 * 0.5**n)
    for k in range(1, n // 2 + 1):
        tail = sum(comb(n, i) for i in range(k)) / 2**n
        if 1 - 2 * tail >= coverage:
            best = (ordered[k - 1], ordered[n - k], 1 - 2 * tail)
    return median(ordered), *best


def verdict(low: float, high: float) -> str:
    """ "within noise" when the interval includes 0, else what the checksums cost (or save)."""
    if low <= 0 <= high:
        return "within noise"
    return "costs" if low > 0 else "faster with checksums"


def run_pairs(scratch: Path, module: Path, pairs: int) -> dict:
    """``pairs`` alternating measurements of ``emitted`` and ``emitted-nocrc``; see the module docstring."""
    samples: dict[str, list[dict]] = {"emitted": [], "emitted-nocrc": []}
    for pair in range(pairs):
        order = ("emitted", "emitted-nocrc") if pair % 2 == 0 else ("emitted-nocrc", "emitted")
        for engine in order:
            directory = scratch / engine
            saved = _run_child("save", engine, directory, module)
            shutil.rmtree(directory / "cold")
            loaded = _run_child("load", engine, directory / "warm", module)
            shutil.rmtree(directory)
            if abs(loaded["fingerprint"] - saved["fingerprint"]) > 1e-6 * max(1.0, abs(saved["fingerprint"])):
                raise RuntimeError(f"{engine}: loaded state differs from the saved one")
            samples[engine].append({**saved, "load_s": loaded["load_s"]})
            print(
                f"pair {pair + 1}/{pairs} {engine}: cold save {saved['cold_save_s']:.2f} s, warm "
                f"{saved['warm_save_s']:.2f} s, load {loaded['load_s']:.2f} s",
                file=sys.stderr,
            )
    from statistics import median

    costs = {}
    for key in ("cold_save_s", "warm_save_s", "load_s"):
        per_pair = [c[key] / u[key] - 1 for c, u in zip(samples["emitted"], samples["emitted-nocrc"])]
        mid, low, high, coverage = median_interval(per_pair)
        costs[key.removesuffix("_s")] = {
            "per_pair": per_pair,
            "median": mid,
            "min": min(per_pair),
            "max": max(per_pair),
            "interval": [low, high],
            "interval_coverage": coverage,
            "verdict": verdict(low, high),
            "median_s": {engine: median(r[key] for r in rows) for engine, rows in samples.items()},
        }
    return {"pairs": pairs, "samples": samples, "cost": costs}


def _print_pairs(result: dict, size_bytes: int) -> None:
    table = Table(
        title=f"checksums' cost, {MODEL} + Adam, {size_bytes / 1e9:.2f} GB, {result['pairs']} pairs "
        f"(emitted / emitted-nocrc - 1 per pair)"
    )
    for column in ("phase", "emitted", "emitted-nocrc", "median cost", "min..max", "interval (cover)", "verdict"):
        table.add_column(column, justify="left" if column in ("phase", "verdict") else "right")
    for phase, c in result["cost"].items():
        table.add_row(
            phase,
            f"{c['median_s']['emitted']:.2f} s",
            f"{c['median_s']['emitted-nocrc']:.2f} s",
            f"{c['median']:+.1%}",
            f"{c['min']:+.1%}..{c['max']:+.1%}",
            f"{c['interval'][0]:+.1%}..{c['interval'][1]:+.1%} ({c['interval_coverage']:.0%})",
            c["verdict"],
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def main() -> None:
    global MODEL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch", type=Path, default=None, help="directory on the storage to measure")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--fio-size", default="2G")
    parser.add_argument("--fio-runs", type=int, default=3, help="0: no fio limits")
    parser.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="only the checksums' cost: this many alternating emitted / emitted-nocrc pairs",
    )
    parser.add_argument("--model", default=None, help=f"the state's model (default {MODEL})")
    parser.add_argument(
        "--repeated",
        type=int,
        default=0,
        help="only repeated saves: this many saves by one process, each beside a fio write of the same bytes",
    )
    args = parse_or_run_child(parser, child)
    if args is None:
        return
    if args.model:
        MODEL = os.environ["CKPT_TRACE_BENCH_MODEL"] = args.model  # the children read it
    if args.pairs:
        main_pairs(args)
        return
    if args.repeated:
        main_repeated(args)
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-writer-", dir=args.scratch))
    rows = []
    try:
        fio_write, write_samples = best_fio(scratch, args.fio_size, args.fio_runs, "write")
        fio_read, read_samples = best_fio(scratch, args.fio_size, args.fio_runs, "read")
        module, tuned_from = _emit_module(scratch)
        for engine in [e for e in args.engines.split(",") if _available(e)]:
            directory = scratch / engine
            saved = _run_child("save", engine, directory, module)
            shutil.rmtree(directory / "cold")
            loaded = _run_child("load", engine, directory / "warm", module)
            if abs(loaded["fingerprint"] - saved["fingerprint"]) > 1e-6 * max(1.0, abs(saved["fingerprint"])):
                raise RuntimeError(f"{engine}: loaded state differs from the saved one")
            rows.append({"engine": engine, **saved, "load_s": loaded["load_s"]})
            shutil.rmtree(directory)
            print(
                f"{engine}: cold save {saved['cold_save_s']:.2f} s, warm {saved['warm_save_s']:.2f} s, "
                f"load {loaded['load_s']:.2f} s",
                file=sys.stderr,
            )
        options = module.read_text().split("OPTIONS = ", 1)[1].split("\n)\n", 1)[0] + "\n)"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _ratios(rows, fio_write, fio_read)
    Console(width=None if sys.stdout.isatty() else 200).print(_table(rows, fio_write, fio_read))
    result = {
        "benchmark": "emitted_writer",
        "model": MODEL,
        "fio_write_bytes_per_s": fio_write,
        "fio_write_samples": write_samples,
        "fio_read_bytes_per_s": fio_read,
        "fio_read_samples": read_samples,
        "emitted_from": tuned_from,
        "emitted_options": options,
        "results": rows,
    }
    print(f"emitted from {tuned_from}: {' '.join(options.split())}")
    save_result("emitted_writer", result)


def main_pairs(args) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-writer-", dir=args.scratch))
    try:
        module, tuned_from = _emit_module(scratch)
        result = run_pairs(scratch, module, args.pairs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    size_bytes = result["samples"]["emitted"][0]["bytes"]
    _print_pairs(result, size_bytes)
    out = RESULTS / "emitted_writer_pairs.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "emitted_writer",
                "model": MODEL,
                "bytes": size_bytes,
                "kernel": os.uname().release,
                "cpus": os.cpu_count(),
                "emitted_from": tuned_from,
                "checksum_pairs": result,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"results: {out}")


if __name__ == "__main__":
    main()
