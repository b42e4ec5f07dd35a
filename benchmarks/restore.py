"""Cold restores of one state dict by every loader, against fio's read limits on the same disk (issue: the restore path).

State: the built-in GPT-2 shape (``--model``, default gpt2-small) with Adam
state, float32, one process. It is saved once per checkpoint format (the
emitted writer, DCP's FileSystemWriter, torch.save, safetensors save_file,
each fsynced), then each loader reads it ``--runs`` times, every time in a
fresh process after the page cache was dropped (root): the emitted reader
(``ckpt_trace.writer.CheckpointReader``: by default a stream of
``--buffer-size`` O_DIRECT reads at ``--queue-depth`` into a fixed arena,
copied out; ``(buffered)``: buffered reads straight into the destination
tensors, ``--load-streams`` threads), DCP's
FileSystemReader, ``torch.load``, ``torch.load(mmap=True)`` and safetensors
``load_file`` (which maps the file). Loaders that fill a state in place (DCP's) get it allocated and
zeroed before the clock starts. The clock stops when every tensor has
been read: each loaded tensor has one element per 4 KiB page touched inside
the timed region, so the mapping loaders pay for their page faults as the
eager ones pay for their reads. Loads are checked against the saved state's
fingerprint.

fio's read limits on a file of the checkpoint's size, laid out once (O_DIRECT,
fsynced), each read after dropping the page cache: sequential 4 MiB reads
through io_uring with O_DIRECT at queue depth 32, and buffered psync (the
kernel's read-ahead at work).

The work runs in ``--runs`` rounds: each round loads once with every loader
and reads once with each fio job, so a disk that slows down for a while
slows every loader alike. Besides each loader's median, two paired figures
come from the rounds: ``of fio``, the median over rounds of the loader's
speed over the better of the two fio reads of the same round; ``vs best
other`` (the emitted reader's rows), the median over rounds of the fastest
other loader's time that round over the emitted reader's.

One run of this script on a shared machine: read the ratios (medians within
the run), not the third digit.

On a virtual machine that reports free pages to its host (the
``page_reporting`` module, with virtio_balloon), memory the guest frees,
such as the page cache dropped before each load, goes back to the host after
about two seconds, and its first use afterwards faults on the host. A load
then pays for the page cache it fills (and any memory it allocates) at that
rate: in one check here, a plain two-stream read of a 1.5 GB file right
after dropping the cache ran at 734-2,047 MB/s, three seconds later at
505-905 MB/s. Each load here starts about that long after the drop (a fresh
process), as a restarted job would. The results say whether the host
reports free pages (``free_page_reporting``).

    python benchmarks/restore.py [--model gpt2-small] [--runs 5] [--queue-depth 32] [--load-streams 2] [--scratch DIR]

Prints a table and writes ``benchmarks/results/restore.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import emitted_writer as ew
from common import drop_caches, parse_or_run_child, run_child, save_result
from rich.console import Console
from rich.table import Table

from ckpt_trace.writer.options import WriterOptions

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
#: loader -> the format it reads (emitted_writer's engine names)
LOADERS = {
    "emitted": "emitted",
    "emitted (buffered)": "emitted",
    "dcp": "dcp-t1",
    "torch.load": "torch.save",
    "torch.load(mmap)": "torch.save",
    "safetensors": "safetensors",
}
PAGE_FLOATS = 1024  # float32 elements per 4 KiB page


def _touch(flat: dict) -> float:
    """Read one element of every 4 KiB page of every tensor (what a mapping loader has not read yet)."""
    return float(sum(t.reshape(-1)[::PAGE_FLOATS].double().sum() for t in flat.values()))


def _load(loader: str, directory: Path, module, target) -> dict:
    import torch

    if loader == "torch.load(mmap)":
        return ew._flat(torch.load(directory / "checkpoint.pt", map_location="cpu", weights_only=True, mmap=True))
    return ew._load(LOADERS[loader], directory, module, target)


def _reader_module(engine: str, queue_depth: int, buffer_bytes: int, load_streams: int):
    """make_writer/make_reader of the emitted writer with these options: it saves with O_DIRECT; it loads
    with its default, the O_DIRECT stream, or, for ``(buffered)``, buffered reads into the destination tensors."""
    from types import SimpleNamespace

    from ckpt_trace.writer import CheckpointReader, CheckpointWriter

    options = WriterOptions(
        queue_depth=queue_depth,
        buffer_bytes=buffer_bytes,
        load_direct_io="buffered" not in engine,
        load_streams=load_streams,
    )
    return SimpleNamespace(
        make_writer=lambda path: CheckpointWriter(path, options),
        make_reader=lambda path: CheckpointReader(path, options),
    )


def child(args) -> None:
    """One cold load in this fresh process; prints one JSON line."""
    warnings.filterwarnings("ignore")
    ew.MODEL = args.model
    module = _reader_module(args.engine, args.queue_depth, args.buffer_size, args.load_streams)
    if args.child == "save":
        state = ew._state()
        ew._save(args.engine, state, Path(args.dir), module)
        print(
            json.dumps(
                {
                    "fingerprint": ew._fingerprint(ew._flat(state)),
                    "bytes": sum(t.numel() * t.element_size() for t in ew._flat(state).values()),
                }
            )
        )
        return
    target = ew._load_target(LOADERS[args.engine])  # loads in place (DCP) fill a state allocated off the clock
    started = time.perf_counter()
    loaded = _load(args.engine, Path(args.dir), module, target)
    _touch(loaded)
    elapsed = time.perf_counter() - started
    print(json.dumps({"load_s": elapsed, "fingerprint": ew._fingerprint(loaded)}))


def _child(mode: str, engine: str, directory: Path, args) -> dict:
    return run_child(
        __file__,
        mode,
        engine,
        directory,
        "--model",
        args.model,
        "--queue-depth",
        str(args.queue_depth),
        "--buffer-size",
        str(args.buffer_size),
        "--load-streams",
        str(args.load_streams),
    )


def _fio_read(path: Path, size: int, direct: bool) -> float:
    """One sequential 4 MiB read of ``path`` by fio from a cold page cache: bytes/s."""
    drop_caches()
    engine = ["--ioengine=io_uring", "--direct=1", "--iodepth=32"] if direct else ["--ioengine=psync", "--direct=0"]
    done = subprocess.run(
        [
            "fio",
            "--name=restore",
            f"--filename={path}",
            "--rw=read",
            "--bs=4M",
            f"--size={size}",
            *engine,
            "--output-format=json",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(done.stdout)["jobs"][0]["read"]["bw_bytes"])


FIO_READS = {"fio O_DIRECT io_uring qd32": True, "fio buffered psync": False}


def _fio_layout(scratch: Path, size: int) -> Path | None:
    """A file of ``size`` bytes for fio's reads, written once with O_DIRECT and fsynced (None without fio)."""
    if shutil.which("fio") is None:
        return None
    path = scratch / "fio-restore.bin"
    subprocess.run(
        [
            "fio",
            "--name=layout",
            f"--filename={path}",
            "--rw=write",
            "--bs=4M",
            f"--size={size}",
            "--ioengine=io_uring",
            "--direct=1",
            "--iodepth=32",
            "--end_fsync=1",
            "--output-format=json",
        ],
        check=True,
        capture_output=True,
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--runs", type=int, default=5, help="cold loads per loader")
    parser.add_argument("--scratch", type=Path, default=None, help="directory on the storage to measure")
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--queue-depth", type=int, default=32, help="the emitted reader's queue depth")
    parser.add_argument(
        "--buffer-size", type=int, default=4 << 20, help="the emitted reader's O_DIRECT read size, bytes"
    )
    parser.add_argument(
        "--load-streams",
        type=int,
        default=WriterOptions.load_streams,
        help="the emitted reader's threads per file (buffered loads)",
    )
    args = parse_or_run_child(parser, child)
    if args is None:
        return
    loaders = [name for name in args.loaders.split(",") if name]
    unknown = [name for name in loaders if name not in LOADERS]
    if unknown:
        sys.exit(f"unknown loader {unknown[0]!r} (choose from {', '.join(LOADERS)})")
    ew.MODEL = args.model
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-restore-", dir=args.scratch))
    rows, saved = [], {}
    try:
        for fmt in sorted({LOADERS[name] for name in loaders}):
            saved[fmt] = _child("save", fmt, scratch / fmt, args)
        size = next(iter(saved.values()))["bytes"]
        fio_file = _fio_layout(scratch, size)
        times: dict[str, list[float]] = {name: [] for name in loaders}
        limits: dict[str, dict] = {}
        for _ in range(args.runs):  # rounds: each loader and each fio read once per round, so drift hits all alike
            for name in loaders:
                fmt = LOADERS[name]
                loaded = _child("load", name, scratch / fmt, args)
                if abs(loaded["fingerprint"] - saved[fmt]["fingerprint"]) > 1e-6 * max(
                    1.0, abs(saved[fmt]["fingerprint"])
                ):
                    raise RuntimeError(f"{name}: the loaded state differs from the saved one")
                times[name].append(loaded["load_s"])
            if fio_file is not None:
                for fio_name, direct in FIO_READS.items():
                    limits.setdefault(fio_name, {"samples": []})["samples"].append(_fio_read(fio_file, size, direct))
        for name in loaders:
            rows.append(
                {
                    "loader": name,
                    "format": LOADERS[name],
                    "runs_s": times[name],
                    "median_s": statistics.median(times[name]),
                }
            )
            print(f"{name}: median {statistics.median(times[name]):.2f} s of {args.runs}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for entry in limits.values():
        entry["median_bytes_per_s"] = statistics.median(entry["samples"])
        entry["best_bytes_per_s"] = max(entry["samples"])
    # Per round: fio's better read limit that round, and the fastest loader other than the emitted reader.
    round_fio = [max(entry["samples"][i] for entry in limits.values()) for i in range(args.runs)] if limits else []
    best_fio = statistics.median(round_fio) if round_fio else None
    base = next((r for r in rows if r["loader"] == "dcp"), rows[0])
    others = [r for r in rows if not r["loader"].startswith("emitted")]
    for r in rows:
        r["bytes_per_s"] = size / r["median_s"]
        r["vs_dcp"] = base["median_s"] / r["median_s"]
        r["of_best_fio"] = r["bytes_per_s"] / best_fio if best_fio else None
        r["paired_of_fio"] = (
            statistics.median(size / t / f for t, f in zip(r["runs_s"], round_fio)) if round_fio else None
        )
        if others and r["loader"].startswith("emitted"):
            r["paired_vs_best_other"] = statistics.median(
                min(o["runs_s"][i] for o in others) / r["runs_s"][i] for i in range(args.runs)
            )
    table = Table(title=f"Cold restore of {args.model} + Adam ({size / 1e9:.2f} GB), median of {args.runs} loads")
    for column in ("loader", "median", "range", "MB/s", "vs DCP", "of fio", "vs best other"):
        table.add_column(column, justify="left" if column == "loader" else "right")
    for r in rows:
        table.add_row(
            r["loader"],
            f"{r['median_s']:.2f} s",
            f"{min(r['runs_s']):.2f}-{max(r['runs_s']):.2f}",
            f"{r['bytes_per_s'] / 1e6:,.0f}",
            f"{r['vs_dcp']:.2f}x",
            f"{r['paired_of_fio']:.0%}" if r["paired_of_fio"] else "-",
            f"{r['paired_vs_best_other']:.2f}x" if r.get("paired_vs_best_other") else "",
        )
    for name, entry in limits.items():
        table.add_row(name, "", "", f"{entry['median_bytes_per_s'] / 1e6:,.0f}", "", "", "")
    Console(width=None if sys.stdout.isatty() else 100).print(table)
    result = {
        "benchmark": "restore",
        "model": args.model,
        "bytes": size,
        "free_page_reporting": Path("/sys/module/page_reporting").exists(),
        "emitted_reader": {
            "queue_depth": args.queue_depth,
            "buffer_bytes": args.buffer_size,
            "load_streams": args.load_streams,
        },
        "runs": args.runs,
        "fio": limits,
        "results": rows,
    }
    save_result("restore", result)


if __name__ == "__main__":
    main()
