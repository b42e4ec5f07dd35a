"""One run's shared state (``RunState``): descriptors by handle, completion events, counts, the first error;
and the ``Signals`` between processes replaying shares of one trace. Written by the engine's worker threads
(``replayer.engine``) under its lock; read by the engine once they have ended, to make the ``ReplayResult``.
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import Protocol

import numpy as np

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer.mapping import FileMapping

from .datapath import DATA_PATHS
from .optable import READ, WRITE
from .plan import ReplayPlan


class Signals(Protocol):
    """Completion signals between processes that replay shares of one trace (``replayer.distributed``).

    ``remote``: seq numbers other processes execute that operations here wait
    for; ``exported``: seq numbers executed here that other processes wait for.
    Called by the executor's worker threads: ``wait`` before an operation with
    a remote dependency (False when the run failed here or elsewhere; then
    ``failure`` says why), ``done`` after an exported operation completed,
    ``fail`` when this process's run failed (so the others stop waiting).
    """

    remote: frozenset[int]
    exported: frozenset[int]

    def wait(self, seq: int, stopped: threading.Event) -> bool: ...

    def done(self, seq: int) -> None: ...

    def fail(self, message: str) -> None: ...

    def failure(self) -> str: ...


class RunState:
    """Shared state of one run: OS fds by handle (a dict, and an array for runs), completion events
    (``signals`` for operations of other processes), totals, the first error."""

    def __init__(self, plan: ReplayPlan, signals: Signals | None = None) -> None:
        self.plan = plan
        self.signals = signals
        self.remote = signals.remote if signals is not None else frozenset()
        self.exported = signals.exported if signals is not None else frozenset()
        self.fds: dict[int, int] = {}
        handles = int(max(plan.ops.handle.max(initial=-1), plan.ops.source_handle.max(initial=-1))) + 1
        self.fd_array = np.full(max(handles, 1), -1, np.int32)
        self.mappings: dict[int, FileMapping] = {}
        self.events = {seq: threading.Event() for seq in plan.awaited if seq not in self.remote}
        self.lock = threading.Lock()
        self.latencies: list[np.ndarray] = []
        self.bytes_written = self.bytes_read = self.data_ops = self.metadata_ops = self.unaligned_ops = 0
        self.preallocated = 0
        self.copies_executed = self.copy_bytes = self.copy_ns = 0
        self.error: ReplayError | None = None
        self.stopped = threading.Event()
        self.exited = [threading.Event() for _ in plan.workers]  # set by each worker thread as it ends
        self.start_ns = 0
        self.notes: set[str] = set()
        self.kernel_copies = 0  # in-kernel copy calls made as recorded (engine.Executor._kernel_copy)
        self.kcopy_fallbacks = 0  # in-kernel copy rows replayed as a plain read or write instead
        self.path_counts = np.zeros((len(DATA_PATHS), 2), np.int64)  # (ops, bytes) per DATA_PATHS entry
        self.rank_first_ts: dict[int, int] = {}  # --timing original: each rank's first recorded start (ns)
        self.rank_last_ts: dict[int, int] = {}
        for worker in plan.workers:
            if worker.stop > worker.start:
                first, last = (
                    int(plan.ops.ts_ns[worker.start : worker.stop].min()),
                    int(plan.ops.ts_ns[worker.start : worker.stop].max()),
                )
                self.rank_first_ts[worker.rank] = min(first, self.rank_first_ts.get(worker.rank, first))
                self.rank_last_ts[worker.rank] = max(last, self.rank_last_ts.get(worker.rank, last))
        self.timing_errors: dict[int, list[np.ndarray]] = {}
        self.phase_spans: dict[str, dict[int, list[int]]] = {}  # phase -> rank -> [first start, last end] ns
        #: --timing original: the workers meet once set up (buffers, rings), and the paced clock starts then
        self.pace_barrier = threading.Barrier(len(plan.workers)) if plan.workers else None
        self.pace_start_ns = 0
        self.timing_started: dict[int, list[np.ndarray]] = {}
        self.timing_waited: dict[int, list[np.ndarray]] = {}
        self._direct_fds: set[int] = set()
        self._direct_array = np.zeros(0, np.int64)
        #: bytes moved per file of the plan's table (``ops.paths`` index): row 0 written, row 1 read
        self.file_bytes = np.zeros((2, max(len(plan.ops.paths), 1)), np.int64)

    def set_fd(self, handle: int, fd: int) -> None:
        self.fds[handle] = fd
        self.fd_array[handle] = fd
        self.mark_direct(fd)

    def pop_fd(self, handle: int) -> int:
        self.fd_array[handle] = -1
        fd = self.fds.pop(handle)
        if fd in self._direct_fds:
            with self.lock:
                self._direct_fds.discard(fd)
                self._direct_array = np.fromiter(self._direct_fds, np.int64, len(self._direct_fds))
        return fd

    def add_spans(self, rank: int, spans: dict[str, list[int]]) -> None:
        with self.lock:
            for phase, (first, last) in spans.items():
                mine = self.phase_spans.setdefault(phase, {}).get(rank)
                self.phase_spans[phase][rank] = (
                    [first, last] if mine is None else [min(mine[0], first), max(mine[1], last)]
                )

    def phase_figures(self) -> dict:
        """Per phase (save: the writes, load: the reads), per rank: bytes (the plan's, which each run moves
        exactly) and the time from its first such operation's start to its last one's end; the phase's time
        (first start to last end over all ranks), its throughput, and the slowest rank with its time."""
        t = self.plan.ops
        figures = {}
        for phase, kind in (("save", WRITE), ("load", READ)):
            spans = self.phase_spans.get(phase)
            if not spans:
                continue
            ranks = {}
            for worker in self.plan.workers:
                if worker.rank not in spans:
                    continue
                rows = slice(worker.start, worker.stop)
                moved = int(np.maximum(t.size[rows][t.kind[rows] == kind], 0).sum())
                entry = ranks.setdefault(str(worker.rank), {"bytes": 0, "elapsed_s": 0.0})
                entry["bytes"] += moved
                first, last = spans[worker.rank]
                entry["elapsed_s"] = (last - first) / 1e9
                entry["finished_s"] = (last - self.start_ns) / 1e9
            first = min(span[0] for span in spans.values())
            last = max(span[1] for span in spans.values())
            elapsed = (last - first) / 1e9
            total = sum(entry["bytes"] for entry in ranks.values())
            slowest = max(ranks, key=lambda r: ranks[r]["elapsed_s"])
            figures[phase] = {
                "bytes": total,
                "elapsed_s": elapsed,
                "throughput_bytes_per_s": total / elapsed if elapsed > 0 else None,
                "slowest_rank": slowest,
                "slowest_rank_s": ranks[slowest]["elapsed_s"],
                "ranks": ranks,
            }
        return figures

    def add_timing(self, rank: int, errors: list[int], started: list[int], waited: list[bool]) -> None:
        with self.lock:
            self.timing_errors.setdefault(rank, []).append(np.asarray(errors, np.int64))
            self.timing_started.setdefault(rank, []).append(np.asarray(started, np.int64))
            self.timing_waited.setdefault(rank, []).append(np.asarray(waited, bool))

    def timing_samples(self) -> dict[int, dict[str, np.ndarray | int]]:
        """``--timing original``'s measurements per rank, for ``timing_figures`` (and a distributed replay's
        job, whose ranks are paced in several processes): ``errors`` (actual minus target start, ns),
        ``started`` (from the paced clock's start, ns), ``waited`` (bool), ``recorded_ns`` (the rank's
        recorded window). Empty when nothing was paced."""
        return {
            rank: {
                "errors": np.concatenate(parts),
                "started": np.concatenate(self.timing_started[rank]),
                "waited": np.concatenate(self.timing_waited[rank]),
                "recorded_ns": self.rank_last_ts[rank] - self.rank_first_ts[rank],
            }
            for rank, parts in sorted(self.timing_errors.items())
        }

    def timing_figures(self) -> dict | None:
        """``timing_figures(self.timing_samples())``."""
        return timing_figures(self.timing_samples())

    def mark_direct(self, fd: int) -> None:
        """Note whether ``fd`` is open with O_DIRECT now (its status flags, fcntl(2) F_GETFL): after an open,
        a dup, or an F_SETFL."""
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        if direct != (fd in self._direct_fds):
            with self.lock:
                (self._direct_fds.add if direct else self._direct_fds.discard)(fd)
                self._direct_array = np.fromiter(self._direct_fds, np.int64, len(self._direct_fds))

    def is_direct(self, fd: int) -> bool:
        return fd in self._direct_fds

    def add_paths(
        self,
        uring: bool,
        fds: np.ndarray,
        moved: np.ndarray,
        first: np.ndarray,
        paths: np.ndarray,
        is_write: np.ndarray,
    ) -> None:
        """Count requests by data path: ``fds``/``moved``/``paths``/``is_write`` per request, ``first`` marks
        each operation's first request (an operation cut into pieces counts once)."""
        code = np.isin(fds, self._direct_array).astype(np.int64) + (2 if uring else 0)
        moved = np.asarray(moved, np.int64)
        n = len(DATA_PATHS)
        ops = np.bincount(code[first], minlength=n)
        moved_by = np.bincount(code, weights=moved, minlength=n).astype(np.int64)
        size = self.file_bytes.shape[1]
        written = np.bincount(paths[is_write], weights=moved[is_write], minlength=size).astype(np.int64)
        read = np.bincount(paths[~is_write], weights=moved[~is_write], minlength=size).astype(np.int64)
        with self.lock:
            self.path_counts[:, 0] += ops
            self.path_counts[:, 1] += moved_by
            self.file_bytes[0] += written[:size]
            self.file_bytes[1] += read[:size]

    def add_path_one(self, code: int, moved: int, path: int, is_write: bool) -> None:
        """Count one operation run as a system call (``code`` 0 buffered, 1 O_DIRECT) or through a mapping."""
        with self.lock:
            self.path_counts[code, 0] += 1
            self.path_counts[code, 1] += moved
            if path >= 0:
                self.file_bytes[0 if is_write else 1, path] += moved

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.add(text)

    def count_kernel_copy(self, fallback: bool) -> None:
        """One side (or both) of an in-kernel copy replayed by its call, or (``fallback``) as a read or write."""
        with self.lock:
            if fallback:
                self.kcopy_fallbacks += 1
            else:
                self.kernel_copies += 1

    def count_preallocated(self) -> None:
        with self.lock:
            self.preallocated += 1

    def wait(self, deps: tuple[int, ...]) -> bool:
        for seq in deps:
            if seq in self.remote:
                signals = self.signals
                assert signals is not None  # remote is empty without signals (__init__)
                if not signals.wait(seq, self.stopped):
                    self.fail(ReplayError(signals.failure()), tell_others=False)
                    return False
            else:
                self.events[seq].wait()
        return self.error is None

    def done(self, seq: int) -> None:
        event = self.events.get(seq)
        if event is not None:
            event.set()
            if seq in self.exported:
                assert self.signals is not None  # exported is empty without signals (__init__)
                self.signals.done(seq)

    def done_many(self, seqs: np.ndarray) -> None:
        if self.events:
            for seq in seqs.tolist():
                self.done(seq)

    def fail(self, error: ReplayError, tell_others: bool = True) -> None:
        with self.lock:
            first = self.error is None
            if first:
                self.error = error
        self.stopped.set()
        if self.pace_barrier is not None:
            self.pace_barrier.abort()  # workers waiting to start a paced run stop
        for event in self.events.values():
            event.set()
        if first and tell_others and self.signals is not None:
            self.signals.fail(str(error))

    def add_one(self, latency_ns: int, moved: int, is_write: bool) -> None:
        with self.lock:
            self.latencies.append(np.array([latency_ns], np.int64))
            self.data_ops += 1
            if is_write:
                self.bytes_written += moved
            else:
                self.bytes_read += moved

    def add_run(self, latencies: np.ndarray, written: int, read: int, data_ops: int, metadata_ops: int) -> None:
        with self.lock:
            self.latencies.append(np.asarray(latencies, np.int64))
            self.bytes_written += written
            self.bytes_read += read
            self.data_ops += data_ops
            self.metadata_ops += metadata_ops

    def add_copy(self, elapsed_ns: int, size_bytes: int) -> None:
        with self.lock:
            self.copies_executed += 1
            self.copy_bytes += size_bytes
            self.copy_ns += elapsed_ns

    def add_metadata(self) -> None:
        with self.lock:
            self.metadata_ops += 1

    def add_unaligned(self) -> None:
        with self.lock:
            self.unaligned_ops += 1


