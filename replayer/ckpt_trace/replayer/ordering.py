"""Cross-thread ordering: the recorded happens-before of every descriptor that crosses workers.

A plan's workers are the recorded threads; each runs its operations in
recorded order, and waits (``deps``) only where the trace orders it against
another worker. The planner already makes every use of a handle wait for the
open or dup that created it. Engines also hand descriptors the other way:
torchsnapshot, fastsafetensors and DeepSpeed's aio handle open a file in one
thread, write or read it in a pool thread and close it in a third. Without
more, the close runs as soon as the open is done, and the pool thread's write
finds no descriptor ("descriptor was never opened", EBADF).

This module adds the missing edges, for handles used by more than one worker
only (a handle of one worker gains nothing; workers whose handles are
disjoint gain no dependency on each other). A handle's uses are the
operations on it (and a dup of it: a use of its source). Of these, *ordered*
uses are those whose effect depends on what ran before them on the
descriptor: close, munmap, lseek, fcntl, ftruncate, fallocate, fsync,
fdatasync, sync_file_range, msync, and reads and writes at the file position
(offset unknown to the trace). Then, in recorded (start-time) order:

- an ordered use waits for the last earlier use of the handle by each other
  worker since the previous ordered use, and for that one (so a close waits
  for every use before it: "every use before close"; a write at the file
  position for the uses that moved it; what the previous ordered use waited
  for is not repeated);
- any other use (a read or write at a known offset, a dup of the handle)
  waits for the last earlier ordered use by another worker (so a write after
  another thread's lseek or ftruncate runs after it);
- a read at a known offset also waits for each other worker's last earlier
  write (it reads what they wrote: a copy thread reading a file the main
  thread just wrote must not find it short).

Edges point from later to earlier recorded start times and each worker runs
its operations in that order, so the waits cannot deadlock. Uses at known
offsets between two ordered uses stay concurrent, as the kernel let them be.
A descriptor inherited through fork or shared by dup is one handle (or a
handle and its source) to the planner, so the same edges cover them;
close-on-exec descriptors are closed by the tracer's model at exec and their
later numbers are new handles.

Pure and columnar: per shared handle, sorted searches over its uses.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .optable import KIND, READ, WRITE, OpTable

__all__ = ["ORDERED_KINDS", "cross_worker_edges", "with_cross_worker_order"]

#: Operation kinds whose effect depends on every earlier use of their descriptor (and which every later
#: use depends on): they wait for each other worker's last use and are waited for by later uses.
ORDERED_KINDS = (
    "close",
    "munmap",
    "lseek",
    "fcntl",
    "ftruncate",
    "fallocate",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "msync",
)
_ORDERED = np.array([KIND[k] for k in ORDERED_KINDS], np.int8)
_DUP = KIND["dup"]


def _uses(table: OpTable) -> tuple[np.ndarray, np.ndarray]:
    """(row, handle) of every use of a handle: the operations on it, and each dup as a use of its source."""
    has = np.flatnonzero(table.handle >= 0)
    dups = np.flatnonzero((table.kind == _DUP) & (table.source_handle >= 0))
    if not len(dups):
        return has, table.handle[has].astype(np.int64)
    rows = np.concatenate([has, dups])
    handles = np.concatenate([table.handle[has], table.source_handle[dups]]).astype(np.int64)
    return rows, handles


def _shared(handles: np.ndarray, workers: np.ndarray) -> np.ndarray:
    """The distinct handles used by more than one worker (folding runs of one (handle, worker) first:
    a worker's calls on one file are few runs)."""
    if not len(handles):
        return np.zeros(0, np.int64)
    start = np.ones(len(handles), bool)
    start[1:] = (handles[1:] != handles[:-1]) | (workers[1:] != workers[:-1])
    h, w = handles[start], workers[start].astype(np.int64)
    size = int(h.max()) + 1
    low = np.full(size, np.iinfo(np.int64).max)
    high = np.full(size, -1, np.int64)
    np.minimum.at(low, h, w)
    np.maximum.at(high, h, w)
    return np.flatnonzero((high >= 0) & (low != high))


def cross_worker_edges(table: OpTable) -> tuple[np.ndarray, np.ndarray]:
    """(row, seq) pairs: row ``row`` of ``table`` must wait for operation ``seq`` of another worker, by the
    rules of the module docstring. Only handles used by more than one worker contribute. Pure."""
    rows, handles = _uses(table)
    shared = _shared(handles, table.worker[rows])
    if not len(shared):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    keep = np.isin(handles, shared)
    rows, handles = rows[keep], handles[keep]
    seq = table.seq[rows]
    order = np.lexsort((rows, seq, handles))  # by handle, then recorded order
    rows, handles, seq = rows[order], handles[order], seq[order]
    worker = table.worker[rows].astype(np.int64)
    kind = table.kind[rows]
    data = (kind == READ) | (kind == WRITE)
    # A dup listed under its source is an unordered use of it; the dup row listed under its own handle is
    # that handle's creation (as an open is).
    ordered = np.isin(kind, _ORDERED) | (data & (table.offset[rows] < 0) & ~table.mapped[rows])
    out_rows, out_seqs = [], []
    bounds = np.r_[0, np.flatnonzero(handles[1:] != handles[:-1]) + 1, len(handles)]
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        w, s, r, o = worker[lo:hi], seq[lo:hi], rows[lo:hi], ordered[lo:hi]
        at = np.flatnonzero(o)  # the ordered uses (positions in this handle's uses)
        if len(at):
            # The previous ordered use already waited for everything before it (or, by the waiter's own
            # worker, precedes it in program order): only the uses since count, so a chain of ordered uses
            # (writes at the file position from a pool) gains about one edge each, not one per worker.
            previous = np.r_[-1, at[:-1]]
            for u in _distinct_small(w):
                of_u = np.flatnonzero(w == u)
                mine = w[at] != u
                waiters, since = at[mine], previous[mine]
                last = np.searchsorted(of_u, waiters) - 1  # u's last use before each waiter
                hit = last >= 0
                hit[hit] = of_u[last[hit]] >= since[hit]  # (the previous ordered use itself, when u's)
                out_rows.append(r[waiters[hit]])
                out_seqs.append(s[of_u[last[hit]]])
        reads = np.flatnonzero(~o & (kind[lo:hi] == READ))
        if len(reads):  # a read waits for each other worker's last write before it (it reads what they wrote)
            writes = kind[lo:hi] == WRITE
            for u in _distinct_small(w[writes]):
                of_u = np.flatnonzero(writes & (w == u))
                waiters = reads[w[reads] != u]
                last = np.searchsorted(of_u, waiters) - 1
                hit = last >= 0
                out_rows.append(r[waiters[hit]])
                out_seqs.append(s[of_u[last[hit]]])
        free = np.flatnonzero(~o)
        if len(free) and len(at):
            last = np.searchsorted(at, free) - 1  # the last ordered use before each
            hit = last >= 0
            free, before = free[hit], at[last[hit]]
            other = w[before] != w[free]
            out_rows.append(r[free[other]])
            out_seqs.append(s[before[other]])
    if not out_rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return (np.concatenate(out_rows).astype(np.int64), np.concatenate(out_seqs).astype(np.int64))


def _distinct_small(values: np.ndarray) -> list[int]:
    """The distinct values of a small-alphabet array (the workers sharing one handle), ascending."""
    if not len(values):
        return []
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]].tolist()


