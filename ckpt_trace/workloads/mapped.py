"""File I/O through mappings, the way numpy.memmap and safetensors' loaders do it: every page touched once.

``python -m ckpt_trace.workloads.mapped OUT_DIR LOG_JSON [SIZE_BYTES]`` (64 MiB by default):

1. writes ``OUT_DIR/shared.bin`` through a shared writable mapping (sized with ftruncate, every
   page stored to, msync(MS_SYNC), munmap), as ``numpy.memmap(mode="w+")`` and ``flush`` do;
2. writes ``OUT_DIR/cold.bin`` and ``OUT_DIR/warm.bin`` with write(2) and fsync, and reads each
   through a private read-only mapping, touching one byte of every page in order (their sum is
   checked): ``cold.bin`` after posix_fadvise(POSIX_FADV_DONTNEED) dropped its pages from the page
   cache (only this file's), ``warm.bin`` with every page still cached from the writes.

LOG_JSON receives the program's own log: ``[phase, path, file offset, bytes]`` per range it
touched through a mapping (mmap(2), msync(2), posix_fadvise(2)).
"""

from __future__ import annotations

import mmap
import os
import sys

from .logged import run_logged

PAGE_BYTES = mmap.PAGESIZE


def _touch_read(mapped: mmap.mmap, size: int) -> int:
    """One byte of every page, in order (a read fault per page the kernel has not mapped yet)."""
    view = memoryview(mapped)
    try:
        return sum(view[offset] for offset in range(0, size, PAGE_BYTES))
    finally:
        view.release()


def run(out: str, size: int = 64 << 20) -> list[list]:
    """Do the three phases; return the log (see the module docstring). Raises OSError, AssertionError."""
    log: list[list] = []
    shared = os.path.join(out, "shared.bin")
    fd = os.open(shared, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mapped:
            page = bytes(range(256)) * (PAGE_BYTES // 256)
            for offset in range(0, size, PAGE_BYTES):
                mapped[offset : offset + PAGE_BYTES] = page
            mapped.flush()  # msync(MS_SYNC)
        log.append(["shared_write", shared, 0, size])
    finally:
        os.close(fd)

    block = bytes([1]) * (1 << 20)
    for phase in ("cold", "warm"):
        path = os.path.join(out, f"{phase}.bin")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for _ in range(size >> 20):
                os.write(fd, block)
            os.fsync(fd)
            if phase == "cold":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            with mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ) as mapped:
                assert _touch_read(mapped, size) == size // PAGE_BYTES
            log.append([f"{phase}_read", path, 0, size])
        finally:
            os.close(fd)
    return log


def main(argv: list[str]) -> int:
    return run_logged(argv, run, 64 << 20)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
