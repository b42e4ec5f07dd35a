"""POSIX executor: runs a ``ReplayPlan`` with plain syscalls, one thread per recorded thread.

Writes carry the pattern (``iolayer.pattern``) from a page-aligned pattern
buffer, so files opened with O_DIRECT are written as the application wrote
them; where the target's file system refuses O_DIRECT the file is opened
without it and the result notes it.
Writes and reads with a known offset use pwrite(2)/preadv(2) at that
offset; those whose offset the trace did not know use write(2)/readv(2)
at the current file position. A vectored call replays as one buffer of
its total size (the trace keeps iovec counts, not each iovec's length).

Requests replay as requests: the io_uring and libaio rows of one recorded
queue go, asynchronously, through one ring of this worker
(``iolayer.ring.Ring``) with at most the queue's recorded depth in flight
(libaio requests too: io_uring carries the same reads, writes and syncs);
before any other operation of the worker, its rings are drained, so
the recorded order between a program's system calls and its requests holds.
Where io_uring is unavailable they run as system calls, and the result says so.

Mapped I/O replays as mapped I/O: ``mmap`` maps the file as recorded
(``iolayer.mapping.FileMapping``), pages read through it are copied out
(faulting them in), pages written back are written into it with the
pattern (dirtying them), ``msync`` and ``munmap`` run where recorded.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import threading
import time
from typing import Protocol

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats.vocabulary import AT_REMOVEDIR
from ckpt_trace.iolayer import files, pattern
from ckpt_trace.iolayer.buffers import PAGE_BYTES, AlignedBuffer, pattern_buffer
from ckpt_trace.iolayer.mapping import MAP_SHARED, PROT_WRITE, FileMapping
from ckpt_trace.iolayer.ring import Ring, RingUnavailable
from ckpt_trace.stats import percentiles_ns

from .pack import INDEX_PATH
from .paths import TargetRoot
from .plan import DATA_KINDS, METADATA_KINDS, PlanOp, ReplayPlan, WorkerPlan
from .results import ReplayResult

O_NOFOLLOW = os.O_NOFOLLOW


class Progress(Protocol):
    """Receives progress: ``start(total_bytes, label)`` once per run, then ``advance(bytes)`` from worker threads."""

    def start(self, total_bytes: int, label: str) -> None: ...

    def advance(self, moved_bytes: int) -> None: ...


def _op_error(op: PlanOp, err: OSError) -> ReplayError:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return ReplayError(f"target file system is full ({op.kind} of {op.path}); replay stopped")
    return ReplayError(f"replay failed at {op.kind} {op.path or ''}: {err.strerror or err}".replace("  ", " "))


class PosixExecutor:
    """Executes plans with POSIX syscalls under one target directory.

    Call order: ``prepare(plan)`` creates the directories and pre-existing
    files outside the timed region, then ``run(plan, ...)`` replays and
    returns a ``ReplayResult``. Called by ``replayer.replay``.
    """

    strategy = "posix"
    maps_files = True  # mapped I/O through mappings (others replay it as reads and writes)

    def __init__(self, root: TargetRoot, max_io_bytes: int) -> None:
        self.root = root
        self.max_io_bytes = max_io_bytes

    # -- before the clock ----------------------------------------------
    def prepare(self, plan: ReplayPlan) -> None:
        try:
            for rel in plan.precreate_dirs:
                path = self.root.resolve(rel)
                if not os.path.isdir(path):
                    os.mkdir(path, 0o755)
            for rel, size in plan.precreate_files:
                self._precreate(self.root.resolve(rel), size, plan.pattern_keys.get(rel, 0))
        except OSError as err:
            raise ReplayError(f"cannot prepare the target: {err.strerror or err} ({err.filename})") from None

    def _precreate(self, path: str, size: int, key: int) -> None:
        buf = pattern_buffer(min(size, self.max_io_bytes) or PAGE_BYTES)
        view = buf.view()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_NOFOLLOW, 0o644)
        try:
            done = 0
            while done < size:
                first = pattern.start(done, key)
                done += os.write(fd, view[first:first + min(buf.size_bytes - pattern.PERIOD, size - done)])
        finally:
            os.close(fd)
            view.release()
            buf.close()

    # -- the timed run -------------------------------------------------
    def run(self, plan: ReplayPlan, *, timing: str = "asap", progress: Progress | None = None,
            durable: bool = False) -> ReplayResult:
        """Replay ``plan``; ``durable`` fsyncs every file the plan leaves behind before the clock stops."""
        state = _RunState(plan)
        threads = [threading.Thread(target=self._thread_main, args=(w, state, timing, progress), daemon=True)
                   for w in plan.workers]
        if progress is not None:
            progress.start(sum(op.size or 0 for w in plan.workers for op in w.ops if op.kind in DATA_KINDS), self.strategy)
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        state.start_ns = time.monotonic_ns()
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except KeyboardInterrupt:  # Ctrl-C: every worker stops before its next operation, then we go
            state.fail(ReplayError("interrupted"))
            for thread in threads:
                thread.join()
            self._close_all(state)
            raise
        if plan.pack_index and state.error is None:
            self._write_pack_index(plan, durable)
        if durable and state.error is None:
            self._fsync_all(plan)
        elapsed_s = (time.monotonic_ns() - state.start_ns) / 1e9
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        self._close_all(state)
        if state.error is not None:
            raise state.error
        return ReplayResult(
            strategy=self.strategy, elapsed_s=elapsed_s, bytes_written=state.bytes_written,
            bytes_read=state.bytes_read, data_ops=state.data_ops, metadata_ops=state.metadata_ops,
            latency_ns=percentiles_ns(state.latencies_ns), cpu_user_s=usage1.ru_utime - usage0.ru_utime,
            cpu_sys_s=usage1.ru_stime - usage0.ru_stime, skipped_ops=dict(plan.skipped_ops),
            unaligned_ops=state.unaligned_ops, metadata_ops_saved=plan.metadata_ops_saved,
            notes=sorted(state.notes),
        )

    @staticmethod
    def _close_all(state: _RunState) -> None:
        for mapping in state.mappings.values():
            mapping.close()
        state.mappings.clear()
        for fd in state.fds.values():
            os.close(fd)
        state.fds.clear()

    def _thread_main(self, worker: WorkerPlan, state: _RunState, timing: str, progress: Progress | None) -> None:
        """A worker thread: any failure, in setup too (a buffer, a ring), fails the run with one line."""
        try:
            self._worker(worker, state, timing, progress)
        except ReplayError as err:
            state.fail(err)
        except Exception as err:  # noqa: BLE001 - a worker must never die silently with a partial result
            detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            state.fail(ReplayError(f"a replay worker failed ({type(err).__name__}: {detail})"))

    def _write_pack_index(self, plan: ReplayPlan, durable: bool) -> None:
        """Write the --pack-files index (final path -> pack, offset, size) inside the timed region."""
        path = self.root.resolve(INDEX_PATH)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_NOFOLLOW, 0o644)
        try:
            os.write(fd, json.dumps({k: dict(v) for k, v in plan.pack_index.items()}, indent=1).encode())
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _fsync_all(self, plan: ReplayPlan) -> None:
        for rel in plan.checks.expected_sizes:
            fd = os.open(self.root.resolve(rel), os.O_RDONLY | O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _buffer_bytes(self, worker: WorkerPlan) -> int:
        """Size of a worker's I/O buffers: its largest operation, at least a page, at most max_io_bytes."""
        largest = max((op.size or 0 for op in worker.ops if op.kind in DATA_KINDS), default=0)
        return min(max(largest, PAGE_BYTES), self.max_io_bytes)

    @staticmethod
    def _pace(op: PlanOp, state: _RunState, timing: str) -> None:
        """With ``--timing original``, wait until the operation's recorded start (a failure or Ctrl-C ends
        the wait at once)."""
        if timing == "original":
            delay_ns = state.start_ns + op.ts_ns - time.monotonic_ns()
            if delay_ns > 0:
                state.stopped.wait(delay_ns / 1e9)

    def _worker(self, worker: WorkerPlan, state: _RunState, timing: str, progress: Progress | None) -> None:
        size = self._buffer_bytes(worker)
        buf, read_buf = pattern_buffer(size), AlignedBuffer(size)
        view, read_view = buf.view(), read_buf.view()
        latencies, written, read = [], 0, 0
        data_ops = metadata_ops = 0
        queues = _Queues(state, latencies)
        op = None
        try:
            for op in worker.ops:
                if not state.wait(op.deps):
                    return
                self._pace(op, state, timing)
                started = time.perf_counter_ns()
                if op.queue is not None and queues.take(op, buf, read_buf, size):
                    moved = (op.size or 0) if op.kind in DATA_KINDS else 0
                else:
                    queues.drain()
                    moved = self._execute(op, state, view, read_view, buf, read_buf)
                    if op.kind in DATA_KINDS:
                        latencies.append(time.perf_counter_ns() - started)
                if op.kind in DATA_KINDS:
                    data_ops += 1
                    if op.kind == "write":
                        written += moved
                    else:
                        read += moved
                    if progress is not None:
                        progress.advance(moved)
                elif op.kind in METADATA_KINDS:
                    metadata_ops += 1
                if op.seq in state.events:
                    queues.drain()
                state.done(op.seq)
            queues.drain()
        except OSError as err:
            state.fail(_op_error(op, err) if op is not None else ReplayError(str(err)))
        except ReplayError as err:
            state.fail(err)
        except KeyError:
            state.fail(ReplayError(f"replay failed at {op.kind} {op.path or ''}: descriptor was never opened"))
        finally:
            queues.close()
            view.release()
            read_view.release()
            buf.close()
            read_buf.close()
            state.add(latencies, written, read, data_ops, metadata_ops)

    def _execute(self, op: PlanOp, state: _RunState, write_view: memoryview, read_view: memoryview,
                 write_buf: AlignedBuffer | None = None, read_buf: AlignedBuffer | None = None) -> int:
        """Run one operation; ``write_view`` is a periodic pattern buffer, ``read_view`` a scratch buffer
        (``write_buf``/``read_buf`` the buffers they view, for mapped I/O)."""
        kind = op.kind
        if op.mapped and self.maps_files and op.handle in state.mappings:
            return self._mapped(op, state.mappings[op.handle], write_buf, read_buf)
        if kind == "write":
            return self._write(state.fds[op.handle], op, write_view)
        if kind == "read":
            return self._read(state.fds[op.handle], op, read_view)
        if kind in ("mmap", "munmap", "msync"):
            self._mapping(op, state)
        elif kind == "open":
            state.fds[op.handle] = self._open(op, state)
        elif kind == "close":
            if op.release:
                os.close(state.fds.pop(op.handle))
        elif kind == "dup":
            state.fds[op.handle] = os.dup(state.fds[op.source_handle])
        else:
            self._metadata(op, state)
        return 0

    def _mapping(self, op: PlanOp, state: _RunState) -> None:
        """mmap (open the file, map it), msync, munmap (unmap, close); without ``maps_files``, only the
        open and close, and msync as fdatasync."""
        if op.kind == "mmap":
            prot = op.prot or 0
            writable = prot & PROT_WRITE and (op.flags or MAP_SHARED) & MAP_SHARED
            fd = files.open_file(self.root.resolve(op.path), os.O_RDWR if writable else os.O_RDONLY).fd
            state.fds[op.handle] = fd
            if self.maps_files:
                state.mappings[op.handle] = FileMapping(fd, op.size or 0, op.offset or 0, prot, op.flags or 0)
        elif op.kind == "msync":
            mapping = state.mappings.get(op.handle)
            if mapping is not None:
                mapping.sync(op.offset or 0, op.size or 0, op.flags or 0)
            else:
                os.fdatasync(state.fds[op.handle])
        else:
            mapping = state.mappings.pop(op.handle, None)
            if mapping is not None:
                mapping.close()
            os.close(state.fds.pop(op.handle))

    def _mapped(self, op: PlanOp, mapping: FileMapping, write_buf: AlignedBuffer, read_buf: AlignedBuffer) -> int:
        """Pages written (the file's pattern copied in) or read (copied out) through ``mapping``."""
        size, done = op.size or 0, 0
        chunk_max = write_buf.size_bytes - pattern.PERIOD if op.kind == "write" else read_buf.size_bytes
        while done < size:
            chunk = min(chunk_max, size - done)
            offset = op.offset + done
            if op.kind == "write":
                base = op.pattern_offset if op.pattern_offset is not None else op.offset
                moved = mapping.touch(offset, chunk, source=write_buf.ptr + pattern.start(base + done, op.pattern_key))
            else:
                moved = mapping.touch(offset, chunk, sink=read_buf.ptr)
            if moved < chunk:
                return done + moved
            done += chunk
        return done

    def _metadata(self, op: PlanOp, state: _RunState) -> None:
        kind = op.kind
        fd = state.fds.get(op.handle) if op.handle is not None else None
        if kind == "lseek" and op.offset is not None:
            os.lseek(fd, op.offset, os.SEEK_SET)
        elif kind == "fsync":
            os.fsync(fd)
        elif kind == "fdatasync":
            os.fdatasync(fd)
        elif kind == "sync_file_range":
            files.sync_file_range(fd, op.offset or 0, op.size or 0, op.flags or 0)
        elif kind == "ftruncate":
            os.ftruncate(fd, op.size)
        elif kind == "fallocate":
            files.fallocate(fd, op.offset, op.size, op.flags or 0)
        elif kind == "fcntl" and op.flags is not None:
            fcntl.fcntl(fd, fcntl.F_SETFL, op.flags)
        elif kind == "rename":
            os.rename(self.root.resolve(op.path), self.root.resolve(op.new_path))
            self.root.forget(op.path)
        elif kind == "unlink":
            target = self.root.resolve(op.path)
            os.rmdir(target) if (op.flags or 0) & AT_REMOVEDIR else os.unlink(target)
            self.root.forget(op.path)
        elif kind == "mkdir":
            try:
                os.mkdir(self.root.resolve(op.path), 0o755)
            except FileExistsError:
                pass

    def _open(self, op: PlanOp, state: _RunState) -> int:
        """Open as recorded (host flags); where the target refuses O_DIRECT, without it, noted once."""
        flags = op.flags or 0
        opened = files.open_file(self.root.resolve(op.path), flags & ~os.O_DIRECT, direct=bool(flags & os.O_DIRECT))
        if opened.fallback:
            state.note(f"{opened.fallback}: files opened with O_DIRECT were opened buffered")
        return opened.fd

    def _write(self, fd: int, op: PlanOp, view: memoryview) -> int:
        """Write ``op.size`` bytes of the file's pattern from the periodic buffer ``view``."""
        size, done = op.size or 0, 0
        chunk_max = len(view) - pattern.PERIOD
        while done < size:
            base = op.pattern_offset if op.pattern_offset is not None else op.offset
            first = pattern.start(base + done, op.pattern_key) if base is not None else 0
            chunk = view[first:first + min(chunk_max, size - done)]
            if op.offset is None:
                n = os.write(fd, chunk)
            else:
                n = os.pwrite(fd, chunk, op.offset + done)
            if n <= 0:
                break
            done += n
        return done

    def _read(self, fd: int, op: PlanOp, view: memoryview) -> int:
        size, done = op.size or 0, 0
        while done < size:
            chunk = view[: min(len(view), size - done)]
            n = os.readv(fd, [chunk]) if op.offset is None else os.preadv(fd, [chunk], op.offset + done)
            if n <= 0:
                break
            done += n
        return done


