"""io_uring executor: the plan's reads and writes submitted through io_uring (``iolayer.ring``).

The same engine as ``PosixExecutor``: a worker's operations are cut into
runs of reads and writes at known offsets; each run is one array of requests
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

Memory-mapped I/O is replayed as the reads and writes it amounts to: a
mapping's file is opened (``mmap``) and closed (``munmap``), its pages read
and written back become requests at their file offsets, msync an fdatasync.

Reference: io_uring_enter(2); open(2) on O_DIRECT alignment.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import TypeVar

import numpy as np

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.iolayer.ring import Ring
from ckpt_trace.iolayer.ring import probe as probe_ring

from .optable import READ, WRITE, PlanOp
from .options import DEFAULT_QUEUE_DEPTH
from .paths import TargetRoot
from .plan import DATA_KINDS, ReplayPlan
from .posix import PosixExecutor, _RunState, _WorkerContext

_T = TypeVar("_T")


def _required(value: _T | None, what: str, op: PlanOp) -> _T:
    """``value`` (an op's handle or path), which the planner always sets for the ops this executor takes it
    from; ReplayError naming the op if it is missing (a plan built by hand or damaged)."""
    if value is None:
        raise ReplayError(f"plan op {op.seq} ({op.kind}) has no {what}")
    return value


def io_uring_available(queue_depth: int = 2) -> str | None:
    """None when a ring of ``queue_depth`` works here, else why not (one line)."""
    return probe_ring(queue_depth)


def uring_executor(
    root: TargetRoot, max_io_bytes: int, *, queue_depth: int, direct: bool, strategy: str
) -> UringExecutor:
    """A ``UringExecutor`` for ``strategy`` (the io_uring strategies' factory, ``replayer.strategies``).
    Raises ReplayError when io_uring is unavailable here."""
    problem = io_uring_available()
    if problem:
        raise ReplayError(f"strategy {strategy} needs io_uring: {problem}")
    return UringExecutor(root, max_io_bytes, queue_depth=queue_depth, direct=direct, strategy=strategy)


class UringExecutor(PosixExecutor):
    """Executes plans with reads and writes through io_uring; see the module docstring.

    Call order as ``PosixExecutor``: ``prepare(plan)``, then ``run(plan, ...)``.
    """

    maps_files = False
    queues_as_recorded = False
    kernel_copies = False  # in-kernel copies as a read and a write, through this strategy's path
    batch_key_kind = True

    def __init__(
        self,
        root: TargetRoot,
        max_io_bytes: int,
        *,
        queue_depth: int = DEFAULT_QUEUE_DEPTH,
        direct: bool = False,
        strategy: str | None = None,
    ) -> None:
        super().__init__(root, max_io_bytes)
        if queue_depth < 1:
            raise ReplayError("{option} must be at least 1", option="queue_depth")
        self.queue_depth = queue_depth
        self.direct = direct
        self.strategy = strategy or ("uring-direct" if direct else "uring-buffered")
        self.block_bytes = os.fstatvfs(root.fd).f_bsize if direct else 1  # the target's O_DIRECT alignment
        self._buffered_fds: dict[int, int] = {}
        self._paths: dict[int, tuple[str, int]] = {}  # handle -> (target-relative path, access mode) of direct opens
        self._lock = threading.Lock()

    def batchable(self, plan: ReplayPlan, rows: slice) -> np.ndarray:
        t = plan.ops
        kind = t.kind[rows]
        return ((kind == READ) | (kind == WRITE)) & (t.offset[rows] >= 0)

    def requests(self, ctx: _WorkerContext, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``PosixExecutor.requests``; under O_DIRECT, the requests it cannot take (offset, size or buffer
        address off the block size) on the file's buffered descriptor, their operations counted unaligned."""
        requests, owner = super().requests(ctx, data)
        if self.direct:
            block = self.block_bytes
            off = requests["off"].astype(np.int64)
            # addr: a generated write's content offset (its slot is page-aligned), else the buffer's address
            bad = (off % block != 0) | (requests["len"] % block != 0) | (requests["addr"] % block != 0)
            if bad.any():
                handles = ctx.plan.ops.handle[data[owner[bad]]]
                unique, inverse = np.unique(handles, return_inverse=True)
                buffered = np.array([self._buffered_fd_of(int(h), ctx.state) for h in unique.tolist()], np.int32)
                requests["fd"][bad] = buffered[inverse]
                for _ in range(len(np.unique(owner[bad]))):
                    ctx.state.add_unaligned()
        return requests, owner

    def _open(self, op: PlanOp, state: _RunState) -> int:
        if self.direct and not (op.flags or 0) & os.O_DIRECTORY:
            op = dataclasses.replace(op, flags=self._direct_flags(op.flags or 0))
            fd = super()._open(op, state)
            handle, path = _required(op.handle, "handle", op), _required(op.path, "path", op)
            with self._lock:
                self._paths[handle] = (path, (op.flags or 0) & os.O_ACCMODE)
            return fd
        return super()._open(op, state)

    def _metadata(self, op: PlanOp, state: _RunState) -> None:
        if self.direct and op.kind == "fcntl" and op.flags is not None:  # F_SETFL must not clear O_DIRECT
            op = dataclasses.replace(op, flags=self._direct_flags(op.flags))
        super()._metadata(op, state)

    @staticmethod
    def _direct_flags(flags: int) -> int:
        """Open and F_SETFL flags under O_DIRECT: O_DIRECT set, O_APPEND cleared. Every read and write this
        executor submits names its offset, and on an O_APPEND file the kernel would ignore it (pwrite(2),
        BUGS), append requests in flight together in completion order, and refuse an O_DIRECT write at an
        unaligned end of file (EINVAL)."""
        return (flags | os.O_DIRECT) & ~os.O_APPEND

    def run(self, plan, *, timing: str = "asap", progress=None, durable: bool = False, signals=None):
        try:
            return super().run(plan, timing=timing, progress=progress, durable=durable, signals=signals)
        finally:
            for fd in self._buffered_fds.values():
                os.close(fd)
            self._buffered_fds.clear()
            self._paths.clear()

    def _submit(self, ctx: _WorkerContext, requests: np.ndarray, queue: int):
        ring = ctx.rings.get(-1)
        if ring is None:
            ring = ctx.rings[-1] = Ring(self.queue_depth)
        ctx.via_uring = True
        return ctx.issue(requests, ring, -1)

    def _one(self, ctx: _WorkerContext, op: PlanOp, row: int) -> None:
        if op.kind not in DATA_KINDS:
            if op.kind in ("close", "munmap") and op.release and op.handle is not None:
                with self._lock:
                    buffered = self._buffered_fds.pop(op.handle, None)
                    self._paths.pop(op.handle, None)
                if buffered is not None:
                    os.close(buffered)
            super()._one(ctx, op, row)
            return
        position, handle = 0, -1
        if op.offset is None:  # at the file position: known here, so the request can name it
            handle = _required(op.handle, "handle", op)
            position = os.lseek(ctx.state.fds[handle], 0, os.SEEK_CUR)
            requests, owner = self._requests_at(ctx, row, position)
        else:
            requests, owner = self.requests(ctx, np.array([row]))
        results, latencies = self._submit(ctx, requests, -1)
        failure = rings.first_failure(requests, results)
        if failure is not None:
            raise failure[1]
        moved_each = np.maximum(results, 0)
        moved = int(moved_each.sum())
        is_write = requests["opcode"] == rings.OP_WRITE
        ctx.state.add_paths(
            True,
            requests["fd"],
            moved_each,
            np.r_[True, owner[1:] != owner[:-1]],
            np.full(len(requests), ctx.plan.ops.path[row]),
            is_write,
        )
        if op.offset is None:
            os.lseek(ctx.state.fds[handle], position + moved, os.SEEK_SET)
        ctx.state.add_run(latencies, moved if op.kind == "write" else 0, 0 if op.kind == "write" else moved, 1, 0)
        if ctx.progress is not None:
            ctx.progress.advance(moved)

    def _requests_at(self, ctx: _WorkerContext, row: int, position: int) -> tuple[np.ndarray, np.ndarray]:
        """The requests of a read or write the trace recorded at the file position, at ``position``."""
        t = ctx.plan.ops
        size = max(int(t.size[row]), 0)
        chunk = ctx.chunk
        pieces = max(1, -(-size // chunk))
        done = np.arange(pieces, dtype=np.int64) * chunk
        write = t.kind[row] == WRITE
        requests = rings.batch(pieces)
        requests["opcode"] = rings.OP_WRITE if write else rings.OP_READ
        requests["fd"] = ctx.state.fds[int(t.handle[row])]
        requests["addr"] = position + done if write else ctx.read_buf.ptr  # a write's: its content offset
        requests["user_data"] = int(t.pattern_key[row]) if write else 0
        requests["len"] = np.minimum(chunk, size - done)
        requests["off"] = position + done
        owner = np.zeros(pieces, np.int64)
        if self.direct:
            block = self.block_bytes
            bad = ((position + done) % block != 0) | (requests["len"] % block != 0)
            if bad.any():
                requests["fd"][bad] = self._buffered_fd_of(int(t.handle[row]), ctx.state)
                ctx.state.add_unaligned()
        return requests, owner

    def _buffered_fd_of(self, handle: int, state: _RunState) -> int:
        """A second, buffered descriptor of the handle's file, for requests O_DIRECT cannot take."""
        with self._lock:
            fd = self._buffered_fds.get(handle)
            if fd is None:
                fd = self._reopen(handle, state.fds[handle])
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
