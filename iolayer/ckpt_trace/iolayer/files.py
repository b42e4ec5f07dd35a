"""Opening, preallocating and syncing files: the O_DIRECT fallback and the calls os does not wrap.

``open_file`` asks for O_DIRECT and, where the file system refuses it
(EINVAL or EOPNOTSUPP from open(2): tmpfs, some FUSE and network file
systems), opens without it and says so in its result, so the caller can name
the fallback taken. fallocate(2) and sync_file_range(2) go through libc.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

from ckpt_trace.formats import fsync_directory

DIRECT_REFUSED = (errno.EINVAL, errno.EOPNOTSUPP)
FALLOC_FL_KEEP_SIZE = 0x1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]

__all__ = ["DIRECT_REFUSED", "Opened", "fallocate", "fsync_directory", "open_file", "sync_file_range"]


@dataclass(frozen=True)
class Opened:
    """An open file: ``fd`` and whether O_DIRECT is on (``direct``); ``fallback`` says why it is not,
    when it was asked for."""

    fd: int
    direct: bool
    fallback: str | None = None


def open_file(path: str | os.PathLike, flags: int, mode: int = 0o644, *, direct: bool = False) -> Opened:
    """open(2) ``path`` with ``flags`` (plus O_DIRECT when ``direct``; O_NOFOLLOW and O_CLOEXEC always).

    Where O_DIRECT is refused, the file is opened without it (a file this call
    created exclusively is removed first, so O_EXCL still holds). Raises OSError
    otherwise (ENOENT, ENOSPC, EEXIST...).
    """
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if direct:
        try:
            return Opened(os.open(path, flags | os.O_DIRECT, mode), True)
        except OSError as err:
            if err.errno not in DIRECT_REFUSED:
                raise
            reason = f"O_DIRECT refused by the file system ({errno.errorcode[err.errno]})"
            if flags & os.O_CREAT and flags & os.O_EXCL and os.path.lexists(path):
                os.unlink(path)
        return Opened(os.open(path, flags, mode), False, reason)
    return Opened(os.open(path, flags, mode), False)


def _checked(ret: int) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def fallocate(fd: int, offset: int, size: int, mode: int = 0) -> None:
    """fallocate(2): reserve ``size`` bytes at ``offset`` (``mode`` FALLOC_FL_*). Raises OSError."""
    _checked(_libc.fallocate(fd, mode, offset, size))


def sync_file_range(fd: int, offset: int, size: int, flags: int) -> None:
    """sync_file_range(2). Raises OSError."""
    _checked(_libc.sync_file_range(fd, offset, size, flags))
