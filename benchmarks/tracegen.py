"""A synthetic trace of any size for scale tests: N rows from R ranks, written as a valid trace in bounded memory.

Each rank is one process (pid 100000 + rank, its ``RANK`` recorded) saving
its shard the way torch.distributed.checkpoint's FileSystemWriter does:
open ``/scratch/ckpt/__R_0.distcp`` (O_WRONLY|O_CREAT|O_TRUNC), ``write(2)``
at the file position, fsync, close; rank 0 then writes ``.metadata.tmp``
and renames it to ``.metadata``. The ranks run side by side: row i of every
rank starts in the same microsecond, so rows are in start-time order as the
format requires. Request sizes (``--mix``):

- ``dcp``: the mix of a real DCP save of GPT-2 + Adam (pickled headers of
  64 B-1 KiB for a third of the calls, tensors of 4 KiB to 16 MiB, log-uniform);
- ``4k``: every write 4 KiB (the engine-rate benchmark);
- ``small``: 64 B to 256 KiB, log-uniform (the small-operation case of
  arXiv 2512.24511).

    python benchmarks/tracegen.py OUT.arrow --rows 10000000 --ranks 1024 [--mix dcp] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from ckpt_trace.formats import CkptTraceError, TraceWriter
from ckpt_trace.formats.vocabulary import open_flag

ROOT = "/scratch/ckpt"
STEP_NS = 1000
O_CREATE = (
    open_flag("O_WRONLY", "x86_64")
    | open_flag("O_CREAT", "x86_64")
    | open_flag("O_TRUNC", "x86_64")
    | open_flag("O_CLOEXEC", "x86_64")
)
FD = 7


def _sizes(rng: np.random.Generator, count: int, mix: str) -> np.ndarray:
    if mix == "4k":
        return np.full(count, 4096, np.int64)
    if mix == "small":
        return np.exp(rng.uniform(np.log(64), np.log(256 << 10), count)).astype(np.int64)
    small = rng.random(count) < 1 / 3
    sizes = np.exp(rng.uniform(np.log(4096), np.log(16 << 20), count)).astype(np.int64)
    sizes[small] = np.exp(rng.uniform(np.log(64), np.log(1024), int(small.sum()))).astype(np.int64)
    return sizes


def _round_block(
    first: int, last: int, ranks: int, per_rank: int, rng, mix: str, positions: np.ndarray, rank_base: int = 0
) -> pa.Table:
    """Rows ``first``..``last``-1 of every rank, round by round (row i of rank 0, of rank 1, ...); ranks
    (pids, files) numbered from ``rank_base``."""
    rounds = np.arange(first, last, dtype=np.int64)
    i = np.repeat(rounds, ranks)
    rank = np.tile(np.arange(ranks, dtype=np.int32), len(rounds))
    n = len(i)
    ts = i * STEP_NS + rank.astype(np.int64) * max(1, STEP_NS // max(ranks, 1))
    is_open, is_fsync, is_close = i == 0, i == per_rank - 2, i == per_rank - 1
    is_write = ~(is_open | is_fsync | is_close)
    sizes = np.zeros(n, np.int64)
    sizes[is_write] = _sizes(rng, int(is_write.sum()), mix)
    offsets = np.full(n, -1, np.int64)
    write_rank = rank[is_write]
    write_sizes = sizes[is_write]
    # Each rank's writes follow one another: its position, then its running sum within this block.
    order = np.argsort(write_rank, kind="stable")
    sorted_sizes = write_sizes[order]
    sorted_rank = write_rank[order]
    running = np.cumsum(sorted_sizes) - sorted_sizes
    starts = np.searchsorted(sorted_rank, np.arange(ranks))
    running -= np.concatenate([[0], np.cumsum(sorted_sizes)])[starts][sorted_rank]
    block_offsets = np.empty_like(running)
    block_offsets[order] = running + positions[sorted_rank]
    offsets[is_write] = block_offsets
    np.add.at(positions, write_rank, write_sizes)
    op = np.where(is_open, "open", np.where(is_fsync, "fsync", np.where(is_close, "close", "write")))
    syscall = np.where(is_open, "openat", op)
    pid = 100000 + rank_base + rank
    paths = np.array([f"{ROOT}/__{r + rank_base}_0.distcp" for r in range(ranks)], dtype=object)[rank]
    ret = np.where(is_open, FD, np.where(is_write, sizes, 0))
    return pa.table(
        {
            "ts_ns": ts,
            "dur_ns": np.where(is_write, 2000 + sizes // 1000, 1500).astype(np.int64),
            "pid": pid,
            "tid": pid,
            "comm": pa.array(["python"] * n),
            "rank": rank + rank_base,
            "syscall": pa.array(syscall.astype(str)),
            "op": pa.array(op.astype(str)),
            "fd": np.full(n, FD, np.int32),
            "path": pa.array(paths, pa.string()),
            "new_path": pa.nulls(n, pa.string()),
            "offset": pa.array(offsets, mask=offsets < 0),
            "offset_source": pa.array(np.where(is_write, "position", None).tolist(), pa.string()),
            "size": pa.array(np.where(is_write, sizes, -1), mask=~is_write),
            "ret": ret.astype(np.int64),
            "flags": pa.array(np.where(is_open, O_CREATE, -1), pa.int64(), mask=~is_open),
            "iov_count": pa.nulls(n, pa.int32()),
        }
    )


def _metadata_rows(ts: int) -> pa.Table:
    """Rank 0 commits: .metadata.tmp written, fsynced, closed, renamed to .metadata."""
    tmp, final = f"{ROOT}/.metadata.tmp", f"{ROOT}/.metadata"
    rows = [
        ("openat", "open", None, None, O_CREATE, FD),
        ("write", "write", 0, 30000, None, 30000),
        ("fsync", "fsync", None, None, None, 0),
        ("close", "close", None, None, None, 0),
        ("rename", "rename", None, None, None, 0),
    ]
    n = len(rows)
    return pa.table(
        {
            "ts_ns": [ts + k * STEP_NS for k in range(n)],
            "dur_ns": [1500] * n,
            "pid": [100000] * n,
            "tid": [100000] * n,
            "comm": ["python"] * n,
            "rank": [0] * n,
            "syscall": [r[0] for r in rows],
            "op": [r[1] for r in rows],
            "fd": [None if r[0] == "rename" else FD for r in rows],
            "path": [tmp] * n,
            "new_path": [None] * 4 + [final],
            "offset": [r[2] for r in rows],
            "offset_source": [None, "position", None, None, None],
            "size": [r[3] for r in rows],
            "ret": [r[5] for r in rows],
            "flags": [r[4] for r in rows],
            "iov_count": pa.nulls(n, pa.int32()),
        },
        schema=pa.schema(
            [
                (name, typ)
                for name, typ in (
                    ("ts_ns", pa.int64()),
                    ("dur_ns", pa.int64()),
                    ("pid", pa.int32()),
                    ("tid", pa.int32()),
                    ("comm", pa.string()),
                    ("rank", pa.int32()),
                    ("syscall", pa.string()),
                    ("op", pa.string()),
                    ("fd", pa.int32()),
                    ("path", pa.string()),
                    ("new_path", pa.string()),
                    ("offset", pa.int64()),
                    ("offset_source", pa.string()),
                    ("size", pa.int64()),
                    ("ret", pa.int64()),
                    ("flags", pa.int64()),
                    ("iov_count", pa.int32()),
                )
            ]
        ),
    )


def generate(
    path: str | os.PathLike,
    rows: int,
    ranks: int,
    *,
    mix: str = "dcp",
    seed: int = 0,
    batch_rows: int = 1 << 20,
    overwrite: bool = False,
    rank_base: int = 0,
    node: dict | None = None,
) -> Path:
    """Write a synthetic trace of about ``rows`` rows (a multiple of ``ranks``, plus rank 0's commit) to
    ``path``; returns it. Memory stays near ``batch_rows`` rows whatever ``rows`` is. ``rank_base``: the
    first rank (one node's trace of a bigger job: only the job's rank 0 commits); ``node``: metadata keys
    of a node's recording (``host``, ``boot_id``, ``clock``) for ``merge``."""
    per_rank = max(4, rows // ranks)
    rng = np.random.default_rng(seed)
    positions = np.zeros(ranks, np.int64)
    writer = TraceWriter(path, overwrite=overwrite)
    rounds_per_batch = max(1, batch_rows // ranks)
    try:
        for first in range(0, per_rank, rounds_per_batch):
            writer.write(
                _round_block(
                    first, min(per_rank, first + rounds_per_batch), ranks, per_rank, rng, mix, positions, rank_base
                )
            )
        if rank_base == 0:
            writer.write(_metadata_rows(per_rank * STEP_NS + STEP_NS))
    except BaseException:
        writer.abort()
        raise
    return writer.close(
        {
            "creator": "ckpt-trace tracegen",
            "creator_version": "0",
            "host": "synthetic",
            "kernel": "synthetic",
            "command": ["benchmarks/tracegen.py", str(rows), str(ranks), mix],
            "backend": "synthetic",
            "start_wall_time_ns": time.time_ns(),
            "filesystems": {"/scratch": {"type": "ext4", "block_size": 4096}},
            "lost_events": 0,
            "arch": "x86_64",
            **(node or {}),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--mix", choices=("dcp", "4k", "small"), default="dcp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="overwrite OUTPUT")
    args = parser.parse_args()
    started = time.monotonic()
    try:
        out = generate(args.output, args.rows, args.ranks, mix=args.mix, seed=args.seed, overwrite=args.force)
    except CkptTraceError as err:  # (an existing OUTPUT, a full disk): one line, no traceback
        sys.exit(f"tracegen: {err}")
    size = out.stat().st_size
    print(f"tracegen: wrote {out} ({size:,} bytes) in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
