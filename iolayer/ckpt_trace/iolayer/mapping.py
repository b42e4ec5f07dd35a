"""File mappings for replaying memory-mapped I/O: mmap(2), msync(2), munmap(2) through libc.

Python's ``mmap.mmap`` refuses a mapping longer than the file, which
programs may create before they grow the file; these calls map exactly what
the trace recorded. Pages are touched with ``memmove`` (a read copies them
out, which faults them in; a write copies pattern bytes in, which dirties
them for writeback).

Touching a page wholly beyond the end of the file raises SIGBUS (mmap(2),
"Errors"), so ``FileMapping.touch`` first clamps the range to the file's
size: bytes a recording saw written back beyond a file the replay made
shorter are not written.
"""

from __future__ import annotations

import ctypes
import os

from .buffers import PAGE_BYTES

PROT_READ, PROT_WRITE = 0x1, 0x2
MAP_SHARED, MAP_PRIVATE, MAP_POPULATE = 0x01, 0x02, 0x8000  # the same on x86-64 and arm64
MS_ASYNC, MS_INVALIDATE, MS_SYNC = 1, 2, 4
_MAP_FLAGS_KEPT = MAP_SHARED | MAP_PRIVATE | MAP_POPULATE
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them (dlopen(3), NULL)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.msync.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _raise(what: str) -> None:
    code = ctypes.get_errno()
    raise OSError(code, f"{what}: {os.strerror(code)}")


class FileMapping:
    """``length_bytes`` of the file on ``fd`` from ``file_offset`` (a multiple of the page size), mapped
    with ``prot`` (PROT_*) and ``flags`` (MAP_SHARED or MAP_PRIVATE, optionally MAP_POPULATE; other bits
    are dropped). Raises OSError from mmap(2).

    Call order: ``touch`` any number of times, ``sync`` where the program
    called msync, then ``close`` (munmap). Used by the POSIX replay executor.
    """

    def __init__(self, fd: int, length_bytes: int, file_offset: int, prot: int, flags: int) -> None:
        if file_offset % PAGE_BYTES:
            raise OSError(22, f"mmap: file offset {file_offset} is not a multiple of the page size")
        self.fd = fd
        self.length_bytes = max(1, length_bytes)
        self.file_offset = file_offset
        self.writable = bool(prot & PROT_WRITE)
        address = _libc.mmap(
            None,
            self.length_bytes,
            prot & (PROT_READ | PROT_WRITE) or PROT_READ,
            (flags & _MAP_FLAGS_KEPT) or MAP_SHARED,
            fd,
            file_offset,
        )
        if address in (None, _MAP_FAILED):
            _raise("mmap")
        self.address: int | None = address

    def _range(self, file_offset: int, size_bytes: int) -> tuple[int, int]:
        """(address, bytes) of [file_offset, file_offset + size_bytes) within the mapping and the file."""
        end = min(file_offset + size_bytes, self.file_offset + self.length_bytes, os.fstat(self.fd).st_size)
        start = max(file_offset, self.file_offset)
        if self.address is None or end <= start:
            return 0, 0
        return self.address + start - self.file_offset, end - start

    def touch(self, file_offset: int, size_bytes: int, *, source: int | None = None, sink: int | None = None) -> int:
        """Copy ``size_bytes`` at ``file_offset`` of the file in from address ``source`` (a write through the
        mapping) or out to address ``sink`` (a read); return the bytes moved (clamped to the mapping and
        the file's size)."""
        address, size = self._range(file_offset, size_bytes)
        if size:
            if source is not None:
                ctypes.memmove(address, source, size)
            elif sink is not None:
                ctypes.memmove(sink, address, size)
            else:
                raise ValueError("touch needs a source (a write) or a sink (a read)")
        return size

    def sync(self, file_offset: int, size_bytes: int, flags: int = MS_SYNC) -> None:
        """msync(2) the pages of [file_offset, file_offset + size_bytes) (the whole mapping when 0)."""
        if self.address is None:
            return
        start = max(file_offset, self.file_offset) if size_bytes else self.file_offset
        start -= (start - self.file_offset) % PAGE_BYTES
        end = (
            min(file_offset + size_bytes, self.file_offset + self.length_bytes)
            if size_bytes
            else self.file_offset + self.length_bytes
        )
        if (
            end > start
            and _libc.msync(
                self.address + start - self.file_offset,
                end - start,
                flags & (MS_ASYNC | MS_SYNC | MS_INVALIDATE) or MS_SYNC,
            )
            != 0
        ):
            _raise("msync")

    def close(self) -> None:
        """munmap(2); idempotent."""
        if self.address is not None:
            address, self.address = self.address, None
            if _libc.munmap(address, self.length_bytes) != 0:
                _raise("munmap")