def with_cross_worker_order(table: OpTable, awaited: frozenset[int] | set[int]) -> tuple[OpTable, frozenset[int]]:
    """``table`` with the edges of ``cross_worker_edges`` added to its deps and ``awaited`` with the seqs they
    name. A row that gains edges has its deps sorted, without repeats; the others keep theirs as they were.
    The same table and set where no handle is shared."""
    rows, seqs = cross_worker_edges(table)
    if not len(rows):
        return table, frozenset(awaited)
    n = len(table)
    touched = np.zeros(n, bool)
    touched[rows] = True
    old_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(table.dep_ptr))
    all_rows = np.concatenate([old_rows, rows])
    all_seqs = np.concatenate([table.dep_seq, seqs])
    # Within a touched row, by seq; within another, as it was (its entries' positions).
    place = np.where(touched[all_rows], all_seqs, np.arange(len(all_rows)))
    order = np.lexsort((place, all_rows))
    all_rows, all_seqs = all_rows[order], all_seqs[order]
    keep = np.ones(len(all_rows), bool)
    keep[1:] = (all_rows[1:] != all_rows[:-1]) | (all_seqs[1:] != all_seqs[:-1]) | ~touched[all_rows[1:]]
    all_rows, all_seqs = all_rows[keep], all_seqs[keep]
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(all_rows, minlength=n), out=dep_ptr[1:])
    new = dataclasses.replace(table, dep_ptr=dep_ptr, dep_seq=all_seqs.astype(np.int64))
    return new, frozenset(awaited) | frozenset(np.unique(seqs).tolist())
