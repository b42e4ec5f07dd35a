"""The writer's I/O engine: page-aligned buffers, data files opened for O_DIRECT, and one io_uring per thread.

No torch here. ``Ring`` keeps at most ``queue_depth`` reads or writes in
flight (pyuring 0.3.0 over liburing; its calls release the GIL, so several
threads each with their own ring run in parallel). Call order, by the
writer's and reader's threads: ``submit`` as long as ``has_room``, otherwise
``wait`` for one completion; ``drain`` before fsync or close; ``close``.

References: io_uring_enter(2); liburing io_uring_prep_write(3) and
io_uring_prep_read(3); open(2), section "O_DIRECT", for the alignment rules.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from dataclasses import dataclass

DIRECT_REFUSED = (errno.EINVAL, errno.EOPNOTSUPP)


class AlignedBuffer:
    """``size_bytes`` of anonymous, page-aligned memory (mmap), usable as an O_DIRECT buffer.

    ``ptr`` is its address; ``mmap`` the writable buffer object. ``close()``
    only after every request using it has completed.
    """

    def __init__(self, size_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.mmap = mmap.mmap(-1, max(size_bytes, mmap.PAGESIZE))
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.mmap))

    def close(self) -> None:
        self.mmap.close()


def open_data_file(path: str, *, write: bool, direct: bool) -> tuple[int, bool]:
    """Open a data file; returns (fd, whether O_DIRECT is on).

    Writing creates the file exclusively (O_CREAT | O_EXCL): a data file
    name is never reused. When ``direct`` is asked and the file system
    refuses O_DIRECT (EINVAL or EOPNOTSUPP from open(2)), the file is opened
    without it. Raises OSError otherwise (ENOENT, ENOSPC, EEXIST...).
    """
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    flags |= (os.O_WRONLY | os.O_CREAT | os.O_EXCL) if write else os.O_RDONLY
    if direct:
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as err:
            if err.errno not in DIRECT_REFUSED:
                raise
            if write and os.path.lexists(path):
                os.unlink(path)
    return os.open(path, flags, 0o644), False


@dataclass
class Request:
    """One submitted read or write: ``tag`` is the caller's (a buffer or window id)."""

    kind: str
    fd: int
    offset: int
    size_bytes: int
    tag: object


class Ring:
    """One thread's io_uring with at most ``queue_depth`` requests in flight (see the module docstring)."""

    def __init__(self, queue_depth: int) -> None:
        import pyuring

        self.ctx = pyuring.UringCtx(entries=max(2, queue_depth))
        self.queue_depth = queue_depth
        self.in_flight: dict[int, Request] = {}
        self._next_id = 1

    @property
    def has_room(self) -> bool:
        return len(self.in_flight) < self.queue_depth

    def submit(self, kind: str, fd: int, ptr: int, size_bytes: int, offset: int, tag: object) -> None:
        """Queue and submit one read or write of ``size_bytes`` at ``offset`` from/to address ``ptr``."""
        request_id = self._next_id
        self._next_id += 1
        self.in_flight[request_id] = Request(kind, fd, offset, size_bytes, tag)
        if kind == "write":
            self.ctx.write_async_ptr(fd, ptr, size_bytes, offset, user_data=request_id)
        else:
            self.ctx.read_async_ptr(fd, ptr, size_bytes, offset, user_data=request_id)

    def wait(self) -> Request:
        """Wait for one completion; returns its request. Raises OSError for a failed or short request."""
        request_id, result = self.ctx.wait_completion()
        request = self.in_flight.pop(request_id)
        if result < 0:
            raise OSError(-result, os.strerror(-result))
        if result < request.size_bytes:
            raise OSError(errno.ENOSPC if request.kind == "write" else errno.EIO,
                          f"short {request.kind}: {result} of {request.size_bytes} bytes at offset {request.offset}")
        return request

    def drain(self) -> None:
        """Wait for every request in flight; the first failure is raised after all have completed."""
        first: OSError | None = None
        while self.in_flight:
            try:
                self.wait()
            except OSError as err:
                first = first or err
        if first is not None:
            raise first

    def close(self) -> None:
        """Reap what is still in flight (its buffers may still be in use), then tear the ring down."""
        while self.in_flight:
            try:
                self.wait()
            except OSError:
                pass
        self.ctx.close()
