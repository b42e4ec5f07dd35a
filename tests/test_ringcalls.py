"""io_uring_enter calls and io_uring requests fed as columns (issue 35, ``tracer.ringcalls``) give the rows and
state that feeding them one event at a time gives: on real bcc recordings' raw records (fio's io_uring
engine: reads and writes, registered files and buffers, a polling thread, fsync requests) and on generated
streams (rings set up and registered, fixed and plain descriptors, requests on the file position, unknown
descriptors, fsyncs, path filters, ties and late events in the re-ordering feeder)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from helpers.raw_stream import STREAM, raw_stream, record_stream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_trace import config
from ckpt_trace.formats import read_trace
from ckpt_trace.tracer import ringcalls, state
from ckpt_trace.tracer import syscalls as sc
from ckpt_trace.tracer.state import (
    AUX_URING_CREATE,
    AUX_URING_REQ,
    AuxEvent,
    EffectOrderFeeder,
    SyscallEvent,
    TraceBuilder,
)

URING_STREAM = STREAM.with_name("raw_stream_uring.npz")
PID = 100


def _count_appended(monkeypatch) -> list[int]:
    """The number of rows of each ``ringcalls._append`` call from now on (the columnar path taken)."""
    appended: list[int] = []
    real = ringcalls._append
    monkeypatch.setattr(
        ringcalls,
        "_append",
        lambda builder, calls, rows, *rest: (appended.append(len(rows)), real(builder, calls, rows, *rest)),
    )
    return appended


@pytest.mark.parametrize("stream", [STREAM, URING_STREAM], ids=["golden", "fio-uring"])
@pytest.mark.parametrize("filtered", [True, False], ids=["path-filter", "no-filter"])
@pytest.mark.parametrize("run_min", [1, 16])
def test_recorded_streams_give_the_same_trace_with_io_uring_as_columns(
    tmp_path, monkeypatch, stream, filtered, run_min
):
    """A bcc recording's raw records decoded with io_uring traffic as columns and as one event each: equal
    tables and metadata, and most requests and calls went through as columns."""
    monkeypatch.setattr(config, "RECORD_DECODE_EVENTS", 64)
    monkeypatch.setattr(state, "_DATA_RUN_MIN", run_min)
    appended = _count_appended(monkeypatch)
    polls, meta = raw_stream(stream)
    if not filtered:
        meta = json.loads(json.dumps(meta))
        meta["builder"]["path_filters"] = []
    monkeypatch.setattr(config, "RECORD_RING_COLUMNS", 0)
    events = read_trace(record_stream(tmp_path, "events", polls, meta, limit_bytes=None))
    assert appended == []
    monkeypatch.setattr(config, "RECORD_RING_COLUMNS", 1)
    columns = read_trace(record_stream(tmp_path, "columns", polls, meta, limit_bytes=None))
    requests = int(np.count_nonzero(np.asarray(events.table.column("interface").to_pylist()) == "io_uring"))
    assert requests >= 16
    if stream == URING_STREAM:
        assert sum(appended) >= requests  # most of the requests and their io_uring_enter calls as columns
    if filtered:
        assert columns.table.num_rows == events.table.num_rows == meta["rows"]
    assert columns.table.equals(events.table)
    held = {"spilled_runs"}  # how many sorted runs the rows went through on their way: how they were held
    assert {k: x for k, x in columns.metadata.items() if k not in held} == {
        k: x for k, x in events.metadata.items() if k not in held
    }


@pytest.mark.parametrize("stream", [STREAM, URING_STREAM], ids=["golden", "fio-uring"])
@pytest.mark.parametrize("columns", [0, 1], ids=["events", "columns"])
def test_rings_slices_fed_as_one_run_give_the_trace_fed_slice_by_slice_gives(tmp_path, monkeypatch, stream, columns):
    """The rings' slices of a group fed as runs that mix rings (``bcc_backend._runs``: each ring's records of a
    run decoded at once, one call to the feeder) and fed one record at a time (``RECORD_DECODE_EVENTS`` 1: a
    run is one slice of one ring, as before runs mixed rings): equal tables and metadata, and runs did mix
    the rings."""
    from ckpt_trace.tracer import bcc_backend

    monkeypatch.setattr(config, "RECORD_DATA_COLUMNS", columns)
    monkeypatch.setattr(config, "RECORD_RING_COLUMNS", columns)
    polls, meta = raw_stream(stream)
    monkeypatch.setattr(config, "RECORD_DECODE_EVENTS", 1)
    one = read_trace(record_stream(tmp_path, "one", polls, meta, limit_bytes=None))
    mixed: list[int] = []
    real = bcc_backend._feed_run
    monkeypatch.setattr(
        bcc_backend,
        "_feed_run",
        lambda feeder, run, ranks: (mixed.append(len({name for name, _ in run})), real(feeder, run, ranks)),
    )
    monkeypatch.setattr(config, "RECORD_DECODE_EVENTS", 4096)
    runs = read_trace(record_stream(tmp_path, "runs", polls, meta, limit_bytes=None))
    assert max(mixed) >= 2  # runs held the slices of several rings
    assert runs.table.num_rows == one.table.num_rows == meta["rows"]
    assert runs.table.equals(one.table)
    held = {"spilled_runs"}
    assert {k: x for k, x in runs.metadata.items() if k not in held} == {
        k: x for k, x in one.metadata.items() if k not in held
    }


class _ArrivalOrder:
    """A feeder that keeps what it was given, place by place in arrival order: ("event", name or kind, ts_ns,
    tid) or ("calls", kind, ts_ns, tid)."""

    def __init__(self) -> None:
        self.places: list[tuple] = []

    def add(self, events) -> None:
        self.places += [("event", getattr(e, "name", None) or e.kind, e.ts_ns, e.tid) for e in events]

    def add_split(self, events, parts) -> None:
        places: list = [None] * len(parts[0][1])
        taken = np.zeros(len(places), dtype=bool)
        for calls, mask in parts:
            for place, ts, tid in zip(np.flatnonzero(mask).tolist(), calls.ts_ns.tolist(), calls.tid.tolist()):
                places[place] = ("calls", type(calls).__name__, ts, tid)
            taken |= mask
        for place, e in zip(np.flatnonzero(~taken).tolist(), events):
            places[place] = ("event", getattr(e, "name", None) or e.kind, e.ts_ns, e.tid)
        assert None not in places
        self.places += places


@pytest.mark.parametrize("step", [64, 4096])
def test_a_run_of_several_rings_slices_arrives_in_the_order_of_its_slices(monkeypatch, step):
    """Every record of a group reaches the feeder at the place it has when the rings' slices are fed one after
    the other (``_runs`` patched to one slice a run), calls as columns and the other records as events alike,
    though runs mix the rings (each ring's records of a run decoded at once)."""
    from ckpt_trace.tracer import bcc_backend

    monkeypatch.setattr(config, "RECORD_DECODE_EVENTS", step)
    polls, meta = raw_stream(URING_STREAM)
    group = {ring: [c for poll in polls for c in poll.get(ring, [])] for ring in bcc_backend.RINGS}
    ranks = {int(pid): rank for pid, rank in meta["ranks"].items()}
    whole = _ArrivalOrder()
    mixed = []
    real = bcc_backend._feed_run
    monkeypatch.setattr(
        bcc_backend,
        "_feed_run",
        lambda feeder, run, ranks: (mixed.append(len({name for name, _ in run})), real(feeder, run, ranks)),
    )
    bcc_backend.feed_group(bcc_backend.BccRecording(feeder=whole), group, ranks)  # type: ignore[arg-type]
    assert max(mixed) >= 2
    one_by_one = _ArrivalOrder()
    monkeypatch.setattr(bcc_backend, "_runs", lambda slices, step: ([(name, part)] for _, _, name, part in slices))
    bcc_backend.feed_group(bcc_backend.BccRecording(feeder=one_by_one), group, ranks)  # type: ignore[arg-type]
    assert len(whole.places) >= 1000
    assert whole.places == one_by_one.places


# -- generated event streams ----------------------------------------------------------------------------------

PATHS = ("/ckpt/a", "/ckpt/b", "/tmp/c")
OPCODES = (22, 23, 1, 5)  # IORING_OP_READ, WRITE, READV, WRITE_FIXED (include/uapi/linux/io_uring.h)
ODD_OPCODES = (3, 0, 22)  # FSYNC, NOP, READ


@st.composite
def streams(draw):
    """SyscallEvents and AuxEvents of two threads of one process using two rings, in about effect order with
    occasional equal times and calls that end late: files opened and rings set up first, then mostly
    io_uring_enter calls and requests, with opens, closes and registrations among them."""
    events, fds, rings = [], [], []
    rare = draw(st.sampled_from([0, 3, 30]))  # % of the calls and requests that are not of the frequent kind
    ts = 0
    setup = [0] * draw(st.integers(1, 3)) + [10] * draw(st.integers(1, 2)) + [14] * draw(st.integers(0, 1))
    for roll in setup + draw(st.lists(st.integers(0, 99), min_size=1, max_size=120)):
        odd = draw(st.integers(0, 99)) < rare
        ts += draw(st.sampled_from([0, 1, 7]))
        tid = draw(st.sampled_from([PID, 101]))
        dur = draw(st.sampled_from([1, 2, 40]))
        free = 3 + len(fds) + len(rings)
        if roll < 4:
            flags = sc.O_RDWR | sc.O_CREAT | draw(st.sampled_from([0, 0, 0, sc.O_APPEND]))
            path = draw(st.sampled_from(PATHS))
            events.append(
                SyscallEvent(ts, dur, tid, "openat", {"dirfd": sc.AT_FDCWD, "path": path, "flags": flags}, free, PID)
            )
            fds.append(free)
        elif roll < 6 and fds:
            fd = fds.pop(draw(st.integers(0, len(fds) - 1)))
            events.append(SyscallEvent(ts, dur, tid, "close", {"fd": fd}, 0, PID))
        elif roll < 12 and len(rings) < 2:
            events.append(SyscallEvent(ts, dur, tid, "io_uring_setup", {"entries": 8}, free, PID))
            ctx = 0xFFFF0000 + free
            if draw(st.booleans()):  # the ring's context seen made (else first seen at a request)
                events.append(AuxEvent(kind=AUX_URING_CREATE, ts_ns=ts, pid=PID, tid=tid, fd=free, ctx=ctx))
            rings.append((free, ctx))
        elif roll < 16 and rings:
            ring_fd, _ = draw(st.sampled_from(rings))
            registered = draw(st.lists(st.sampled_from([*fds, -1]), min_size=1, max_size=3)) if fds else [-1]
            args = {"fd": ring_fd, "opcode": draw(st.sampled_from([2, 2, 6, 3])), "nr_args": len(registered)}
            args.update(fds=registered, files_offset=draw(st.sampled_from([0, 1])))
            events.append(SyscallEvent(ts, dur, tid, "io_uring_register", args, 0, PID))
        elif roll < 45 and rings:
            ring_fd, _ = draw(st.sampled_from(rings))
            if odd and fds:  # not a ring: the call fails, and its row is the file's
                ring_fd = draw(st.sampled_from(fds))
            args = {"fd": ring_fd, "to_submit": draw(st.integers(0, 4)), "min_complete": 0, "flags": 1, "sigsz": 8}
            events.append(SyscallEvent(ts, dur, tid, "io_uring_enter", args, args["to_submit"], PID, "fio"))
        elif rings:
            _, ctx = draw(st.sampled_from(rings))
            fixed = draw(st.integers(0, 3)) == 0
            if fixed:
                fd = draw(st.integers(0, 2))
            else:
                fd = draw(st.sampled_from(fds)) if fds and (not odd or draw(st.booleans())) else 77  # 77: unknown
            opcode = draw(st.sampled_from(ODD_OPCODES if odd else OPCODES))
            events.append(
                AuxEvent(
                    kind=AUX_URING_REQ,
                    ts_ns=ts,
                    dur_ns=draw(st.sampled_from([0, 5, 400])),
                    pid=PID,
                    tid=tid,
                    fd=fd,
                    ctx=ctx,
                    user_data=draw(st.sampled_from([1, 2**63 + 5])),
                    offset=-1 if draw(st.integers(0, 99)) < rare else draw(st.sampled_from([0, 4096, 123456])),
                    length=draw(st.sampled_from([4096, 1 << 20, -1])),
                    res=draw(st.sampled_from([4096, 0, -5])),
                    addr=draw(st.sampled_from([0x7F0000001000, 2**64 - 4096])),
                    opcode=opcode,
                    flags=draw(st.sampled_from([0, 0, 1])),
                    in_flight=draw(st.integers(1, 8)),
                    fixed=fixed,
                    vectored=draw(st.sampled_from([0, 2])) if opcode == 1 else 0,
                    comm=draw(st.sampled_from(["fio", ""])),
                )
            )
    return events


def _is_ring(event) -> bool:
    return isinstance(event, AuxEvent) and event.kind == AUX_URING_REQ or getattr(event, "name", "") == "io_uring_enter"


def _columns_of(events) -> ringcalls.RingCalls:
    """The io_uring_enter calls and requests of ``events`` as the bcc backend would decode them."""

    def column(get, dtype=np.int64):
        return np.array([get(e) for e in events], dtype=dtype)

    def enter_arg(name):
        return column(lambda e: e.args.get(name, 0) if isinstance(e, SyscallEvent) else 0)

    def request(name, dtype=np.int64):
        return column(lambda e: getattr(e, name) if isinstance(e, AuxEvent) else 0, dtype)

    return ringcalls.RingCalls(
        enter=column(lambda e: isinstance(e, SyscallEvent), bool),
        ts_ns=column(lambda e: e.ts_ns),
        dur_ns=column(lambda e: e.dur_ns),
        pid=column(lambda e: e.pid),
        tid=column(lambda e: e.tid),
        ret=column(lambda e: e.ret if isinstance(e, SyscallEvent) else e.res),
        fd=column(lambda e: e.args["fd"] if isinstance(e, SyscallEvent) else e.fd),
        to_submit=enter_arg("to_submit"),
        min_complete=enter_arg("min_complete"),
        enter_flags=enter_arg("flags"),
        sigsz=enter_arg("sigsz"),
        size=column(lambda e: e.size if isinstance(e, SyscallEvent) and e.size is not None else -1),
        ctx=request("ctx", np.uint64),
        user_data=request("user_data", np.uint64),
        addr=request("addr", np.uint64),
        offset=request("offset"),
        length=request("length"),
        opcode=request("opcode"),
        flags=request("flags"),
        in_flight=request("in_flight"),
        vectored=request("vectored"),
        fixed=request("fixed", bool),
        comm=np.array([e.comm for e in events], dtype=object),
    )


def _feed(events, *, split: bool, chunk: int, filters: tuple[str, ...], release_every: int, slack_ns: int):
    builder = TraceBuilder(start_ns=0, root_pid=PID, cwd="/", path_filters=filters)
    taken = []
    feeder = EffectOrderFeeder(
        builder, slack_ns=slack_ns, on_rows=lambda b: taken.append(b.take_rows()), release_every=release_every
    )
    for start in range(0, len(events), chunk):
        part = events[start : start + chunk]
        is_ring = np.array([_is_ring(e) for e in part], dtype=bool)
        if split:
            ring = [e for e, r in zip(part, is_ring) if r]
            feeder.add_split(
                [e for e, r in zip(part, is_ring) if not r], [(_columns_of(ring), is_ring)] if ring else []
            )
        else:
            feeder.add(part)
    feeder.finish()
    taken.append(builder.take_rows())
    taken = [part.to_pydict() if isinstance(part, pa.Table) else part for part in taken]
    rows = {name: [value for part in taken for value in part[name]] for name in state._COLUMN_NAMES}
    rings = {
        ctx: (ring.queue_id, sorted((i, d.path) for i, d in ring.fixed.items())) for ctx, ring in builder.rings.items()
    }
    counters = (dict(builder.unattributed), feeder.late_events, dict(builder.sizes), rings, builder.queues)
    return rows, counters


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    events=streams(),
    chunk=st.sampled_from([1, 5, 50]),
    filters=st.sampled_from([(), ("/ckpt/",)]),
    release=st.sampled_from([(3, 20), (64, 20), (64, 10**6)]),
)
def test_generated_streams_give_the_same_rows_and_state_with_io_uring_as_columns(
    monkeypatch, events, chunk, filters, release
):
    monkeypatch.setattr(state, "_DATA_RUN_MIN", 1)
    every, slack = release
    one_by_one = _feed(events, split=False, chunk=chunk, filters=filters, release_every=every, slack_ns=slack)
    as_columns = _feed(events, split=True, chunk=chunk, filters=filters, release_every=every, slack_ns=slack)
    assert as_columns == one_by_one


