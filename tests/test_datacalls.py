"""Read/write calls fed as columns (issue 35, ``tracer.datacalls``) give the rows and state that feeding them
one ``SyscallEvent`` at a time gives: on a real bcc recording's raw records and on generated event streams
(positions shared through dup and threads, O_APPEND and RWF_APPEND, unknown descriptors, failed calls, path
filters with renames, ties and late events in the re-ordering feeder)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from helpers.raw_stream import raw_stream, record_stream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_trace import config
from ckpt_trace.formats import read_trace
from ckpt_trace.tracer import datacalls, state
from ckpt_trace.tracer import syscalls as sc
from ckpt_trace.tracer.state import EffectOrderFeeder, SyscallEvent, TraceBuilder

PID = 100


@pytest.mark.parametrize("run_min", [1, 16])
def test_a_recorded_stream_gives_the_same_trace_with_calls_as_columns(tmp_path, monkeypatch, run_min):
    """The golden raw stream (a bcc recording: writes and pwrites from two threads, seeks, a dup, fsync, a
    rename, a mapped read, io_uring requests), decoded with read/write calls as columns and as one event
    each: equal tables and metadata, and the columnar path did take calls (runs as short as ``run_min``)."""
    monkeypatch.setattr(config, "RECORD_DECODE_EVENTS", 64)
    monkeypatch.setattr(state, "_DATA_RUN_MIN", run_min)
    taken = []
    real = datacalls.feed_data
    monkeypatch.setattr(datacalls, "feed_data", lambda builder, calls: (taken.append(len(calls)), real(builder, calls)))
    polls, meta = raw_stream()
    monkeypatch.setattr(config, "RECORD_DATA_COLUMNS", 0)
    events = read_trace(record_stream(tmp_path, "events", polls, meta, limit_bytes=None))
    assert taken == []
    monkeypatch.setattr(config, "RECORD_DATA_COLUMNS", 1)
    columns = read_trace(record_stream(tmp_path, "columns", polls, meta, limit_bytes=None))
    assert sum(taken) >= 100  # most of the 174 read/write calls went through as columns
    assert columns.table.num_rows == events.table.num_rows == meta["rows"]
    assert columns.table.equals(events.table)
    held = {"spilled_runs"}  # how many sorted runs the rows went through on their way: how they were held
    assert {k: x for k, x in columns.metadata.items() if k not in held} == {
        k: x for k, x in events.metadata.items() if k not in held
    }


# -- generated event streams ----------------------------------------------------------------------------------

PATHS = ("/ckpt/a", "/ckpt/b", "/tmp/c", "/dev/null")
DATA = ("read", "pread64", "readv", "preadv", "preadv2", "write", "pwrite64", "writev", "pwritev", "pwritev2")


@st.composite
def streams(draw):
    """A list of SyscallEvents of two threads of one process and a child process, in effect order with
    occasional equal effect times and calls that end late."""
    events, open_fds, ts = [], {PID: [], 200: []}, 0
    draw_ops = draw(st.lists(st.integers(0, 99), min_size=1, max_size=120))
    forked = False
    for roll in draw_ops:
        ts += draw(st.sampled_from([0, 1, 7]))
        tid = draw(st.sampled_from([PID, 101] + ([200] if forked else [])))
        group = 200 if tid == 200 else PID
        fds = open_fds[group]
        dur = draw(st.sampled_from([1, 2, 40]))  # 40: ends after calls that started later
        if roll < 8:
            fd = 3 + len(fds)
            flags = sc.O_RDWR | sc.O_CREAT | draw(st.sampled_from([0, 0, 0, 0, sc.O_APPEND, sc.O_TRUNC]))
            path = draw(st.sampled_from(PATHS))
            events.append(
                SyscallEvent(ts, dur, tid, "openat", {"dirfd": sc.AT_FDCWD, "path": path, "flags": flags}, fd, group)
            )
            fds.append(fd)
        elif roll < 10 and fds:
            fd = fds.pop(draw(st.integers(0, len(fds) - 1)))
            events.append(SyscallEvent(ts, dur, tid, "close", {"fd": fd}, 0, group))
        elif roll < 12 and fds:
            new = 3 + len(fds) + 10
            events.append(
                SyscallEvent(ts, dur, tid, "dup2", {"fd": draw(st.sampled_from(fds)), "newfd": new}, new, group)
            )
            fds.append(new)
        elif roll < 14 and fds:
            whence = draw(st.sampled_from([sc.SEEK_SET, sc.SEEK_END]))
            ret = draw(st.integers(0, 5000))
            events.append(
                SyscallEvent(
                    ts, dur, tid, "lseek", {"fd": draw(st.sampled_from(fds)), "offset": 0, "whence": whence}, ret, group
                )
            )
        elif roll < 15:
            events.append(SyscallEvent(ts, dur, tid, "rename", {"path": "/tmp/c", "path2": "/ckpt/c"}, 0, group))
        elif roll < 16 and not forked and tid != 200:
            events.append(SyscallEvent(ts, dur, tid, "clone", {"clone_flags": 17}, 200, group))
            open_fds[200] = list(fds)
            forked = True
        else:
            name = draw(st.sampled_from(DATA))
            fd = draw(st.sampled_from(fds)) if fds and draw(st.integers(0, 9)) else 77  # 77: never opened
            count = draw(st.sampled_from([0, 1, 512, 4096, 1 << 20]))
            ret = draw(st.sampled_from([count, count, count, count // 2, -5]))
            args = {"fd": fd}
            size = None
            if name in sc.VECTORED:
                args["iov_count"] = draw(st.integers(1, 4))
                size = draw(st.sampled_from([count, None]))
            else:
                args["count"] = count
            if name in sc.POSITIONAL:
                args["offset"] = draw(st.sampled_from([0, 4096, 123456, -1]))
            if name in ("preadv2", "pwritev2"):
                args["rwflags"] = draw(st.sampled_from([0, 0, 0, sc.RWF_APPEND]))
            events.append(SyscallEvent(ts, dur, tid, name, args, ret, group, draw(st.sampled_from(["py", ""])), size))
    return events


def _columns_of(events: list[SyscallEvent]) -> datacalls.DataCalls:
    """The read/write calls of ``events`` as the bcc backend's ``decode_data_calls`` would give them."""

    def column(get):
        return np.array([get(e) for e in events], dtype=np.int64)

    return datacalls.DataCalls(
        ts_ns=column(lambda e: e.ts_ns),
        dur_ns=column(lambda e: e.dur_ns),
        pid=column(lambda e: e.pid),
        tid=column(lambda e: e.tid),
        ret=column(lambda e: e.ret),
        fd=column(lambda e: e.args["fd"]),
        call=column(lambda e: datacalls.CALLS.index(e.name)),
        offset=column(lambda e: e.args.get("offset", 0)),
        size=column(lambda e: (e.size if e.size is not None else -1) if e.name in sc.VECTORED else e.args["count"]),
        iov_count=column(lambda e: e.args.get("iov_count", 0)),
        rwflags=column(lambda e: e.args.get("rwflags", 0)),
        comm=np.array([e.comm for e in events], dtype=object),
    )


