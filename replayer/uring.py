"""io_uring executor: the plan's reads and writes submitted through io_uring (pyuring 0.3.0).

Each worker thread owns one ring (``UringCtx`` is single-issuer) and keeps up
to ``queue_depth`` reads and writes in flight; metadata operations run as
syscalls. The trace's ordering constraints are kept by draining in-flight
requests first:

- an operation on a descriptor (fsync, close, lseek, ftruncate, dup...) waits
  for that descriptor's in-flight requests;
- an operation naming paths (open, rename, unlink, mkdir) and one that other
  workers wait on wait for all of the worker's in-flight requests;
- a read waits for in-flight writes on its descriptor; a write or read whose
  offset the trace did not know runs synchronously at the file position.

``direct=True`` (uring-direct) opens files with O_DIRECT and submits from
page-aligned buffers. An operation whose offset or size is not a multiple of
the file system's block size (statvfs f_bsize) cannot go through O_DIRECT;
it is written or read with a buffered pwrite/pread on a second descriptor of
the same file, after the descriptor's in-flight requests complete, and is
counted in ``unaligned_ops`` (the "buffered tail" choice of issue 3; the
kernel keeps the page cache coherent with direct I/O around it).

Reference: io_uring_enter(2), liburing io_uring_prep_write(3); open(2) on
O_DIRECT alignment.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import threading
import time
from collections import Counter

from ckpt_trace.errors import ReplayError

from . import pattern
from .paths import TargetRoot
from .plan import DATA_KINDS, FD_KINDS, METADATA_KINDS, PATH_KINDS, PlanOp, WorkerPlan
from .posix import PosixExecutor, Progress, _RunState, _op_error, pattern_buffer

_HANDLE_BARRIERS = FD_KINDS - DATA_KINDS  # operations on one descriptor: drain its requests first


def io_uring_available() -> str | None:
    """None when io_uring works here, else why not (module missing, kernel refusal)."""
    try:
        import pyuring
    except ImportError:
        return "the pyuring module is not installed"
    try:
        ctx = pyuring.UringCtx(entries=2)
    except Exception as err:  # pyuring raises its own UringError or OSError
        return f"io_uring_setup failed: {err}"
    ctx.close()
    return None


def _address(buf) -> int:
    """Address of a writable buffer; the temporary ctypes export is released at once, so the
    buffer can be closed later (only after every request using it completed)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class TimedRing:
    """One thread's ring: at most ``queue_depth`` requests in flight, counted per handle, each timed.

    ``latencies_ns`` collects, per request, the time from submission to the
    reaping of its completion (completions already posted are reaped after
    every submission, so late reaping does not inflate it). Call order, by
    the owning thread only: ``submit`` (waits for room itself), ``drain``
    (all, or one handle's requests) before an operation that needs them
    complete, ``close``. A failed or short write raises OSError from the
    call that reaps it. Used by the replayer's io_uring executor and by
    ``ckpt-trace bench``.
    """

    def __init__(self, queue_depth: int) -> None:
        import pyuring

        self.ctx = pyuring.UringCtx(entries=max(2, queue_depth))
        self.queue_depth = queue_depth
        self.pending: dict[int, tuple[int, int, int, str, int]] = {}  # tag -> (handle, started_ns, size, kind, offset)
        self.by_handle: Counter = Counter()
        self.next_tag = 1
        self.latencies_ns: list[int] = []

    def submit(self, kind: str, fd: int, handle: int, ptr: int, size: int, offset: int) -> None:
        while len(self.pending) >= self.queue_depth:
            self.reap_one()
        tag = self.next_tag
        self.next_tag += 1
        self.pending[tag] = (handle, time.perf_counter_ns(), size, kind, offset)
        self.by_handle[handle] += 1
        if kind == "write":
            self.ctx.write_async_ptr(fd, ptr, size, offset, user_data=tag)
        else:
            self.ctx.read_async_ptr(fd, ptr, size, offset, user_data=tag)
        self.reap_ready()

    def reap_ready(self) -> None:
        """Reap completions already posted, without waiting, so latencies are not inflated by late reaping."""
        while self.pending:
            completion = self.ctx.peek_completion()
            if completion is None:
                return
            self._complete(*completion)

    def reap_one(self) -> None:
        self._complete(*self.ctx.wait_completion())

    def _complete(self, tag: int, result: int) -> None:
        handle, started_ns, size, kind, offset = self.pending.pop(tag)
        self.by_handle[handle] -= 1
        self.latencies_ns.append(time.perf_counter_ns() - started_ns)
        if result < 0:
            raise OSError(-result, os.strerror(-result))
        if kind == "write" and result < size:
            raise OSError(errno.EIO, f"short io_uring write ({result} of {size} bytes at {offset})")

    def drain(self, handle: int | None = None) -> None:
        while self.pending and (handle is None or self.by_handle[handle] > 0):
            self.reap_one()

    def close(self) -> None:
        self.ctx.close()


