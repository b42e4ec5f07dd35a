"""Helpers shared by the benchmarks: the fio device limit and dropping the page cache."""

from __future__ import annotations

import os
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
