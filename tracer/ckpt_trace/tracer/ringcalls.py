"""io_uring traffic as columns: ``io_uring_enter`` calls and the requests they submit turned into trace rows
without a Python object per row.

An io_uring job makes two rows per request at low batch sizes (fio at queue depth 32 submits one request an
``io_uring_enter``), and in effect order they alternate: a request takes effect at its submission, inside
the call that submits it, the call at its exit. Decoded one at a time (an ``AuxEvent`` or a
``SyscallEvent``, a handler, a row's appends), each cost the recorder about 9 us of CPU on the 4 KiB
io_uring storm of ``benchmarks/tracer_overhead.py``, taken from the traced program on a 2-core machine.
Here the bcc backend decodes both into one ``RingCalls`` (numpy columns, one row per call or request),
``state.EffectOrderFeeder`` holds them like ``datacalls.DataCalls`` in its re-ordering window, and
``feed_ring`` applies a run of them (no other event in between) to the ``TraceBuilder`` at once:

- each thread and each (thread, descriptor) or (ring, fixed index) is looked up once;
- a request's ring state is made at its first request, in the order one at a time makes them, so queue
  ids are the same;
- the rows go to the builder as one Arrow table in the run's order (``TraceBuilder.add_block``).

A run takes this path only when every row in it is the frequent kind: an ``io_uring_enter`` whose row the
filters keep, a read or write request with its own offset on a known descriptor whose row the filters keep
(or one on an unknown descriptor, which is only counted). Anything else in a run (a request that uses the
file position, an fsync or other opcode, a row the path filters or the rename follower would decide on, a
huge-page mapping waiting for its thread's next system call) sends the whole run through
``RingCalls.events`` and ``TraceBuilder.feed`` one at a time, so the rows are the same either way
(``tests/test_ringcalls.py`` compares both on recorded and generated streams).

Call order: build a ``RingCalls`` (``bcc_backend.decode_ring_calls``), give it to
``EffectOrderFeeder.add_split``; the feeder calls ``feed_ring`` with each run in effect order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ckpt_trace.formats import SCHEMA
from ckpt_trace.formats import vocabulary as v

from .datacalls import Columns, _encoded, _ints, _pairs, _processes
from .state import AUX_URING_REQ, AuxEvent, RingState, SyscallEvent, _uring_kind

if TYPE_CHECKING:
    from .state import TraceBuilder

#: The register arguments of an ``io_uring_enter`` row, as the bcc backend decodes them (``args``' keys).
ENTER_ARGS = ("fd", "to_submit", "min_complete", "flags", "sigsz")


@dataclass(frozen=True, slots=True)
class RingCalls(Columns):
    """``io_uring_enter`` system calls and io_uring requests, one row each, every column a 1-D array of the
    same length.

    ``enter``: bool, an ``io_uring_enter`` call (else a request). ``ts_ns`` (a call's entry, a request's
    submission) and ``dur_ns`` (to the call's exit, to the request's completion), ``pid``, ``tid``, ``ret``
    (the call's return value, the request's result), ``fd`` (the ring's descriptor; the request's file
    descriptor, or fixed-file index when ``fixed``): int64. Calls only (0 for requests): ``to_submit``,
    ``min_complete``, ``enter_flags``, ``sigsz`` (``ENTER_ARGS``), ``size`` (the record's size, -1 when
    none). Requests only (0 for calls): ``ctx`` (the ring), ``user_data``, ``addr`` (uint64),
    ``offset`` (-1: the file position), ``length`` (bytes, -1 if unknown), ``opcode``, ``flags``,
    ``in_flight``, ``vectored`` (int64), ``fixed`` (bool). ``comm``: object (str).
    """

    enter: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ret: np.ndarray
    fd: np.ndarray
    to_submit: np.ndarray
    min_complete: np.ndarray
    enter_flags: np.ndarray
    sigsz: np.ndarray
    size: np.ndarray
    ctx: np.ndarray
    user_data: np.ndarray
    addr: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    opcode: np.ndarray
    flags: np.ndarray
    in_flight: np.ndarray
    vectored: np.ndarray
    fixed: np.ndarray
    comm: np.ndarray

    @classmethod
    def of(cls, count: int, **columns: np.ndarray) -> RingCalls:
        """``count`` rows of the ``columns`` given; every other field holds what a row of the other kind
        holds there (the class docstring): 0 (uint64 for ``ctx``, ``user_data``, ``addr``; False for ``enter``
        and ``fixed``), -1 for ``size``."""
        defaults = {"size": -1}
        dtypes = {"ctx": np.uint64, "user_data": np.uint64, "addr": np.uint64, "enter": bool, "fixed": bool}
        for name in cls.__slots__:  # type: ignore[attr-defined]
            if name not in columns:
                columns[name] = np.full(count, defaults.get(name, 0), dtype=dtypes.get(name, np.int64))
        return cls(**columns)

    @property
    def effect_ns(self) -> np.ndarray:
        """When each took effect (``state.effect_ns``): a call at its exit, a request at its submission."""
        return np.where(self.enter, self.ts_ns + np.maximum(self.dur_ns, 0), self.ts_ns)

    def feed(self, builder: TraceBuilder) -> None:
        """Feed these rows (in effect order, no other event between them) to ``builder``
        (``TraceBuilder.feed_ring``)."""
        builder.feed_ring(self)

    def events(self) -> list[SyscallEvent | AuxEvent]:
        """The rows as the events a backend would decode one at a time: a ``SyscallEvent`` per call (``args``
        ``ENTER_ARGS``), an ``AuxEvent`` (``AUX_URING_REQ``) per request."""
        out: list[SyscallEvent | AuxEvent] = []
        names = self.__slots__  # type: ignore[attr-defined]
        for row in zip(*(getattr(self, name).tolist() for name in names)):
            r = dict(zip(names, row))
            if r["enter"]:
                args: dict[str, Any] = dict(
                    zip(ENTER_ARGS, (r["fd"], r["to_submit"], r["min_complete"], r["enter_flags"], r["sigsz"]))
                )
                size = r["size"] if r["size"] >= 0 else None
                out.append(
                    SyscallEvent(
                        r["ts_ns"], r["dur_ns"], r["tid"], "io_uring_enter", args, r["ret"], r["pid"], r["comm"], size
                    )
                )
                continue
            out.append(
                AuxEvent(
                    kind=AUX_URING_REQ,
                    ts_ns=r["ts_ns"],
                    dur_ns=r["dur_ns"],
                    pid=r["pid"],
                    tid=r["tid"],
                    fd=r["fd"],
                    ctx=r["ctx"],
                    user_data=r["user_data"],
                    offset=r["offset"],
                    length=r["length"],
                    res=r["ret"],
                    addr=r["addr"],
                    opcode=r["opcode"],
                    flags=r["flags"],
                    in_flight=r["in_flight"],
                    fixed=bool(r["fixed"]),
                    vectored=r["vectored"],
                    comm=r["comm"],
                )
            )
        return out


def feed_ring(builder: TraceBuilder, calls: RingCalls) -> None:
    """Apply ``calls`` (in effect order, no other event between them) to ``builder`` as its ``feed`` would,
    one at a time, and append their rows: as columns when every row is of the frequent kind (module
    docstring), else one at a time. Raises nothing of its own."""
    if not len(calls):
        return
    planned = None if builder._pmd_maps else _plan(builder, calls)
    if planned is None:
        for event in calls.events():
            builder.feed(event)
        return
    procs, proc_of_row, paths, path_of_row, queue_of_row, kinds, kind_of_row, attributed = planned
    enter = calls.enter
    builder.unattributed["requests"] += int(np.count_nonzero(~enter & ~attributed))
    writes = ~enter & attributed & (np.array([k[1] == v.WRITE for k in kinds] + [False])[kind_of_row]) & (calls.ret > 0)
    if writes.any() and builder.sizes:
        ends = np.full(len(paths), -1, dtype=np.int64)
        np.maximum.at(ends, path_of_row[writes], (calls.offset + calls.ret)[writes])
        for path, end in zip(paths, ends.tolist()):
            if end >= 0:
                builder._grow(path, end)
    rows = np.flatnonzero(enter | attributed)
    if len(rows):
        _append(builder, calls, rows, procs, proc_of_row, paths, path_of_row, queue_of_row, kinds, kind_of_row)


def _plan(builder: TraceBuilder, calls: RingCalls):
    """What the rows need from the builder's state, looked up once per distinct key, or None when a row is
    not of the frequent kind (``feed_ring`` then feeds one at a time). Makes the rings' states that the
    requests' first sight makes, in that order, and adopts the threads' processes, as feeding would."""
    enter = calls.enter
    procs, proc_of_row = _processes(builder, calls.tid, calls.pid)
    paths: list[str | None] = []  # in order of first sight: each row's path is an index into it
    path_index: dict[str | None, int] = {}
    path_of_row = np.full(len(calls), -1, dtype=np.int64)
    queue_of_row = np.full(len(calls), -1, dtype=np.int64)
    attributed = np.zeros(len(calls), dtype=bool)

    def place(path: str | None, rows: np.ndarray) -> None:
        if path not in path_index:
            path_index[path] = len(paths)
            paths.append(path)
        path_of_row[rows] = path_index[path]

    # io_uring_enter: the ring's descriptor and its state, per (process, fd).
    for p, fd, rows in _groups(proc_of_row, calls.fd, enter):
        proc = procs[p]
        desc = proc.table.fds.get(fd)
        path = desc.path if desc is not None else None
        if not builder._keep(path, "io_uring_enter"):
            return None
        state = builder.ring_of_fd.get((proc.tgid, fd))
        place(path, rows)
        queue_of_row[rows] = state.queue_id if state is not None else -1
    # Requests: the ring's state (made at the first request of an unknown ring), the file, the kind.
    requests = ~enter
    kinds: list[tuple[str, str, str]] = []
    kind_of_row = np.zeros(len(calls), dtype=np.int64)  # requests: index into ``kinds``
    if requests.any():
        if np.any(calls.offset[requests] < 0):
            return None  # the file position: ``TraceBuilder._request_offset`` one at a time
        codes, pair_of_row = np.unique(calls.opcode[requests] * 2 + (calls.flags[requests] & 1), return_inverse=True)
        kinds = [_uring_kind(code // 2, code % 2) for code in codes.tolist()]  # IORING_FSYNC_DATASYNC: bit 0
        if any(op not in v.DATA_OPS for _, op, _ in kinds):
            return None
        kind_of_row[requests] = pair_of_row.ravel()
        ctxs, ctx_first, ctx_of = np.unique(calls.ctx[requests], return_index=True, return_inverse=True)
        req_rows = np.flatnonzero(requests)
        ctx_of_row = np.full(len(calls), -1, dtype=np.int64)
        ctx_of_row[req_rows] = ctx_of.ravel()
        states = [builder.rings.get(int(ctx)) for ctx in ctxs.tolist()]
        key = np.where(calls.fixed, -1 - ctx_of_row, proc_of_row)  # fixed: the ring's table; else the process's
        for owner, fd, rows in _groups(key, calls.fd, requests):
            if owner < 0:
                state = states[-1 - owner]
                desc = state.fixed.get(fd) if state is not None else None
            else:
                desc = procs[owner].table.fds.get(fd)
            if desc is None:
                continue  # unattributed: counted, no row
            ops = {kinds[k][1] for k in kind_of_row[rows].tolist()}
            if not all(builder._keep(desc.path, op) for op in ops):
                return None
            attributed[rows] = True
            place(desc.path, rows)
        for k in np.argsort(ctx_first, kind="stable").tolist():  # made in the order of first sight
            if states[k] is None:
                states[k] = builder.rings[int(ctxs[k])] = RingState(builder._new_queue())
        queues = np.array([state.queue_id for state in states if state is not None], dtype=np.int64)
        queue_of_row[req_rows] = queues[ctx_of.ravel()]
    return procs, proc_of_row, paths, path_of_row, queue_of_row, kinds, kind_of_row, attributed


def _groups(owner: np.ndarray, fd: np.ndarray, mask: np.ndarray):
    """(owner, fd, row indices) of each distinct (owner, fd) among the rows where ``mask`` holds."""
    rows = np.flatnonzero(mask)
    if not len(rows):
        return []
    pairs, inverse = _pairs(owner[rows], fd[rows])
    order = np.argsort(inverse, kind="stable")
    starts = np.flatnonzero(np.r_[True, inverse[order][1:] != inverse[order][:-1]])
    return [(o, f, group) for (o, f), group in zip(pairs, np.split(rows[order], starts[1:]))]


def _append(builder, calls, rows, procs, proc_of_row, paths, path_of_row, queue_of_row, kinds, kind_of_row) -> None:
    """The rows ``rows`` of ``calls`` as ``_on_io_uring``/``_on_uring_request`` append each, handed to the
    builder as one table of ``formats.SCHEMA`` (``TraceBuilder.add_block``)."""
    count = len(rows)
    enter = calls.enter[rows]
    request = ~enter
    p = proc_of_row[rows]
    comm = calls.comm[rows]
    empty = np.array([not c for c in comm.tolist()], dtype=bool)
    if empty.any():
        comm = comm.copy()
        comm[empty] = np.array([proc.comm for proc in procs], dtype=object)[p[empty]]
    kind = kind_of_row[rows]
    syscall_values = ["io_uring_enter"] + [syscall for _, _, syscall in kinds]
    op_values = ["io_uring_enter"] + [op for _, op, _ in kinds]
    kind_code = np.where(enter, 0, kind + 1)
    fixed = calls.fixed[rows]
    length = calls.length[rows]
    vectored = calls.vectored[rows]
    queue = queue_of_row[rows]
    columns = {
        "ts_ns": _ints(np.maximum(calls.ts_ns[rows] - builder.start_ns, 0), pa.int64()),
        "dur_ns": _ints(np.maximum(calls.dur_ns[rows], 0), pa.int64()),
        "pid": _ints(np.array([proc.tgid for proc in procs], dtype=np.int64)[p], pa.int32()),
        "tid": _ints(calls.tid[rows], pa.int32()),
        "comm": pa.array(comm, pa.string()).dictionary_encode(),
        "rank": _ints(np.array([proc.rank for proc in procs], dtype=np.int64)[p], pa.int32()),
        "syscall": _encoded(kind_code, syscall_values),
        "op": _encoded(kind_code, op_values),
        "fd": _ints(calls.fd[rows], pa.int32(), enter | ~fixed),
        "path": _encoded(np.where(path_of_row[rows] >= 0, path_of_row[rows], len(paths)), [*paths, None]),
        "offset": _ints(calls.offset[rows], pa.int64(), request),
        "offset_source": _encoded(np.where(enter, 1, 0), [v.OFFSET_EXPLICIT, None]),
        "size": _ints(np.where(enter, calls.to_submit[rows], length), pa.int64(), enter | (length >= 0)),
        "ret": _ints(calls.ret[rows], pa.int64()),
        "flags": _ints(calls.enter_flags[rows], pa.int64(), enter),
        "iov_count": _ints(vectored, pa.int32(), request & (vectored != 0)),
        "interface": _encoded(np.where(enter, 0, 1), [v.SYSCALL, v.IO_URING]),
        "queue_id": _ints(queue, pa.int64(), queue >= 0),
        "request_id": _ints(calls.user_data[rows].view(np.int64), pa.int64(), request),
        "in_flight": _ints(calls.in_flight[rows], pa.int32(), request),
        "address": _ints(calls.addr[rows].view(np.int64), pa.int64(), request),
    }
    arrays = [columns[f.name] if f.name in columns else pa.nulls(count, f.type) for f in SCHEMA]
    builder.add_block(pa.Table.from_arrays(arrays, schema=SCHEMA))
