"""The I/O layer's ring: every request completes exactly once, failures follow one rule, batches run in C."""

from __future__ import annotations

import errno
import os
from array import array

import numpy as np
import pytest

from ckpt_trace.iolayer import pattern
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.iolayer.buffers import AlignedBuffer, pattern_buffer

pytestmark = pytest.mark.io_uring


@pytest.fixture
def data_file(tmp_path, io_uring):
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    yield fd
    os.close(fd)


def test_every_request_is_returned_by_wait_exactly_once(data_file):
    """The reader's loop (submit while there is room, then wait) ends with every request returned, also
    when one reap brings back several completions at once."""
    buf = AlignedBuffer(4096)
    with rings.Ring(8) as ring:
        returned, position, total = [], 0, 200
        while position < total or ring.pending:
            while position < total and ring.has_room:
                ring.submit("write", data_file, buf.ptr, 4096, position * 4096, tag=position)
                position += 1
            returned.append(ring.wait().tag)
        assert sorted(returned) == list(range(total))
        with pytest.raises(RuntimeError, match="no request pending"):
            ring.wait()
    assert os.fstat(data_file).st_size == total * 4096
    buf.close()


def test_drain_by_key_keeps_other_keys_completions_for_wait(data_file):
    buf = AlignedBuffer(4096)
    latencies = array("q")
    with rings.Ring(16, latency_sink=latencies) as ring:
        for index in range(12):
            ring.submit("write", data_file, buf.ptr, 4096, index * 4096, key=index % 3, tag=index)
        ring.drain(1)
        assert ring.by_key[1] == 0
        rest = sorted(ring.wait().tag for _ in range(ring.pending))
        assert set(rest) <= {i for i in range(12) if i % 3 != 1} and not ring.pending
    assert len(latencies) == 12 and min(latencies) > 0
    buf.close()


def test_a_failed_request_raises_its_errno_after_draining_everything(data_file):
    buf = AlignedBuffer(4096)
    ring = rings.Ring(4)
    ring.submit("write", data_file, buf.ptr, 4096, 0)
    ring.submit("write", 987654, buf.ptr, 4096, 0)  # not a descriptor
    ring.submit("write", data_file, buf.ptr, 4096, 4096)
    with pytest.raises(OSError) as caught:
        ring.drain()
    assert caught.value.errno == errno.EBADF and not ring.pending
    ring.close()
    buf.close()


def test_a_short_write_is_enospc(small_tmpfs, io_uring):
    buf = AlignedBuffer(2 << 20)
    fd = os.open(small_tmpfs / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with rings.Ring(2) as ring:
            ring.submit("write", fd, buf.ptr, 2 << 20, 0)  # 2 MiB into a 1 MiB tmpfs
            with pytest.raises(OSError) as caught:
                ring.drain()
        assert caught.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
        buf.close()


@pytest.mark.parametrize("engine", ["uring", "posix"])
def test_a_batch_writes_every_byte_where_it_belongs(data_file, engine):
    source = pattern_buffer(64 << 10)
    sizes = np.array([4096, 512, 65536, 100, 8192] * 40, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    requests = rings.batch(len(sizes))
    requests["opcode"] = rings.OP_WRITE
    requests["fd"] = data_file
    requests["off"] = offsets
    requests["len"] = sizes
    requests["addr"] = source.ptr + (offsets + pattern.PAGE * 3) % pattern.PERIOD
    if engine == "uring":
        with rings.Ring(16) as ring:
            results, latencies = ring.run(requests)
    else:
        results, latencies = rings.pio_run(requests)
    assert (results == sizes).all() and (latencies > 0).all() and rings.first_failure(requests, results) is None
    total = int(sizes.sum())
    assert pattern.first_difference(os.pread(data_file, total, 0), 0, 3) is None
    source.close()


def test_a_batch_stops_at_the_first_failure_and_says_which(data_file):
    buf = AlignedBuffer(4096)
    requests = rings.batch(50)
    requests["opcode"] = rings.OP_WRITE
    requests["fd"] = data_file
    requests["len"] = 4096
    requests["addr"] = buf.ptr
    requests["off"] = np.arange(50) * 4096
    requests["fd"][10] = 987654
    for results, _ in (rings.Ring(4).run(requests), rings.pio_run(requests)):
        index, error = rings.first_failure(requests, results)
        assert index == 10 and error.errno == errno.EBADF
        assert (results[:10] == 4096).all() and (results == rings.NOT_ISSUED).sum() >= 30
    buf.close()


def test_registered_buffers_and_the_queue_depth_probe(data_file):
    buffers = [AlignedBuffer(4096).fill(bytes([i]) * 4096) for i in range(3)]
    with rings.Ring(4) as ring:
        assert rings.OP_WRITE_FIXED in ring.supported_ops()
        ring.register_buffers(buffers)
        for i, buf in enumerate(buffers):
            ring.submit("write", data_file, buf.ptr, 4096, i * 4096, buf_index=i)
        ring.drain()
    assert os.pread(data_file, 3 * 4096, 0) == b"".join(bytes([i]) * 4096 for i in range(3))
    assert "exceeds io_uring's limit of 32768" in rings.probe(65536) and rings.probe(32) is None
    for buf in buffers:
        buf.close()
