"""``mmap``: every recorded read and write moved through a shared file mapping instead of a system call.

A write of ``size`` bytes at offset ``at`` grows the file to ``at + size``
with ftruncate(2) where it is shorter (never shrinks it: the check and the
growth are one step under a lock of the data path), maps the pages covering
the range ``MAP_SHARED`` (mmap(2), the I/O layer's ``FileMapping``), copies
the file's replay data in (the same bytes every strategy writes, so
``--verify`` holds) and unmaps. A read maps the range ``PROT_READ`` and
copies it out, up to the end of the file as read(2) would. An operation at
the file position (write(2), read(2)) uses and then advances the position;
on an O_APPEND descriptor a write lands at the end of the file, as the
kernel puts one there (pwrite(2), BUGS). Files are opened read-write where
the trace opened them write-only (a shared writable mapping needs a
descriptor open for reading, mmap(2) EACCES), and without O_DIRECT (a
mapping goes through the page cache). The dirty pages are the page cache's:
a recorded fsync(2)/fdatasync(2), a recorded msync(2) of a recorded mapping
and ``durable``'s fsync at the end write them back (on Linux a shared file
mapping's pages are the file's page-cache pages, so fsync covers them;
msync(2) NOTES). Recorded mappings replay as they do under posix.

Replayed only when named (not part of ``all``). Two processes of a
distributed replay growing one file at once could undo each other's growth
(ftruncate is not an atomic "grow to at least"); within one process the
lock makes it so.

The engine (``replayer.engine``) runs everything else as it does for posix;
this module's ``MmapPath`` is the ``datapath.DataPath`` it is given.

Reference: mmap(2), msync(2), ftruncate(2); fio's ``mmap`` ioengine does
the same for its jobs.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import threading

from ckpt_trace import config
from ckpt_trace.iolayer.buffers import PAGE_BYTES
from ckpt_trace.iolayer.mapping import MAP_SHARED, PROT_READ, PROT_WRITE, FileMapping

from ..datapath import DATA_PATHS, DataPathDefaults, WorkerIO
from ..engine import Executor
from ..optable import PlanOp
from ..paths import TargetRoot
from . import Strategy


class MmapPath(DataPathDefaults):
    """Reads and writes through shared file mappings; see the module docstring. Every operation runs alone
    (no runs for the C loop, no recorded io_uring queues: their requests go through mappings too)."""

    name = "mmap"
    path_code: int | None = DATA_PATHS.index("mapped")
    maps_files = True  # recorded mappings replay as posix replays them
    queues_as_recorded = False
    kernel_copies = True  # by their call, as posix; a side without its partner through a mapping
    separates_reads_and_writes = False

    def __init__(self) -> None:
        self._grow = threading.Lock()

    def open_flags(self, flags: int) -> int:
        """Read-write where the trace opened write-only (a shared writable mapping needs read access, mmap(2)
        EACCES); without O_DIRECT (a mapping goes through the page cache)."""
        if flags & os.O_ACCMODE == os.O_WRONLY:
            flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
        return flags & ~os.O_DIRECT

    def transfer(self, io: WorkerIO, op: PlanOp, row: int) -> int:
        """Move ``op``'s bytes through a mapping of the pages they cover; return the bytes moved."""
        fd = io.fd(op.handle)
        size = op.size or 0
        offset = op.offset
        at_position = offset is None
        at = os.lseek(fd, 0, os.SEEK_CUR) if offset is None else offset
        # the data's offset in the file's pattern: where posix would take it (its offset, else the position)
        base = op.pattern_offset if op.pattern_offset is not None else at
        write = op.kind == "write"
        if write and size > 0:
            with self._grow:
                length = os.fstat(fd).st_size
                if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
                    at = length
                if length < at + size:
                    os.ftruncate(fd, at + size)
        moved = 0
        if size > 0:
            start = at - at % PAGE_BYTES
            mapping = FileMapping(fd, at + size - start, start, PROT_READ | (PROT_WRITE if write else 0), MAP_SHARED)
            try:
                moved = io.through_mapping(dataclasses.replace(op, offset=at, pattern_offset=base), mapping)
            finally:
                mapping.close()
        if at_position:
            os.lseek(fd, at + moved, os.SEEK_SET)
        return moved


def _executor(root: TargetRoot, queue_depth: int) -> Executor:
    del queue_depth  # no ring
    return Executor(root, config.REPLAY_MAX_IO_BYTES, MmapPath())


STRATEGY = Strategy(
    name="mmap",
    summary="reads and writes through shared file mappings (ftruncate, mmap, copy)",
    executor=_executor,
    in_all=False,
    only_when_named="copies through mappings, for comparison",
    order=50,
    named_path="mapped",
    named_path_members=("mapped",),
    fio_args=("--ioengine=mmap", "--bs=4k", "--fallocate=none"),
)
