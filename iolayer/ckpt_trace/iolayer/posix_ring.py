"""The ring's stand-in where io_uring cannot be used: the same request-by-request interface on os.preadv/os.pwritev.

``ring.open_ring`` returns a ``PosixRing`` when the ring library cannot be
loaded (not built, stale, a wheel without it) or the kernel refuses
io_uring_setup(2) (EPERM where io_uring is disabled, as in many container
sandboxes; ENOSYS before Linux 5.1), and says so once per process on stderr
(one line). Each ``submit`` moves its bytes at once, synchronously, with
preadv(2)/pwritev(2) (fsync(2)/fdatasync(2)); ``wait``, ``wait_result``
and ``drain`` then hand the completions back in submission order, with the
ring's failure rule: a failed request raises ``OSError`` with its errno, a
write that moves fewer bytes than asked raises ``OSError(ENOSPC)``, a short
read is the end of the file. No queue depth is reached (one request at a
time), so it is slower than the ring: a 256 MiB state dict (16 tensors of
16 MiB, the default WriterOptions, O_DIRECT) saved in 2.23 s against the
ring's 1.43 s and loaded cold in 1.80 s against 0.83 s (medians of 3,
alternating, on the project's 2-core VM); it is correct everywhere
os.preadv exists (Linux, Python 3.7+).
"""

from __future__ import annotations

import ctypes
import os
import time
from array import array
from collections import Counter, deque
from collections.abc import Sequence

from .ring import Request, failure_of


class PosixRing:
    """``Ring``'s request-by-request interface (``submit``, ``flush``, ``wait``, ``wait_result``, ``drain``,
    ``pending``, ``has_room``, ``close``) on synchronous system calls; see the module docstring.
    ``register_buffers`` is accepted and does nothing (``buf_index`` is ignored: ``addr`` is used)."""

    def __init__(self, queue_depth: int, *, latency_sink: array | None = None, batch_size: int = 1) -> None:
        if queue_depth < 1:
            raise ValueError("queue depth must be at least 1")
        self.queue_depth = queue_depth
        self.batch_size = max(1, min(batch_size, queue_depth))
        self.latency_sink = latency_sink
        self.by_key: Counter = Counter()
        self._done: deque[tuple[Request, int]] = deque()

    @property
    def pending(self) -> int:
        """Completions ``wait`` has yet to return."""
        return len(self._done)

    @property
    def has_room(self) -> bool:
        """Always true: each request completes in ``submit``."""
        return True

    def submit(
        self,
        kind: str,
        fd: int,
        addr: int,
        size_bytes: int,
        offset: int,
        key: object = None,
        tag: object = None,
        *,
        buf_index: int | None = None,
    ) -> None:
        """Do one request now (``kind``: read, write, fsync, fdatasync; ``addr``: the buffer's address;
        ``offset`` None or negative: the file position); its result waits for ``wait``."""
        request = Request(kind, fd, offset, size_bytes, key, tag)
        started = time.perf_counter_ns()
        try:
            res = _move(kind, fd, addr, size_bytes, offset)
        except OSError as err:
            res = -(err.errno or 5)  # EIO when the error carries no errno
        if self.latency_sink is not None:
            self.latency_sink.append(time.perf_counter_ns() - started)
        self.by_key[key] += 1
        self._done.append((request, res))

    def flush(self) -> None:
        """Nothing to do: every request was done in ``submit``."""

    def wait(self) -> Request:
        """The oldest completed request. Raises OSError for a failed or short write, RuntimeError when
        nothing is pending."""
        return self.wait_result()[0]

    def wait_result(self) -> tuple[Request, int]:
        """``wait``, with the bytes moved."""
        if not self._done:
            raise RuntimeError("PosixRing.wait() with no request pending")
        request, res = self._done.popleft()
        self.by_key[request.key] -= 1
        failure = failure_of(request, res)
        if failure is not None:
            raise failure
        return request, res

    def drain(self, key: object = ...) -> None:
        """Hand back every pending completion (of ``key`` only, when given); raise the first failure among
        them after all are taken."""
        first: OSError | None = None
        kept: deque[tuple[Request, int]] = deque()
        for request, res in self._done:
            if key is not ... and request.key != key:
                kept.append((request, res))
                continue
            self.by_key[request.key] -= 1
            first = first or failure_of(request, res)
        self._done = kept
        if first is not None:
            raise first

    def register_buffers(self, buffers: Sequence) -> None:
        """Accepted for ``Ring``'s interface; plain system calls need no registration."""

    def close(self) -> None:
        """Drop completions not waited for (their bytes have moved already)."""
        self._done.clear()

    def __enter__(self) -> PosixRing:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _move(kind: str, fd: int, addr: int, size_bytes: int, offset: int | None) -> int:
    """Do one request; return the bytes moved (a read stops at the end of the file, a write when the
    kernel takes no more). Raises OSError."""
    if kind == "fsync":
        os.fsync(fd)
        return 0
    if kind == "fdatasync":
        os.fdatasync(fd)
        return 0
    if kind not in ("read", "write"):
        raise ValueError(f"unknown request kind {kind!r}")
    position = offset if offset is not None and offset >= 0 else None
    view = memoryview((ctypes.c_char * size_bytes).from_address(addr)).cast("B") if size_bytes else memoryview(b"")
    moved = 0
    while moved < size_bytes:
        piece = [view[moved:]]
        if kind == "read":
            got = os.readv(fd, piece) if position is None else os.preadv(fd, piece, position + moved)
        else:
            got = os.writev(fd, piece) if position is None else os.pwritev(fd, piece, position + moved)
        if got == 0:
            break
        moved += got
    return moved