def _write_4k(ts_ns: int, ctx: int, fd: int, user_data: int, offset: int, *, fixed: bool = False) -> AuxEvent:
    """A completed 4 KiB IORING_OP_WRITE request of fio's main thread, queue depth 1."""
    return AuxEvent(
        kind=AUX_URING_REQ,
        ts_ns=ts_ns,
        dur_ns=3,
        pid=PID,
        tid=PID,
        fd=fd,
        ctx=ctx,
        user_data=user_data,
        offset=offset,
        length=4096,
        res=4096,
        addr=0x1000,
        opcode=23,
        in_flight=1,
        fixed=fixed,
        comm="fio",
    )


def test_a_run_of_requests_takes_the_columns_and_gets_the_rows_one_at_a_time_gives(monkeypatch):
    """A ring set up, a file opened and registered, then 40 enters and 40 write requests alternating (fio at
    queue depth 1): every row went through ``_append`` as columns, with the ring's queue id, the fixed file's
    path, the request ids as signed 64-bit values, and the same rows as one at a time."""
    monkeypatch.setattr(state, "_DATA_RUN_MIN", 16)
    events = [
        SyscallEvent(1, 1, PID, "io_uring_setup", {"entries": 8}, 3, PID),
        SyscallEvent(2, 1, PID, "openat", {"dirfd": sc.AT_FDCWD, "path": "/ckpt/f", "flags": sc.O_WRONLY}, 4, PID),
        SyscallEvent(3, 1, PID, "io_uring_register", {"fd": 3, "opcode": 2, "fds": [4], "nr_args": 1}, 0, PID),
        AuxEvent(kind=AUX_URING_CREATE, ts_ns=3, pid=PID, tid=PID, fd=3, ctx=0xABC),
    ]
    for i in range(40):
        ts = 10 + 10 * i
        events.append(_write_4k(ts + 1, 0xABC, 0, 2**64 - 1 - i, 4096 * i, fixed=True))
        events.append(
            SyscallEvent(ts, 2, PID, "io_uring_enter", {"fd": 3, "to_submit": 1, "min_complete": 1, "flags": 1}, 1, PID)
        )
    appended = _count_appended(monkeypatch)
    rows, counters = _feed(events, split=True, chunk=200, filters=(), release_every=4096, slack_ns=10**6)
    assert sum(appended) == 80
    writes = [i for i, op in enumerate(rows["op"]) if op == "write"]
    assert [rows["path"][i] for i in writes] == ["/ckpt/f"] * 40 and [rows["fd"][i] for i in writes] == [None] * 40
    assert [rows["request_id"][i] for i in writes] == [-1 - i for i in range(40)]
    enters = [i for i, op in enumerate(rows["op"]) if op == "io_uring_enter"]
    assert len(enters) == 40 and {rows["queue_id"][i] for i in enters + writes} == {0}
    assert (rows, counters) == _feed(events, split=False, chunk=200, filters=(), release_every=4096, slack_ns=10**6)


