"""The io_uring data path: the plan's reads and writes submitted through io_uring (``iolayer.ring``).

A ``datapath.DataPath`` for the engine (``replayer.engine``), which cuts a
worker's operations into runs of reads and writes at known offsets; each run is one array of requests
``Ring.run`` keeps ``queue_depth`` deep in the C loop of the I/O layer, and
completes before the worker's next operation, so the trace's ordering holds
without per-request bookkeeping: an fsync, a close, a rename or an operation
another worker waits for comes after every request before it has completed.
A run does not mix reads and writes (a read may depend on a write before
it). Reads and writes whose offset the trace did not know run synchronously
at the file position.

``direct=True`` (uring-direct, aggregated) opens files with O_DIRECT (and
without O_APPEND: every request names its offset) and submits from
page-aligned buffers. A request whose offset, size or buffer address is not
a multiple of the file system's block size (statvfs f_bsize) cannot go
through O_DIRECT; it stays an io_uring request, in the same run, on a second,
buffered descriptor of the same file (io_uring buffered: the strategy's
interface, not a system call), and its operation is counted in
``unaligned_ops`` (the kernel keeps the page cache coherent with direct I/O
around it: a direct request writes back and invalidates the cached pages it
covers). Reads and writes whose offset the trace did not know are submitted
at the descriptor's position (lseek(2) SEEK_CUR), which is then advanced
past the bytes moved. Every result says which path carried what
(``ReplayResult.data_paths``).

Memory-mapped I/O is replayed as the reads and writes it amounts to (the
path does not ``maps_files``; in-kernel copies likewise): a
mapping's file is opened (``mmap``) and closed (``munmap``), its pages read
and written back become requests at their file offsets, msync an fdatasync.

Reference: io_uring_enter(2); open(2) on O_DIRECT alignment.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.iolayer.ring import probe as probe_ring

from .datapath import DataPathDefaults, Submitted, WorkerIO
from .engine import Executor
from .optable import READ, WRITE, PlanOp
from .options import DEFAULT_QUEUE_DEPTH
from .paths import TargetRoot
from .plan import ReplayPlan

#: The key of a worker's own ring (``WorkerIO.ring``): recorded queues are numbered from 0.
_OWN_RING = -1


def io_uring_available(queue_depth: int = 2) -> str | None:
    """None when a ring of ``queue_depth`` works here, else why not (one line)."""
    return probe_ring(queue_depth)


def uring_executor(root: TargetRoot, max_io_bytes: int, *, queue_depth: int, direct: bool, strategy: str) -> Executor:
    """The engine with an io_uring data path for ``strategy`` (the io_uring strategies' factory,
    ``replayer.strategies``). Raises ReplayError when io_uring is unavailable here or ``queue_depth`` < 1."""
    problem = io_uring_available()
    if problem:
        raise ReplayError(f"strategy {strategy} needs io_uring: {problem}")
    return Executor(root, max_io_bytes, UringPath(root, queue_depth=queue_depth, direct=direct, name=strategy))


class UringPath(DataPathDefaults):
    """Reads and writes through a ring of each worker, ``queue_depth`` deep; with ``direct``, O_DIRECT
    descriptors (what O_DIRECT cannot take on a second, buffered descriptor). See the module docstring.
    Raises ReplayError for a ``queue_depth`` under 1."""

    maps_files = False
    queues_as_recorded = False
    kernel_copies = False  # in-kernel copies as a read and a write, through this path
    separates_reads_and_writes = True
    path_code: int | None = None  # never used: every transfer is counted as its requests

    def __init__(
        self,
        root: TargetRoot,
        *,
        queue_depth: int = DEFAULT_QUEUE_DEPTH,
        direct: bool = False,
        name: str | None = None,
    ) -> None:
        if queue_depth < 1:
            raise ReplayError("{option} must be at least 1", option="queue_depth")
        self.root = root
        self.queue_depth = queue_depth
        self.direct = direct
        self.name = name or ("uring-direct" if direct else "uring-buffered")
        self.block_bytes = os.fstatvfs(root.fd).f_bsize if direct else 1  # the target's O_DIRECT alignment
        self._buffered_fds: dict[int, int] = {}
        self._paths: dict[int, tuple[str, int]] = {}  # handle -> (target-relative path, access mode) of direct opens
        self._lock = threading.Lock()

    def batchable(self, plan: ReplayPlan, rows: slice) -> np.ndarray:
        """Every read and write at a known offset."""
        t = plan.ops
        kind = t.kind[rows]
        return ((kind == READ) | (kind == WRITE)) & (t.offset[rows] >= 0)

    def open_flags(self, flags: int) -> int:
        return self._direct_flags(flags) if self.direct else flags

    def setfl_flags(self, flags: int) -> int:
        return self._direct_flags(flags) if self.direct else flags  # F_SETFL must not clear O_DIRECT

    @staticmethod
    def _direct_flags(flags: int) -> int:
        """Open and F_SETFL flags under O_DIRECT: O_DIRECT set, O_APPEND cleared. Every read and write this
        path submits names its offset, and on an O_APPEND file the kernel would ignore it (pwrite(2),
        BUGS), append requests in flight together in completion order, and refuse an O_DIRECT write at an
        unaligned end of file (EINVAL)."""
        return (flags | os.O_DIRECT) & ~os.O_APPEND

    def opened(self, handle: int, path: str, flags: int) -> None:
        if self.direct:
            with self._lock:
                self._paths[handle] = (path, flags & os.O_ACCMODE)

    def released(self, handle: int) -> None:
        with self._lock:
            buffered = self._buffered_fds.pop(handle, None)
            self._paths.pop(handle, None)
        if buffered is not None:
            os.close(buffered)

    def finish(self) -> list[str]:
        with self._lock:
            for fd in self._buffered_fds.values():
                os.close(fd)
            self._buffered_fds.clear()
            self._paths.clear()
        return []

    def submit(self, io: WorkerIO, requests: np.ndarray, rows: np.ndarray, queue: int) -> Submitted:
        """Through this worker's ring; under O_DIRECT, the requests it cannot take (offset, size or buffer
        address off the block size) on the file's buffered descriptor, their operations counted unaligned."""
        if self.direct:
            block = self.block_bytes
            off = requests["off"].astype(np.int64)
            # addr: a generated write's content offset (its slot is page-aligned), else the buffer's address
            bad = (off % block != 0) | (requests["len"] % block != 0) | (requests["addr"] % block != 0)
            if bad.any():
                handles = io.plan.ops.handle[rows[bad]]
                unique, inverse = np.unique(handles, return_inverse=True)
                buffered = np.array([self._buffered_fd_of(io, int(h)) for h in unique.tolist()], np.int32)
                requests["fd"][bad] = buffered[inverse]
                for _ in range(len(np.unique(rows[bad]))):
                    io.count_unaligned()
        return Submitted(*io.issue(requests, io.ring(_OWN_RING, self.queue_depth), _OWN_RING), via_uring=True)

    def transfer(self, io: WorkerIO, op: PlanOp, row: int) -> None:
        """One read or write as requests through the ring; at the file position (recorded without an
        offset) from the descriptor's position, which is then moved past the bytes moved."""
        position = 0
        if op.offset is None:  # at the file position: known here, so the request can name it
            position = os.lseek(io.fd(op.handle), 0, os.SEEK_CUR)
            requests = self._requests_at(io, row, position)
            results, latencies = io.issue(requests, io.ring(_OWN_RING, self.queue_depth), _OWN_RING)
        else:
            requests, _ = io.requests(np.array([row]))
            results, latencies, _ = self.submit(io, requests, np.full(len(requests), row), -1)
        failure = rings.first_failure(requests, results)
        if failure is not None:
            raise failure[1]
        moved = io.complete(
            requests, results, latencies, np.full(len(requests), row), via_uring=True, data_ops=1, metadata_ops=0
        )
        if op.offset is None:
            os.lseek(io.fd(op.handle), position + moved, os.SEEK_SET)
        return None

    def _requests_at(self, io: WorkerIO, row: int, position: int) -> np.ndarray:
        """The requests of a read or write the trace recorded at the file position, at ``position``."""
        t = io.plan.ops
        size = max(int(t.size[row]), 0)
        chunk = io.buffer_bytes
        pieces = max(1, -(-size // chunk))
        done = np.arange(pieces, dtype=np.int64) * chunk
        write = t.kind[row] == WRITE
        requests = rings.batch(pieces)
        requests["opcode"] = rings.OP_WRITE if write else rings.OP_READ
        requests["fd"] = io.fd(int(t.handle[row]))
        requests["addr"] = position + done if write else io.read_buf.ptr  # a write's: its content offset
        # a write's user_data is its content key, a read's its recorded operation's size (``issue``)
        requests["user_data"] = int(t.pattern_key[row]) if write else int(t.op_sizes(slice(row, row + 1))[0])
        requests["len"] = np.minimum(chunk, size - done)
        requests["off"] = position + done
        if self.direct:
            block = self.block_bytes
            bad = ((position + done) % block != 0) | (requests["len"] % block != 0)
            if bad.any():
                requests["fd"][bad] = self._buffered_fd_of(io, int(t.handle[row]))
                io.count_unaligned()
        return requests

    def _buffered_fd_of(self, io: WorkerIO, handle: int) -> int:
        """A second, buffered descriptor of the handle's file, for requests O_DIRECT cannot take."""
        with self._lock:
            fd = self._buffered_fds.get(handle)
            if fd is None:
                fd = self._reopen(handle, io.fd(handle))
                self._buffered_fds[handle] = fd
            return fd

    def _reopen(self, handle: int, main_fd: int) -> int:
        """The handle's file opened again without O_DIRECT: by the path it was opened at, beneath the target (so
        a tracer recording the replay sees an open of that file, and the requests on it: bcc ignores
        descriptors opened through /proc) when that path still names the same inode, else through the
        descriptor's magic link (the inode, never another file)."""
        known = self._paths.get(handle)
        if known is not None:
            path, mode = known
            try:
                fd = self.root.open(path, mode | os.O_CLOEXEC)
            except OSError:
                fd = -1
            if fd >= 0:
                mine, main = os.fstat(fd), os.fstat(main_fd)
                if (mine.st_dev, mine.st_ino) == (main.st_dev, main.st_ino):
                    return fd
                os.close(fd)
        return os.open(f"/proc/self/fd/{main_fd}", os.O_RDWR | os.O_CLOEXEC)
