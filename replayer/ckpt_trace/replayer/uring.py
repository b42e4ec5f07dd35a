"""io_uring executor: the plan's reads and writes submitted through io_uring (``iolayer.ring``).

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

Memory-mapped I/O is replayed as the reads and writes it amounts to: a
mapping's file is opened (``mmap``) and closed (``munmap``), its pages read
and written back become requests at their file offsets, msync an fdatasync.

``direct=True`` (uring-direct) opens files with O_DIRECT and submits from
page-aligned buffers. An operation whose offset or size is not a multiple of
the file system's block size (statvfs f_bsize) cannot go through O_DIRECT;
it is written or read with a buffered pwrite/pread on a second descriptor of
the same file, after the descriptor's in-flight requests complete, and is
counted in ``unaligned_ops`` (the "buffered tail" choice of issue 3; the
kernel keeps the page cache coherent with direct I/O around it).

Every worker's ring is ``iolayer.ring.Ring`` with a latency sink: each
request's time from entering the kernel to the reaping of its completion.

Reference: io_uring_enter(2); open(2) on O_DIRECT alignment.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from array import array
from collections import Counter

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer import pattern
from ckpt_trace.iolayer.buffers import AlignedBuffer, pattern_buffer
from ckpt_trace.iolayer.ring import Ring
from ckpt_trace.iolayer.ring import probe as probe_ring

from .paths import TargetRoot
from .plan import DATA_KINDS, FD_KINDS, METADATA_KINDS, PATH_KINDS, PlanOp, WorkerPlan
from .posix import PosixExecutor, Progress, _op_error, _RunState

_HANDLE_BARRIERS = (FD_KINDS - DATA_KINDS) | {"munmap", "msync"}  # on one descriptor: drain its requests first


def io_uring_available(queue_depth: int = 2) -> str | None:
    """None when a ring of ``queue_depth`` works here, else why not (one line)."""
    return probe_ring(queue_depth)


class UringExecutor(PosixExecutor):
    """Executes plans with reads and writes through io_uring; see the module docstring.

    Call order as ``PosixExecutor``: ``prepare(plan)``, then ``run(plan, ...)``.
    """

    maps_files = False

    def __init__(self, root: TargetRoot, max_io_bytes: int, *, queue_depth: int = 32, direct: bool = False,
                 strategy: str | None = None) -> None:
        super().__init__(root, max_io_bytes)
        if queue_depth < 1:
            raise ReplayError("--queue-depth must be at least 1")
        self.queue_depth = queue_depth
        self.direct = direct
        self.strategy = strategy or ("uring-direct" if direct else "uring-buffered")
        self.block_bytes = os.statvfs(root.root).f_bsize if direct else 1  # the target's O_DIRECT alignment
        self._buffered_fds: dict[int, int] = {}
        self._lock = threading.Lock()

    def _open(self, op: PlanOp, state: _RunState) -> int:
        if self.direct and not (op.flags or 0) & os.O_DIRECTORY:
            op = dataclasses.replace(op, flags=(op.flags or 0) | os.O_DIRECT)
        return super()._open(op, state)

    def run(self, plan, *, timing: str = "asap", progress: Progress | None = None, durable: bool = False):
        try:
            return super().run(plan, timing=timing, progress=progress, durable=durable)
        finally:
            for fd in self._buffered_fds.values():
                os.close(fd)
            self._buffered_fds.clear()

    def _worker(self, worker: WorkerPlan, state: _RunState, timing: str, progress: Progress | None) -> None:
        size = self._buffer_bytes(worker)
        write_buf, read_buf = pattern_buffer(size), AlignedBuffer(size)
        ptrs = {"write": write_buf.ptr, "read": read_buf.ptr}
        views = {"write": write_buf.view(), "read": read_buf.view()}
        latencies = array("q")
        ring = Ring(self.queue_depth, latency_sink=latencies)
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
            self._finish_worker(ring, latencies, views, (write_buf, read_buf), state, totals)

    @staticmethod
    def _finish_worker(ring: Ring, latencies: array, views: dict, bufs: tuple, state: _RunState,
                       totals: Counter) -> None:
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
        state.add(latencies.tolist(), totals["write"], totals["read"], totals["data_ops"], totals["metadata_ops"],
                  totals["unaligned_ops"])

    def _barrier(self, op: PlanOp, ring: Ring) -> None:
        if op.kind in PATH_KINDS:
            ring.drain()
        elif op.kind in _HANDLE_BARRIERS:
            ring.drain(op.handle)
            if op.kind in ("close", "munmap") and op.release:
                with self._lock:
                    buffered = self._buffered_fds.pop(op.handle, None)
                if buffered is not None:
                    os.close(buffered)

    def _aligned(self, offset: int, size: int) -> bool:
        return offset % self.block_bytes == 0 and size % self.block_bytes == 0

    def _data(self, op: PlanOp, state: _RunState, ring: Ring, ptrs, views, totals: Counter, chunk_max: int) -> int:
        fd = state.fds[op.handle]
        size = op.size or 0
        if op.offset is None:
            ring.drain(op.handle)
            return self._synchronous(fd, op, views, ring)
        if op.kind == "read" and ring.by_key[op.handle]:
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
            ring.submit(op.kind, fd, ptr, chunk, op.offset + done, key=op.handle)
            done += chunk
        return size

    def _synchronous(self, fd: int, op: PlanOp, views: dict, ring: Ring) -> int:
        started = time.perf_counter_ns()
        moved = self._write(fd, op, views["write"]) if op.kind == "write" else self._read(fd, op, views["read"])
        ring.latency_sink.append(time.perf_counter_ns() - started)
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
