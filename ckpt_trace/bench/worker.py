"""One writer process of a bench point: open, write the stream, fsync, close, timed.

Call order, inside the child process (``child_main``): ``StreamWriter(...)``
opens the file and allocates and pre-faults every buffer (untimed), the
process waits at the point's barrier, then ``run()`` writes the stream and
fsyncs it inside the timed region, and ``close()`` frees everything.

The source data: one page-aligned buffer of ``size_bytes + 7 * 4096`` bytes
whose byte i is ``i % 251``; piece k is taken from offset
``4096 * (k % 7)`` of it, so neighbouring pieces differ (a misplaced piece
shows) and every source address stays aligned for O_DIRECT.

The stream's layout is ``matrix.pieces`` / ``matrix.staging_writes``. POSIX
writes are pwrite(2) calls, one at a time; io_uring writes go through one
ring per process with at most ``queue_depth`` in flight
(``replayer.uring.TimedRing``). Aggregated points copy pieces into staging
buffers (one for POSIX, ``queue_depth + 1`` for io_uring, fewer when the
stream has fewer buffers) and write a buffer when the stream leaves it.
A preallocated point calls posix_fallocate(3) for the whole file at the start of the timed
region. Latency is per write: the syscall for POSIX, submission to completion for
io_uring; CPU is the process's user + system time over the timed region
(getrusage(2)).
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

from ckpt_trace.replayer.uring import TimedRing
from ckpt_trace.writer.engine import AlignedBuffer

from .matrix import BenchPoint, pieces, staging_writes

SOURCE_PERIOD = 251
SOURCE_ROTATIONS = 7
SOURCE_STEP_BYTES = 4096
UNSUPPORTED = (errno.EINVAL, errno.EOPNOTSUPP)


@dataclass
class StreamResult:
    """What one process measured: CLOCK_MONOTONIC start and end of the timed region (ns, comparable
    across processes), the stream's bytes, file writes issued, their latencies (``array('q')`` bytes, ns)
    and the CPU seconds spent."""

    start_ns: int
    end_ns: int
    stream_bytes: int
    write_ops: int
    latencies_ns: bytes
    cpu_s: float


def piece_source_offset(index: int) -> int:
    """Where piece ``index`` starts in the source buffer (see the module docstring)."""
    return SOURCE_STEP_BYTES * (index % SOURCE_ROTATIONS)


def _fill(buf: AlignedBuffer, block: bytes) -> AlignedBuffer:
    """Write ``block`` over ``buf`` again and again (which also faults every page in, before the clock)."""
    for start in range(0, len(buf.mmap), len(block)):
        chunk = min(len(block), len(buf.mmap) - start)
        buf.mmap[start:start + chunk] = block[:chunk]
    return buf


def source_buffer(size_bytes: int) -> AlignedBuffer:
    """The pattern-filled source buffer for pieces of ``size_bytes``."""
    period = bytes(range(SOURCE_PERIOD))
    block = period * ((1 << 20) // SOURCE_PERIOD + 1)  # whole periods, so every copy starts in phase
    return _fill(AlignedBuffer(size_bytes + SOURCE_STEP_BYTES * SOURCE_ROTATIONS), block)


class StreamWriter:
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
        self.ring: TimedRing | None = None
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
        self.source = source_buffer(point.size_bytes)
        if point.aggregated:
            count = len(staging_writes(point, self.stream, self.aggregate_bytes, self.block_bytes))
            wanted = 1 if point.engine == "posix" else min(point.queue_depth + 1, count)
            zeros = bytes(min(self.aggregate_bytes, 1 << 20))
            self.buffers = [_fill(AlignedBuffer(self.aggregate_bytes), zeros) for _ in range(wanted)]
        if point.engine == "uring":
            self.ring = TimedRing(point.queue_depth)

    def run(self) -> StreamResult:
        """Write the stream, fsync the file, and return the measurements."""
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        start_ns = time.monotonic_ns()
        if self.point.preallocated:
            os.posix_fallocate(self.fd, 0, self.point.misaligned_bytes + self.stream)
        writes = self._aggregated() if self.point.aggregated else self._direct_pieces()
        if self.ring is not None:
            self.ring.drain()
            self.latencies_ns.extend(self.ring.latencies_ns)
        if self.point.aggregated:
            os.ftruncate(self.fd, self.point.misaligned_bytes + self.stream)
        os.fsync(self.fd)
        end_ns = time.monotonic_ns()
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
        return StreamResult(start_ns, end_ns, self.stream, writes, self.latencies_ns.tobytes(), cpu_s)

    def _write(self, buf: AlignedBuffer, start: int, size: int, offset: int, slot: int) -> None:
        """One file write of ``size`` bytes from ``buf[start:]`` at ``offset``; ``slot`` names the buffer."""
        if self.ring is not None:
            self.ring.submit("write", self.fd, slot, buf.ptr + start, size, offset)
            return
        view = memoryview(buf.mmap)
        try:
            done = 0
            began = time.perf_counter_ns()
            while done < size:
                written = os.pwrite(self.fd, view[start + done:start + size], offset + done)
                if written <= 0:
                    raise OSError(errno.ENOSPC, "short write")
                done += written
            self.latencies_ns.append(time.perf_counter_ns() - began)
        finally:
            view.release()

    def _direct_pieces(self) -> int:
        """Each piece is one write straight from the source buffer."""
        count = 0
        for index, (offset, size) in enumerate(pieces(self.point, self.stream)):
            self._write(self.source, piece_source_offset(index), size, offset, 0)
            count += 1
        return count

    def _aggregated(self) -> int:
        """Copy the pieces into the staging buffers; write each buffer once the stream leaves it."""
        plan = staging_writes(self.point, self.stream, self.aggregate_bytes, self.block_bytes)
        source = memoryview(self.source.mmap)
        current = -1
        try:
            for index, (offset, size) in enumerate(pieces(self.point, self.stream)):
                first = piece_source_offset(index)
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
                    staging.mmap[within:within + take] = source[first + done:first + done + take]
                    done += take
            self._flush(plan, current)
        finally:
            source.release()
        return len(plan)

    def _reclaim(self, buffer_index: int) -> None:
        """Before refilling a staging buffer, wait for its previous write (io_uring) to complete."""
        if self.ring is not None:
            self.ring.drain(buffer_index % len(self.buffers))

    def _flush(self, plan: list[tuple[int, int]], buffer_index: int) -> None:
        offset, size = plan[buffer_index]
        slot = buffer_index % len(self.buffers)
        self._write(self.buffers[slot], 0, size, offset, slot)

    def close(self) -> None:
        """Reap what is in flight (the kernel may still read the buffers), then free everything."""
        if self.ring is not None:
            try:
                self.ring.drain()
            except OSError:
                pass
            self.ring.close()
            self.ring = None
        for buf in self.buffers + ([self.source] if self.source is not None else []):
            buf.close()
        self.buffers, self.source = [], None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def describe_os_error(err: OSError, point: BenchPoint) -> str:
    """One line for a failed point: what the storage refused, in the field's terms."""
    if err.errno in UNSUPPORTED and point.direct:
        what = "O_DIRECT" + (f" at an offset misaligned by {point.misaligned_bytes} B" if point.misaligned_bytes
                             and not point.aggregated else "")
        return f"{errno.errorcode.get(err.errno, err.errno)}: this storage refuses {what}"
    return f"{errno.errorcode.get(err.errno, 'error')}: {err.strerror or err}"


def child_main(point: BenchPoint, path: str, stream: int, aggregate_bytes: int, block_bytes: int,
               barrier, conn) -> None:
    """Entry point of one bench process: set up, meet the others at ``barrier``, run, send the outcome.

    Sends ("ok", StreamResult), ("unsupported", line) when the storage refuses
    the configuration (EINVAL/EOPNOTSUPP), or ("error", line) for any other
    OSError; a process whose partner failed during setup sends ("aborted", "").
    SIGINT is ignored: Ctrl-C reaches the whole process group, and the parent
    decides (it kills its writers and removes their files).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        writer = StreamWriter(point, path, stream, aggregate_bytes, block_bytes)
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
    except BrokenBarrierError:
        conn.send(("aborted", ""))
    finally:
        writer.close()
        conn.close()
