"""Helpers shared by the benchmarks: the fio device limit, dropping the page cache, child processes, the results
file each writes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from ckpt_trace.iolayer.fio import fio_bytes_per_s

#: Where every benchmark writes its results (``save_result``).
RESULTS = Path(__file__).resolve().parent / "results"


def run_child(script: str, mode: str, engine: str, directory: Path, *extra: str) -> dict:
    """Run ``script`` as a measurement child (the hidden arguments ``parse_or_run_child`` reads, then ``extra``)
    from a cold page cache and return the JSON object on its last line of stdout. Raises RuntimeError with the
    end of its stderr when it fails."""
    drop_caches()
    proc = subprocess.run(
        [sys.executable, script, "--child", mode, "--engine", engine, "--dir", str(directory), *extra],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} {mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def storm_fio(directory: Path, writes: int, threads: int | None = None) -> list[str]:
    """The fio command line of a storm of small writes: ``writes`` blocks of 512 B written with pwrite(2)
    (``ioengine=psync``) under ``directory``, by one job in its own process, or by ``threads`` jobs as threads
    of one process sharing the writes out."""
    jobs = [] if threads is None else ["--thread", f"--numjobs={threads}"]
    size_bytes = writes // (threads or 1) * 512
    return [
        "fio",
        "--name=storm",
        f"--directory={directory}",
        "--ioengine=psync",
        "--rw=write",
        "--bs=512",
        *jobs,
        f"--size={size_bytes}",
        "--output=/dev/null",
    ]


def save_result(name: str, result: dict) -> Path:
    """Write ``result`` as indented JSON to ``RESULTS``/``name``.json (the folder made if missing), say where on
    stdout, and return the path. The machine is stamped in: ``host`` (node name) and ``kernel`` (release),
    uname(2), where ``result`` does not give them."""
    result.setdefault("host", os.uname().nodename)
    result.setdefault("kernel", os.uname().release)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {path}")
    return path


def best_fio(directory: Path, size: str, runs: int, rw: str = "write") -> tuple[float | None, list]:
    """(best, all samples) of ``runs`` fio runs: one sample on a shared disk varies."""
    samples = [fio_bytes_per_s(directory, size, rw) for _ in range(runs)]
    return (max(samples) if samples and None not in samples else None), samples


def drop_caches() -> bool:
    """sync, then drop the page cache, dentries and inodes (root only); returns whether it could."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def fsync_tree(path: Path) -> None:
    """fsync every file under ``path`` (or ``path`` itself when it is a file), then ``path``'s directory entry.

    Raises OSError from open(2)/fsync(2). The benchmarks call it inside their timed regions, so a save's
    figure includes its durability, as DCP's ``sync_files`` does.
    """
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()] + [path]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def parse_or_run_child(parser: argparse.ArgumentParser, child) -> argparse.Namespace | None:
    """Parse the command line with the hidden arguments of a measurement child (``--child save|load|repeated``,
    ``--engine``, ``--dir``, ``--module``): a child runs ``child(args)`` and gets None back; the parent gets
    its arguments, warned when not root (cold figures would then be warm)."""
    parser.add_argument("--child", choices=("save", "load", "repeated"), help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--module", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return None
    if os.geteuid() != 0:
        print("warning: not root, so the page cache cannot be dropped; cold figures are warm", file=sys.stderr)
    return args
