"""How much of a file the page cache holds, asked cheaply before reading it.

``resident_share(fd, size_bytes, offset=0)`` returns the share (0.0-1.0) of the pages of the byte range
[offset, offset + size_bytes) of a file that are in the page cache, and how it was measured:

- ``cachestat``: the cachestat(2) system call (Linux 6.5+, number 451 on x86-64 and arm64), which counts
  the cached pages of a byte range without touching them (``nr_cache``, in pages; kernel documentation,
  "cachestat", and the man page cachestat(2));
- ``nowait``: where cachestat is missing, up to ``samples`` one-page reads with ``preadv2(RWF_NOWAIT)`` at
  evenly spaced offsets, which fail with EAGAIN instead of going to the device when the page is not
  cached (preadv2(2), RWF_NOWAIT); the share is the fraction of samples served;
- ``unknown``: neither works (the share is then 0.0, which a caller treats as cold).

Nothing is read from the device and no page is brought in. Used by the emitted reader to read a warm file
through the page cache and a cold one with O_DIRECT.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

_SYSCALL_CACHESTAT = 451  # the generic syscall table: the same number on x86-64 and arm64


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        ("nr_cache", ctypes.c_uint64),
        ("nr_dirty", ctypes.c_uint64),
        ("nr_writeback", ctypes.c_uint64),
        ("nr_evicted", ctypes.c_uint64),
        ("nr_recently_evicted", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them (dlopen(3), NULL)
_libc.syscall.restype = ctypes.c_long
_cachestat_works: bool | None = None


def _pages(offset: int, size_bytes: int) -> int:
    """How many pages the byte range [offset, offset + size_bytes) touches."""
    return -(-(offset + size_bytes) // mmap.PAGESIZE) - offset // mmap.PAGESIZE


def _cachestat(fd: int, offset: int, size_bytes: int) -> float | None:
    cached = resident_pages(fd, offset, size_bytes)
    if cached is None:
        return None
    pages = _pages(offset, size_bytes)
    return min(1.0, cached / pages) if pages else 1.0


def _nowait(fd: int, offset: int, size_bytes: int, samples: int) -> float | None:
    if not hasattr(os, "RWF_NOWAIT") or size_bytes <= 0:
        return None
    page = mmap.PAGESIZE
    first, pages = offset // page, _pages(offset, size_bytes)
    picks = sorted({first + (i * pages) // samples for i in range(min(samples, pages))})
    buf = bytearray(1)
    hits = 0
    for index in picks:
        try:
            hits += os.preadv(fd, [buf], index * page, os.RWF_NOWAIT) > 0
        except BlockingIOError:
            pass
        except OSError as err:
            if err.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return None
            raise
    return hits / len(picks)


def resident_pages(fd: int, offset: int, size_bytes: int) -> int | None:
    """How many pages of the byte range [offset, offset + size_bytes) of ``fd`` the page cache holds, by
    cachestat(2) (``nr_cache``); None where cachestat is missing (before Linux 6.5, or refused)."""
    global _cachestat_works
    if _cachestat_works is False:
        return None
    stat = _Stat()
    rng = _Range(offset, size_bytes)
    result = _libc.syscall(
        _SYSCALL_CACHESTAT, ctypes.c_uint(fd), ctypes.byref(rng), ctypes.byref(stat), ctypes.c_uint(0)
    )
    if result != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _cachestat_works = False
        return None
    _cachestat_works = True
    return int(stat.nr_cache)


def resident_share(fd: int, size_bytes: int, samples: int = 16, offset: int = 0) -> tuple[float, str]:
    """(share of the pages of bytes [offset, offset + size_bytes) of ``fd`` in the page cache, method:
    cachestat | nowait | unknown); ``samples`` is how many pages the ``nowait`` probe reads at most.

    ``fd`` must be open for reading without O_DIRECT for the ``nowait`` probe. Raises OSError only for a
    bad descriptor."""
    share = _cachestat(fd, offset, size_bytes)
    if share is not None:
        return share, "cachestat"
    share = _nowait(fd, offset, size_bytes, samples)
    if share is not None:
        return share, "nowait"
    return 0.0, "unknown"


def evict(path: str | os.PathLike) -> None:
    """Write back the file at ``path`` (fsync(2)), then drop its pages from the page cache
    (posix_fadvise(2) POSIX_FADV_DONTNEED over the whole file): its next reads go to the device. Only this
    file's clean pages go; pages another process maps stay (the kernel keeps mapped pages). Raises OSError
    from open(2) or fsync(2)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
