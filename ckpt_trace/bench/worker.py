"""One process of a bench point: write the stream and fsync it, or read it back, timed.

Call order, inside the child process (``child_main``): ``StreamWriter(...)``
(or ``StreamReader(...)`` for a read point) opens the file and allocates and
pre-faults every buffer (untimed), the process waits at the point's barrier,
then ``run()`` writes the stream and fsyncs it (reads it) inside the timed
region, and ``close()`` frees everything.

A read point first lays its file out untimed: the stream's content written
with buffered pwrite(2), fsynced, and its pages dropped from the page cache
with posix_fadvise(POSIX_FADV_DONTNEED) (clean pages of this file only;
nothing else is evicted), so the timed reads come from the storage. They land
in one destination buffer the size of the stream, as a restore reads into
the state dict's memory, and the destination is compared byte for byte with
the pattern after the clock stops: a read that returned wrong or missing
bytes fails the point.

The data: every byte at file offset ``o`` is ``iolayer.pattern``'s byte for
``o`` (key 0), taken from one pattern buffer, so a piece written at the wrong
offset shows in the file and every aligned piece starts at an aligned
address, as O_DIRECT requires. Bytes before a misaligned stream's start are
zeros.

The stream's layout is ``matrix.pieces`` / ``matrix.staging_writes``. Plain
(not aggregated) streams are one batch of requests issued by the I/O layer's
C loops: ``pio_run`` (one pwrite(2) at a time) for POSIX, ``Ring.run`` (at
most ``queue_depth`` in flight) for io_uring, so the figures are the
storage's, not Python's. Aggregated points copy the pieces into staging
buffers (one for POSIX, ``queue_depth + 1`` for io_uring, fewer when the
stream has fewer buffers) and write a buffer when the stream leaves it. A
preallocated point calls posix_fallocate(3) for the whole file at the start
of the timed region. Latency is per write: the syscall for POSIX, entering
the kernel to the reaping of the completion for io_uring; CPU is the
process's user + system time over the timed region (getrusage(2)).
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import time
from array import array
from dataclasses import dataclass
from threading import BrokenBarrierError

import numpy as np

from ckpt_trace.iolayer import pattern
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.iolayer.buffers import AlignedBuffer, pattern_buffer

from .matrix import BenchPoint, pieces, staging_writes

UNSUPPORTED = (errno.EINVAL, errno.EOPNOTSUPP)
PATTERN_KEY = 0


@dataclass
class StreamResult:
    """What one process measured: CLOCK_MONOTONIC start and end of the timed region (ns, comparable
    across processes), the stream's bytes, file writes (reads) issued, their latencies (``array('q')`` bytes, ns)
    and the CPU seconds spent."""

    start_ns: int
    end_ns: int
    stream_bytes: int
    io_ops: int
    latencies_ns: bytes
    cpu_s: float


def expected_content(point: BenchPoint, stream: int) -> bytes:
    """What a stream of ``stream`` bytes leaves in its file (see the module docstring)."""
    return bytes(point.misaligned_bytes) + pattern.expected(point.misaligned_bytes, stream, PATTERN_KEY)


def _held(buf: AlignedBuffer | None, what: str) -> AlignedBuffer:
    """A stream's ``what`` buffer, allocated when the stream is made; ValueError once ``close`` freed it."""
    if buf is None:
        raise ValueError(f"the stream's {what} buffer is freed: the stream was closed")
    return buf