class _RunState:
    """Shared state of one run: OS fds by handle, completion events, totals, the first error."""

    def __init__(self, plan: ReplayPlan) -> None:
        self.fds: dict[int, int] = {}
        self.mappings: dict[int, FileMapping] = {}
        self.depths = plan.queue_depths
        self.events = {seq: threading.Event() for seq in plan.awaited}
        self.lock = threading.Lock()
        self.latencies_ns: list[int] = []
        self.bytes_written = self.bytes_read = self.data_ops = self.metadata_ops = self.unaligned_ops = 0
        self.error: ReplayError | None = None
        self.stopped = threading.Event()
        self.start_ns = 0
        self.notes: set[str] = set()

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.add(text)

    def wait(self, deps: tuple[int, ...]) -> bool:
        for seq in deps:
            self.events[seq].wait()
        return self.error is None

    def done(self, seq: int) -> None:
        event = self.events.get(seq)
        if event is not None:
            event.set()

    def fail(self, error: ReplayError) -> None:
        with self.lock:
            if self.error is None:
                self.error = error
        self.stopped.set()
        for event in self.events.values():
            event.set()

    def add(self, latencies: list[int], written: int, read: int, data_ops: int, metadata_ops: int,
            unaligned_ops: int = 0) -> None:
        with self.lock:
            self.latencies_ns.extend(latencies)
            self.bytes_written += written
            self.bytes_read += read
            self.data_ops += data_ops
            self.metadata_ops += metadata_ops
            self.unaligned_ops += unaligned_ops