def timing_figures(samples: dict[int, dict[str, np.ndarray | int]]) -> dict | None:
    """``--timing original``'s accuracy from ``samples`` (``RunState.timing_samples``; a distributed replay's:
    every process's, merged): per-operation start error (actual minus recorded start, each rank's first
    operation at the paced clock's start, once every worker is set up) as median and p99 of its absolute
    value, as a share of the job's recorded I/O window (the longest rank's, first to last operation start)
    and in ns per rank; per rank, the replayed window against the recorded one (None under 1 ms). Where the
    error comes from: ``busy_share``, the share of operations whose thread was still busy past their
    recorded start (with the previous operation, slower than recorded, or with the replayer's own work
    between operations closer than it), and ``waited_error_p50_ns`` / ``waited_error_p99_ns``, the start
    error of the operations the thread waited for (the pacing's own: waking up, which a loaded CPU delays);
    per rank ``busy_ops``. None when nothing was paced."""
    if not samples:
        return None
    ranks, errors_all, waited_all = {}, [], []
    window_ns = max(int(sample["recorded_ns"]) for sample in samples.values())
    for rank, sample in sorted(samples.items()):
        errors = np.abs(np.asarray(sample["errors"], np.int64))
        waited = np.asarray(sample["waited"], bool)
        started = np.asarray(sample["started"], np.int64)
        errors_all.append(errors)
        waited_all.append(waited)
        recorded_ns = int(sample["recorded_ns"])
        replayed_ns = int(started.max() - started.min()) if len(started) else 0
        judged = recorded_ns >= 1_000_000  # a window under 1 ms (a launcher's few calls) has no error share
        ranks[str(rank)] = {
            "ops": int(len(errors)),
            "busy_ops": int((~waited).sum()),
            "recorded_window_s": recorded_ns / 1e9,
            "replayed_window_s": replayed_ns / 1e9,
            "window_error": (replayed_ns - recorded_ns) / recorded_ns if judged else None,
            "start_error_p50_ns": int(np.percentile(errors, 50)),
            "start_error_p99_ns": int(np.percentile(errors, 99)),
        }
    errors, waited = np.concatenate(errors_all), np.concatenate(waited_all)
    share = errors / window_ns if window_ns > 0 else np.zeros(0)
    woken = errors[waited]
    return {
        "start_error_share_p50": float(np.percentile(share, 50)) if len(share) else None,
        "start_error_share_p99": float(np.percentile(share, 99)) if len(share) else None,
        "busy_share": float((~waited).mean()) if len(waited) else None,
        "waited_error_p50_ns": int(np.percentile(woken, 50)) if len(woken) else None,
        "waited_error_p99_ns": int(np.percentile(woken, 99)) if len(woken) else None,
        "ranks": ranks,
    }


def merge_timing_samples(parts: list[dict[int, dict[str, np.ndarray | int]]]) -> dict[int, dict[str, np.ndarray | int]]:
    """Several processes' ``timing_samples`` as one job's: a rank paced in several processes (rows without a
    rank, shared out by process) gets all their operations, and the longest recorded window."""
    merged: dict[int, dict[str, np.ndarray | int]] = {}
    for part in parts:
        for rank, sample in part.items():
            mine = merged.get(rank)
            if mine is None:
                merged[rank] = dict(sample)
                continue
            for name in ("errors", "started", "waited"):
                mine[name] = np.concatenate([np.asarray(mine[name]), np.asarray(sample[name])])
            mine["recorded_ns"] = max(int(mine["recorded_ns"]), int(sample["recorded_ns"]))
    return merged


__all__ = ["RunState", "Signals", "merge_timing_samples", "timing_figures"]
