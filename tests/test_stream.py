"""Streaming record (issue 35): raw ring records decoded while the command runs give the trace the
whole-job path gives.

The events are a real bcc recording's (``tests/data/raw_stream.npz``, saved by
``scripts/save_raw_stream.py``: a Python workload of writes, pwrites from two threads, seeks, a dup,
fsync, a rename, a mapped read, then fio's io_uring requests), as the rings gave them poll by poll.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from helpers.raw_stream import raw_stream, record_stream

from ckpt_trace import config
from ckpt_trace.errors import TracerError
from ckpt_trace.formats import read_trace
from ckpt_trace.tracer.stream import RawSpill, StreamDecoder

# Keys that say how long things took or how the raw records were held, not what the trace holds.
NOT_COMPARED = {"spilled_raw_bytes"}


@pytest.mark.parametrize("limit_bytes", [1, 1 << 30], ids=["every-poll-spilled", "held"])
def test_a_streamed_recording_is_the_whole_job_recording(tmp_path, monkeypatch, limit_bytes):
    """The same raw events decoded as they come (each poll compressed to the spill file and read back, or
    held and batched as the decoder falls behind), 7 events at a time, equal the whole job decoded at once:
    the same table (``Table.equals``) and the same metadata but for how the raw records were held; and the
    rows the real recording wrote."""
    monkeypatch.setattr(config, "RECORD_DECODE_EVENTS", 7)
    polls, meta = raw_stream()
    assert sum(len(c) for poll in polls for chunks in poll.values() for c in chunks) > 1000
    whole = read_trace(record_stream(tmp_path, "whole", polls, meta, limit_bytes=None))
    streamed = read_trace(record_stream(tmp_path, "streamed", polls, meta, limit_bytes=limit_bytes))
    assert streamed.table.num_rows == whole.table.num_rows == meta["rows"]
    assert streamed.table.equals(whole.table)
    keys = set(whole.metadata) | set(streamed.metadata)
    assert {k: streamed.metadata.get(k) for k in keys - NOT_COMPARED} == {
        k: whole.metadata.get(k) for k in keys - NOT_COMPARED
    }
    assert whole.metadata["spilled_raw_bytes"] == 0
    assert (streamed.metadata["spilled_raw_bytes"] > 0) == (limit_bytes == 1)
    assert streamed.metadata["spilled_runs"] >= 2  # rows went through sorted runs too
    ops = set(whole.table.column("op").to_pylist())
    assert {"write", "read", "fsync", "rename", "mmap", "dup"} <= ops  # the workload's calls are there
    assert any(i == "io_uring" for i in whole.table.column("interface").to_pylist())


def test_the_decoder_holds_at_most_its_limit_and_spills_the_rest_in_order(tmp_path):
    """While the decoder is busy, what comes past ``limit_bytes`` is spilled and read back in its turn: the
    feed sees every record once, in the order put, and memory queued never passes the limit."""
    dtype = np.dtype([("ts_ns", "<u8"), ("pad", "u1", (56,))])
    raw = RawSpill(tmp_path, {"events": dtype})
    gate, seen = threading.Event(), []

    def feed(group):
        gate.wait()
        seen.extend(int(t) for records in group.get("events", []) for t in records["ts_ns"])

    decoder = StreamDecoder(feed, raw, limit_bytes=10 * dtype.itemsize)
    for start in range(0, 100, 4):
        decoder.put({"events": [np.array([(t, np.zeros(56, np.uint8)) for t in range(start, start + 4)], dtype)]})
    assert decoder.peak_queued_bytes <= 10 * dtype.itemsize
    assert raw.count > 0  # the rest went to the spill file
    assert decoder.pending_bytes == 100 * dtype.itemsize  # nothing fed yet (the feed holds the first group)
    gate.set()
    decoder.close()
    assert decoder.pending_bytes == decoder.queued_bytes == 0
    raw.close()
    assert seen == list(range(100))


def test_a_feed_that_fails_is_raised_by_the_consumer(tmp_path):
    raw = RawSpill(tmp_path, {"events": np.dtype("<u8")})

    def feed(group):
        raise TracerError("no space left for runs")

    decoder = StreamDecoder(feed, raw, limit_bytes=1 << 20)
    decoder.put({"events": [np.arange(3, dtype="<u8")]})
    with pytest.raises(TracerError, match="no space"):
        decoder.close()
    raw.close()


def test_the_decoder_gathers_its_batch_before_it_feeds(tmp_path):
    """With ``batch_bytes``, groups put one poll at a time are fed together once that many bytes wait (a
    decoder that keeps up would otherwise pay its fixed cost per poll), in the order put; ``close`` feeds a
    smaller rest at once, without waiting out ``batch_wait_s``."""
    dtype = np.dtype([("ts_ns", "<u8")])
    raw = RawSpill(tmp_path, {"events": dtype})
    fed = []
    decoder = StreamDecoder(
        lambda group: fed.append([int(t) for records in group["events"] for t in records["ts_ns"]]),
        raw,
        limit_bytes=1 << 20,
        batch_bytes=10 * 8,
        batch_wait_s=600,
    )
    for t in range(10):
        decoder.put({"events": [np.array([t], dtype)]})
    deadline = time.monotonic() + 60
    while not fed and time.monotonic() < deadline:  # the decoder thread takes them: polled, not slept for
        time.sleep(0.01)
    assert fed == [list(range(10))]  # nothing before the tenth (a feed before it would hold fewer)
    for t in range(10, 13):
        decoder.put({"events": [np.array([t], dtype)]})
    started = time.monotonic()
    decoder.close()
    assert fed == [list(range(10)), [10, 11, 12]] and time.monotonic() - started < 60