class _Stream:
    """What a writer and a reader share: the plain stream as one batch of requests through the I/O layer's C
    loops, the staging buffers and the ring, and freeing them. Subclasses set ``point``, ``stream``,
    ``fd``, ``ring``, ``requests``, ``buffers``, ``latencies_ns`` and list their own buffers in ``_owned``."""

    point: BenchPoint
    stream: int
    fd: int
    ring: rings.Ring | None
    requests: np.ndarray | None
    buffers: list[AlignedBuffer]
    latencies_ns: array

    def _batch(self, opcode: int, addresses) -> np.ndarray:
        """Each piece of the stream one request of ``opcode`` at its own offset, from ``addresses(offsets)``."""
        layout = np.array(list(pieces(self.point, self.stream)), dtype=np.int64).reshape(-1, 2)
        requests = rings.batch(len(layout))
        requests["opcode"] = opcode
        requests["fd"] = self.fd
        requests["off"] = layout[:, 0]
        requests["len"] = layout[:, 1]
        requests["addr"] = addresses(layout[:, 0])
        return requests

    def _plain(self) -> int:
        """The pieces as one batch through the C loop (io_uring, or one call at a time); requests issued."""
        requests = self.requests
        if requests is None:
            raise ValueError("the stream's requests are made for a plain (not aggregated) point only")
        if self.ring is not None:
            results, latencies = self.ring.run(requests)
        else:
            results, latencies = rings.pio_run(requests)
            self.latencies_ns.extend(latencies.tolist())
        failed = rings.first_failure(requests, results)
        if failed is not None:
            raise failed[1]
        return len(requests)

    def _staged(self, kind: str, buf: AlignedBuffer, size: int, offset: int, slot: int) -> None:
        """One staging buffer's ``kind`` (read or write) of ``size`` bytes at ``offset``: submitted to the ring
        under key ``slot``, or done at once by pread(2)/pwrite(2) (timed; a read stops at the end of the
        file, a write that cannot finish raises ENOSPC)."""
        if self.ring is not None:
            self.ring.submit(kind, self.fd, buf.ptr, size, offset, key=slot)
            return
        view = buf.view()
        try:
            done = 0
            began = time.perf_counter_ns()
            while done < size:
                moved = (
                    os.pwrite(self.fd, view[done:size], offset + done)
                    if kind == "write"
                    else os.preadv(self.fd, [view[done:size]], offset + done)
                )
                if moved <= 0:
                    if kind == "write":
                        raise OSError(errno.ENOSPC, "short write")
                    break  # the end of the file: a read window rounded up past it
                done += moved
            self.latencies_ns.append(time.perf_counter_ns() - began)
        finally:
            view.release()

    def _owned(self) -> list[AlignedBuffer]:
        return []

    def close(self) -> None:
        """Reap what is in flight (the kernel may still use the buffers), then free everything."""
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        for buf in self.buffers + self._owned():
            buf.close()
        self.buffers = []
        self._release_owned()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _release_owned(self) -> None:
        pass


def _cpu_s(before: resource.struct_rusage) -> float:
    """User + system seconds of this process since ``before`` (getrusage(2))."""
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