def _feed(events, *, split: bool, chunk: int, filters: tuple[str, ...], release_every: int = 3, slack_ns: int = 20):
    builder = TraceBuilder(start_ns=0, root_pid=PID, cwd="/", path_filters=filters)
    taken = []
    feeder = EffectOrderFeeder(
        builder, slack_ns=slack_ns, on_rows=lambda b: taken.append(b.take_rows()), release_every=release_every
    )
    for start in range(0, len(events), chunk):
        part = events[start : start + chunk]
        is_call = np.array([e.name in DATA for e in part], dtype=bool)
        if split:
            feeder.add_split(
                [e for e, c in zip(part, is_call) if not c],
                [(_columns_of([e for e, c in zip(part, is_call) if c]), is_call)],
            )
        else:
            feeder.add(part)
    feeder.finish()
    taken.append(builder.take_rows())
    taken = [part.to_pydict() if isinstance(part, pa.Table) else part for part in taken]
    rows = {name: [value for part in taken for value in part[name]] for name in state._COLUMN_NAMES}
    positions = {(tgid, fd): desc.pos for tgid, proc in builder.procs.items() for fd, desc in proc.table.fds.items()}
    counters = (builder.untracked_fd_ops, builder.filtered_rows, feeder.late_events, dict(builder.sizes), positions)
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
def test_generated_streams_give_the_same_rows_and_state_with_calls_as_columns(
    monkeypatch, events, chunk, filters, release
):
    monkeypatch.setattr(state, "_DATA_RUN_MIN", 1)
    every, slack = release
    one_by_one = _feed(events, split=False, chunk=chunk, filters=filters, release_every=every, slack_ns=slack)
    as_columns = _feed(events, split=True, chunk=chunk, filters=filters, release_every=every, slack_ns=slack)
    assert as_columns == one_by_one


def test_a_run_of_writes_on_shared_positions_gets_the_offsets_one_at_a_time_gives():
    """Two threads writing through a descriptor and its dup (one description, one position), a failed write
    that moves nothing, a descriptor with an unknown position: offsets continue across them."""
    events = [
        SyscallEvent(
            1, 1, PID, "openat", {"dirfd": sc.AT_FDCWD, "path": "/f", "flags": sc.O_WRONLY | sc.O_CREAT}, 3, PID
        ),
        SyscallEvent(3, 1, PID, "dup", {"fd": 3}, 4, PID),
        SyscallEvent(5, 1, PID, "openat", {"dirfd": sc.AT_FDCWD, "path": "/g", "flags": sc.O_WRONLY}, 5, PID),
    ]
    events += [
        SyscallEvent(10 + i, 1, PID + i % 2, "write", {"fd": 3 + i % 3, "count": 100}, -5 if i == 3 else 100, PID, "py")
        for i in range(30)
    ]
    rows, (untracked, *_rest) = _feed(events, split=True, chunk=50, filters=(), release_every=64)
    writes = [(p, o) for p, o, op in zip(rows["path"], rows["offset"], rows["op"]) if op == "write"]
    shared = [100 * k - (100 if k > 2 else 0) for k in range(20)]  # fds 3 and 4: one position; call 3 failed
    assert [o for p, o in writes if p == "/f"] == shared
    assert [o for p, o in writes if p == "/g"] == [100 * k for k in range(10)]
    assert rows == _feed(events, split=False, chunk=50, filters=(), release_every=64)[0] and untracked == 0
