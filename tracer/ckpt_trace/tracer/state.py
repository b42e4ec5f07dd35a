"""Per-process file-description state: syscall events in, trace rows out.

Both backends decode their raw events into ``SyscallEvent`` and feed them,
in the order their effects became visible (``effect_ns``), to ``TraceBuilder``. The builder keeps what the
kernel keeps (open(2), dup(2), fork(2), execve(2)):

- a process (thread group) owns a descriptor table, shared by its threads
  and, after ``clone(CLONE_FILES)``, by other processes too;
- a descriptor points to an open file description holding the path, the
  status flags and the file position; dup and fork share descriptions, so
  positions are shared exactly as the kernel shares them;
- execve closes close-on-exec descriptors; chdir/fchdir move the cwd that
  relative paths are resolved against.

Offsets of plain read/write/readv/writev come from the tracked position
(``offset_source='position'``), O_APPEND writes from the tracked file size
(``'append'``), positional calls from their argument (``'explicit'``); a
backend that reads the kernel's ``struct file`` supplies ``kernel_offset``
(``'kernel'``). Where none of these is known the offset is null with
``offset_source='unknown'`` rather than a guess.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ckpt_trace.formats import COLUMNS, table_from_columns
from ckpt_trace.formats import vocabulary as v
from ckpt_trace.formats.vocabulary import IO_URING_PATH, SPECIAL_PATHS, SPECIAL_PREFIXES
from ckpt_trace.ranges import covered_bytes

from . import syscalls as sc
from .renames import RenameFollower

if TYPE_CHECKING:
    from .datacalls import DataCalls
    from .ringcalls import RingCalls

#: Fewer read/write calls in a run than this go through ``TraceBuilder.feed`` one at a time: the columnar
#: path's fixed cost (a few numpy calls, tens of microseconds) is then more than it saves.
_DATA_RUN_MIN = 16


@dataclass(slots=True)
class SyscallEvent:
    """One completed system call as a backend decoded it.

    ``ts_ns`` is the entry time on the backend's clock, ``dur_ns`` the time
    to exit. ``args`` maps the names of ``syscalls.SYSCALLS[name].args`` to
    ints or path strings. ``pid`` is the thread group id when the backend
    knows it. ``size`` is the summed iov_len of vectored calls.
    ``kernel_offset`` is the file offset read from the kernel, when read.
    ``rank`` is the rank found in a new image's environment (execve only).
    """

    ts_ns: int
    dur_ns: int
    tid: int
    name: str
    args: dict[str, Any]
    ret: int
    pid: int | None = None
    comm: str | None = None
    size: int | None = None
    kernel_offset: int | None = None
    rank: int | None = None


# AuxEvent.kind (bcc_program.c's AUX_*): what the kernel reports beside system calls.
AUX_URING_REQ, AUX_URING_CREATE, AUX_AIO_SUBMIT, AUX_AIO_EVENT, AUX_FAULT, AUX_MAP_PAGES, AUX_DIRTY, AUX_RSS = range(
    1, 9
)
AUX_CACHE_INSERT = 9  # pages entering the page cache: kept apart as arrays (tracer.page_cache), never fed here


@dataclass(slots=True)
class AuxEvent:
    """A request or page event (not a system call), as the bcc backend decoded it (strace: libaio only).

    ``AUX_URING_REQ``: one io_uring request, ``ts_ns`` its submission and
    ``dur_ns`` the time to its completion, ``ctx`` its ring, ``fd`` the file
    descriptor (or fixed-file index when ``fixed``), ``offset`` (-1: the file
    position), ``length`` (bytes; the iovecs summed when ``vectored``, -1 if too
    many), ``res`` the completion's result, ``opcode``, ``flags`` (fsync or
    sync_file_range flags, fallocate mode), ``in_flight`` (this ring's requests
    in flight, this one included), ``addr`` the buffer, ``user_data``.
    ``AUX_URING_CREATE``: ring ``ctx`` set up as descriptor ``fd``.
    ``AUX_AIO_SUBMIT``: one iocb of io_submit (``ctx`` the aio context,
    ``obj`` the iocb's address, ``user_data`` its aio_data, ``opcode``
    IOCB_CMD_*, ``fd``, ``offset``, ``length``, ``addr``); ``AUX_AIO_EVENT``: one
    io_event of io_getevents (``ts_ns`` when reaped, ``obj``, ``user_data``,
    ``res``). ``AUX_FAULT``/``AUX_MAP_PAGES``/``AUX_DIRTY``: file pages
    ``index``..``last_index`` of inode ``ino`` (device ``dev``, kernel
    encoding; 0 when unknown) faulted in, mapped by fault-around, or dirtied (bcc widens them to the whole
    folios the kernel mapped or dirtied). ``AUX_RSS``: the process's file pages mapped changed to ``res``
    pages (kmem:rss_stat MM_FILEPAGES, exact; ``ctx`` the event's mm_id), ``addr`` the user fault that changed it
    (0: inside a traced system call).
    """

    kind: int
    ts_ns: int
    dur_ns: int = 0
    pid: int = 0
    tid: int = 0
    fd: int = -1
    ctx: int = 0
    obj: int = 0
    user_data: int = 0
    offset: int = 0
    length: int = 0
    res: int = 0
    addr: int = 0
    ino: int = 0
    dev: int = 0
    index: int = 0
    last_index: int = 0
    opcode: int = 0
    flags: int = 0
    in_flight: int = 0
    fixed: bool = False
    vectored: int = 0
    comm: str | None = None


@dataclass(slots=True)
class Mapping:
    """A file mapping of a process: ``address``/``length`` in memory, ``path`` and ``file_offset`` on disk,
    ``prot``/``flags`` as mmap(2) got them, the file's inode (``ino``, ``dev``; None when unknown)."""

    address: int
    length: int
    path: str
    file_offset: int
    prot: int
    flags: int
    ino: int | None
    dev: int | None


class Mappings:
    """A process's file mappings (``Mapping``), found by address range, start address or inode without a pass
    over all of them: a process maps hundreds of files (its libraries, a checkpoint's shards) and unmaps or
    faults thousands of times (anonymous munmaps included), and a pass per event was 0.3 s of a 2-rank DCP
    save's recording (2026-11-30). Lookups return mappings in the order they were added, as a list would.

    Kept: the mappings of at most ``long_bytes`` sorted by start address (``bisect``) with the longest of
    their lengths (any of them that overlaps [a, e) starts in [a - longest, e)); the few longer ones (a whole
    checkpoint file mapped) in a list of their own, passed over whole; and a table inode -> mappings."""

    __slots__ = ("_starts", "_items", "_long", "_seq", "_next", "_longest", "_by_inode", "_long_bytes")

    def __init__(self, long_bytes: int = 64 << 20) -> None:
        self._long_bytes = long_bytes
        self._starts: list[int] = []
        self._items: list[Mapping] = []
        self._long: list[Mapping] = []
        self._seq: dict[int, int] = {}  # id(mapping) -> when it was added
        self._next = 0
        self._longest = 0
        self._by_inode: dict[int | None, list[Mapping]] = {}

    def __len__(self) -> int:
        return len(self._items) + len(self._long)

    def __iter__(self):
        return iter(self._in_order(self._items + self._long))

    def _in_order(self, mappings: list[Mapping]) -> list[Mapping]:
        return sorted(mappings, key=lambda m: self._seq[id(m)]) if len(mappings) > 1 else mappings

    def append(self, mapping: Mapping) -> None:
        self._file(mapping)
        self._seq[id(mapping)] = self._next
        self._next += 1
        self._by_inode.setdefault(mapping.ino, []).append(mapping)

    def remove(self, mapping: Mapping) -> None:
        """Remove ``mapping`` (this object, not an equal one). Raises ValueError when it is not held."""
        if id(mapping) not in self._seq:
            raise ValueError("mapping not held")
        self._unfile(mapping)
        del self._seq[id(mapping)]
        same = self._by_inode[mapping.ino]
        del same[next(j for j, m in enumerate(same) if m is mapping)]
        if not same:
            del self._by_inode[mapping.ino]

    def move(self, mapping: Mapping, address: int, length: int) -> None:
        """Give ``mapping`` (held) a new range (mremap), keeping its place in the order of addition, as a list
        whose item changed would. Raises ValueError when it is not held."""
        if id(mapping) not in self._seq:
            raise ValueError("mapping not held")
        self._unfile(mapping)
        mapping.address, mapping.length = address, length
        self._file(mapping)

    def _file(self, mapping: Mapping) -> None:
        """Hold ``mapping`` by its address range: in ``_long``, or among ``_items`` by start address."""
        if mapping.length > self._long_bytes:
            self._long.append(mapping)
        else:
            i = bisect.bisect_right(self._starts, mapping.address)
            self._starts.insert(i, mapping.address)
            self._items.insert(i, mapping)
            self._longest = max(self._longest, mapping.length)  # a bound: never lowered

    def _unfile(self, mapping: Mapping) -> None:
        if mapping.length > self._long_bytes:
            del self._long[next(i for i, m in enumerate(self._long) if m is mapping)]
        else:
            lo = bisect.bisect_left(self._starts, mapping.address)
            i = next(i for i in range(lo, len(self._items)) if self._items[i] is mapping)
            del self._starts[i], self._items[i]

    def overlapping(self, address: int, length: int) -> list[Mapping]:
        """The mappings that share a byte with [address, address + length), in the order they were added."""
        end = address + length
        lo = bisect.bisect_left(self._starts, address - self._longest)
        hi = bisect.bisect_left(self._starts, end)
        found = [m for m in self._items[lo:hi] if address < m.address + m.length]
        found += [m for m in self._long if m.address < end and address < m.address + m.length]
        return self._in_order(found)

    def starting_at(self, address: int) -> Mapping | None:
        """The first mapping added of those that start at ``address``, or None."""
        lo, hi = bisect.bisect_left(self._starts, address), bisect.bisect_right(self._starts, address)
        found = self._in_order(self._items[lo:hi] + [m for m in self._long if m.address == address])
        return found[0] if found else None

    def of_inode(self, ino: int | None) -> list[Mapping]:
        """The mappings of inode ``ino``, in the order they were added."""
        return self._by_inode.get(ino, [])


@dataclass(slots=True)
class RingState:
    """An io_uring instance: its ``queue_id`` in the trace and its fixed-file table (index -> description)."""

    queue_id: int
    fixed: dict = field(default_factory=dict)


@dataclass(slots=True)
class AioState:
    """A Linux AIO context: its ``queue_id`` and the submitted iocbs not yet reaped (in submission order)."""

    queue_id: int
    pending: dict = field(default_factory=dict)  # submission number -> (iocb address or 0, row values)
    serial: int = 0


@dataclass(slots=True)
class Description:
    """An open file description (struct file): path, status flags, position."""

    path: str | None
    flags: int
    pos: int | None = 0


@dataclass(slots=True)
class FdTable:
    """A descriptor table (struct files_struct)."""

    fds: dict[int, Description] = field(default_factory=dict)
    cloexec: set[int] = field(default_factory=set)

    def copy(self) -> FdTable:
        return FdTable(dict(self.fds), set(self.cloexec))

    def install(self, fd: int, desc: Description, cloexec: bool) -> None:
        self.fds[fd] = desc
        if cloexec:
            self.cloexec.add(fd)
        else:
            self.cloexec.discard(fd)

    def remove(self, fd: int) -> Description | None:
        self.cloexec.discard(fd)
        return self.fds.pop(fd, None)


@dataclass(slots=True)
class Process:
    """A thread group: its descriptor table, cwd, rank and command name."""

    tgid: int
    table: FdTable
    cwd: str | None
    rank: int = -1
    comm: str | None = None
    mappings: Mappings = field(default_factory=Mappings)


def rank_from_environ(env: Iterable[str]) -> int | None:
    """Return the distributed rank named in ``KEY=VALUE`` strings, or None.

    Keys, first match wins: RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI),
    SLURM_PROCID (Slurm), PMI_RANK (MPICH).
    """
    values = {}
    for item in env:
        key, sep, value = item.partition("=")
        if sep:
            values[key] = value
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"):
        if key in values:
            try:
                return int(values[key])
            except ValueError:
                continue
    return None


_AT_ENTRY = frozenset({"clone", "clone3", "fork", "vfork", "close", "close_range"})


def effect_ns(ev: SyscallEvent | AuxEvent) -> int:
    """When a call's effect on descriptor state became visible to other threads.

    A descriptor exists from the moment open/dup *returns*, so calls take
    effect at their exit; but close frees the number at the start of the
    call (another thread's open may return it before close returns), and a
    child exists from inside its parent's clone, before any of its own calls,
    so those take effect at their entry.
    """
    if isinstance(ev, AuxEvent):
        return ev.ts_ns  # requests act on descriptors at submission; reaping and pages are instants
    return ev.ts_ns if ev.name in _AT_ENTRY else ev.ts_ns + max(ev.dur_ns, 0)


class EffectOrderFeeder:
    """Feeds a ``TraceBuilder`` events that arrive in chunks in about the order the calls ended (a BPF ring
    buffer is written at syscall exit; strace prints a call when it returns), re-ordered by ``effect_ns``
    with bounded memory.

    Call order: ``add(events)`` (or ``add_split``, whose read/write calls come as columns) for each chunk,
    in arrival order, then ``finish()``. Once
    ``release_every`` more events have arrived, those that took effect at least ``slack_ns`` before the
    latest end seen so far are fed (sorted; ties keep arrival order), so an event that arrives later with
    an earlier effect can only be one whose effect came more than ``slack_ns`` before its end (a close or
    a clone that long, a request in flight that long): it is still fed, and counted in ``late_events``.
    ``on_rows(builder)`` is called every ``release_every`` events fed, for the caller to take rows
    (``TraceBuilder.take_rows``). Called by ``tracer.record``.
    """

    def __init__(self, builder: TraceBuilder, *, slack_ns: int, on_rows=None, release_every: int = 4096) -> None:
        self.builder = builder
        self.release_every = max(1, release_every)  # events between two releases (each sorts), and between
        # two ``on_rows`` calls within one
        self.slack_ns = slack_ns
        self.on_rows = on_rows
        self.late_events = 0
        self._pending: list[tuple[int, int, SyscallEvent | AuxEvent]] = []  # sorted: (effect, arrival, event)
        self._fresh: list[tuple[int, int, SyscallEvent | AuxEvent]] = []  # arrived since the last release
        # Calls held as columns, per kind (DataCalls, RingCalls): (effect, arrival, calls) not yet fed
        self._calls: dict[type, list[tuple[np.ndarray, np.ndarray, Any]]] = {}
        self._arrived = self._released = 0
        self._latest_end = None
        self._last_fed = None

    def add(self, events: Iterable[SyscallEvent | AuxEvent]) -> None:
        """One chunk of events, in arrival order."""
        fresh = self._fresh
        for event in events:
            fresh.append((effect_ns(event), self._arrived, event))
            self._arrived += 1
            end = event.ts_ns + max(event.dur_ns, 0)
            if self._latest_end is None or end > self._latest_end:
                self._latest_end = end
        if self._latest_end is not None and self._arrived - self._released >= self.release_every:
            self._release(self._latest_end - self.slack_ns)

    def add_split(self, events: Sequence[SyscallEvent | AuxEvent], parts: list[tuple[Any, np.ndarray]]) -> None:
        """One chunk some of whose calls came as columns: ``parts`` are (calls, mask) pairs, ``calls`` a
        ``datacalls.DataCalls`` or a ``ringcalls.RingCalls`` and ``mask`` (bool, one per record of the chunk,
        in arrival order) true at the places of its rows; ``events`` fill the places no mask holds, in order.
        The same order of feeding as ``add`` of the whole chunk as events."""
        base = self._arrived
        fresh = self._fresh
        latest = self._latest_end
        count = len(parts[0][1]) if parts else len(events)
        taken = np.zeros(count, dtype=bool)
        for _, mask in parts:
            taken |= mask
        for event, arrival in zip(events, (np.flatnonzero(~taken) + base).tolist()):
            fresh.append((effect_ns(event), arrival, event))
            end = event.ts_ns + max(event.dur_ns, 0)
            if latest is None or end > latest:
                latest = end
        for calls, mask in parts:
            if not len(calls):
                continue
            effect, arrival = calls.effect_ns, np.flatnonzero(mask) + base
            order = np.lexsort((arrival, effect))  # each held chunk sorted once: a release takes its prefix
            self._calls.setdefault(type(calls), []).append((effect[order], arrival[order], calls.take(order)))
            end = int(np.max(calls.ts_ns + np.maximum(calls.dur_ns, 0)))  # the latest end among them
            if latest is None or end > latest:
                latest = end
        self._latest_end = latest
        self._arrived += count
        if latest is not None and self._arrived - self._released >= self.release_every:
            self._release(latest - self.slack_ns)

    def finish(self) -> None:
        """Feed what is left, then ``TraceBuilder.finish``."""
        self._release(None)
        self.builder.finish()
        if self.on_rows is not None:
            self.on_rows(self.builder)

    def _settle(self) -> None:
        """Merge the events that arrived since the last release into the sorted pending ones. Only the tail
        of the pending events that the new ones overlap is sorted again (events arrive in about effect
        order): the work per release is the new events, not the whole reorder window."""
        fresh, pending = self._fresh, self._pending
        if not fresh:
            return
        fresh.sort()  # (effect, arrival) tuples: the arrival number is unique, events are never compared
        if pending and fresh[0] < pending[-1]:
            at = bisect.bisect_right(pending, fresh[0])
            fresh.extend(pending[at:])
            del pending[at:]
            fresh.sort()  # two sorted runs: timsort merges them in one pass
        pending.extend(fresh)
        self._fresh = []

    def _release(self, watermark: int | None) -> None:
        self._released = self._arrived
        self._settle()
        pending = self._pending
        count = len(pending) if watermark is None else bisect.bisect_right(pending, (watermark, math.inf))
        ready = pending[:count]
        del pending[:count]
        if self._calls:
            self._release_with_calls(ready, watermark)
            return
        feed = self.builder.feed
        for i, (effect, _, event) in enumerate(ready):
            if self._last_fed is not None and effect < self._last_fed:
                self.late_events += 1
            else:
                self._last_fed = effect
            feed(event)
            if i % self.release_every == self.release_every - 1 and self.on_rows is not None:
                self.on_rows(self.builder)  # a long release hands rows over as it goes
        if ready and self.on_rows is not None:
            self.on_rows(self.builder)

    def _ready_calls(self, kind: type, watermark: int | None):
        """The held calls of ``kind`` that took effect at or before ``watermark`` (all of them if None),
        sorted by (effect, arrival), as (effect, arrival, calls). Each held chunk is sorted: its ready rows are
        a prefix, the rest stays held as it is (views, not copies), so a release sorts only what it feeds."""
        parts, held = [], []
        chunks = self._calls[kind]
        empty = chunks[0][2].take(slice(0, 0))
        for chunk in chunks:
            effect, arrival, calls = chunk
            count = len(effect) if watermark is None else int(np.searchsorted(effect, watermark, side="right"))
            if count == len(effect):
                parts.append(chunk)
            elif not count:
                held.append(chunk)  # nothing ready: kept as it is (no copy of its columns' views)
            else:
                parts.append((effect[:count], arrival[:count], calls.take(slice(0, count))))
                held.append((effect[count:], arrival[count:], calls.take(slice(count, None))))
        if held:
            self._calls[kind] = held
        else:
            del self._calls[kind]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), empty
        effect = np.concatenate([e for e, _, _ in parts])
        arrival = np.concatenate([a for _, a, _ in parts])
        calls = kind.concat([c for _, _, c in parts])
        step, tie = np.diff(effect), np.diff(arrival)
        if ((step > 0) | ((step == 0) & (tie > 0))).all():  # chunks arrive about in order: often already sorted
            return effect, arrival, calls
        order = np.lexsort((arrival, effect))
        return effect[order], arrival[order], calls.take(order)

    def _release_with_calls(self, ready: list, watermark: int | None) -> None:
        """``_release``'s feeding when calls are held as columns: the ready events and calls merged by
        (effect, arrival), each run of one kind's calls between two other items fed at once (``calls.feed``:
        ``TraceBuilder.feed_data``, ``feed_ring``)."""
        streams = [
            stream for stream in (self._ready_calls(kind, watermark) for kind in list(self._calls)) if len(stream[0])
        ]
        event_effect = np.array([item[0] for item in ready], dtype=np.int64)
        if self._last_fed is not None:  # each is sorted: only what comes before the last fed can be late
            for effect in [event_effect, *(stream[0] for stream in streams)]:
                self.late_events += int(np.count_nonzero(effect < self._last_fed))
        tops = [int(x[-1]) for x in [event_effect, *(stream[0] for stream in streams)] if len(x)]
        if tops:
            self._last_fed = max(tops) if self._last_fed is None else max(self._last_fed, *tops)
        if len(streams) == 1:
            runs = self._runs_among_events(ready, event_effect, streams[0])
        else:
            runs = self._runs_merged(ready, event_effect, streams)
        builder, on_rows, every = self.builder, self.on_rows, self.release_every
        since = 0  # events and calls fed since ``on_rows`` was last called
        for source, start, stop in runs:
            if source < 0:
                for _, _, event in ready[start:stop]:
                    builder.feed(event)
                    since += 1
                    if since >= every and on_rows is not None:  # a long release hands rows over as it goes
                        on_rows(builder)
                        since = 0
                continue
            streams[source][2].take(slice(start, stop)).feed(builder)
            since += stop - start
            if since >= every and on_rows is not None:
                on_rows(builder)
                since = 0
        if on_rows is not None and (ready or streams):
            on_rows(builder)

    @staticmethod
    def _runs_among_events(ready: list, event_effect: np.ndarray, stream) -> list[tuple[int, int, int]]:
        """(source, start, stop) runs in feeding order of the ready events (source -1) and one kind's calls
        (source 0): where each event goes among the calls, by (effect, arrival), with a binary search each."""
        effect, arrival, calls = stream
        at = np.searchsorted(effect, event_effect, side="left")
        ties = np.searchsorted(effect, event_effect, side="right")
        for i in np.flatnonzero(ties > at).tolist():
            at[i] += int(np.searchsorted(arrival[at[i] : ties[i]], ready[i][1]))
        runs, fed = [], 0
        for i, place in enumerate(at.tolist()):
            if place > fed:
                runs.append((0, fed, place))
                fed = place
            if runs and runs[-1][0] < 0:
                runs[-1] = (-1, runs[-1][1], i + 1)
            else:
                runs.append((-1, i, i + 1))
        if fed < len(calls):
            runs.append((0, fed, len(calls)))
        return runs

    @staticmethod
    def _runs_merged(ready: list, event_effect: np.ndarray, streams: list) -> list[tuple[int, int, int]]:
        """(source, start, stop) runs in feeding order of the ready events (source -1) and several kinds'
        calls (source: index into ``streams``), all merged by (effect, arrival)."""
        effect = np.concatenate([event_effect, *(s[0] for s in streams)])
        arrival = np.concatenate([np.array([item[1] for item in ready], dtype=np.int64), *(s[1] for s in streams)])
        source = np.concatenate(
            [
                np.full(len(ready), -1, dtype=np.int64),
                *(np.full(len(s[0]), k, dtype=np.int64) for k, s in enumerate(streams)),
            ]
        )
        order = source[np.lexsort((arrival, effect))]
        if not len(order):
            return []
        breaks = np.flatnonzero(order[1:] != order[:-1]) + 1
        fed = {-1: 0, **{k: 0 for k in range(len(streams))}}
        runs = []
        for start, stop in zip(np.r_[0, breaks].tolist(), np.r_[breaks, len(order)].tolist()):
            k = int(order[start])
            runs.append((k, fed[k], fed[k] + stop - start))
            fed[k] += stop - start
        return runs