def test_rings_first_seen_at_requests_in_one_run_get_queue_ids_in_the_order_they_appear(monkeypatch):
    """Two rings set up with no creation seen (their contexts first seen at requests), the higher context's
    requests first, alternating in one run that takes the columns: the ring seen first gets the next queue id
    and the other the one after, as one at a time numbers them (not by context value)."""
    monkeypatch.setattr(state, "_DATA_RUN_MIN", 1)
    low, high = 0x1000, 0x2000
    events = [
        SyscallEvent(1, 1, PID, "io_uring_setup", {"entries": 8}, 3, PID),
        SyscallEvent(2, 1, PID, "io_uring_setup", {"entries": 8}, 4, PID),
        SyscallEvent(3, 1, PID, "openat", {"dirfd": sc.AT_FDCWD, "path": "/ckpt/f", "flags": sc.O_WRONLY}, 5, PID),
    ]
    events += [_write_4k(10 + i, high if i % 2 == 0 else low, 5, i, 4096 * i) for i in range(20)]
    appended = _count_appended(monkeypatch)
    rows, counters = _feed(events, split=True, chunk=100, filters=(), release_every=4096, slack_ns=10**6)
    assert sum(appended) == 20
    queue_of = {rows["request_id"][i]: rows["queue_id"][i] for i, op in enumerate(rows["op"]) if op == "write"}
    first = queue_of[0]  # after the queues of the two set-up calls
    assert queue_of == {i: first if i % 2 == 0 else first + 1 for i in range(20)}
    assert counters[3] == {high: (first, []), low: (first + 1, [])}
    assert (rows, counters) == _feed(events, split=False, chunk=100, filters=(), release_every=4096, slack_ns=10**6)
