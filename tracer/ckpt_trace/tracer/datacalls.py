"""Read and write system calls as columns: the rows most traces are made of, turned into trace rows without
a Python object per call.

A storm of small writes is almost only read/write-family calls on descriptors already open. Decoded one
event at a time, each costs the recorder several microseconds of Python (a ``SyscallEvent``, a sort key, a
handler call, an append per column); on a 2-core machine that CPU is taken from the traced program. Here
the bcc backend decodes such records into one ``DataCalls`` (numpy columns), ``state.EffectOrderFeeder``
keeps them as arrays in its re-ordering window, and ``feed_data`` applies a run of them (no other event in
between) to the ``TraceBuilder``'s state at once:

- each distinct (thread, descriptor) is looked up once; calls on descriptors the builder does not know are
  counted in ``untracked_fd_ops``, as one at a time;
- offsets of calls that use the file position are the description's position plus the bytes moved by the
  earlier calls on that description in the run (an exclusive cumulative sum per description); positional
  calls keep their argument; the positions and the tracked file sizes are then moved as the calls would
  have moved them one by one;
- the rows go to the builder as one Arrow table in the calls' order (``TraceBuilder.add_block``), numpy
  columns converted without a Python object per value.

What this path does not take (an O_APPEND or RWF_APPEND write, whose offset is the tracked size; a page
fault waiting for its system call) goes through ``DataCalls.events`` and ``TraceBuilder.feed`` one call at
a time, so the rows are the same either way (``tests/test_datacalls.py`` compares the two on recorded and
generated events).

Call order: build a ``DataCalls`` (``bcc_backend.decode_data_calls``), give it to
``EffectOrderFeeder.add_split``; the feeder calls ``feed_data`` with each run in effect order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ckpt_trace.formats import SCHEMA
from ckpt_trace.formats import vocabulary as v

from . import syscalls as sc
from .state import SyscallEvent

if TYPE_CHECKING:
    from .state import Description, Process, TraceBuilder

#: The calls a ``DataCalls`` holds; ``DataCalls.call`` indexes this tuple.
CALLS = tuple(name for name, call in sc.SYSCALLS.items() if call.op in ("read", "write"))
_IS_WRITE = np.array([sc.SYSCALLS[name].op == "write" for name in CALLS])
_IS_VECTORED = np.array([name in sc.VECTORED for name in CALLS])
_IS_POSITIONAL = np.array([name in sc.POSITIONAL for name in CALLS])
_POSITION_IF_MINUS_ONE = np.array([name in ("preadv2", "pwritev2") for name in CALLS])  # offset -1: the position
_HAS_RWFLAGS = np.array(["rwflags" in sc.SYSCALLS[name].args for name in CALLS])
_NAMES = np.array(CALLS, dtype=object)
_OPS = np.array(["write" if w else "read" for w in _IS_WRITE], dtype=object)
_SOURCES = np.array([v.OFFSET_EXPLICIT, v.OFFSET_POSITION, v.OFFSET_UNKNOWN], dtype=object)


class Columns:
    """What a chunk of calls held as columns has (``DataCalls``, ``ringcalls.RingCalls``): every field a 1-D
    array of the same length, ``ts_ns`` among them; taken and joined field by field."""

    __slots__ = ()

    def __len__(self) -> int:
        return len(self.ts_ns)  # type: ignore[attr-defined]

    def take(self, index):
        """The rows at ``index`` (an integer array, a boolean mask or a slice), as a new chunk of this kind."""
        return type(self)(*(getattr(self, name)[index] for name in self.__slots__))

    @classmethod
    def concat(cls, parts: list):
        """The rows of ``parts`` (chunks of this kind), one after the other."""
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in cls.__slots__))


@dataclass(frozen=True, slots=True)
class DataCalls(Columns):
    """Read/write-family system calls, one row per call, every column a 1-D array of the same length.

    ``ts_ns`` (entry) and ``dur_ns`` on the backend's clock, ``pid`` (thread group), ``tid``, ``ret``,
    ``fd``, ``call`` (index into ``CALLS``), ``offset`` (the offset argument of positional calls, bytes;
    ignored for the others), ``size`` (bytes: ``count``, or the summed iov_len of vectored calls; -1 when
    unknown), ``iov_count`` (vectored calls), ``rwflags`` (RWF_* of preadv2/pwritev2, else 0): int64;
    ``comm``: object (str). Raises nothing; the backend guarantees the lengths.
    """

    ts_ns: np.ndarray
    dur_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ret: np.ndarray
    fd: np.ndarray
    call: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    iov_count: np.ndarray
    rwflags: np.ndarray
    comm: np.ndarray

    @property
    def effect_ns(self) -> np.ndarray:
        """When each call took effect (``state.effect_ns``: a read or write at its exit)."""
        return self.ts_ns + np.maximum(self.dur_ns, 0)

    def feed(self, builder: TraceBuilder) -> None:
        """Feed these calls (in effect order, no other event between them) to ``builder``
        (``TraceBuilder.feed_data``)."""
        builder.feed_data(self)

    def events(self) -> list[SyscallEvent]:
        """The calls as the ``SyscallEvent`` objects a backend would decode one at a time (``args``: fd,
        count or iov_count, and offset and rwflags where the call has them)."""
        out = []
        columns = (self.ts_ns, self.dur_ns, self.tid, self.call, self.ret, self.pid, self.fd, self.offset)
        rest = (self.size, self.iov_count, self.rwflags, self.comm)
        for (ts, dur, tid, call, ret, pid, fd, offset), (size, iov_count, rwflags, comm) in zip(
            zip(*(c.tolist() for c in columns)), zip(*(c.tolist() for c in rest))
        ):
            name = CALLS[call]
            if _IS_VECTORED[call]:
                args = {"fd": fd, "iov_count": iov_count}
                event_size = size if size >= 0 else None
            else:
                args = {"fd": fd, "count": size}
                event_size = None
            if _IS_POSITIONAL[call]:
                args["offset"] = offset
            if _HAS_RWFLAGS[call]:
                args["rwflags"] = rwflags
            out.append(SyscallEvent(ts, dur, tid, name, args, ret, pid, comm, event_size))
        return out


def feed_data(builder: TraceBuilder, calls: DataCalls) -> None:
    """Apply ``calls`` (in effect order, no other event between them) to ``builder`` as its ``feed`` would,
    one call at a time, and append their rows. Raises nothing of its own."""
    if not len(calls):
        return
    if builder._pmd_maps:  # a huge-page mapping waits for its thread's next system call (TraceBuilder.feed)
        for event in calls.events():
            builder.feed(event)
        return
    procs, tid_of_row, descs, row_desc = _descriptions(builder, calls)
    known = row_desc >= 0
    call = calls.call
    is_write = _IS_WRITE[call]
    desc_flags = np.array([d.flags for d in descs] + [0], dtype=np.int64)  # index -1: no description
    appends = is_write & known & (((desc_flags[row_desc] & sc.O_APPEND) != 0) | ((calls.rwflags & sc.RWF_APPEND) != 0))
    if appends.any():  # offsets from the tracked size, which the calls themselves move: one at a time
        for event in calls.events():
            builder.feed(event)
        return
    builder.untracked_fd_ops += int(np.count_nonzero(~known))
    explicit = _IS_POSITIONAL[call] & ~(_POSITION_IF_MINUS_ONE[call] & (calls.offset == -1))
    moved = np.maximum(calls.ret, 0)
    offset = np.where(explicit, calls.offset, 0)
    offset_known = explicit.copy()
    _positions(descs, row_desc, np.flatnonzero(known & ~explicit), moved, offset, offset_known)
    grows = known & is_write & offset_known & (moved > 0)
    if grows.any() and builder.sizes:
        ends = np.full(len(descs), -1, dtype=np.int64)
        np.maximum.at(ends, row_desc[grows], (offset + moved)[grows])
        for desc, end in zip(descs, ends.tolist()):
            if end >= 0:
                builder._grow(desc.path, end)
    kept_desc = np.array([builder._keep(d.path, "write") for d in descs] + [False])  # read or write alike
    kept = kept_desc[row_desc] & known
    dropped = np.flatnonzero(known & ~kept)
    if len(dropped):
        if builder.follow is None:
            builder.filtered_ops += len(dropped)
        else:
            _hold(
                builder,
                calls.take(dropped),
                [procs[t] for t in tid_of_row[dropped].tolist()],
                [descs[d] for d in row_desc[dropped].tolist()],
                offset[dropped],
                offset_known[dropped],
                explicit[dropped],
            )
    rows = np.flatnonzero(kept)
    if len(rows):
        _append(builder, calls, rows, procs, tid_of_row, descs, row_desc, offset, offset_known, explicit)


def _descriptions(builder: TraceBuilder, calls: DataCalls):
    """(processes, process index per row, open file descriptions, description index per row, -1 where the
    builder knows no such descriptor): each distinct thread and (thread, fd) looked up once, processes
    adopted in the order their first calls came, as ``feed`` adopts them."""
    procs, tid_of_row = _processes(builder, calls.tid, calls.pid)
    pairs, pair_of_row = _pairs(tid_of_row, calls.fd)
    descs: list[Description] = []
    index_of: dict[int, int] = {}  # id(description) -> its index: dup'd descriptors and threads share one
    pair_desc = []
    for t, fd in pairs:
        desc = procs[t].table.fds.get(fd)
        if desc is None:
            pair_desc.append(-1)
            continue
        index = index_of.setdefault(id(desc), len(descs))
        if index == len(descs):
            descs.append(desc)
        pair_desc.append(index)
    return procs, tid_of_row, descs, np.asarray(pair_desc, dtype=np.int64)[pair_of_row]


def _processes(builder: TraceBuilder, tid: np.ndarray, pid: np.ndarray) -> tuple[list[Process], np.ndarray]:
    """(the processes of the distinct threads of ``tid``, each row's index into them): each thread looked up
    once (``TraceBuilder._process_of_ids``), adopted in the order of its first row, as ``feed`` adopts them."""
    tids, first, index = np.unique(tid, return_index=True, return_inverse=True)
    procs: list[Process] = [None] * len(tids)  # type: ignore[list-item]
    for k in np.argsort(first, kind="stable").tolist():
        procs[k] = builder._process_of_ids(int(tids[k]), int(pid[first[k]]))
    return procs, index.ravel()


def _pairs(owner: np.ndarray, fd: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The distinct (owner, fd) pairs sorted as tuples, and each row's pair index: ``np.unique`` of one int64
    key per row (the owner's place among the owners times the fds' span plus the fd's place in it), 20x faster
    than ``np.unique(..., axis=1)`` on two columns (112 ms against 5.7 ms for 200,000 rows, measured here),
    with the same order."""
    low, base = int(fd.min()), int(owner.min())
    span = int(fd.max()) - low + 1
    if span * (int(owner.max()) - base + 1) >= 1 << 62:  # cannot happen for fds (int32); kept exact anyway
        pairs, inverse = np.unique(np.stack([owner, fd]), axis=1, return_inverse=True)
        return [(o, f) for o, f in pairs.T.tolist()], inverse.ravel()
    _, first, inverse = np.unique((owner - base) * span + (fd - low), return_index=True, return_inverse=True)
    return list(zip(owner[first].tolist(), fd[first].tolist())), inverse.ravel()


def _positions(descs, row_desc, rows, moved, offset, offset_known) -> None:
    """Offsets of the calls ``rows`` that use their description's position (into ``offset``, with
    ``offset_known`` false where the position is unknown), and the positions moved past them: per
    description, its position plus the bytes the earlier calls on it moved (a failed call moves none)."""
    if not len(rows):
        return
    owner = row_desc[rows]
    order = np.argsort(owner, kind="stable")
    rows, owner = rows[order], owner[order]
    step = moved[rows]
    before = np.cumsum(step) - step  # bytes moved by the earlier calls (all descriptions)
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    lengths = np.diff(np.r_[starts, len(owner)])
    before -= np.repeat(before[starts], lengths)  # ... on the same description
    start_pos = [descs[d].pos for d in owner[starts].tolist()]
    base = np.array([p if p is not None else 0 for p in start_pos], dtype=np.int64)
    offset[rows] = np.repeat(base, lengths) + before
    offset_known[rows] = np.repeat(np.array([p is not None for p in start_pos]), lengths)
    for d, pos, total in zip(owner[starts].tolist(), start_pos, np.add.reduceat(step, starts).tolist()):
        if pos is not None:
            descs[d].pos = pos + total


def _source_codes(explicit: np.ndarray, offset_known: np.ndarray) -> np.ndarray:
    """offset_source per row, as indices into ``_SOURCES``: explicit, position, or unknown (a position never
    known)."""
    return np.where(explicit, 0, np.where(offset_known, 1, 2))


def _nullable(values: np.ndarray, valid: np.ndarray) -> list:
    """``values`` as Python ints, None where not ``valid``."""
    if valid.all():
        return values.tolist()
    out = values.astype(object)
    out[~valid] = None
    return out.tolist()


def _encoded(codes: np.ndarray, values: list) -> pa.Array:
    """The dictionary array of ``values[codes[i]]`` (str or None; None is null), its dictionary in order of
    first appearance, as pyarrow's conversion of the same Python list makes it, so that the trace's
    dictionaries do not depend on which way a row came (``Table.equals``)."""
    index_of: dict = {}
    same = np.array([index_of.setdefault(value, len(index_of)) for value in values], dtype=np.int64)
    codes = same[codes] if len(values) else codes
    distinct_values = list(index_of)
    first = np.full(len(distinct_values), len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))  # each code's first row (np.unique's sort is 15x slower)
    present = np.flatnonzero(first < len(codes))
    appearing = present[np.argsort(first[present], kind="stable")]
    dictionary = [distinct_values[c] for c in appearing.tolist() if distinct_values[c] is not None]
    renumber = np.full(len(distinct_values), -1, dtype=np.int64)
    kept = [c for c in appearing.tolist() if distinct_values[c] is not None]
    renumber[kept] = np.arange(len(kept))
    indices = renumber[codes]
    null = indices < 0
    return pa.DictionaryArray.from_arrays(
        pa.array(np.where(null, 0, indices).astype(np.int32), mask=null if null.any() else None),
        pa.array(dictionary, pa.string()),
    )


