"""The posix data path: reads and writes by POSIX system calls, as recorded (``datapath.DataPath``).

Writes and reads with a known offset use pwrite(2)/pread(2) at that offset;
those whose offset the trace did not know use write(2)/read(2) at the
current file position. A vectorised call replays as one buffer of its total
size (the trace keeps iovec counts, not each iovec's length). Runs of reads
and writes at known offsets (``replayer.engine``) go to the I/O layer's C
loop (``iolayer.ring.pio_run``: pwrite/pread one after another), and the
requests of a recorded io_uring or libaio queue through a ring of its
recorded depth (``WorkerIO.queue_ring``; system calls where io_uring is
unavailable). posix replays everything else as recorded too: mappings
through mappings, in-kernel copies by their call (``maps_files``,
``queues_as_recorded``, ``kernel_copies``), files opened with the recorded
flags.
"""

from __future__ import annotations

import os

import numpy as np

from ckpt_trace.iolayer import pattern

from .datapath import DataPathDefaults, Submitted, WorkerIO
from .engine import Executor
from .optable import NONE, READ, WRITE, PlanOp
from .paths import TargetRoot
from .plan import ReplayPlan


class PosixPath(DataPathDefaults):
    """The posix strategy's data path; see the module docstring."""

    name = "posix"
    maps_files = True
    queues_as_recorded = True
    kernel_copies = True
    separates_reads_and_writes = False
    path_code: int | None = None  # a system call, buffered or O_DIRECT by its descriptor

    def batchable(self, plan: ReplayPlan, rows: slice) -> np.ndarray:
        """Reads and writes at known offsets, not through a mapping, not an in-kernel copy."""
        t = plan.ops
        kind = t.kind[rows]
        return ((kind == READ) | (kind == WRITE)) & (t.offset[rows] >= 0) & ~t.mapped[rows] & (t.kcopy[rows] == 0)

    def submit(self, io: WorkerIO, requests: np.ndarray, rows: np.ndarray, queue: int) -> Submitted:
        """The recorded queue's ring at its depth, or (no queue, io_uring unavailable) the C loop."""
        if queue != NONE:
            ring = io.queue_ring(queue)
            if ring is not None:
                return Submitted(*io.issue(requests, ring, queue), via_uring=True)
        return Submitted(*io.issue(requests), via_uring=False)

    def transfer(self, io: WorkerIO, op: PlanOp, row: int) -> int:
        fd = io.fd(op.handle)
        return write(io, fd, op) if op.kind == "write" else read(io, fd, op)


def write(io: WorkerIO, fd: int, op: PlanOp) -> int:
    """Write ``op.size`` bytes of the file's replay data to ``fd`` by pwrite(2) (write(2) where the offset is
    unknown): from the bytes made before the clock (``io.data``) where they cover the write, else generated
    into ``io.write_buf`` piece by piece just before each call (at the file position: the data of the offset
    where the position is). Returns the bytes written; raises OSError."""
    size, done = op.size or 0, 0
    view = io.write_view
    chunk_max = len(view)
    while done < size:
        base = op.pattern_offset if op.pattern_offset is not None else op.offset
        if base is None:
            try:
                base = os.lseek(fd, 0, os.SEEK_CUR) - done
            except OSError:  # not seekable: no offset to take the data of
                base = 0
        n = min(chunk_max, size - done)
        chunk = io.data.view(op.pattern_key, base + done, n) if io.data is not None else None
        if chunk is None:
            pattern.fill(io.write_buf.ptr, n, op.pattern_key, base + done)
            chunk = view[:n]
        try:
            n = os.write(fd, chunk) if op.offset is None else os.pwrite(fd, chunk, op.offset + done)
        finally:
            chunk.release()
        if n <= 0:
            break
        done += n
    return done


def read(io: WorkerIO, fd: int, op: PlanOp) -> int:
    """Read ``op.size`` bytes of ``fd`` into ``io.read_buf`` by preadv(2) (readv(2) where the offset is unknown),
    up to the end of the file, each piece where ``io.read_target`` puts it (by the recorded operation's size,
    ``op.op_size``). Returns the bytes read; raises
    OSError."""
    size, done = op.size or 0, 0
    op_bytes = size if op.op_size is None else op.op_size
    while done < size:
        n = min(io.buffer_bytes, size - done)
        chunk = io.read_target(n, op_bytes)
        n = os.readv(fd, [chunk]) if op.offset is None else os.preadv(fd, [chunk], op.offset + done)
        if n <= 0:
            break
        done += n
    return done


def posix_executor(root: TargetRoot, max_io_bytes: int) -> Executor:
    """The engine with the posix data path (the posix strategy's executor)."""
    return Executor(root, max_io_bytes, PosixPath())


__all__ = ["PosixPath", "posix_executor", "read", "write"]
