"""Helpers shared by the benchmarks: the fio device limit, dropping the page cache, child processes."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ckpt_trace.iolayer.fio import fio_bytes_per_s


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


def parse_or_run_child(parser: argparse.ArgumentParser, child) -> argparse.Namespace | None:
    """Parse the command line with the hidden arguments of a measurement child (``--child save|load``,
    ``--engine``, ``--dir``, ``--module``): a child runs ``child(args)`` and gets None back; the parent gets
    its arguments, warned when not root (cold figures would then be warm)."""
    parser.add_argument("--child", choices=("save", "load"), help=argparse.SUPPRESS)
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