def _ints(values: np.ndarray, kind: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """``values`` as an Arrow array of ``kind``, null where not ``valid``."""
    mask = None if valid is None or valid.all() else ~valid
    return pa.array(values.astype(kind.to_pandas_dtype()), type=kind, mask=mask)


def _append(builder, calls, rows, procs, tid_of_row, descs, row_desc, offset, offset_known, explicit) -> None:
    """The rows ``rows`` of ``calls``, as ``_emit_data`` would append each, handed to the builder as one
    table of ``formats.SCHEMA`` (``TraceBuilder.add_block``): numpy columns to Arrow without a Python
    object per value."""
    count = len(rows)
    call = calls.call[rows]
    t = tid_of_row[rows]
    vectored = _IS_VECTORED[call]
    comm = calls.comm[rows]
    empty = comm == ""
    if empty.any():
        comm = comm.copy()
        comm[empty] = np.array([p.comm for p in procs], dtype=object)[t[empty]]
    size = calls.size[rows]
    sources = _source_codes(explicit[rows], offset_known[rows])
    columns = {
        "ts_ns": _ints(np.maximum(calls.ts_ns[rows] - builder.start_ns, 0), pa.int64()),
        "dur_ns": _ints(np.maximum(calls.dur_ns[rows], 0), pa.int64()),
        "pid": _ints(np.array([p.tgid for p in procs], dtype=np.int64)[t], pa.int32()),
        "tid": _ints(calls.tid[rows], pa.int32()),
        "comm": _strings_encoded(comm),
        "rank": _ints(np.array([p.rank for p in procs], dtype=np.int64)[t], pa.int32()),
        "syscall": _encoded(call, list(CALLS)),
        "op": _encoded(_IS_WRITE[call].astype(np.int64), ["read", "write"]),
        "fd": _ints(calls.fd[rows], pa.int32()),
        "path": _encoded(row_desc[rows], [d.path for d in descs]),
        "offset": _ints(offset[rows], pa.int64(), offset_known[rows]),
        "offset_source": _encoded(sources, list(_SOURCES)),
        "size": _ints(size, pa.int64(), ~vectored | (size >= 0)),
        "ret": _ints(calls.ret[rows], pa.int64()),
        "iov_count": _ints(calls.iov_count[rows], pa.int32(), vectored),
        "interface": _encoded(np.zeros(count, dtype=np.int64), [v.SYSCALL]),
    }
    arrays = [columns[f.name] if f.name in columns else _nulls(count, f.type) for f in SCHEMA]
    builder.add_block(pa.Table.from_arrays(arrays, schema=SCHEMA))


def _strings_encoded(values: np.ndarray, most: int = 16) -> pa.DictionaryArray:
    """``values`` (an object array of str) as a dictionary array, its dictionary in order of first appearance,
    equal to ``pa.array(list(values)).dictionary_encode()``. A chunk's command names are a few distinct
    values: one vectorised compare per value (the next first appearance is the first value not yet coded),
    with no Python object per row; past ``most`` distinct values, pyarrow's conversion of the list. (From a
    numpy object array pyarrow converts about 20x slower than from a list: 11 ms against 0.6 ms for 20,000
    strings, measured here on pyarrow 26.)"""
    codes = np.zeros(len(values), dtype=np.int32)
    distinct: list[str] = []
    left, rest = np.arange(len(values)), values
    while len(left):
        if len(distinct) == most:
            return pa.array(values.tolist(), pa.string()).dictionary_encode()
        same = rest == rest[0]
        codes[left[same]] = len(distinct)
        distinct.append(rest[0])
        left, rest = left[~same], rest[~same]
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(distinct, pa.string()))


