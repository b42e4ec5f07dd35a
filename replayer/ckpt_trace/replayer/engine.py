"""The replay engine: runs a ``ReplayPlan``, one thread per recorded thread, moving data by a ``DataPath``.

``Executor(root, max_io_bytes, path)`` is the one executor of every
strategy: it makes the target, opens and closes descriptors by handle, waits
for dependencies, paces ``--timing original``, runs metadata operations,
recorded mappings, in-kernel copies and host<->device copies, and counts
everything into a ``ReplayResult``. How the bytes of reads and writes reach
the file is its data path's (``replayer.datapath``: posix's system calls in
``replayer.posix``, io_uring's in ``replayer.uring``, ...); the engine never
branches on a strategy, only on what its data path says it does
(``maps_files``, ``queues_as_recorded``, ``kernel_copies``).

Writes carry the replay data (``iolayer.pattern.fill``: incompressible,
unique per 4 KiB block of each file), made before the clock in page-aligned
buffers per file (``replayer.data``) or, where memory does not allow,
generated just before each write is issued (in the I/O layer's C loop, into
a slot per write in flight). Where the target's file system refuses
O_DIRECT a file is opened without it and the result notes it.

How it keeps up with the applications it replays: a worker's operations are
cut into *runs*, maximal stretches of reads and writes at known offsets
(lseeks in between are done on the way; they move only the position, which
those calls do not use) that no other worker waits in the middle of. A run
is one array of requests handed to the data path (``DataPath.submit``;
posix's: the I/O layer's C loop ``pio_run``, pwrite/pread one after another,
as recorded), with one Python step per run
rather than per operation; everything else runs one operation at a time.
Run boundaries: an operation other workers wait for ends a run (they are
signalled after it), an operation that waits for others starts one.

Requests replay as requests (where the data path ``queues_as_recorded``):
the io_uring and libaio rows of one recorded queue go, as runs of their own, through a ring of this worker
(``iolayer.ring.Ring.run``) with at most the queue's recorded depth in
flight (libaio requests too: io_uring carries the same reads, writes and
syncs). Where io_uring is unavailable they run as system calls, and the
result says so.

Mapped I/O replays as mapped I/O (where the data path ``maps_files``): ``mmap`` maps the file as recorded
(``iolayer.mapping.FileMapping``), pages read through it are copied out
(faulting them in), pages written back are written into it with the
pattern (dirtying them), ``msync`` and ``munmap`` run where recorded.

Where reads land (``read_memory``): ``reused``, one buffer per worker, resident after its first
use; ``fresh``, each read at the next unused bytes of the worker's read arena (``FRESH_READ_BYTES``), released
(madvise(2) ``MADV_DONTNEED``) when full, so every read faults in the pages it fills, inside the call, as a read
into newly mapped memory does (700 MB read warm took 2.3x as long into fresh pages as into one reused buffer on
the 2-vCPU VM); ``malloc`` (the default), fresh for the reads of recorded operations of at least
``MALLOC_MMAP_THRESHOLD_BYTES`` (``OpTable.op_sizes``: a piece a strategy re-planned counts as the recorded
read it belongs to) and reused for the others, as glibc's malloc(3) serves a loader's buffers (torch's CPU tensors, Python's bytes): a
block that large is always a new mapping, a smaller one mostly memory freed before (mallopt(3),
``M_MMAP_THRESHOLD``: its dynamic threshold rises to the largest freed mapping, at most 32 MiB on 64-bit
systems). The trace does not say which memory a recorded read filled; ``benchmarks/cache_load.py`` compares
the modes' read times with the recorded ones (docs/verdicts.md).
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import resource
import threading
import time
from typing import Protocol, TypeVar

import numpy as np

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import is_any_of
from ckpt_trace.iolayer import files, gpu, pattern
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.iolayer.buffers import PAGE_BYTES, AlignedBuffer
from ckpt_trace.iolayer.mapping import MAP_SHARED, PROT_WRITE, FileMapping
from ckpt_trace.iolayer.ring import Ring, RingUnavailable, Slots
from ckpt_trace.stats import LatencyHistogram

from . import entries
from .data import PREGENERATED, Pregenerated
from .datapath import DATA_PATHS, DataPath
from .optable import KCOPIES, KIND, NO_FLAGS, NONE, READ, WRITE, PlanOp
from .pack import INDEX_PATH
from .paths import TargetRoot
from .plan import DATA_KINDS, METADATA_KINDS, ReplayPlan, WorkerPlan
from .results import ReplayResult
from .runstate import RunState, Signals

_LSEEK = KIND["lseek"]
_COPY = KIND["copy"]
_METADATA_CODES = np.array([KIND[k] for k in METADATA_KINDS if k in KIND], np.int8)
_ALL = np.iinfo(np.uint64).max  # REQUEST_DTYPE "off" meaning the file position
_KCOPY_PATH = DATA_PATHS.index("in_kernel_copy")
F_SETPIPE_SZ = 1031  # fcntl(2)
_MAPPED = 4


class Progress(Protocol):
    """Receives progress: ``start(total_bytes, label)`` once per run, then ``advance(bytes)`` from worker threads."""

    def start(self, total_bytes: int, label: str) -> None: ...

    def advance(self, moved_bytes: int) -> None: ...


_T = TypeVar("_T")


def _known(handle: int | None) -> int:
    """A plan operation's handle, to look its descriptor up. The planner gives one to every operation on a
    descriptor; None raises the KeyError a lookup of it raised, which the worker reports as a descriptor
    never opened."""
    if handle is None:
        raise KeyError(handle)
    return handle


def _given(value: _T | None, op: PlanOp, field: str) -> _T:
    """``value``, ``op``'s ``field``, which the planner sets for every operation of that kind (a path for an
    open, a size for an ftruncate, ...). Raises ReplayError when it is missing."""
    if value is None:
        raise ReplayError(f"operation {op.seq} ({op.kind}) of the plan has no {field}")
    return value


def _op_error(op: PlanOp, err: OSError) -> ReplayError:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return ReplayError(f"target file system is full ({op.kind} of {op.path}); replay stopped")
    if err.errno in (errno.EMFILE, errno.ENFILE):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return ReplayError(
            f"replay failed at {op.kind} {op.path or ''}: {err.strerror} (the trace holds more files "
            f"open at once than this process may: raise the limit, e.g. ulimit -n {max(soft * 4, 65536)}"
            f"; it is {soft})"
        )
    if err.errno in (errno.ELOOP, errno.EXDEV):
        return ReplayError(
            f"replay refused {op.kind} {op.path or ''}: a symbolic link on its way (a replay never "
            "resolves a path through one, so nothing outside the target is touched)"
        )
    return ReplayError(f"replay failed at {op.kind} {op.path or ''}: {err.strerror or err}".replace("  ", " "))


class Segments:
    """A worker's rows cut into runs (see the module docstring): ``starts``/``stops`` (table rows) and
    ``batched`` (a run handed to the C loop, or a single row run one operation at a time)."""

    def __init__(self, starts: np.ndarray, stops: np.ndarray, batched: np.ndarray) -> None:
        self.starts, self.stops, self.batched = starts, stops, batched


class Executor:
    """Executes plans under one target directory, moving data by ``path`` (see the module docstring).

    Call order: ``prepare(plan)`` creates the directories and pre-existing
    files, cuts each worker's operations into runs and prepares the data
    path, outside the timed region, then ``run(plan, ...)`` replays and
    returns a ``ReplayResult`` (one run per ``prepare``). Called by
    ``replayer.replay`` and ``replayer.distributed``; made by each
    strategy's ``executor`` factory (``replayer.strategies``).
    ``max_io_bytes``: the largest buffer of a worker (a larger operation is
    cut into pieces of it). ``gpu_copies`` (recorded, pinned, skip): what
    host<->device copy rows become (set by the caller before ``prepare``);
    ``read_memory`` (malloc, reused, fresh): where reads land (the module docstring; set likewise).
    """

    def __init__(self, root: TargetRoot, max_io_bytes: int, path: DataPath) -> None:
        self.root = root
        self.max_io_bytes = max_io_bytes
        self.path = path
        self._segments: dict[int, Segments] = {}
        self.gpu_copies = "recorded"  # recorded | pinned | skip: what copy operations become (set by replay)
        self._copiers: dict[int, gpu.DeviceCopier] = {}
        self._copies_skipped_why: str | None = None
        self._pause = _test_pause()
        self._data: Pregenerated | None = None  # the written bytes, made by prepare (replayer.data)
        self.read_memory = "malloc"  # malloc | reused | fresh: where reads land (set by replay; module docstring)

    # -- before the clock ----------------------------------------------
    def prepare(self, plan: ReplayPlan) -> None:
        try:
            for rel in plan.precreate_dirs:  # exist_ok: another process of a distributed replay made it
                self.root.mkdir(rel, 0o755, exist_ok=True)
            for rel, size in plan.precreate_files:
                self._precreate(rel, size, plan.pattern_keys.get(rel, 0))
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.EXDEV):
                raise ReplayError(
                    f"cannot prepare the target: {err.filename} is a symbolic link or lies behind one "
                    "(a replay never follows one)"
                ) from None
            raise ReplayError(f"cannot prepare the target: {err.strerror or err} ({err.filename})") from None
        self._segments = {index: self.segments(plan, worker) for index, worker in enumerate(plan.workers)}
        self._prepare_copies(plan)
        self._data = Pregenerated(plan.ops)
        self.path.prepare(plan, self._data)

    @property
    def strategy(self) -> str:
        """The strategy this executor replays (its data path's name)."""
        return self.path.name

    def _prepare_copies(self, plan: ReplayPlan) -> None:
        """Device and host buffers for the workers that replay host<->device copies, before the clock; or
        the reason copies are skipped."""
        t = plan.ops
        copies = t.kind == _COPY
        if not copies.any():
            return
        why = "--gpu-copies skip" if self.gpu_copies == "skip" else gpu.probe()
        if why is not None:
            self._copies_skipped_why = why
            return
        for index, worker in enumerate(plan.workers):
            rows = slice(worker.start, worker.stop)
            mine = copies[rows]
            if mine.any():
                largest = int(t.size[rows][mine].max())
                try:
                    self._copiers[index] = gpu.DeviceCopier(largest, pinned_staging=self.gpu_copies == "pinned")
                except (RuntimeError, MemoryError) as err:
                    raise ReplayError(
                        f"cannot stage host<->device copies of {largest} B: {str(err).splitlines()[0]}"
                    ) from None

    def _precreate(self, rel: str, size: int, key: int) -> None:
        buf = AlignedBuffer(min(size, self.max_io_bytes) or PAGE_BYTES)
        view = buf.view()
        try:
            fd = self.root.open(rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError:
            view.release()
            buf.close()
            raise
        try:
            done = 0
            while done < size:
                n = min(buf.size_bytes, size - done)
                pattern.fill(buf.ptr, n, key, done)
                done += os.write(fd, view[:n])
        finally:
            os.close(fd)
            view.release()
            buf.close()

    def segments(self, plan: ReplayPlan, worker: WorkerPlan) -> Segments:
        """Cut a worker's rows into runs. Pure (reads only the plan)."""
        t, lo, hi = plan.ops, worker.start, worker.stop
        rows = slice(lo, hi)
        n = hi - lo
        if n == 0:
            return Segments(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool))
        batch = self.path.batchable(plan, rows)
        awaited = (
            np.isin(t.seq[rows], np.fromiter(plan.awaited, np.int64, len(plan.awaited)))
            if plan.awaited
            else np.zeros(n, bool)
        )
        has_deps = (t.dep_ptr[lo + 1 : hi + 1] - t.dep_ptr[lo:hi]) > 0
        queue = t.queue[rows] if self.path.queues_as_recorded else np.full(n, NONE)
        # lseeks ride along inside runs (they move only the position, which runs do not use)
        rider = (t.kind[rows] == _LSEEK) & ~awaited & ~has_deps
        member = batch | rider
        key = queue * 4 + (t.kind[rows] == READ) * self.path.separates_reads_and_writes
        start = np.ones(n, bool)
        start[1:] = (
            ~member[1:] | ~member[:-1] | has_deps[1:] | awaited[:-1] | ((key[1:] != key[:-1]) & batch[1:] & batch[:-1])
        )
        starts = np.flatnonzero(start)
        stops = np.r_[starts[1:], n]
        data_in = np.add.reduceat(batch.astype(np.int64), starts) if len(starts) else np.zeros(0, np.int64)
        keys_ok = self._uniform_keys(key, batch, starts, stops)
        batched = (data_in >= 2) & keys_ok
        return Segments(starts + lo, stops + lo, batched)

    @staticmethod
    def _uniform_keys(key: np.ndarray, batch: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """Whether every data row of each run has the same key (riders may sit between different keys)."""
        masked = np.where(batch, key, np.iinfo(np.int64).min)
        hi = np.maximum.reduceat(masked, starts)
        lo_ = np.minimum.reduceat(np.where(batch, key, np.iinfo(np.int64).max), starts)
        return (hi == lo_) | (hi == np.iinfo(np.int64).min)

    # -- the timed run -------------------------------------------------
    def run(
        self,
        plan: ReplayPlan,
        *,
        timing: str = "asap",
        progress: Progress | None = None,
        durable: bool = False,
        signals: Signals | None = None,
    ) -> ReplayResult:
        """Replay ``plan``; ``durable`` fsyncs every file the plan leaves behind before the clock stops;
        ``signals`` connects this run to the other processes replaying shares of the same trace. The data
        path's ``finish`` runs after, failed or not; its notes end the result's. Raises ReplayError."""
        try:
            result = self._replay(plan, timing, progress, durable, signals)
        finally:
            notes = self.path.finish()
        result.notes.extend(notes)
        return result

    def _replay(
        self, plan: ReplayPlan, timing: str, progress: Progress | None, durable: bool, signals: Signals | None
    ) -> ReplayResult:
        if not self._segments and plan.workers:
            self._segments = {index: self.segments(plan, worker) for index, worker in enumerate(plan.workers)}
        state = RunState(plan, signals)
        if self._data is not None and self._data.note:
            state.note(self._data.note)
        threads = [
            threading.Thread(target=self._thread_main, args=(i, w, plan, state, timing, progress), daemon=True)
            for i, w in enumerate(plan.workers)
        ]
        if progress is not None:
            t = plan.ops
            data = (t.kind == READ) | (t.kind == WRITE)
            progress.start(int(np.maximum(t.size[data], 0).sum()), self.strategy)
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        state.start_ns = time.monotonic_ns()
        try:  # the starts inside: a Ctrl-C between two starts still stops the workers already going
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        except KeyboardInterrupt:  # Ctrl-C: every worker stops before its next operation, then we go
            state.fail(ReplayError("interrupted"))
            for index, thread in enumerate(threads):  # not join: Python 3.11's join, once interrupted, may
                if thread.ident is not None:  # return at once later (the worker still running)
                    state.exited[index].wait()
            self._close_all(state)
            raise
        if plan.pack_index and state.error is None:
            self._write_pack_index(plan, durable)
        if durable and state.error is None:
            self._fsync_all(plan)
        elapsed_s = (time.monotonic_ns() - state.start_ns) / 1e9
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        self._close_all(state)
        for copier in self._copiers.values():
            copier.close()
        if self._data is not None:  # one run per prepare: its bytes are not needed again
            self._data.close()
            self._data = None
        if state.error is not None:
            raise state.error
        kcopy_rows = int((plan.ops.kcopy != 0).sum())
        if kcopy_rows and not self.path.kernel_copies:
            state.notes.add(
                f"{kcopy_rows} in-kernel copy rows (sendfile, copy_file_range, splice) replayed as reads "
                f"and writes: strategy {self.strategy} moves data its own way"
            )
        elif kcopy_rows:
            state.notes.add(
                f"in-kernel copies: {state.kernel_copies} calls made as recorded, "
                f"{state.kcopy_fallbacks} rows replayed as a read or write (their other side not in "
                f"the plan)"
            )
        copies = int((plan.ops.kind == _COPY).sum())
        gpu_copies = None
        if copies:
            skipped = copies - state.copies_executed
            gpu_copies = {
                "mode": self.gpu_copies,
                "executed": state.copies_executed,
                "skipped": skipped,
                "bytes": state.copy_bytes,
                "elapsed_s": state.copy_ns / 1e9,
                "skipped_why": self._copies_skipped_why,
            }
            if skipped:
                state.notes.add(f"{skipped} host<->device copy rows skipped: {self._copies_skipped_why}")
        latencies = np.concatenate(state.latencies) if state.latencies else np.zeros(0, np.int64)
        histogram = LatencyHistogram()  # the percentiles the report computes from the same durations
        histogram.add(latencies)
        return ReplayResult(
            strategy=self.strategy,
            elapsed_s=elapsed_s,
            bytes_written=state.bytes_written,
            bytes_read=state.bytes_read,
            data_ops=state.data_ops,
            metadata_ops=state.metadata_ops,
            latency_ns=histogram.percentiles_ns(),
            latency_histogram=histogram if signals is not None else None,
            cpu_user_s=usage1.ru_utime - usage0.ru_utime,
            cpu_sys_s=usage1.ru_stime - usage0.ru_stime,
            skipped_ops=dict(plan.skipped_ops),
            unaligned_ops=state.unaligned_ops,
            metadata_ops_saved=plan.metadata_ops_saved,
            notes=sorted(state.notes),
            preallocated_files=state.preallocated,
            gpu_copies=gpu_copies,
            data_paths={
                name: {"ops": int(ops), "bytes": int(moved)}
                for name, (ops, moved) in zip(DATA_PATHS, state.path_counts.tolist())
            },
            file_bytes=files_moved(plan, state.file_bytes),
            timing=state.timing_figures(),
            timing_samples=state.timing_samples() if signals is not None else {},
            phases=state.phase_figures(),
        )

    @staticmethod
    def _close_all(state: RunState) -> None:
        for mapping in state.mappings.values():
            mapping.close()
        state.mappings.clear()
        for fd in state.fds.values():
            os.close(fd)
        state.fds.clear()

    def _thread_main(
        self, index: int, worker: WorkerPlan, plan: ReplayPlan, state: RunState, timing: str, progress: Progress | None
    ) -> None:
        """A worker thread: any failure, in setup too (a buffer, a ring), fails the run with one line."""
        try:
            self._worker(index, worker, plan, state, timing, progress)
        except ReplayError as err:
            state.fail(err)
        except Exception as err:  # noqa: BLE001 - a worker must never die silently with a partial result
            detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            state.fail(ReplayError(f"a replay worker failed ({type(err).__name__}: {detail})"))
        finally:
            state.exited[index].set()

    def _write_pack_index(self, plan: ReplayPlan, durable: bool) -> None:
        """Write the --pack-files index (final path -> pack, offset, size) inside the timed region."""
        fd = self.root.open(INDEX_PATH, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps({k: dict(v) for k, v in plan.pack_index.items()}, indent=1).encode())
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _fsync_all(self, plan: ReplayPlan) -> None:
        """``--durable``: fsync every file the plan leaves behind, except pre-created files it never writes
        (their sync is setup, not the replay's work: a load's files would otherwise be timed)."""
        t = plan.ops
        changes = np.isin(t.kind, [WRITE, KIND["ftruncate"], KIND["fallocate"], KIND["rename"]]) | (
            (t.kind == KIND["open"]) & (t.flags != NO_FLAGS) & ((t.flags & (os.O_CREAT | os.O_TRUNC)) != 0)
        )
        touched = {t.paths[i] for i in np.unique(np.r_[t.path[changes], t.new_path[changes]]).tolist() if i >= 0}
        untouched = {rel for rel, _ in plan.precreate_files} - touched
        for rel in plan.checks.expected_sizes:
            if rel in untouched:
                continue
            fd = self.root.open(rel, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _buffer_bytes(self, plan: ReplayPlan, worker: WorkerPlan, timing: str = "asap") -> int:
        """Size of a worker's I/O buffers: its largest operation, at least a page, at most max_io_bytes; under
        ``--timing original`` at most ``ORIGINAL_MAX_IO_BYTES``, so that no operation is split into pieces
        (a 154 MB write replayed as three of 64 MiB took 2.5x its recorded time, issue 34)."""
        t = plan.ops
        rows = slice(worker.start, worker.stop)
        data = (t.kind[rows] == READ) | (t.kind[rows] == WRITE)
        largest = int(t.size[rows][data].max()) if data.any() else 0
        limit = max(self.max_io_bytes, ORIGINAL_MAX_IO_BYTES) if timing == "original" else self.max_io_bytes
        return min(max(largest, PAGE_BYTES), limit)

    @staticmethod
    def _pace(ts_ns: int, state: RunState, timing: str, ctx: WorkerContext | None = None) -> None:
        """With ``--timing original``, wait until the operation's recorded start relative to its rank's first
        operation (a failure or Ctrl-C ends the wait at once), by an Event wait; the
        start error (actual start minus target, ns) is kept in ``ctx.start_errors``, and in ``ctx.waited``
        whether the thread waited for it (False: the thread was still busy past the target, with the
        previous operation or with the replayer's own work between operations; a thread's first operation,
        at the paced clock's start, counts as waited)."""
        if timing != "original":
            return
        base = ctx.pace_base_ns if ctx is not None else 0
        target = (state.pace_start_ns or state.start_ns) + ts_ns - base
        delay_ns = target - time.monotonic_ns()
        if delay_ns > 0:  # no spin: a spinning thread would hold the GIL from the other workers
            state.stopped.wait(delay_ns / 1e9)
        if ctx is not None:
            now = time.monotonic_ns()
            ctx.waited.append(delay_ns > 0 or not ctx.start_errors)
            ctx.start_errors.append(now - target)
            ctx.started_ns.append(now - (state.pace_start_ns or state.start_ns))

    def _worker(
        self, index: int, worker: WorkerPlan, plan: ReplayPlan, state: RunState, timing: str, progress: Progress | None
    ) -> None:
        t = plan.ops
        size = self._buffer_bytes(plan, worker, timing)
        fresh_min = {"fresh": 0, "malloc": MALLOC_MMAP_THRESHOLD_BYTES}.get(self.read_memory)
        ctx = WorkerContext(plan, state, size, progress, self._data, fresh_min_bytes=fresh_min)
        ctx.index = index
        ctx.pace_base_ns = state.rank_first_ts.get(worker.rank, 0) if timing == "original" else 0
        if timing == "original" and state.pace_barrier is not None:  # every worker set up: the paced clock starts
            try:
                if state.pace_barrier.wait() == 0:
                    state.pace_start_ns = time.monotonic_ns()
                state.pace_barrier.wait()
            except threading.BrokenBarrierError:
                return
        segments = self._segments.get(index) or self.segments(plan, worker)
        row = None
        try:
            for start, stop, batched in zip(
                segments.starts.tolist(), segments.stops.tolist(), segments.batched.tolist()
            ):
                if self._pause is not None and start <= self._pause[0] < stop:
                    _pause_here(self._pause[1])
                    if state.stopped.is_set():
                        return
                if batched and timing != "original":  # original timing paces every operation: no runs
                    row = start
                    if not state.wait(t.deps_of(start)):
                        return
                    began = time.monotonic_ns()
                    self._run(ctx, start, stop)
                    kinds = t.kind[start:stop]
                    ctx.phase_span(bool((kinds == WRITE).any()), bool((kinds == READ).any()), began)
                    state.done_many(t.seq[start:stop])
                    continue
                for row in range(start, stop):
                    op = t.op(row)
                    if not state.wait(op.deps):
                        return
                    self._pace(op.ts_ns, state, timing, ctx)
                    began = time.monotonic_ns()
                    self._one(ctx, op, row)
                    if op.kind in DATA_KINDS:
                        ctx.phase_span(op.kind == "write", op.kind == "read", began)
                    state.done(op.seq)
            ctx.drain()
        except _Failed as err:
            state.fail(_op_error(t.op(err.row), err))
        except OSError as err:
            state.fail(_op_error(t.op(row), err) if row is not None else ReplayError(str(err)))
        except ReplayError as err:
            state.fail(err)
        except KeyError:
            assert row is not None  # a KeyError comes from a descriptor lookup, which runs only once row is set
            op = t.op(row)
            state.fail(ReplayError(f"replay failed at {op.kind} {op.path or ''}: descriptor was never opened"))
        finally:
            ctx.close()

    # -- a run: one array of requests for the C loop ---------------------
    def _run(self, ctx: WorkerContext, start: int, stop: int) -> None:
        t = ctx.plan.ops
        rows = np.arange(start, stop)
        kinds = t.kind[rows]
        for row in rows[kinds == _LSEEK].tolist():  # riders: done on the way
            os.lseek(ctx.state.fds[int(t.handle[row])], int(t.offset[row]), os.SEEK_SET)
        data = rows[(kinds == READ) | (kinds == WRITE)]
        requests, owner = ctx.requests(data)
        of = data[owner]
        done = self.path.submit(ctx, requests, of, int(t.queue[data[0]]))
        failure = rings.first_failure(requests, done.results)
        if failure is not None:
            i, err = failure
            raise _Failed(int(of[i]), err)
        metadata = int(is_any_of(kinds, _METADATA_CODES).sum())
        ctx.complete(
            requests,
            done.results,
            done.latencies,
            of,
            via_uring=done.via_uring,
            data_ops=len(data),
            metadata_ops=metadata,
        )

    # -- one operation ---------------------------------------------------
    def _one(self, ctx: WorkerContext, op: PlanOp, row: int) -> None:
        started = time.perf_counter_ns()
        if op.kind == "copy":
            copier = self._copiers.get(ctx.index)
            if copier is not None:
                direction, memory = gpu.decode(op.flags or 0)
                copier.copy(direction, memory, op.size or 0)
                ctx.state.add_copy(time.perf_counter_ns() - started, op.size or 0)
            return
        if op.kcopy and self.path.kernel_copies and op.kind in DATA_KINDS:
            self._kernel_copy(ctx, op, row)
            return
        if (
            op.queue is not None
            and self.path.queues_as_recorded
            and op.kind in DATA_KINDS | {"fsync", "fdatasync"}
            and (op.offset is not None or op.kind not in DATA_KINDS)
            and not op.mapped
        ):
            ring = ctx.queue_ring(op.queue)
            if ring is not None:
                self._one_request(ctx, op, row, ring)
                return
        if op.kind not in DATA_KINDS:
            self._execute(op, ctx.state)
            if op.kind in ("close", "munmap") and op.release and op.handle is not None:
                self.path.released(op.handle)
            if op.kind in METADATA_KINDS:
                ctx.state.add_metadata()
            return
        mapped = self._recorded_mapping(op, ctx.state)
        moved = ctx.through_mapping(op, mapped) if mapped is not None else self.path.transfer(ctx, op, row)
        if moved is None:  # requests the data path counted (WorkerIO.complete)
            return
        ctx.state.add_one(time.perf_counter_ns() - started, moved, op.kind == "write")
        code = (
            self.path.path_code
            if self.path.path_code is not None
            else int(ctx.state.is_direct(ctx.state.fds[_known(op.handle)]))
        )
        ctx.state.add_path_one(
            _MAPPED if mapped is not None else code, moved, int(ctx.plan.ops.path[row]), op.kind == "write"
        )
        if ctx.progress is not None:
            ctx.progress.advance(moved)

    def _recorded_mapping(self, op: PlanOp, state: RunState) -> FileMapping | None:
        """The recorded mapping a read or write of pages goes through (None: not one, or the data path does
        not map files)."""
        if op.mapped and self.path.maps_files and op.handle is not None:
            return state.mappings.get(op.handle)
        return None

    def _kernel_copy(self, ctx: WorkerContext, op: PlanOp, row: int) -> None:
        """One side of a recorded in-kernel copy (``PlanOp.kcopy``) by the recorded call. sendfile(2) and
        copy_file_range(2): at the source's read row, the call from it into the destination of the write row
        right after (the same call's), which then counts as done; splice(2): each recorded call through this
        worker's pipe (the source into it, the pipe into the destination). A side whose other side the plan
        lacks (a file outside the trace), or a splice the pipe cannot hold or feed, is a plain read or write
        (counted: ``RunState.kcopy_fallbacks``). Raises OSError."""
        if ctx.copied_row == row:  # the write side of the copy its read side made
            ctx.copied_row = None
            return
        t, state = ctx.plan.ops, ctx.state
        name = KCOPIES[op.kcopy]
        partner = row + 1
        paired = (
            op.kind == "read"
            and partner < len(t)
            and t.worker[partner] == t.worker[row]
            and t.kcopy[partner] == op.kcopy
            and t.kind[partner] == WRITE
            and t.ts_ns[partner] == op.ts_ns
        )
        if paired and not state.wait(t.deps_of(partner)):
            return
        started = time.perf_counter_ns()
        if paired:
            dst = t.op(partner)
            src_fd, dst_fd = state.fds[_known(op.handle)], state.fds[_known(dst.handle)]
            size = max(dst.size or 0, 0)
            if name == "sendfile":
                if dst.offset is not None:
                    os.lseek(dst_fd, dst.offset, os.SEEK_SET)
                moved = _loop(
                    lambda n, done: os.sendfile(dst_fd, src_fd, None if op.offset is None else op.offset + done, n),
                    size,
                )
            elif name == "copy_file_range":
                moved = _loop(
                    lambda n, done: os.copy_file_range(
                        src_fd,
                        dst_fd,
                        n,
                        None if op.offset is None else op.offset + done,
                        None if dst.offset is None else dst.offset + done,
                    ),
                    size,
                )
            else:  # a splice naming both files: through the pipe
                moved = self._splice_in(ctx, src_fd, op.offset, size)
                moved = self._splice_out(ctx, dst_fd, dst.offset, moved) if moved is not None else None
            if moved is not None:
                ctx.copied_row = partner
                state.count_kernel_copy(False)
                self._count_copy(ctx, time.perf_counter_ns() - started, moved, int(t.path[row]), False)
                self._count_copy(ctx, 0, moved, int(t.path[partner]), True)
                return
        elif name == "splice":
            fd = state.fds[_known(op.handle)]
            size = max(op.size or 0, 0)
            moved = (
                self._splice_in(ctx, fd, op.offset, size)
                if op.kind == "read"
                else self._splice_out(ctx, fd, op.offset, size)
            )
            if moved is not None:
                state.count_kernel_copy(False)
                self._count_copy(ctx, time.perf_counter_ns() - started, moved, int(t.path[row]), op.kind == "write")
                return
        state.count_kernel_copy(True)  # a plain read or write, as the other strategies replay it
        mapping = self._recorded_mapping(op, state)
        moved = ctx.through_mapping(op, mapping) if mapping is not None else self.path.transfer(ctx, op, row)
        if moved is None:  # requests the data path counted (WorkerIO.complete)
            return
        state.add_one(time.perf_counter_ns() - started, moved, op.kind == "write")
        state.add_path_one(
            int(state.is_direct(state.fds[_known(op.handle)])), moved, int(t.path[row]), op.kind == "write"
        )
        if ctx.progress is not None:
            ctx.progress.advance(moved)

    @staticmethod
    def _count_copy(ctx: WorkerContext, latency_ns: int, moved: int, path: int, is_write: bool) -> None:
        ctx.state.add_one(latency_ns, moved, is_write)
        ctx.state.add_path_one(_KCOPY_PATH, moved, path, is_write)
        if ctx.progress is not None:
            ctx.progress.advance(moved)

    @staticmethod
    def _splice_in(ctx: WorkerContext, fd: int, offset: int | None, size: int) -> int | None:
        """splice(2) ``size`` bytes of ``fd`` from ``offset`` (None: its position) into the worker's pipe;
        None when the pipe cannot hold them."""
        pipe = ctx.pipe(size)
        if pipe is None:
            return None
        moved = _loop(
            lambda n, done: os.splice(fd, pipe[1], n, offset_src=None if offset is None else offset + done), size
        )
        ctx.pipe_bytes += moved
        return moved

    @staticmethod
    def _splice_out(ctx: WorkerContext, fd: int, offset: int | None, size: int) -> int | None:
        """splice(2) ``size`` bytes from the worker's pipe into ``fd`` at ``offset``; None when the pipe holds
        fewer (what the recorded call took from it never came in: its source is outside the plan)."""
        if ctx.pipe_bytes < size or ctx.pipe_fds is None:
            return None
        read_end = ctx.pipe_fds[0]
        moved = _loop(
            lambda n, done: os.splice(read_end, fd, n, offset_dst=None if offset is None else offset + done), size
        )
        ctx.pipe_bytes -= moved
        return moved

    def _one_request(self, ctx: WorkerContext, op: PlanOp, row: int, ring: Ring) -> None:
        """One request through its queue's ring (a lone request, or a sync): submitted and completed."""
        if op.kind in DATA_KINDS:
            requests, _ = ctx.requests(np.array([row]))
        else:
            requests = rings.batch(1)
            requests["opcode"] = rings.OP_FSYNC
            requests["op_flags"] = rings.FSYNC_DATASYNC if op.kind == "fdatasync" else 0
            requests["fd"] = ctx.state.fds[_known(op.handle)]
        assert op.queue is not None  # _one sends through a ring only an operation with its recorded queue
        results, latencies = ctx.issue(requests, ring, op.queue)
        failure = rings.first_failure(requests, results)
        if failure is not None:
            raise failure[1]
        moved = int(np.maximum(results, 0).sum())
        if op.kind in DATA_KINDS:
            ctx.state.add_run(latencies, moved if op.kind == "write" else 0, 0 if op.kind == "write" else moved, 1, 0)
            ctx.state.add_paths(
                True,
                requests["fd"],
                np.maximum(results, 0),
                np.r_[True, np.zeros(len(requests) - 1, bool)],
                np.full(len(requests), ctx.plan.ops.path[row]),
                requests["opcode"] == rings.OP_WRITE,
            )
            if ctx.progress is not None:
                ctx.progress.advance(moved)
        else:
            ctx.state.add_metadata()

    def _execute(self, op: PlanOp, state: RunState) -> None:
        """Run one operation other than a read or write."""
        kind = op.kind
        if kind in ("mmap", "munmap", "msync"):
            self._mapping(op, state)
        elif kind == "open":
            state.set_fd(_known(op.handle), self._open(op, state))
        elif kind == "close":
            if op.release:
                os.close(state.pop_fd(_known(op.handle)))
        elif kind == "dup":
            state.set_fd(_known(op.handle), os.dup(state.fds[_known(op.source_handle)]))
        else:
            self._metadata(op, state)

    def _mapping(self, op: PlanOp, state: RunState) -> None:
        """mmap (open the file, map it), msync, munmap (unmap, close); without ``maps_files``, only the
        open and close, and msync as fdatasync."""
        if op.kind == "mmap":
            prot = op.prot or 0
            writable = prot & PROT_WRITE and (op.flags or MAP_SHARED) & MAP_SHARED
            fd = self.root.open(_given(op.path, op, "path"), os.O_RDWR if writable else os.O_RDONLY)
            state.set_fd(_known(op.handle), fd)
            if self.path.maps_files:
                state.mappings[_known(op.handle)] = FileMapping(fd, op.size or 0, op.offset or 0, prot, op.flags or 0)
        elif op.kind == "msync":
            handle = _known(op.handle)
            mapping = state.mappings.get(handle)
            if mapping is not None:
                mapping.sync(op.offset or 0, op.size or 0, op.flags or 0)
            else:
                os.fdatasync(state.fds[handle])
        else:
            handle = _known(op.handle)
            mapping = state.mappings.pop(handle, None)
            if mapping is not None:
                mapping.close()
            os.close(state.pop_fd(handle))

    def _metadata(self, op: PlanOp, state: RunState) -> None:
        kind = op.kind
        fd = state.fds.get(op.handle) if op.handle is not None else None

        def opened() -> int:
            """The descriptor the operation acts on; one never opened raises the KeyError the worker reports."""
            if fd is None:
                raise KeyError(op.handle)
            return fd

        if kind == "lseek" and op.offset is not None:
            os.lseek(opened(), op.offset, os.SEEK_SET)
        elif kind == "fsync":
            os.fsync(opened())
        elif kind == "fdatasync":
            os.fdatasync(opened())
        elif kind == "sync_file_range":
            files.sync_file_range(opened(), op.offset or 0, op.size or 0, op.flags or 0)
        elif kind == "ftruncate":
            os.ftruncate(opened(), _given(op.size, op, "size"))
        elif kind == "fallocate":
            files.fallocate(opened(), _given(op.offset, op, "offset"), _given(op.size, op, "size"), op.flags or 0)
        elif kind == "fcntl" and op.flags is not None:
            fcntl.fcntl(opened(), fcntl.F_SETFL, self.path.setfl_flags(op.flags))
            state.mark_direct(opened())
        elif kind == "rename":
            entries.rename_entry(self.root, _given(op.path, op, "path"), _given(op.new_path, op, "new path"), op.flags)
        elif kind == "unlink":
            entries.remove_entry(self.root, _given(op.path, op, "path"), op.flags)
        elif kind == "link":
            entries.link_entry(self.root, _given(op.path, op, "path"), _given(op.new_path, op, "new path"))
        elif kind == "symlink":
            entries.symlink_entry(self.root, _given(op.path, op, "path"), _given(op.new_path, op, "new path"))
        elif kind == "mkdir":
            try:
                self.root.mkdir(_given(op.path, op, "path"), 0o755)
            except FileExistsError:
                pass

    def _open(self, op: PlanOp, state: RunState) -> int:
        """Open as recorded (host flags); where the target refuses O_DIRECT, without it, noted once. A file
        the plan preallocates is reserved at its final size when this open creates it."""
        flags = op.flags or 0
        is_file = not flags & os.O_DIRECTORY
        if is_file:
            flags = self.path.open_flags(flags)
        path = _given(op.path, op, "path")
        opened = open_beneath(self.root, path, flags & ~os.O_DIRECT, direct=bool(flags & os.O_DIRECT))
        if opened.fallback:
            state.note(f"{opened.fallback}: files opened with O_DIRECT were opened buffered")
        size = state.plan.preallocate.get(op.seq)
        if size and flags & os.O_CREAT:
            try:
                files.fallocate(opened.fd, 0, size, 0)
                state.count_preallocated()
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
                    os.close(opened.fd)
                    raise
                state.note("fallocate(2) refused by the target file system: files were not preallocated")
        if is_file:
            self.path.opened(_known(op.handle), path, flags)
        return opened.fd


def _loop(call, size: int) -> int:
    """Bytes moved by ``call(n, done)`` repeated until ``size`` moved or it moves nothing (end of file)."""
    done = 0
    while done < size:
        got = call(size - done, done)
        if got <= 0:
            break
        done += got
    return done


def open_beneath(root: TargetRoot, rel: str, flags: int, mode: int = 0o644, *, direct: bool = False) -> files.Opened:
    """``files.open_file`` beneath ``root`` (``iolayer.beneath``): with O_DIRECT when ``direct``, and without it
    where the file system refuses it (said in ``fallback``). Raises OSError."""
    if not direct:
        return files.Opened(root.open(rel, flags, mode), False)
    existed = bool(flags & os.O_CREAT) and root.exists(rel)
    try:
        return files.Opened(root.open(rel, flags | os.O_DIRECT, mode), True)
    except OSError as err:
        if err.errno not in files.DIRECT_REFUSED:
            raise
        reason = f"O_DIRECT refused by the file system ({errno.errorcode[err.errno]})"
    made = bool(flags & os.O_CREAT) and not existed and root.exists(rel)  # the refused open created it
    if made and flags & os.O_EXCL:
        root.unlink(rel)
        made = False
    fd = root.open(rel, flags & ~os.O_CREAT if made else flags, mode)
    if made:
        root.remember(fd)
    return files.Opened(fd, False, reason)


def _test_pause() -> tuple[int, str] | None:
    """``CKPT_TRACE_TEST_PAUSE=ROW:FIFO`` (tests only): (plan row, FIFO path) to pause before, or None."""
    value = os.environ.get("CKPT_TRACE_TEST_PAUSE")
    if not value:
        return None
    row, _, fifo = value.partition(":")
    return int(row), fifo


def _pause_here(fifo: str) -> None:
    """The test hook's pause: open ``fifo`` for reading (which blocks until the test opens it for writing:
    the test then knows the replay stands here) and read it to its end (the test closes it to let the replay
    go on). So a race test provably acts between two operations."""
    fd = os.open(fifo, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while os.read(fd, 4096):
            pass
    finally:
        os.close(fd)


def files_moved(plan: ReplayPlan, per_path: np.ndarray) -> dict[str, tuple[int, int]]:
    """(bytes written, bytes read) per file path from per-path-index counts (``RunState.file_bytes``)."""
    moved: dict[str, tuple[int, int]] = {}
    for index in np.flatnonzero(per_path.any(axis=0)).tolist():
        name = plan.ops.paths[index]
        written, read = moved.get(name, (0, 0))
        moved[name] = (written + int(per_path[0, index]), read + int(per_path[1, index]))
    return moved


class _Failed(OSError):
    """A request of a run failed: the row it came from, and the error."""

    def __init__(self, row: int, err: OSError) -> None:
        super().__init__(err.errno, err.strerror)
        self.row = row


#: ``--timing original``: the largest operation replayed as one request (one request's length is 32 bits,
#: ``ckr_req.len``); a larger one is still cut into pieces of this size. Its buffers are set up before the
#: paced clock starts.
ORIGINAL_MAX_IO_BYTES = (1 << 32) - PAGE_BYTES

#: Memory a worker's ring may hold for the generated writes it keeps in flight (one slot of the worker's buffer
#: size each, at most the ring's depth): 32 writes of 1 MiB, 8 of 4 MiB. More slots measured slower, not faster:
#: on the 2-vCPU VM a uring-buffered replay of 469 MiB took 1.2-2.7 s with 256 MiB of slots against 0.9-1.1 s
#: with 16 MiB (filling slots that no cache holds costs memory bandwidth the page cache's copies need).
RING_SLOT_BYTES = 32 << 20

#: glibc's largest dynamic mmap threshold on 64-bit systems (mallopt(3), ``DEFAULT_MMAP_THRESHOLD_MAX``): with
#: ``read_memory="malloc"``, the reads of operations at least this large land in fresh pages.
MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20

#: A worker's read arena for fresh reads (at least its buffer size): they fill it from its start,
#: one after another, and it is released (MADV_DONTNEED) when the next would not fit. Virtual memory; what a
#: worker holds resident is at most this.
FRESH_READ_BYTES = 64 << 20


class WorkerContext:
    """One worker's buffers and rings for one run of a plan: the engine's ``datapath.WorkerIO``."""

    def __init__(
        self,
        plan: ReplayPlan,
        state: RunState,
        size: int,
        progress: Progress | None,
        data: Pregenerated | None,
        *,
        fresh_min_bytes: int | None = None,
    ) -> None:
        self.plan, self.state, self.progress, self.data = plan, state, progress, data
        self.buffer_bytes = size
        self.write_slots = Slots(size, 1)  # generated writes issued one at a time (and the Python paths') buffer
        # Reads of operations of at least this many bytes land in fresh pages of the arena (None: none do).
        self.fresh_min_bytes = fresh_min_bytes
        # 4 KiB pages, as malloc gives a loader: each read into the arena faults in every page it fills
        self.fresh_buf = (
            AlignedBuffer(max(size, FRESH_READ_BYTES), huge_pages=False) if fresh_min_bytes is not None else None
        )
        self.fresh_cursor = 0  # the arena's first byte no read has filled since its release
        self.write_buf, self.read_buf = self.write_slots.buffer, AlignedBuffer(size)
        self.ring_slots: dict[int, Slots] = {}  # a ring's slots, by queue: one per write it keeps in flight
        self.write_view, self.read_view = self.write_buf.view(), self.read_buf.view()
        self.fresh_view = self.fresh_buf.view() if self.fresh_buf is not None else None
        self.rings: dict[int, Ring | None] = {}
        self.index = 0  # the worker's index in the plan
        self.pace_base_ns = 0  # --timing original: the recorded start of this worker's rank's first operation
        self.start_errors: list[int] = []  # --timing original: actual minus target start of each operation (ns)
        self.started_ns: list[int] = []  # and when each started, from the run's start (ns)
        self.waited: list[bool] = []  # and whether the thread waited for it (False: busy past its start)
        self.spans: dict[str, list[int]] = {}  # phase (save, load) -> [first start, last end] of its data ops (ns)
        self.copied_row: int | None = None  # the write row of an in-kernel copy its read row made
        self.pipe_fds: tuple[int, int] | None = None  # (read end, write end) of the pipe splices go through
        self.pipe_bytes = 0  # bytes in it
        self.pipe_capacity = 0

    def pipe(self, adding: int) -> tuple[int, int] | None:
        """This worker's pipe, made (and grown, F_SETPIPE_SZ) to hold ``adding`` more bytes; None if it cannot."""
        if self.pipe_fds is None:
            self.pipe_fds = os.pipe()
            self.pipe_capacity = (
                fcntl.fcntl(self.pipe_fds[1], fcntl.F_GETPIPE_SZ) if hasattr(fcntl, "F_GETPIPE_SZ") else 65536
            )
        need = self.pipe_bytes + adding
        if need > self.pipe_capacity:
            try:
                self.pipe_capacity = fcntl.fcntl(self.pipe_fds[1], F_SETPIPE_SZ, max(need, 1 << 20))
            except OSError:
                return None
        return self.pipe_fds if need <= self.pipe_capacity else None

    def fd(self, handle: int | None) -> int:
        return self.state.fds[_known(handle)]

    def ring(self, key: int, queue_depth: int) -> Ring:
        ring = self.rings.get(key)
        if ring is None:
            ring = self.rings[key] = Ring(queue_depth)
        return ring

    def note(self, text: str) -> None:
        self.state.note(text)

    def count_unaligned(self) -> None:
        self.state.add_unaligned()

    def complete(
        self,
        requests: np.ndarray,
        results: np.ndarray,
        latencies: np.ndarray,
        rows: np.ndarray,
        *,
        via_uring: bool,
        data_ops: int,
        metadata_ops: int = 0,
    ) -> int:
        moved = np.maximum(results, 0)
        is_write = requests["opcode"] == rings.OP_WRITE
        first = np.r_[True, rows[1:] != rows[:-1]]
        self.state.add_paths(via_uring, requests["fd"], moved, first, self.plan.ops.path[rows], is_write)
        written, read = int(moved[is_write].sum()), int(moved[~is_write].sum())
        self.state.add_run(latencies, written, read, data_ops, metadata_ops)
        if self.progress is not None:
            self.progress.advance(written + read)
        return written + read

    def through_mapping(self, op: PlanOp, mapping: FileMapping) -> int:
        size, done = op.size or 0, 0
        buf = self.write_buf if op.kind == "write" else self.read_buf
        chunk_max = buf.size_bytes
        while done < size:
            chunk = min(chunk_max, size - done)
            offset = _given(op.offset, op, "offset") + done
            if op.kind == "write":
                base = op.pattern_offset if op.pattern_offset is not None else _given(op.offset, op, "offset")
                source = self.data.address(op.pattern_key, base + done, chunk) if self.data is not None else None
                if source is None:
                    pattern.fill(buf.ptr, chunk, op.pattern_key, base + done)
                    source = buf.ptr
                moved = mapping.touch(offset, chunk, source=source)
            else:
                moved = mapping.touch(offset, chunk, sink=buf.ptr)
            if moved < chunk:
                return done + moved
            done += chunk
        return done

    def requests(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        data = rows
        t = self.plan.ops
        chunk = self.buffer_bytes
        size = np.maximum(t.size[data], 0)
        pieces = np.maximum(1, -(-size // chunk))
        owner = np.repeat(np.arange(len(data)), pieces)
        k = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        r = data[owner]
        done = k * chunk
        offset = t.offset[r] + done
        base = np.where(t.pattern_offset[r] >= 0, t.pattern_offset[r], t.offset[r]) + done
        writes = t.kind[r] == WRITE
        requests = rings.batch(len(r))
        requests["opcode"] = np.where(writes, rings.OP_WRITE, rings.OP_READ)
        requests["fd"] = self.fds_of(t.handle[r])
        # A write's addr is its content offset and user_data its content key: its bytes are generated into a
        # slot as it is issued (_WorkerContext.issue); unless they were made before the clock (replayer.data):
        # then addr is where they are and user_data PREGENERATED.
        requests["addr"] = np.where(writes, base, self.read_buf.ptr)
        # A read's user_data is its recorded operation's size (``issue``: whether it lands in fresh pages).
        requests["user_data"] = np.where(writes, t.pattern_key[r].astype(np.int64), t.op_sizes(r)).astype(np.uint64)
        requests["len"] = np.minimum(chunk, size[owner] - done)
        made = self.data
        if made is not None and writes.any():
            addresses, covered = made.addresses(t.pattern_key[r], base, requests["len"].astype(np.int64))
            covered &= writes
            requests["addr"][covered] = addresses[covered]
            requests["user_data"][covered] = PREGENERATED
        requests["off"] = offset
        return requests, owner

    def fds_of(self, handles: np.ndarray) -> np.ndarray:
        fds = self.state.fd_array[handles]
        if (fds < 0).any():
            raise KeyError(int(handles[np.flatnonzero(fds < 0)[0]]))
        return fds

    def queue_ring(self, queue: int) -> Ring | None:
        """This worker's ring for a recorded queue, as deep as recorded (None: io_uring unavailable)."""
        if queue not in self.rings:
            try:
                self.rings[queue] = Ring(self.plan.queue_depths.get(queue, 1))
            except (RingUnavailable, OSError) as err:
                self.state.note(f"io_uring unavailable ({err.strerror or err}): requests replayed as system calls")
                self.rings[queue] = None
        return self.rings[queue]

    def read_target(self, size: int, op_bytes: int) -> memoryview:
        """Where a read of ``size`` bytes (at most ``buffer_bytes``) of an operation of ``op_bytes`` lands:
        the next unused pages of the fresh arena (released first when they would not fit) where the
        operation's reads go fresh (``fresh_min_bytes``), else the start of ``read_buf``."""
        if self.fresh_buf is None or self.fresh_min_bytes is None or op_bytes < self.fresh_min_bytes:
            return self.read_view[:size]
        span = -(-size // PAGE_BYTES) * PAGE_BYTES
        if self.fresh_cursor + span > len(self.fresh_buf.mmap):
            self._release_fresh()
        at, self.fresh_cursor = self.fresh_cursor, self.fresh_cursor + span
        assert self.fresh_view is not None
        return self.fresh_view[at : at + size]

    def _release_fresh(self) -> None:
        """Give the fresh arena's pages back (their next touch faults in a zeroed page) and start it again."""
        assert self.fresh_buf is not None
        self.fresh_buf.mmap.madvise(mmap.MADV_DONTNEED)
        self.fresh_cursor = 0

    def issue(self, requests: np.ndarray, ring: Ring | None = None, queue: int = -1):
        """(results, latencies) of ``requests`` through ``ring`` (else the POSIX C loop), their writes'
        bytes generated as each is issued (``requests``: a write's addr is its content offset, user_data its
        key) into slots: one for the C loop, for a ring one per write it keeps in flight, as deep as the ring
        within ``RING_SLOT_BYTES`` (fewer slots: fewer generated writes in flight). A read's user_data is its
        operation's size: where its operation's reads go fresh (``read_target``), each gets its own pages of
        the arena, and the requests go in groups that fit in it, the arena released between them; a failed
        group ends the issuing (the rest stay ``NOT_ISSUED``)."""
        if self.fresh_buf is None or self.fresh_min_bytes is None:
            return self._issue(requests, ring, queue)
        fresh = (requests["opcode"] == rings.OP_READ) & (requests["user_data"] >= self.fresh_min_bytes)
        if not fresh.any():
            return self._issue(requests, ring, queue)
        spans = np.where(fresh, -(-requests["len"].astype(np.int64) // PAGE_BYTES) * PAGE_BYTES, 0)
        capacity = len(self.fresh_buf.mmap)
        results = np.full(len(requests), rings.NOT_ISSUED, np.int64)
        latencies = np.zeros(len(requests), np.int64)
        start = 0
        while start < len(requests):
            ends = self.fresh_cursor + np.cumsum(spans[start:])
            stop = start + int(np.searchsorted(ends, capacity, side="right"))
            if stop == start:  # the next fresh read does not fit: fill the arena again from its start
                self._release_fresh()
                continue
            group = requests[start:stop]
            at = ends[: stop - start] - spans[start:stop]  # each read's offset in the arena
            mine = fresh[start:stop]
            group["addr"][mine] = self.fresh_buf.ptr + at[mine]
            self.fresh_cursor = int(ends[stop - start - 1])
            results[start:stop], latencies[start:stop] = self._issue(group, ring, queue)
            if rings.first_failure(group, results[start:stop]) is not None:
                break
            start = stop
        return results, latencies

    def _issue(self, requests: np.ndarray, ring: Ring | None, queue: int):
        generate = (requests["opcode"] == rings.OP_WRITE) & (requests["user_data"] != PREGENERATED)
        if not generate.any():
            return ring.run(requests) if ring is not None else rings.pio_run(requests)
        if ring is None:
            return rings.pio_run(requests, generate=generate, slots=self.write_slots)
        slots = self.ring_slots.get(queue)
        if slots is None:
            count = max(1, min(ring.queue_depth, RING_SLOT_BYTES // self.buffer_bytes))
            slots = self.ring_slots[queue] = Slots(self.buffer_bytes, count, prefault=False)  # only the slots used
        return ring.run(requests, generate=generate, slots=slots)

    def drain(self) -> None:
        """Wait for what is still in flight (nothing, after ``run``: hook for executors that keep requests)."""

    def phase_span(self, wrote: bool, read: bool, began_ns: int) -> None:
        """Extend the save (writes) and load (reads) phases' spans of this worker to a run or operation that
        began at ``began_ns`` and ended now."""
        ended = time.monotonic_ns()
        for phase, present in (("save", wrote), ("load", read)):
            if present:
                span = self.spans.get(phase)
                if span is None:
                    self.spans[phase] = [began_ns, ended]
                else:
                    span[1] = ended

    def close(self) -> None:
        if self.pipe_fds is not None:
            os.close(self.pipe_fds[0])
            os.close(self.pipe_fds[1])
            self.pipe_fds = None
        if self.spans:
            self.state.add_spans(self.plan.workers[self.index].rank, self.spans)
        if self.start_errors:
            self.state.add_timing(self.plan.workers[self.index].rank, self.start_errors, self.started_ns, self.waited)
        for ring in self.rings.values():
            if ring is not None:
                ring.close()
        self.rings.clear()
        for slots in self.ring_slots.values():
            slots.close()
        self.ring_slots.clear()
        self.write_view.release()
        self.read_view.release()
        if self.fresh_view is not None and self.fresh_buf is not None:
            self.fresh_view.release()
            self.fresh_buf.close()
        self.write_buf.close()
        self.read_buf.close()


__all__ = ["Executor", "Progress", "Segments", "Signals", "WorkerContext", "files_moved", "open_beneath"]