class StreamWriter(_Stream):
    """Writes one process's stream of ``point`` to ``path`` (created exclusively); see the module docstring.

    ``stream`` is the stream's bytes, ``aggregate_bytes`` the staging buffer
    size and ``block_bytes`` the file system block the last staging write is
    rounded to. Raises OSError from open (EINVAL: O_DIRECT refused) or from
    ``run`` (EINVAL: an O_DIRECT write the storage cannot take, ENOSPC...).
    """

    def __init__(self, point: BenchPoint, path: str, stream: int, aggregate_bytes: int, block_bytes: int) -> None:
        self.point, self.stream = point, stream
        self.aggregate_bytes, self.block_bytes = aggregate_bytes, block_bytes
        self.fd = -1
        self.source: AlignedBuffer | None = None
        self.buffers: list[AlignedBuffer] = []
        self.ring: rings.Ring | None = None
        self.requests: np.ndarray | None = None
        self.latencies_ns = array("q")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
        self.fd = os.open(path, flags | (os.O_DIRECT if point.direct else 0), 0o644)
        try:
            self._allocate()
        except BaseException:
            self.close()
            raise

    def _allocate(self) -> None:
        point = self.point
        self.source = pattern_buffer(min(point.size_bytes, self.stream) + point.misaligned_bytes)
        if point.aggregated:
            count = len(staging_writes(point, self.stream, self.aggregate_bytes, self.block_bytes))
            wanted = 1 if point.engine == "posix" else min(point.queue_depth + 1, count)
            self.buffers = [AlignedBuffer(self.aggregate_bytes).prefault() for _ in range(wanted)]
        else:
            self.requests = self._piece_requests()
        if point.engine == "uring":
            self.ring = rings.Ring(point.queue_depth, latency_sink=self.latencies_ns)

    def _piece_requests(self) -> np.ndarray:
        """The plain stream as one batch: each piece one write from the pattern buffer at its own offset."""
        source = _held(self.source, "pattern")
        return self._batch(
            rings.OP_WRITE, lambda offsets: source.ptr + (offsets + pattern.PAGE * PATTERN_KEY) % pattern.PERIOD
        )

    def run(self) -> StreamResult:
        """Write the stream, fsync the file, and return the measurements."""
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        start_ns = time.monotonic_ns()
        if self.point.preallocated:
            os.posix_fallocate(self.fd, 0, self.point.misaligned_bytes + self.stream)
        writes = self._aggregated() if self.point.aggregated else self._plain()
        if self.ring is not None:
            self.ring.drain()
        if self.point.aggregated:
            os.ftruncate(self.fd, self.point.misaligned_bytes + self.stream)
        os.fsync(self.fd)
        end_ns = time.monotonic_ns()
        return StreamResult(start_ns, end_ns, self.stream, writes, self.latencies_ns.tobytes(), _cpu_s(usage0))

    def _write(self, buf: AlignedBuffer, size: int, offset: int, slot: int) -> None:
        """One staging buffer's write of ``size`` bytes at ``offset``; ``slot`` names the buffer."""
        self._staged("write", buf, size, offset, slot)

    def _aggregated(self) -> int:
        """Copy the pieces into the staging buffers; write each buffer once the stream leaves it."""
        plan = staging_writes(self.point, self.stream, self.aggregate_bytes, self.block_bytes)
        source = _held(self.source, "pattern").view()
        current = -1
        try:
            for offset, size in pieces(self.point, self.stream):
                first = pattern.start(offset, PATTERN_KEY)
                done = 0
                while done < size:
                    position = offset + done
                    buffer_index = position // self.aggregate_bytes
                    if buffer_index != current:
                        if current >= 0:
                            self._flush(plan, current)
                        current = buffer_index
                        self._reclaim(current)
                    within = position - buffer_index * self.aggregate_bytes
                    take = min(size - done, self.aggregate_bytes - within)
                    staging = self.buffers[current % len(self.buffers)]
                    staging.mmap[within : within + take] = source[first + done : first + done + take]
                    done += take
            self._flush(plan, current)
        finally:
            source.release()
        return len(plan)

    def _reclaim(self, buffer_index: int) -> None:
        """Before refilling a staging buffer, wait for its previous write (io_uring) to complete; a fresh
        stretch of the file before the stream's start stays zero."""
        if self.ring is not None:
            self.ring.drain(buffer_index % len(self.buffers))
        if buffer_index * self.aggregate_bytes < self.point.misaligned_bytes:
            staging = self.buffers[buffer_index % len(self.buffers)]
            staging.mmap[: self.point.misaligned_bytes] = bytes(self.point.misaligned_bytes)

    def _flush(self, plan: list[tuple[int, int]], buffer_index: int) -> None:
        offset, size = plan[buffer_index]
        slot = buffer_index % len(self.buffers)
        self._write(self.buffers[slot], size, offset, slot)

    def _owned(self) -> list[AlignedBuffer]:
        return [self.source] if self.source is not None else []

    def _release_owned(self) -> None:
        self.source = None


LAYOUT_CHUNK_BYTES = 8 << 20  # a read point's file is laid out (and checked) this much at a time