_NULLS: dict[pa.DataType, pa.Array] = {}


def _nulls(count: int, kind: pa.DataType) -> pa.Array:
    """``count`` nulls of ``kind``: a slice of one array kept per type (no allocation per chunk)."""
    held = _NULLS.get(kind)
    if held is None or len(held) < count:
        held = _NULLS[kind] = pa.nulls(max(count, 1 << 16), kind)
    return held.slice(0, count)


def _hold(builder, calls: DataCalls, procs, descs, offset, offset_known, explicit) -> None:
    """Rows the path filters leave out, offered one at a time to the rename follower (``tracer.renames``),
    as ``_emit_data`` offers them; those it does not take are counted in ``filtered_ops``."""
    sources = _SOURCES[_source_codes(explicit, offset_known)].tolist()
    offsets = _nullable(offset, offset_known)
    for event, proc, desc, off, source in zip(calls.events(), procs, descs, offsets, sources):
        vectored = event.name in sc.VECTORED
        values = {
            "fd": event.args["fd"],
            "path": desc.path,
            "offset": off,
            "offset_source": source,
            "size": event.size if vectored else int(event.args.get("count", 0)),
            "iov_count": int(event.args["iov_count"]) if vectored else None,
        }
        op = "write" if sc.SYSCALLS[event.name].op == "write" else "read"
        if not builder.follow.hold(desc.path, builder._held_row(proc, event, op, values)):
            builder.filtered_ops += 1