class UringExecutor(PosixExecutor):
    """Executes plans with reads and writes through io_uring; see the module docstring.

    Call order as ``PosixExecutor``: ``prepare(plan)``, then ``run(plan, ...)``.
    """

    def __init__(self, root: TargetRoot, max_io_bytes: int, *, queue_depth: int = 32, direct: bool = False,
                 strategy: str | None = None) -> None:
        super().__init__(root, max_io_bytes)
        if queue_depth < 1:
            raise ReplayError("--queue-depth must be at least 1")
        self.queue_depth = queue_depth
        self.direct = direct
        self.strategy = strategy or ("uring-direct" if direct else "uring-buffered")
        self.block_bytes = os.statvfs(root.root).f_bsize if direct else 1
        self._buffered_fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def _open(self, op: PlanOp) -> int:
        if self.direct and not (op.flags or 0) & os.O_DIRECTORY:
            op = dataclasses.replace(op, flags=(op.flags or 0) | os.O_DIRECT)
        return super()._open(op)

    def run(self, plan, *, timing: str = "asap", progress: Progress | None = None, durable: bool = False):
        try:
            return super().run(plan, timing=timing, progress=progress, durable=durable)
        finally:
            for fd in self._buffered_fds.values():
                os.close(fd)
            self._buffered_fds.clear()

    def _worker(self, worker: WorkerPlan, state: _RunState, timing: str, progress: Progress | None) -> None:
        size = self._buffer_bytes(worker)
        write_buf, read_buf = pattern.periodic_buffer(size), pattern_buffer(size)
        ptrs = {"write": _address(write_buf), "read": _address(read_buf)}
        views = {"write": memoryview(write_buf), "read": memoryview(read_buf)}
        ring = TimedRing(self.queue_depth)
        totals = Counter()
        op = None
        try:
            for op in worker.ops:
                if not state.wait(op.deps):
                    return
                self._pace(op, state, timing)
                if op.kind in DATA_KINDS:
                    moved = self._data(op, state, ring, ptrs, views, totals, size)
                    totals[op.kind] += moved
                    totals["data_ops"] += 1
                    if progress is not None:
                        progress.advance(moved)
                else:
                    self._barrier(op, ring)
                    self._execute(op, state, views["write"], views["read"])
                    totals["metadata_ops"] += op.kind in METADATA_KINDS
                if op.seq in state.events:
                    ring.drain()
                state.done(op.seq)
            ring.drain()
        except OSError as err:
            state.fail(_op_error(op, err) if op is not None else ReplayError(str(err)))
        except ReplayError as err:
            state.fail(err)
        except KeyError:
            state.fail(ReplayError(f"replay failed at {op.kind} {op.path or ''}: descriptor was never opened"))
        finally:
            self._finish_worker(ring, views, (write_buf, read_buf), state, totals)

    @staticmethod
    def _finish_worker(ring: TimedRing, views: dict, bufs: tuple, state: _RunState, totals: Counter) -> None:
        """Reap what is still in flight (the kernel may still use the buffers), free them, add the totals."""
        try:
            ring.drain()
        except OSError as err:
            state.fail(ReplayError(f"io_uring request failed: {err.strerror}"))
        ring.close()
        for view in views.values():
            view.release()
        for buf in bufs:
            buf.close()
        state.add(ring.latencies_ns, totals["write"], totals["read"], totals["data_ops"], totals["metadata_ops"],
                  totals["unaligned_ops"])

    def _barrier(self, op: PlanOp, ring: TimedRing) -> None:
        if op.kind in PATH_KINDS:
            ring.drain()
        elif op.kind in _HANDLE_BARRIERS:
            ring.drain(op.handle)
            if op.kind == "close" and op.release:
                with self._lock:
                    buffered = self._buffered_fds.pop(op.handle, None)
                if buffered is not None:
                    os.close(buffered)

    def _aligned(self, offset: int, size: int) -> bool:
        return offset % self.block_bytes == 0 and size % self.block_bytes == 0

    def _data(self, op: PlanOp, state: _RunState, ring: TimedRing, ptrs, views, totals: Counter, chunk_max: int) -> int:
        fd = state.fds[op.handle]
        size = op.size or 0
        if op.offset is None:
            ring.drain(op.handle)
            return self._synchronous(fd, op, views, ring)
        if op.kind == "read" and ring.by_handle[op.handle]:
            ring.drain(op.handle)
        if self.direct and not self._aligned(op.offset, size):
            totals["unaligned_ops"] += 1
            ring.drain(op.handle)
            return self._synchronous(self._buffered_fd(op, state), op, views, ring)
        done = 0
        while done < size:
            chunk = min(chunk_max, size - done)
            ptr = ptrs[op.kind]
            if op.kind == "write":
                base = op.pattern_offset if op.pattern_offset is not None else op.offset
                ptr += pattern.start(base + done, op.pattern_key)
            ring.submit(op.kind, fd, op.handle, ptr, chunk, op.offset + done)
            done += chunk
        return size

    def _synchronous(self, fd: int, op: PlanOp, views: dict, ring: TimedRing) -> int:
        started = time.perf_counter_ns()
        moved = self._write(fd, op, views["write"]) if op.kind == "write" else self._read(fd, op, views["read"])
        ring.latencies_ns.append(time.perf_counter_ns() - started)
        return moved

    def _buffered_fd(self, op: PlanOp, state: _RunState) -> int:
        """A second, buffered descriptor of the handle's file, for operations O_DIRECT cannot take."""
        with self._lock:
            fd = self._buffered_fds.get(op.handle)
            if fd is None:
                path = os.readlink(f"/proc/self/fd/{state.fds[op.handle]}")
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
                self._buffered_fds[op.handle] = fd
            return fd