class _Queues:
    """One worker's rings, one per recorded io_uring ring or libaio context, each as deep as recorded.

    ``take`` submits a request and returns True, or returns False when the
    request must run as a system call (an unknown offset, io_uring
    unavailable); ``drain`` waits for every request in flight; ``close`` after
    the worker's last operation.
    """

    def __init__(self, state: _RunState, latencies: list) -> None:
        self.state, self.latencies = state, latencies
        self.rings: dict[int, Ring | None] = {}

    def _ring(self, queue: int) -> Ring | None:
        if queue not in self.rings:
            try:
                self.rings[queue] = Ring(self.state.depths.get(queue, 1), latency_sink=self.latencies)
            except (RingUnavailable, OSError) as err:
                self.state.note(f"io_uring unavailable ({err.strerror or err}): requests replayed as system calls")
                self.rings[queue] = None
        return self.rings[queue]

    def take(self, op: PlanOp, write_buf: AlignedBuffer, read_buf: AlignedBuffer, chunk_max: int) -> bool:
        if op.kind in DATA_KINDS and op.offset is None or op.kind not in DATA_KINDS | {"fsync", "fdatasync"}:
            return False
        ring = self._ring(op.queue)
        if ring is None:
            return False
        fd = self.state.fds[op.handle]
        if op.kind not in DATA_KINDS:
            ring.drain(op.handle)  # a sync request covers the writes completed before it
            ring.submit(op.kind, fd, 0, 0, 0, key=op.handle)
            return True
        size, done = op.size or 0, 0
        while done < size:
            chunk = min(chunk_max, size - done)
            if op.kind == "write":
                base = op.pattern_offset if op.pattern_offset is not None else op.offset
                ptr = write_buf.ptr + pattern.start(base + done, op.pattern_key)
            else:
                ptr = read_buf.ptr
            ring.submit(op.kind, fd, ptr, chunk, op.offset + done, key=op.handle)
            done += chunk
        return True

    def drain(self) -> None:
        for ring in self.rings.values():
            if ring is not None and ring.pending:
                ring.drain()

    def close(self) -> None:
        for ring in self.rings.values():
            if ring is not None:
                ring.close()
        self.rings.clear()