def _row_op(name: str) -> str:
    """The trace op of system call ``name``, for the handlers that write a row for every call they get
    (each call routed to them has an op in ``syscalls.SYSCALLS``). Raises ValueError for a call without one."""
    op = sc.SYSCALLS[name].op
    if op is None:
        raise ValueError(f"{name} has no trace op in syscalls.SYSCALLS, so it cannot be written as a row")
    return op


def normalize_path(path: str) -> str:
    """Absolute path with '.', '..' and repeated slashes folded (no symlink lookup)."""
    norm = posixpath.normpath(path)
    return "/" + norm.lstrip("/") if norm.startswith("/") else norm


class TraceBuilder:
    """Turns time-ordered ``SyscallEvent`` objects into trace rows.

    Call order: construct with the root process's state, ``feed`` every
    event in ``effect_ns`` order (``feed_all`` sorts for you), then read
    ``columns()`` and the counters. Called by both tracer backends.
    """

    def __init__(
        self,
        *,
        start_ns: int,
        root_pid: int | None = None,
        cwd: str | None = None,
        inherited_fds: dict[int, str] | None = None,
        root_rank: int = -1,
        path_filters: Iterable[str] = (),
        keep_special: bool = False,
    ) -> None:
        self.start_ns = start_ns
        self.path_filters = tuple(path_filters)
        self.keep_special = keep_special
        self.procs: dict[int, Process] = {}
        self.sizes: dict[str, int] = {}
        self.untracked_fd_ops = 0
        self.filtered_ops = 0
        # With path filters, rows of files that may yet be renamed into them are held (``tracer.renames``).
        self.follow = RenameFollower(self.path_filters) if self.path_filters else None
        self.rings: dict[int, RingState] = {}  # kernel ctx -> ring (bcc)
        self.ring_of_fd: dict[tuple[int, int], RingState] = {}  # (tgid, ring fd) -> ring
        self.aio: dict[tuple[int, int], AioState] = {}  # (tgid, aio context id) -> context
        self.queues = 0
        self.unattributed = {"requests": 0, "pages": 0}
        self.unreaped_requests = 0
        self.mapped_uncovered_bytes: int | None = None  # set by finish() when file-page counts came (bcc)
        self._file_rss: dict[tuple[int, int], int] = {}  # (tgid, mm id) -> bytes of file pages mapped
        self._mapped: dict[int, list] = {}  # id(Mapping) -> [mapping, bytes the kernel mapped, ranges rows cover]
        self._pmd_maps: dict[int, tuple] = {}  # tid -> (process, mapping, fault AuxEvent): a PMD map not yet shown
        self.page_bytes = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._root_template = Process(
            tgid=-1,
            table=FdTable({fd: Description(path, 0, None) for fd, path in (inherited_fds or {}).items()}),
            cwd=cwd,
            rank=root_rank,
        )
        if root_pid is not None:
            self._adopt_root(root_pid)
        self._new_columns()
        self.rows_taken = 0
        # Rows that came as Arrow tables (``tracer.datacalls``), with the column lists sealed before each, in
        # emission order: (table or columns, rows).
        self._blocks: list[tuple[pa.Table | dict[str, list], int]] = []
        self._block_rows = 0

    def _new_columns(self) -> None:
        """Empty columns, with the bound appends ``_append_row`` fills them through."""
        self._cols: dict[str, list] = {name: [] for name in _COLUMN_NAMES}
        self._fixed_appends = tuple(self._cols[name].append for name in _FIXED_COLUMNS)
        self._optional_appends = tuple(self._cols[name].append for name in _OPTIONAL_COLUMNS)

    def _adopt_root(self, pid: int) -> Process:
        proc = self._root_template
        proc.tgid = pid
        self.procs[pid] = proc
        return proc

    # -- public --------------------------------------------------------
    def feed_all(self, events: Iterable[SyscallEvent]) -> None:
        """Feed events in the order their effects became visible (see ``effect_ns``)."""
        for event in sorted(events, key=effect_ns):
            self.feed(event)

    def feed(self, ev: SyscallEvent | AuxEvent) -> None:
        if isinstance(ev, AuxEvent):
            proc = self._process_of_ids(ev.tid, ev.pid)
            _AUX_HANDLERS[ev.kind](self, proc, ev)
            return
        if self._pmd_maps:
            self._pmd_row(ev.tid)
        proc = self._process_of(ev)
        handler = _HANDLERS.get(ev.name)
        if handler is not None:
            handler(self, proc, ev)

    def feed_data(self, calls: DataCalls) -> None:
        """Feed a run of read/write-family calls held as columns (``tracer.datacalls``), in effect order with
        no other event between them: the same state and rows as ``feed`` of each, without a Python object
        per call where the run is long enough to gain (``_DATA_RUN_MIN`` calls)."""
        if len(calls) < _DATA_RUN_MIN:
            for event in calls.events():
                self.feed(event)
            return
        from .datacalls import feed_data  # datacalls builds on this module

        feed_data(self, calls)

    def feed_ring(self, calls: RingCalls) -> None:
        """Feed a run of ``io_uring_enter`` calls and io_uring requests held as columns
        (``tracer.ringcalls``), in effect order with no other event between them: the same state and rows as
        ``feed`` of each, as columns where the run is long enough to gain (``_DATA_RUN_MIN``)."""
        if len(calls) < _DATA_RUN_MIN:
            for event in calls.events():
                self.feed(event)
            return
        from .ringcalls import feed_ring  # ringcalls builds on this module

        feed_ring(self, calls)

    def finish(self) -> None:
        """After the last event: requests submitted and never reaped are rows too (``ret`` -ECANCELED),
        counted in ``unreaped_requests``."""
        for (tgid, _), state in self.aio.items():
            self._unreaped(self.procs.get(tgid), state)
        for tid in list(self._pmd_maps):
            self._pmd_row(tid)
        if self._file_rss:
            self.mapped_uncovered_bytes = self._uncovered()
        if self.follow is not None:
            self.follow.finish()  # candidates never renamed into the filters: left out

    def _unreaped(self, proc: Process | None, state: AioState) -> None:
        """Rows (``ret`` -ECANCELED) of the iocbs of ``state`` submitted and never seen reaped."""
        for _, values in list(state.pending.values()):
            self.unreaped_requests += 1
            values.pop("desc", None)
            self._emit_request(proc, values, ret=-125, end_ns=values["ts_ns"])
        state.pending.clear()

    def columns(self) -> dict[str, list]:
        """The rows emitted since the last ``take_rows`` (all of them, if never taken), column by column."""
        if not self._blocks:
            return self._cols
        return {name: values for name, values in self._held_table().to_pydict().items() if name in self._cols}

    @property
    def num_rows(self) -> int:
        """Rows held now (emitted since the last ``take_rows``)."""
        return len(self._cols["ts_ns"]) + self._block_rows

    def take_rows(self) -> dict[str, list] | pa.Table:
        """Hand over the rows held (in emission order) and start afresh: the builder's memory is then its
        descriptor state, not the trace (``tracer.spool``). ``rows_taken`` counts what was handed over.
        Column lists (column -> values), or a table of ``formats.SCHEMA`` once rows came as tables."""
        taken = self._held_table() if self._blocks else self._cols
        self.rows_taken += self.num_rows
        self._blocks, self._block_rows = [], 0
        self._new_columns()
        return taken

    def add_block(self, table: pa.Table) -> None:
        """Rows already in ``formats.SCHEMA``'s columns and types, emitted after every row so far."""
        if self._cols["ts_ns"]:
            self._blocks.append((self._cols, len(self._cols["ts_ns"])))
            self._block_rows += len(self._cols["ts_ns"])
            self._new_columns()
        self._blocks.append((table, table.num_rows))
        self._block_rows += table.num_rows

    def _held_table(self) -> pa.Table:
        parts = [part if isinstance(part, pa.Table) else table_from_columns(part) for part, _ in self._blocks]
        if self._cols["ts_ns"]:
            parts.append(table_from_columns(self._cols))
        return pa.concat_tables(parts)

    # -- processes -----------------------------------------------------
    def _process_of(self, ev: SyscallEvent) -> Process:
        return self._process_of_ids(ev.tid, ev.pid)

    def _process_of_ids(self, tid: int, pid: int | None) -> Process:
        """The process of thread ``tid`` (of thread group ``pid``, when known), adopted on first sight."""
        proc = self.procs.get(tid)
        if proc is not None:
            return proc
        if self._root_template.tgid == -1:
            proc = self._adopt_root(pid if pid is not None else tid)
            self.procs[tid] = proc
            return proc
        if pid is not None and pid in self.procs:
            proc = self.procs[pid]
        else:
            proc = Process(tgid=pid if pid is not None else tid, table=FdTable(), cwd=None)
            self.procs[proc.tgid] = proc
        self.procs[tid] = proc
        return proc

    def _resolve(self, proc: Process, dirfd: int | None, path: str | None) -> str | None:
        if path is None:
            return None
        if path.startswith("/"):
            return normalize_path(path)
        if dirfd is None or dirfd == sc.AT_FDCWD:
            base = proc.cwd
        else:
            desc = proc.table.fds.get(dirfd)
            base = desc.path if desc else None
        if base is None or not base.startswith("/"):
            return None
        return normalize_path(posixpath.join(base, path)) if path else normalize_path(base)

    def _keep(self, path: str | None, op: str) -> bool:
        """Path filters, when given, decide alone (so ``--path-filter /dev/shm/ckpt/`` keeps an in-memory
        checkpoint); without them, pseudo files and non-files are left out. io_uring instance rows stay."""
        ring = op in v.RING_OPS
        if path is None:
            return ring
        if self.path_filters:
            return path.startswith(self.path_filters) or (ring and path == IO_URING_PATH)
        if not self.keep_special and (path in SPECIAL_PATHS or path.startswith(SPECIAL_PREFIXES)):
            return ring and path == IO_URING_PATH
        return True

    def _emit(self, proc: Process, ev: SyscallEvent, op: str, **values: Any) -> None:
        self._emit_row(proc, ev.ts_ns, ev.dur_ns, ev.tid, ev.comm, ev.name, op, ev.ret, values)

    def _emit_row(
        self,
        proc: Process,
        ts_ns: int,
        dur_ns: int,
        tid: int,
        comm: str | None,
        syscall: str,
        op: str,
        ret: int,
        values: dict[str, Any],
    ) -> None:
        """``_emit`` from the row's own values, without an event object (``_emit_request``)."""
        path, new_path = values.get("path"), values.get("new_path")
        if not (self._keep(path, op) or (new_path is not None and self._keep(new_path, op))):
            if not (
                self.follow is not None
                and self.follow.hold(
                    new_path if op == "rename" else path,
                    self._held_row(proc, SyscallEvent(ts_ns, dur_ns, tid, syscall, {}, ret, comm=comm), op, values),
                )
            ):
                self.filtered_ops += 1
            return
        get = values.get
        self._append_row(
            proc, ts_ns, dur_ns, tid, comm, syscall, op, ret, get("interface", v.SYSCALL),
            *[get(name) for name in _OPTIONAL_COLUMNS],
        )  # fmt: skip

    def _append_row(
        self,
        proc: Process,
        ts_ns: int,
        dur_ns: int,
        tid: int,
        comm: str | None,
        syscall: str,
        op: str,
        ret: int,
        interface: str,
        fd: int | None,
        path: str | None,
        new_path: str | None,
        offset: int | None,
        offset_source: str | None,
        size: int | None,
        flags: int | None,
        iov_count: int | None,
        queue_id: int | None,
        request_id: int | None,
        in_flight: int | None,
        address: int | None,
        prot: int | None,
    ) -> None:
        """Append one row: the columns every row has, then ``_OPTIONAL_COLUMNS``' values in their order (the
        handlers of frequent rows call it directly, without a keyword dict)."""
        ts_, dur_, pid_, tid_, comm_, rank_, syscall_, op_, ret_, interface_ = self._fixed_appends
        ts = ts_ns - self.start_ns
        ts_(ts if ts > 0 else 0)
        dur_(dur_ns if dur_ns > 0 else 0)
        pid_(proc.tgid)
        tid_(tid)
        comm_(comm or proc.comm)
        rank_(proc.rank)
        syscall_(syscall)
        op_(op)
        ret_(ret)
        interface_(interface)
        fd_, path_, new_path_, offset_, source_, size_, flags_, iov_, queue_, request_, flight_, address_, prot_ = (
            self._optional_appends
        )
        fd_(fd)
        path_(path)
        new_path_(new_path)
        offset_(offset)
        source_(offset_source)
        size_(size)
        flags_(flags)
        iov_(iov_count)
        queue_(queue_id)
        request_(request_id)
        flight_(in_flight)
        address_(address)
        prot_(prot)

    def _emit_data(
        self,
        proc: Process,
        ev: SyscallEvent,
        op: str,
        fd: int,
        path: str | None,
        offset: int | None,
        offset_source: str,
        size: int | None,
        iov_count: int | None,
    ) -> None:
        """``_emit`` of a read or write row, its values positional: the row most traces are made of, without
        a keyword dict (``_append_row``)."""
        if not self._keep(path, op):
            if not (
                self.follow is not None
                and self.follow.hold(
                    path,
                    self._held_row(
                        proc,
                        ev,
                        op,
                        {
                            "fd": fd,
                            "path": path,
                            "offset": offset,
                            "offset_source": offset_source,
                            "size": size,
                            "iov_count": iov_count,
                        },
                    ),
                )
            ):
                self.filtered_ops += 1
            return
        self._append_row(
            proc, ev.ts_ns, ev.dur_ns, ev.tid, ev.comm, ev.name, op, ev.ret, v.SYSCALL,
            fd, path, None, offset, offset_source, size, None, iov_count, None, None, None, None, None,
        )  # fmt: skip

    def _held_row(self, proc: Process, ev: SyscallEvent, op: str, values: dict) -> dict:
        """The row ``_emit`` would append, as a dict (for ``tracer.renames`` to hold)."""
        row = {name: values.get(name) for name in _OPTIONAL_COLUMNS}
        row.update(
            ts_ns=max(0, ev.ts_ns - self.start_ns),
            dur_ns=max(0, ev.dur_ns),
            pid=proc.tgid,
            tid=ev.tid,
            comm=ev.comm or proc.comm,
            rank=proc.rank,
            syscall=ev.name,
            op=op,
            ret=ev.ret,
            interface=values.get("interface", v.SYSCALL),
        )
        return row

    def _release_held(self, rows: list[dict]) -> None:
        """Rows a rename brought into the path filters, appended (the spool sorts by start time)."""
        cols = self._cols
        for row in rows:
            for name in _COLUMN_NAMES:
                cols[name].append(row.get(name))

    @property
    def filtered_rows(self) -> int:
        """Rows the path filters left out (so far, and held rows given up or dropped)."""
        follow = self.follow
        return self.filtered_ops + (follow.dropped + follow.given_up if follow is not None else 0)

    def _desc(self, proc: Process, fd: int) -> Description | None:
        desc = proc.table.fds.get(fd)
        if desc is None:
            self.untracked_fd_ops += 1
        return desc

    def _grow(self, path: str | None, end: int) -> None:
        if path is not None and path in self.sizes:
            self.sizes[path] = max(self.sizes[path], end)

    # -- handlers ------------------------------------------------------
    def _on_open(self, proc: Process, ev: SyscallEvent) -> None:
        flags = sc.O_CREAT | sc.O_WRONLY | sc.O_TRUNC if ev.name == "creat" else int(ev.args.get("flags", 0))
        path = self._resolve(proc, ev.args.get("dirfd"), ev.args.get("path"))
        if ev.ret >= 0 and self.follow is not None and flags & (sc.O_ACCMODE | sc.O_CREAT):
            self.follow.start(path)  # written or created outside the filters: may yet be renamed into them
        if ev.ret >= 0:
            proc.table.install(ev.ret, Description(path, flags, 0), bool(flags & sc.O_CLOEXEC))
            writable = flags & sc.O_ACCMODE != 0
            if path is not None and ((flags & sc.O_TRUNC and writable) or flags & sc.O_EXCL and flags & sc.O_CREAT):
                self.sizes[path] = 0
        self._emit(proc, ev, "open", fd=ev.ret if ev.ret >= 0 else None, path=path, flags=flags)

    def _on_close(self, proc: Process, ev: SyscallEvent) -> None:
        fd = int(ev.args["fd"])
        desc = proc.table.fds.get(fd) if ev.ret < 0 else proc.table.remove(fd)
        if desc is None:
            self.untracked_fd_ops += 1
            return
        self._emit(proc, ev, "close", fd=fd, path=desc.path)

    def _on_close_range(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.ret != 0:
            return
        first, last, flags = int(ev.args["fd"]), int(ev.args["max_fd"]) & 0xFFFFFFFF, int(ev.args.get("flags", 0))
        for fd in [fd for fd in proc.table.fds if first <= fd <= last]:
            if flags & sc.CLOSE_RANGE_CLOEXEC:
                proc.table.cloexec.add(fd)
            else:
                proc.table.remove(fd)

    def _data_offset(self, desc: Description, ev: SyscallEvent, is_write: bool) -> tuple[int | None, str, bool]:
        """Return (offset, offset_source, uses_file_position) of a read or write."""
        explicit = ev.args.get("offset") if ev.name in sc.POSITIONAL else None
        if explicit is not None and int(explicit) == -1 and ev.name in ("preadv2", "pwritev2"):
            explicit = None
        appends = is_write and (desc.flags & sc.O_APPEND or int(ev.args.get("rwflags", 0)) & sc.RWF_APPEND)
        if ev.kernel_offset is not None and explicit is None:
            return ev.kernel_offset, v.OFFSET_KERNEL, True
        if appends:
            size = self.sizes.get(desc.path) if desc.path is not None else None
            return size, (v.OFFSET_APPEND if size is not None else v.OFFSET_UNKNOWN), explicit is None
        if explicit is not None:
            return int(explicit), v.OFFSET_EXPLICIT, False
        return desc.pos, (v.OFFSET_POSITION if desc.pos is not None else v.OFFSET_UNKNOWN), True

    def _on_data(self, proc: Process, ev: SyscallEvent) -> None:
        fd = int(ev.args["fd"])
        desc = self._desc(proc, fd)
        if desc is None:
            return
        is_write = sc.SYSCALLS[ev.name].op == "write"
        offset, source, uses_pos = self._data_offset(desc, ev, is_write)
        moved = max(ev.ret, 0)
        if uses_pos and ev.ret >= 0:
            desc.pos = offset + moved if offset is not None else None
        if is_write and offset is not None and moved:
            self._grow(desc.path, offset + moved)
        vectored = ev.name in sc.VECTORED
        size = ev.size if vectored else int(ev.args.get("count", 0))
        self._emit_data(
            proc,
            ev,
            "write" if is_write else "read",
            fd,
            desc.path,
            offset,
            source,
            size,
            int(ev.args["iov_count"]) if vectored else None,
        )

    def _on_lseek(self, proc: Process, ev: SyscallEvent) -> None:
        fd = int(ev.args["fd"])
        desc = self._desc(proc, fd)
        if desc is None:
            return
        if ev.ret >= 0:
            desc.pos = ev.ret
            if int(ev.args.get("whence", 0)) == sc.SEEK_END and desc.path is not None:
                self.sizes[desc.path] = ev.ret - int(ev.args.get("offset", 0))
        self._emit(
            proc,
            ev,
            "lseek",
            fd=fd,
            path=desc.path,
            offset=ev.ret if ev.ret >= 0 else None,
            offset_source=v.OFFSET_POSITION if ev.ret >= 0 else None,
        )

    def _on_fd_only(self, proc: Process, ev: SyscallEvent) -> None:
        fd = int(ev.args["fd"])
        desc = self._desc(proc, fd)
        if desc is None:
            return
        op = _row_op(ev.name)
        values: dict[str, Any] = {"fd": fd, "path": desc.path}
        if ev.name == "sync_file_range":
            values.update(
                offset=int(ev.args["offset"]),
                offset_source=v.OFFSET_EXPLICIT,
                size=int(ev.args["count"]),
                flags=int(ev.args.get("flags", 0)),
            )
        elif ev.name == "ftruncate":
            values["size"] = int(ev.args["length"])
            if ev.ret == 0 and desc.path is not None:
                self.sizes[desc.path] = int(ev.args["length"])
        elif ev.name == "fallocate":
            offset, length, mode = int(ev.args["offset"]), int(ev.args["count"]), int(ev.args.get("mode", 0))
            values.update(offset=offset, offset_source=v.OFFSET_EXPLICIT, size=length, flags=mode)
            if ev.ret == 0 and not mode & sc.FALLOC_FL_KEEP_SIZE:
                self._grow(desc.path, offset + length)
        self._emit(proc, ev, op, **values)

    def _rename_open_files(self, old: str, new: str) -> None:
        prefix = old + "/"
        seen: set[int] = set()
        for proc in self.procs.values():
            for desc in proc.table.fds.values():
                if id(desc) in seen or desc.path is None:
                    continue
                seen.add(id(desc))
                if desc.path == old:
                    desc.path = new
                elif desc.path.startswith(prefix):
                    desc.path = new + desc.path[len(old) :]
        if old in self.sizes:
            self.sizes[new] = self.sizes.pop(old)

    def _on_rename(self, proc: Process, ev: SyscallEvent) -> None:
        old = self._resolve(proc, ev.args.get("dirfd"), ev.args.get("path"))
        new = self._resolve(proc, ev.args.get("dirfd2"), ev.args.get("path2"))
        if ev.ret == 0 and old is not None and new is not None:
            self._rename_open_files(old, new)
            if self.follow is not None:
                self._release_held(self.follow.rename(old, new))
        flags = ev.args.get("flags")
        self._emit(proc, ev, "rename", path=old, new_path=new, flags=int(flags) if flags is not None else None)

    def _on_link(self, proc: Process, ev: SyscallEvent) -> None:
        """link(2)/linkat(2): a second name of a file; symlink(2)/symlinkat(2): a symbolic link whose content
        (``path``) is kept exactly as passed, never resolved (a relative target is relative to the link)."""
        new = self._resolve(proc, ev.args.get("dirfd2"), ev.args.get("path2"))
        if ev.name.startswith("symlink"):
            self._emit(proc, ev, "symlink", path=ev.args.get("path"), new_path=new)
            return
        old = self._resolve(proc, ev.args.get("dirfd"), ev.args.get("path"))
        if ev.ret == 0 and self.follow is not None and self.follow.is_candidate(old):
            self.follow.start(new)
        flags = ev.args.get("flags")
        self._emit(proc, ev, "link", path=old, new_path=new, flags=int(flags) if flags else None)

    def _on_path_only(self, proc: Process, ev: SyscallEvent) -> None:
        path = self._resolve(proc, ev.args.get("dirfd"), ev.args.get("path"))
        op = _row_op(ev.name)
        if op == "unlink" and ev.ret == 0 and path is not None:
            self.sizes.pop(path, None)
        if self.follow is not None and ev.ret == 0:
            if op == "mkdir":
                self.follow.start(path)
            else:  # a candidate unlinked: its rows, and this one, are left out
                self.follow.unlink(path)
        if op == "mkdir":
            self._emit(proc, ev, op, path=path)
        else:  # (rmdir(2) is unlinkat's AT_REMOVEDIR)
            flags = v.AT_REMOVEDIR if ev.name == "rmdir" else int(ev.args.get("flags", 0))
            self._emit(proc, ev, op, path=path, flags=flags or None)

    def _dup(self, proc: Process, ev: SyscallEvent, cloexec: bool, syscall_flags: int | None) -> None:
        fd = int(ev.args["fd"])
        desc = self._desc(proc, fd)
        if desc is None:
            return
        if ev.ret >= 0:
            proc.table.install(ev.ret, desc, cloexec)
        self._emit(proc, ev, "dup", fd=fd, path=desc.path, flags=syscall_flags)

    def _on_dup(self, proc: Process, ev: SyscallEvent) -> None:
        flags = int(ev.args.get("flags", 0)) if ev.name == "dup3" else None
        self._dup(proc, ev, bool(flags and flags & sc.O_CLOEXEC), flags)

    def _on_fcntl(self, proc: Process, ev: SyscallEvent) -> None:
        cmd, fd, arg = int(ev.args["cmd"]), int(ev.args["fd"]), int(ev.args.get("arg", 0))
        if cmd in (sc.F_DUPFD, sc.F_DUPFD_CLOEXEC):
            self._dup(proc, ev, cmd == sc.F_DUPFD_CLOEXEC, None)
        elif cmd == sc.F_SETFD and ev.ret == 0 and fd in proc.table.fds:
            if arg & sc.FD_CLOEXEC:
                proc.table.cloexec.add(fd)
            else:
                proc.table.cloexec.discard(fd)
        elif cmd == sc.F_SETFL:
            desc = self._desc(proc, fd)
            if desc is None:
                return
            if ev.ret == 0:
                desc.flags = (desc.flags & ~sc.SETFL_MASK) | (arg & sc.SETFL_MASK)
            self._emit(proc, ev, "fcntl", fd=fd, path=desc.path, flags=arg)

    def _on_ioctl(self, proc: Process, ev: SyscallEvent) -> None:
        cmd, fd = int(ev.args["cmd"]) & 0xFFFFFFFF, int(ev.args["fd"])
        if cmd in (sc.FICLONE, sc.FICLONERANGE):
            self._on_clone_ioctl(proc, ev, cmd, fd)
            return
        if ev.ret != 0 or fd not in proc.table.fds:
            return
        if cmd == sc.FIOCLEX:
            proc.table.cloexec.add(fd)
        elif cmd == sc.FIONCLEX:
            proc.table.cloexec.discard(fd)

    # -- in-kernel copies: a read row on the source, a write row on the destination ------------------------
    def _copy_file(self, proc: Process, fd: int) -> Description | None:
        """The description a copy reads or writes through, when it is a file a row may name (not a pipe,
        socket or pseudo file, which the trace leaves out)."""
        desc = proc.table.fds.get(fd)
        if desc is None or desc.path is None:
            return None
        if not self.keep_special and (desc.path in SPECIAL_PATHS or desc.path.startswith(SPECIAL_PREFIXES)):
            return None
        return desc

    def _copy_rows(
        self, proc: Process, ev: SyscallEvent, interface: str, sides: tuple, size: int | None, moved: int
    ) -> None:
        """Rows of one in-kernel copy of ``moved`` bytes. ``sides``: (fd, description or None, offset argument,
        moves the file position) for the source, then the destination; an offset argument of None means the
        file position (-2: unreadable, the offset unknown), which advances by ``moved``."""
        (src_fd, src, _, _), (dst_fd, dst, _, _) = sides
        if src is None and dst is None:
            self.untracked_fd_ops += 1
            return
        for (fd, desc, explicit, moves), op, other in zip(sides, (v.READ, v.WRITE), (dst, src)):
            if desc is None:
                continue
            if explicit is None:
                if op == v.WRITE and desc.flags & sc.O_APPEND:
                    offset = self.sizes.get(desc.path)
                    source = v.OFFSET_APPEND if offset is not None else v.OFFSET_UNKNOWN
                else:
                    offset, source = desc.pos, (v.OFFSET_POSITION if desc.pos is not None else v.OFFSET_UNKNOWN)
                if moves and ev.ret >= 0:
                    desc.pos = offset + moved if offset is not None else None
            elif explicit < 0:
                offset, source = None, v.OFFSET_UNKNOWN
            else:
                offset, source = explicit, v.OFFSET_EXPLICIT
            if op == v.WRITE and offset is not None and moved:
                self._grow(desc.path, offset + moved)
            self._emit(
                proc,
                ev,
                op,
                fd=fd,
                path=desc.path,
                new_path=other.path if other is not None else None,
                offset=offset,
                offset_source=source,
                size=size,
                interface=interface,
            )

    def _on_copy(self, proc: Process, ev: SyscallEvent) -> None:
        """sendfile(2), copy_file_range(2), splice(2): ``count`` bytes asked, ``ret`` moved."""
        src_fd, dst_fd = int(ev.args["in_fd"]), int(ev.args["out_fd"])
        src, dst = self._copy_file(proc, src_fd), self._copy_file(proc, dst_fd)
        src_offset, dst_offset = ev.args.get("in_offset"), ev.args.get("out_offset")
        sides = ((src_fd, src, src_offset, True), (dst_fd, dst, dst_offset, True))
        self._copy_rows(proc, ev, ev.name, sides, int(ev.args.get("count", 0)), max(ev.ret, 0))

    def _on_clone_ioctl(self, proc: Process, ev: SyscallEvent, cmd: int, fd: int) -> None:
        """ioctl FICLONE (the whole source file, ``arg`` its descriptor) and FICLONERANGE (a range): a reflink,
        recorded as a copy with interface ``ficlone`` and ``ret`` the ioctl's (0). ``size``: the range's
        length, or for a whole file (length 0) the source's size when the trace knows it, else null."""
        if cmd == sc.FICLONE:
            src_fd, src_offset, length, dst_offset = int(ev.args.get("arg", -1)), 0, 0, 0
        elif "src_fd" in ev.args:
            src_fd, src_offset = int(ev.args["src_fd"]), int(ev.args["src_offset"])
            length, dst_offset = int(ev.args["src_length"]), int(ev.args["dest_offset"])
        else:
            src_fd, src_offset, length, dst_offset = -1, None, 0, None
        src, dst = self._copy_file(proc, src_fd), self._copy_file(proc, fd)
        if length == 0 and src is not None and src_offset is not None:
            known = self.sizes.get(src.path) if src.path is not None else None
            length = known - src_offset if known is not None and known >= src_offset else None
        sides = (
            (src_fd, src, -2 if src_offset is None else src_offset, False),
            (fd, dst, -2 if dst_offset is None else dst_offset, False),
        )
        self._copy_rows(proc, ev, v.FICLONE, sides, length, (length or 0) if ev.ret == 0 else 0)

    def _on_io_uring(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.name == "io_uring_setup":
            state = None
            if ev.ret >= 0:
                proc.table.install(ev.ret, Description(IO_URING_PATH, sc.O_CLOEXEC, None), True)
                state = self.ring_of_fd.get((proc.tgid, ev.ret)) or self._new_ring(proc, ev.ret)
            self._emit(
                proc,
                ev,
                "io_uring_setup",
                fd=ev.ret if ev.ret >= 0 else None,
                path=IO_URING_PATH,
                queue_id=state.queue_id if state else None,
            )
            return
        fd = int(ev.args["fd"])
        desc = proc.table.fds.get(fd)
        state = self.ring_of_fd.get((proc.tgid, fd))
        ring = {"fd": fd, "path": desc.path if desc else None, "queue_id": state.queue_id if state else None}
        if ev.name == "io_uring_register":
            if ev.ret >= 0 and state is not None:
                self._register_files(proc, state, ev)
            self._emit(proc, ev, "io_uring_register", flags=int(ev.args.get("opcode", 0)), **ring)
            return
        if self._keep(ring["path"], "io_uring_enter"):  # the frequent row: appended without a keyword dict
            self._append_row(
                proc, ev.ts_ns, ev.dur_ns, ev.tid, ev.comm, ev.name, "io_uring_enter", ev.ret, v.SYSCALL,
                fd, ring["path"], None, None, None, int(ev.args.get("to_submit", 0)), int(ev.args.get("flags", 0)),
                None, ring["queue_id"], None, None, None, None,
            )  # fmt: skip
            return
        self._emit(
            proc,
            ev,
            "io_uring_enter",
            flags=int(ev.args.get("flags", 0)),
            size=int(ev.args.get("to_submit", 0)),
            **ring,
        )

    def _new_queue(self) -> int:
        self.queues += 1
        return self.queues - 1

    def _new_ring(self, proc: Process, fd: int) -> RingState:
        state = RingState(self._new_queue())
        self.ring_of_fd[(proc.tgid, fd)] = state
        return state

    def _register_files(self, proc: Process, state: RingState, ev: SyscallEvent) -> None:
        """IORING_REGISTER_FILES (2) / FILES2 (13) fill the fixed-file table; FILES_UPDATE (6) / UPDATE2 (14)
        replace entries from ``files_offset``; UNREGISTER_FILES (3) empties it (include/uapi/linux/io_uring.h)."""
        opcode, fds = int(ev.args.get("opcode", 0)), ev.args.get("fds") or []
        if opcode in (2, 13):
            state.fixed = {}
        elif opcode == 3:
            state.fixed = {}
            return
        elif opcode not in (6, 14):
            return
        first = int(ev.args.get("files_offset", 0)) if opcode in (6, 14) else 0
        for index, fd in enumerate(fds):
            desc = proc.table.fds.get(int(fd)) if int(fd) >= 0 else None
            if desc is None:
                state.fixed.pop(first + index, None)
            else:
                state.fixed[first + index] = desc

    # -- io_uring requests, libaio iocbs (request rows) --------------------------------
    def _on_uring_create(self, proc: Process, ev: AuxEvent) -> None:
        state = self.ring_of_fd.get((proc.tgid, ev.fd)) or self._new_ring(proc, ev.fd)
        self.rings[ev.ctx] = state

    def _request_offset(self, desc: Description, offset: int, moved: int, is_write: bool) -> tuple[int | None, str]:
        """(offset, offset_source) of a request: its own offset, or the file position when it asked for -1."""
        if offset >= 0:
            return offset, v.OFFSET_EXPLICIT
        if is_write and desc.flags & sc.O_APPEND:
            size = self.sizes.get(desc.path) if desc.path is not None else None
            return size, (v.OFFSET_APPEND if size is not None else v.OFFSET_UNKNOWN)
        position = desc.pos
        if position is not None and moved >= 0:
            desc.pos = position + moved
        return position, (v.OFFSET_POSITION if position is not None else v.OFFSET_UNKNOWN)

    def _on_uring_request(self, proc: Process, ev: AuxEvent) -> None:
        state = self.rings.get(ev.ctx)
        if state is None:
            state = self.rings[ev.ctx] = RingState(self._new_queue())
        desc = state.fixed.get(ev.fd) if ev.fixed else proc.table.fds.get(ev.fd)
        if desc is None:
            self.unattributed["requests"] += 1
            return
        name, op, syscall = _uring_kind(ev.opcode, ev.flags & 1)
        if op in v.DATA_OPS and ev.offset >= 0 and self._keep(desc.path, op):  # the frequent row, appended as is
            if op == v.WRITE and ev.res > 0:
                self._grow(desc.path, ev.offset + ev.res)
            self._append_row(
                proc, ev.ts_ns, ev.dur_ns, ev.tid, ev.comm, syscall, op, ev.res, v.IO_URING,
                None if ev.fixed else ev.fd, desc.path, None, ev.offset, v.OFFSET_EXPLICIT,
                ev.length if ev.length >= 0 else None, None, ev.vectored or None, state.queue_id,
                _signed64(ev.user_data), ev.in_flight, _signed64(ev.addr), None,
            )  # fmt: skip
            return
        values = {
            "ts_ns": ev.ts_ns,
            "tid": ev.tid,
            "comm": ev.comm,
            "syscall": syscall,
            "op": op,
            "fd": None if ev.fixed else ev.fd,
            "path": desc.path,
            "interface": v.IO_URING,
            "queue_id": state.queue_id,
            "request_id": _signed64(ev.user_data),
            "in_flight": ev.in_flight,
        }
        if op in v.DATA_OPS:
            offset, source = self._request_offset(desc, ev.offset, ev.res, op == v.WRITE)
            values.update(
                offset=offset,
                offset_source=source,
                size=ev.length if ev.length >= 0 else None,
                address=_signed64(ev.addr),
                iov_count=ev.vectored or None,
            )
            if op == v.WRITE and offset is not None and ev.res > 0:
                self._grow(desc.path, offset + ev.res)
        else:
            values.update(offset=ev.offset, offset_source=v.OFFSET_EXPLICIT, size=ev.length, flags=ev.flags)
            if op == v.FALLOCATE and ev.res == 0 and not ev.flags & sc.FALLOC_FL_KEEP_SIZE:
                self._grow(desc.path, ev.offset + ev.length)
        self._emit_request(proc, values, ret=ev.res, end_ns=ev.ts_ns + ev.dur_ns)

    def _emit_request(self, proc: Process | None, values: dict, *, ret: int, end_ns: int) -> None:
        if proc is None:
            return
        ts_ns, tid, syscall, op = values.pop("ts_ns"), values.pop("tid"), values.pop("syscall"), values.pop("op")
        comm = values.pop("comm", None)  # ``values`` is the request's own, used once
        self._emit_row(proc, ts_ns, max(0, end_ns - ts_ns), tid, comm, syscall, op, ret, values)

    def _on_io_setup(self, proc: Process, ev: SyscallEvent) -> None:
        state = None
        if ev.ret == 0 and ev.args.get("ctx_id") is not None:
            state = AioState(self._new_queue())
            self.aio[(proc.tgid, int(ev.args["ctx_id"]))] = state
        self._emit(
            proc,
            ev,
            "io_setup",
            size=int(ev.args.get("nr_events", 0)),
            interface=v.LIBAIO,
            queue_id=state.queue_id if state else None,
        )

    def _aio_state(self, proc: Process, ctx: int) -> AioState:
        key = (proc.tgid, ctx)
        if key not in self.aio:
            self.aio[key] = AioState(self._new_queue())  # a context set up before the recording started
        return self.aio[key]

    def _on_aio_call(self, proc: Process, ev: SyscallEvent) -> None:
        state = self.aio.get((proc.tgid, int(ev.args.get("ctx", 0))))
        op = _row_op(ev.name)
        if op == v.IO_DESTROY and state is not None and ev.ret == 0:
            self.aio.pop((proc.tgid, int(ev.args["ctx"])))
            self._unreaped(proc, state)  # their completions can no longer be seen
        self._emit(
            proc,
            ev,
            op,
            interface=v.LIBAIO,
            queue_id=state.queue_id if state else None,
            size=int(ev.args["nr"]) if "nr" in ev.args else None,
        )

    def _on_aio_submit(self, proc: Process, ev: AuxEvent) -> None:
        state = self._aio_state(proc, ev.ctx)
        desc = proc.table.fds.get(ev.fd)
        name = v.AIO_OPCODES.get(ev.opcode, str(ev.opcode))
        op = _AIO_OPS.get(name, "other")
        values = {
            "ts_ns": ev.ts_ns,
            "tid": ev.tid,
            "comm": ev.comm,
            "syscall": f"aio:{name}",
            "op": op,
            "fd": ev.fd,
            "path": desc.path if desc else None,
            "interface": v.LIBAIO,
            "queue_id": state.queue_id,
            "request_id": _signed64(ev.user_data),
            "in_flight": len(state.pending) + 1,
            "desc": desc,
        }
        if op in v.DATA_OPS:
            values.update(
                offset=ev.offset,
                offset_source=v.OFFSET_EXPLICIT,
                address=_signed64(ev.addr),
                size=None if ev.vectored else ev.length,
                iov_count=ev.length if ev.vectored else None,
            )
        if desc is None:
            self.unattributed["requests"] += 1
        state.serial += 1
        state.pending[state.serial] = (ev.obj, values)  # in submission order: the oldest match is the first

    def _on_aio_event(self, proc: Process, ev: AuxEvent) -> None:
        state = self._aio_state(proc, ev.ctx)
        key = self._aio_match(state, ev.obj, ev.user_data)
        if key is None:
            return
        values = state.pending.pop(key)[1]
        desc = values.pop("desc")
        if desc is None:
            return
        if values["op"] == v.WRITE and values.get("offset") is not None and ev.res > 0:
            self._grow(desc.path, values["offset"] + ev.res)
        self._emit_request(proc, values, ret=ev.res, end_ns=ev.ts_ns)

    @staticmethod
    def _aio_match(state: AioState, obj: int, data: int):
        """The pending iocb an io_event answers: the oldest carrying both its iocb address and its aio_data
        (bcc reads both; a program may reuse an iocb, or an aio_data, while an earlier one is in flight),
        else, where submissions carry no address (strace prints iocbs, not their addresses), the oldest
        carrying its aio_data."""
        data = _signed64(data)
        by_data = None
        for key, (address, values) in state.pending.items():
            if values["request_id"] != data:
                continue
            if address and address == obj:
                return key
            if by_data is None and not address:
                by_data = key
        return by_data

    # -- file mappings ----------------------------------------------------------------------
    def _mapping_row(
        self, proc: Process, ev: SyscallEvent, op: str, mapping: Mapping, address: int, length: int, **extra
    ) -> None:
        offset = mapping.file_offset + max(0, address - mapping.address)
        self._emit(
            proc,
            ev,
            op,
            path=mapping.path,
            offset=offset,
            offset_source=v.OFFSET_EXPLICIT,
            size=length,
            address=address,
            interface=v.MMAP,
            prot=mapping.prot,
            **extra,
        )

    def _on_mmap(self, proc: Process, ev: SyscallEvent) -> None:
        fd, flags = int(ev.args.get("fd", -1)), int(ev.args.get("mmap_flags", 0))
        if fd < 0 or flags & MAP_ANONYMOUS:
            return
        desc = self._desc(proc, fd)
        if desc is None or desc.path is None:
            return
        length, offset, prot = int(ev.args.get("length", 0)), int(ev.args.get("offset", 0)), int(ev.args.get("prot", 0))
        if ev.ret >= 0:
            proc.mappings.append(
                Mapping(ev.ret, length, desc.path, offset, prot, flags, ev.args.get("ino"), ev.args.get("dev"))
            )
        self._emit(
            proc,
            ev,
            "mmap",
            fd=fd,
            path=desc.path,
            offset=offset,
            offset_source=v.OFFSET_EXPLICIT,
            size=length,
            flags=flags,
            prot=prot,
            address=_signed64(ev.ret) if ev.ret >= 0 else None,
            interface=v.MMAP,
        )

    def _on_munmap(self, proc: Process, ev: SyscallEvent) -> None:
        address, length = int(ev.args.get("addr", 0)), int(ev.args.get("length", 0))
        for mapping in proc.mappings.overlapping(address, length):
            start, end = max(address, mapping.address), min(address + length, mapping.address + mapping.length)
            self._mapping_row(proc, ev, "munmap", mapping, start, end - start)
            if ev.ret != 0:
                continue
            proc.mappings.remove(mapping)
            if start > mapping.address:  # the part before the hole stays mapped
                proc.mappings.append(
                    Mapping(
                        mapping.address,
                        start - mapping.address,
                        mapping.path,
                        mapping.file_offset,
                        mapping.prot,
                        mapping.flags,
                        mapping.ino,
                        mapping.dev,
                    )
                )
            if end < mapping.address + mapping.length:  # and the part after it
                proc.mappings.append(
                    Mapping(
                        end,
                        mapping.address + mapping.length - end,
                        mapping.path,
                        mapping.file_offset + end - mapping.address,
                        mapping.prot,
                        mapping.flags,
                        mapping.ino,
                        mapping.dev,
                    )
                )

    def _on_msync_madvise(self, proc: Process, ev: SyscallEvent) -> None:
        address, length = int(ev.args.get("addr", 0)), int(ev.args.get("length", 0))
        op = _row_op(ev.name)
        for mapping in proc.mappings.overlapping(address, length):
            start, end = max(address, mapping.address), min(address + length, mapping.address + mapping.length)
            self._mapping_row(
                proc, ev, op, mapping, start, end - start, flags=int(ev.args.get("flags", ev.args.get("advice", 0)))
            )

    def _on_mremap(self, proc: Process, ev: SyscallEvent) -> None:
        address = int(ev.args.get("addr", 0))
        mapping = proc.mappings.starting_at(address)
        if mapping is None:
            return
        new_length = int(ev.args.get("new_length", 0))
        if ev.ret >= 0:
            proc.mappings.move(mapping, ev.ret, new_length)
        self._mapping_row(proc, ev, "mremap", mapping, mapping.address, new_length)

    def _on_pages(self, proc: Process, ev: AuxEvent) -> None:
        """Pages faulted in, mapped by fault-around, or dirtied through a mapping of the process."""
        if self._pmd_maps:
            self._pmd_row(ev.tid, ev)
        dirty = ev.kind == AUX_DIRTY
        first, last = ev.index, max(ev.index, ev.last_index)
        page = self.page_bytes
        for mapping in proc.mappings.of_inode(ev.ino):
            if ev.dev and mapping.dev and mapping.dev != ev.dev:
                continue
            if dirty and not (mapping.flags & MAP_SHARED and mapping.prot & PROT_WRITE):
                continue
            start = max(first * page, mapping.file_offset)
            end = min((last + 1) * page, mapping.file_offset + mapping.length)
            if start >= end:
                continue
            size = end - start
            event = SyscallEvent(ev.ts_ns, 0, ev.tid, "", {}, size, pid=proc.tgid, comm=ev.comm)
            event.name = {AUX_FAULT: v.PAGE_FAULT, AUX_MAP_PAGES: v.FAULT_AROUND, AUX_DIRTY: v.PAGE_DIRTY}[ev.kind]
            self._mapped_entry(mapping)[2].append((start, end))
            self._emit(
                proc,
                event,
                v.WRITE if dirty else v.READ,
                path=mapping.path,
                offset=start,
                offset_source=v.OFFSET_PAGE,
                size=size,
                interface=v.MMAP,
                address=mapping.address + start - mapping.file_offset,
            )
            if dirty:
                self._grow(mapping.path, end)
            return
        self.unattributed["pages"] += 1

    def _mapped_entry(self, mapping: Mapping) -> list:
        entry = self._mapped.get(id(mapping))
        if entry is None:
            entry = self._mapped[id(mapping)] = [mapping, 0, []]
        return entry

    def _on_rss(self, proc: Process, ev: AuxEvent) -> None:
        """A change of the process's file pages mapped: a rise in a user fault is what the kernel mapped for the
        mapping holding the fault's address (the first change seen of a process only sets the base)."""
        key = (proc.tgid, ev.ctx)
        before = self._file_rss.get(key)
        self._file_rss[key] = ev.res * self.page_bytes
        ev = AuxEvent(
            ev.kind,
            ev.ts_ns,
            pid=ev.pid,
            tid=ev.tid,
            ctx=ev.ctx,
            res=ev.res * self.page_bytes,
            addr=ev.addr,
            comm=ev.comm,
        )
        if self._pmd_maps:
            self._pmd_row(ev.tid)
        if before is None or ev.res <= before or not ev.addr:
            return
        for mapping in proc.mappings.overlapping(ev.addr, 1):
            if mapping.address <= ev.addr < mapping.address + mapping.length:
                if self._keep(mapping.path, v.READ):
                    self._mapped_entry(mapping)[1] += ev.res - before
                    if ev.res - before == self.page_bytes * self.page_bytes // 8:  # one PMD (2 MiB of 4 KiB pages)
                        self._pmd_maps[ev.tid] = (proc, mapping, ev)
                return

    def _pmd_row(self, tid: int, pages: AuxEvent | None = None) -> None:
        """A fault that mapped one PMD's worth of file pages with no page event of its own (filemap_map_pages
        maps a PMD-sized folio whole through do_set_pmd and returns before its tracepoint) becomes a
        ``page_fault`` row of the PMD-aligned range holding the fault's address, unless the thread's next
        event is a page event covering that address (fault-around of as many small pages)."""
        held = self._pmd_maps.pop(tid, None)
        if held is None:
            return
        proc, mapping, ev = held
        pmd = self.page_bytes * self.page_bytes // 8
        start = max(ev.addr - ev.addr % pmd, mapping.address)
        end = min(start + pmd, mapping.address + mapping.length)
        offset = mapping.file_offset + start - mapping.address
        if (
            pages is not None
            and pages.ino == mapping.ino
            and pages.index * self.page_bytes <= offset + ev.addr - start <= pages.last_index * self.page_bytes
        ):
            return
        event = SyscallEvent(ev.ts_ns, 0, ev.tid, v.PAGE_FAULT, {}, end - start, pid=proc.tgid, comm=ev.comm)
        self._emit(
            proc,
            event,
            v.READ,
            path=mapping.path,
            offset=offset,
            offset_source=v.OFFSET_PAGE,
            size=end - start,
            interface=v.MMAP,
            address=start,
        )
        self._mapped_entry(mapping)[2].append((offset, offset + end - start))

    def _uncovered(self) -> int:
        """Bytes the kernel mapped into the kept file mappings beyond what their page rows cover, summed over
        mappings (each mapping's rows merged first)."""
        return sum(max(0, mapped - covered_bytes(ranges)) for _, mapped, ranges in self._mapped.values())

    def _on_clone(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.ret <= 0:
            return
        child = ev.ret
        flags = int(ev.args.get("clone_flags", 0)) if ev.name in ("clone", "clone3") else 0
        if flags & sc.CLONE_THREAD:
            self.procs[child] = proc
            return
        table = proc.table if flags & sc.CLONE_FILES else proc.table.copy()
        self.procs[child] = Process(tgid=child, table=table, cwd=proc.cwd, rank=proc.rank, comm=proc.comm)

    def _on_execve(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.ret != 0:
            return
        table = proc.table.copy()
        for fd in list(table.cloexec):
            table.remove(fd)
        proc.table = table
        path = ev.args.get("path")
        proc.comm = ev.comm or (os.path.basename(path)[:15] if path else proc.comm)
        if ev.rank is not None:
            proc.rank = ev.rank

    def _on_chdir(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.ret != 0:
            return
        if ev.name == "chdir":
            proc.cwd = self._resolve(proc, None, ev.args.get("path"))
        else:
            desc = proc.table.fds.get(int(ev.args["fd"]))
            proc.cwd = desc.path if desc else None


_COPY_COLUMNS = ("device", "memory_kind")  # copy rows only: the GPU capture's (tracer.gpu), null here
# Filled when the trace is written (tracer.page_cache, by RowSpool.annotate), null here.
_LATER_COLUMNS = ("cold_bytes",)
_COLUMN_NAMES = tuple(name for name in COLUMNS if name not in _COPY_COLUMNS + _LATER_COLUMNS)
# ``_append_row``'s parameters after ``interface``, in this order.
_OPTIONAL_COLUMNS = (
    "fd",
    "path",
    "new_path",
    "offset",
    "offset_source",
    "size",
    "flags",
    "iov_count",
    "queue_id",
    "request_id",
    "in_flight",
    "address",
    "prot",
)
# What ``_emit`` fills for every row, in its order (bound appends, ``_new_columns``).
_FIXED_COLUMNS = ("ts_ns", "dur_ns", "pid", "tid", "comm", "rank", "syscall", "op", "ret", "interface")


def _handlers() -> dict:
    table = {}
    by_op = {
        "open": TraceBuilder._on_open,
        "close": TraceBuilder._on_close,
        "read": TraceBuilder._on_data,
        "write": TraceBuilder._on_data,
        "lseek": TraceBuilder._on_lseek,
        "fsync": TraceBuilder._on_fd_only,
        "fdatasync": TraceBuilder._on_fd_only,
        "sync_file_range": TraceBuilder._on_fd_only,
        "ftruncate": TraceBuilder._on_fd_only,
        "fallocate": TraceBuilder._on_fd_only,
        "rename": TraceBuilder._on_rename,
        "unlink": TraceBuilder._on_path_only,
        "link": TraceBuilder._on_link,
        "symlink": TraceBuilder._on_link,
        "mkdir": TraceBuilder._on_path_only,
        "dup": TraceBuilder._on_dup,
        "fcntl": TraceBuilder._on_fcntl,
        "io_uring_setup": TraceBuilder._on_io_uring,
        "io_uring_enter": TraceBuilder._on_io_uring,
        "io_uring_register": TraceBuilder._on_io_uring,
        "io_setup": TraceBuilder._on_io_setup,
        "io_destroy": TraceBuilder._on_aio_call,
        "io_submit": TraceBuilder._on_aio_call,
        "io_getevents": TraceBuilder._on_aio_call,
        "mmap": TraceBuilder._on_mmap,
        "munmap": TraceBuilder._on_munmap,
        "msync": TraceBuilder._on_msync_madvise,
        "madvise": TraceBuilder._on_msync_madvise,
        "mremap": TraceBuilder._on_mremap,
    }
    for name, call in sc.SYSCALLS.items():
        if call.op is not None:
            table[name] = by_op[call.op]
    table.update(
        close_range=TraceBuilder._on_close_range,
        ioctl=TraceBuilder._on_ioctl,
        sendfile=TraceBuilder._on_copy,
        copy_file_range=TraceBuilder._on_copy,
        splice=TraceBuilder._on_copy,
        clone=TraceBuilder._on_clone,
        clone3=TraceBuilder._on_clone,
        fork=TraceBuilder._on_clone,
        vfork=TraceBuilder._on_clone,
        execve=TraceBuilder._on_execve,
        execveat=TraceBuilder._on_execve,
        chdir=TraceBuilder._on_chdir,
        fchdir=TraceBuilder._on_chdir,
    )
    return table


_HANDLERS = _handlers()
_AUX_HANDLERS = {
    AUX_URING_REQ: TraceBuilder._on_uring_request,
    AUX_URING_CREATE: TraceBuilder._on_uring_create,
    AUX_AIO_SUBMIT: TraceBuilder._on_aio_submit,
    AUX_AIO_EVENT: TraceBuilder._on_aio_event,
    AUX_FAULT: TraceBuilder._on_pages,
    AUX_MAP_PAGES: TraceBuilder._on_pages,
    AUX_DIRTY: TraceBuilder._on_pages,
    AUX_RSS: TraceBuilder._on_rss,
}
_URING_OPS = {
    "READ": v.READ,
    "READ_FIXED": v.READ,
    "READV": v.READ,
    "WRITE": v.WRITE,
    "WRITE_FIXED": v.WRITE,
    "WRITEV": v.WRITE,
    "FSYNC": v.FSYNC,
    "SYNC_FILE_RANGE": v.SYNC_FILE_RANGE,
    "FALLOCATE": v.FALLOCATE,
}
_AIO_OPS = {
    "PREAD": v.READ,
    "PREADV": v.READ,
    "PWRITE": v.WRITE,
    "PWRITEV": v.WRITE,
    "FSYNC": v.FSYNC,
    "FDSYNC": v.FDATASYNC,
}
MAP_SHARED, MAP_ANONYMOUS, PROT_WRITE = sc.MAP_SHARED, sc.MAP_ANONYMOUS, sc.PROT_WRITE


@functools.cache
def _uring_kind(opcode: int, datasync: int) -> tuple[str, str, str]:
    """(opcode name, trace op, syscall column) of an io_uring request (``datasync``: IORING_FSYNC_DATASYNC)."""
    name = v.URING_OPCODES.get(opcode, str(opcode))
    op = v.FDATASYNC if name == "FSYNC" and datasync else _URING_OPS.get(name, "other")
    return name, op, f"io_uring:{name}"


def _signed64(value: int) -> int:
    """A u64 (user_data, an address) as the int64 a trace column holds."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value