class StreamReader(_Stream):
    """Reads one process's stream of ``point`` back from ``path`` (created exclusively and laid out first,
    untimed; see the module docstring) into ``destination``, a buffer of ``stream`` bytes.

    Plain streams are one batch of reads, each piece into its place in the
    destination (``Ring.run`` or ``pio_run``); aggregated streams read each
    aligned staging window of ``aggregate_bytes`` (the last rounded up to
    ``block_bytes``; the read stops at the end of the file) and copy the
    pieces out, with io_uring up to ``queue_depth`` windows ahead. Raises
    OSError from open (EINVAL: O_DIRECT refused) or ``run`` (EINVAL: an
    O_DIRECT read the storage cannot take), and ``ValueError`` from ``run``
    when the bytes read differ from the pattern.
    """

    def __init__(self, point: BenchPoint, path: str, stream: int, aggregate_bytes: int, block_bytes: int) -> None:
        self.point, self.stream = point, stream
        self.aggregate_bytes, self.block_bytes = aggregate_bytes, block_bytes
        self.fd = -1
        self.source: AlignedBuffer | None = None
        self.destination: AlignedBuffer | None = None
        self.buffers: list[AlignedBuffer] = []
        self.ring: rings.Ring | None = None
        self.requests: np.ndarray | None = None
        self.latencies_ns = array("q")
        try:
            self.source = pattern_buffer(LAYOUT_CHUNK_BYTES)
            self._lay_out(path)
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_DIRECT if point.direct else 0))
            self.destination = AlignedBuffer(stream).prefault()
            if point.aggregated:
                count = len(staging_writes(point, stream, aggregate_bytes, block_bytes))
                wanted = 1 if point.engine == "posix" else min(point.queue_depth + 1, count)
                self.buffers = [AlignedBuffer(aggregate_bytes).prefault() for _ in range(wanted)]
            else:
                self.requests = self._piece_requests()
            if point.engine == "uring":
                self.ring = rings.Ring(point.queue_depth, latency_sink=self.latencies_ns)
        except BaseException:
            self.close()
            raise

    def _chunks(self):
        """(file offset, bytes, pattern buffer start) of the stream's content, ``LAYOUT_CHUNK_BYTES`` at a time."""
        first, end = self.point.misaligned_bytes, self.point.misaligned_bytes + self.stream
        for offset in range(first, end, LAYOUT_CHUNK_BYTES):
            yield offset, min(LAYOUT_CHUNK_BYTES, end - offset), pattern.start(offset, PATTERN_KEY)

    def _lay_out(self, path: str) -> None:
        """Write what a write stream leaves (``expected_content``), fsync it, drop its pages from the cache."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            if self.point.misaligned_bytes:
                os.pwrite(fd, bytes(self.point.misaligned_bytes), 0)
            view = _held(self.source, "pattern").view()
            try:
                for offset, size, first in self._chunks():
                    done = 0
                    while done < size:
                        written = os.pwrite(fd, view[first + done : first + size], offset + done)
                        if written <= 0:
                            raise OSError(errno.ENOSPC, "short write laying out the read stream")
                        done += written
            finally:
                view.release()
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def _piece_requests(self) -> np.ndarray:
        """The plain stream as one batch: each piece one read into its place in the destination."""
        destination = _held(self.destination, "destination")
        return self._batch(rings.OP_READ, lambda offsets: destination.ptr + offsets - self.point.misaligned_bytes)

    def run(self) -> StreamResult:
        """Read the stream, then (after the clock) check every byte of the destination."""
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        start_ns = time.monotonic_ns()
        reads = self._aggregated() if self.point.aggregated else self._plain()
        if self.ring is not None:
            self.ring.drain()
        end_ns = time.monotonic_ns()
        cpu_s = _cpu_s(usage0)
        self.check()
        return StreamResult(start_ns, end_ns, self.stream, reads, self.latencies_ns.tobytes(), cpu_s)

    def check(self) -> None:
        """Raise ValueError unless the destination holds the stream's pattern bytes."""
        got = np.frombuffer(_held(self.destination, "destination").mmap, np.uint8)
        want = np.frombuffer(_held(self.source, "pattern").mmap, np.uint8)
        for offset, size, first in self._chunks():
            at = offset - self.point.misaligned_bytes
            if not np.array_equal(got[at : at + size], want[first : first + size]):
                bad = at + int(np.flatnonzero(got[at : at + size] != want[first : first + size])[0])
                raise ValueError(
                    f"the read stream returned wrong bytes at file offset {bad + self.point.misaligned_bytes}"
                )

    def _read(self, slot: int, offset: int, size: int) -> None:
        """Read staging window ``slot`` (``size`` bytes at ``offset``; less at the end of the file)."""
        self._staged("read", self.buffers[slot], size, offset, slot)

    def _aggregated(self) -> int:
        """Read each staging window (io_uring: up to ``len(buffers)`` ahead) and copy the pieces out."""
        plan = staging_writes(self.point, self.stream, self.aggregate_bytes, self.block_bytes)
        slots = len(self.buffers)
        for index in range(min(slots, len(plan))):
            self._read(index % slots, *plan[index])
        destination = _held(self.destination, "destination").view()
        current = -1
        try:
            for offset, size in pieces(self.point, self.stream):
                done = 0
                while done < size:
                    position = offset + done
                    window = position // self.aggregate_bytes
                    if window != current:
                        if self.ring is None:
                            if window > 0:
                                self._read(0, *plan[window])
                        else:
                            if current >= 0 and current + slots < len(plan):  # its buffer is free again
                                self._read(current % slots, *plan[current + slots])
                            self.ring.drain(window % slots)
                        current = window
                    within = position - window * self.aggregate_bytes
                    take = min(size - done, self.aggregate_bytes - within)
                    at = position - self.point.misaligned_bytes
                    destination[at : at + take] = self.buffers[window % slots].mmap[within : within + take]
                    done += take
        finally:
            destination.release()
        return len(plan)

    def _owned(self) -> list[AlignedBuffer]:
        return [b for b in (self.source, self.destination) if b is not None]

    def _release_owned(self) -> None:
        self.source = self.destination = None


