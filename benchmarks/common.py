"""Helpers shared by the benchmarks: the fio device limit and dropping the page cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path


def fio_bytes_per_s(directory: Path, size: str, rw: str = "write") -> float | None:
    """Sequential O_DIRECT io_uring bandwidth (bytes/s) of fio, 4 MiB blocks, queue depth 32, or None without fio.

    ``rw="write"`` ends with an fsync (end_fsync=1); ``rw="read"`` lays the
    file out first, then reads it (fio(1), --output-format=json).
    """
    if shutil.which("fio") is None:
        return None
    cmd = ["fio", "--name=limit", f"--directory={directory}", f"--rw={rw}", "--bs=4M", "--ioengine=io_uring",
           "--direct=1", "--iodepth=32", f"--size={size}", "--output-format=json"]
    if rw == "write":
        cmd.append("--end_fsync=1")
    report = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    for path in directory.glob("limit*"):
        path.unlink()
    return float(report["jobs"][0][rw]["bw_bytes"])


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