def describe_os_error(err: OSError, point: BenchPoint) -> str:
    """One line for a failed point: what the storage refused, in the field's terms."""
    if err.errno in UNSUPPORTED and point.direct:
        what = "O_DIRECT" + (
            f" at an offset misaligned by {point.misaligned_bytes} B"
            if point.misaligned_bytes and not point.aggregated
            else ""
        )
        return f"{errno.errorcode.get(err.errno, err.errno)}: this storage refuses {what}"
    name = errno.errorcode.get(err.errno, "error") if err.errno is not None else "error"
    return f"{name}: {err.strerror or err}"


def child_main(
    point: BenchPoint, path: str, stream: int, aggregate_bytes: int, block_bytes: int, barrier, conn
) -> None:
    """Entry point of one bench process: set up, meet the others at ``barrier``, run, send the outcome.

    Sends ("ok", StreamResult), ("unsupported", line) when the storage refuses
    the configuration (EINVAL/EOPNOTSUPP), or ("error", line) for any other
    OSError; a process whose partner failed during setup sends ("aborted", "").
    SIGINT is ignored: Ctrl-C reaches the whole process group, and the parent
    decides (it kills its writers and removes their files).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        kind = StreamReader if point.direction == "read" else StreamWriter
        writer = kind(point, path, stream, aggregate_bytes, block_bytes)
    except OSError as err:
        barrier.abort()
        conn.send(("unsupported" if err.errno in UNSUPPORTED else "error", describe_os_error(err, point)))
        return
    except Exception as err:  # noqa: BLE001 - e.g. MemoryError for the buffers: end the point, not hang it
        barrier.abort()
        conn.send(("error", f"{type(err).__name__}: {err}"))
        return
    try:
        barrier.wait()
        conn.send(("ok", writer.run()))
    except OSError as err:
        conn.send(("unsupported" if err.errno in UNSUPPORTED else "error", describe_os_error(err, point)))
    except ValueError as err:  # a read stream that returned wrong bytes
        conn.send(("error", str(err)))
    except BrokenBarrierError:
        conn.send(("aborted", ""))
    finally:
        writer.close()
        conn.close()
