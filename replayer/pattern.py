"""The deterministic content every strategy writes, so ``--verify`` can check it.

The byte at offset ``o`` of a file with key ``k`` is ``TABLE[(o + PAGE * k) % PERIOD]``:
``TABLE`` is a fixed pseudo-random table of ``PERIOD`` bytes (251 pages, a
prime count, so no file layout aliases it) and ``k`` (0-250) comes from the
file's final path. Keys shift the pattern by whole pages, so a write at a
page-aligned offset starts at a page-aligned address of a periodic buffer,
as O_DIRECT requires.
"""

from __future__ import annotations

import mmap
import random
import zlib

PAGE = 4096
PAGES = 251
PERIOD = PAGE * PAGES
TABLE = random.Random(20261121).randbytes(PERIOD)


def file_key(path: str) -> int:
    """Pattern key (0-250) of a target-relative path."""
    return zlib.crc32(path.encode("utf-8", "surrogateescape")) % PAGES


def start(offset: int, key: int) -> int:
    """Index into a periodic buffer where the bytes for ``offset`` of a file with ``key`` begin."""
    return (offset + PAGE * key) % PERIOD


def periodic_buffer(size_bytes: int) -> mmap.mmap:
    """A page-aligned buffer of ``size_bytes + PERIOD`` bytes repeating TABLE, so any window of ``size_bytes`` fits."""
    total = -(-(size_bytes + PERIOD) // PERIOD) * PERIOD
    buf = mmap.mmap(-1, total)
    for offset in range(0, total, PERIOD):
        buf[offset:offset + PERIOD] = TABLE
    return buf


def expected(offset: int, size: int, key: int) -> bytes:
    """The pattern bytes of [offset, offset + size) of a file with ``key``."""
    out = bytearray()
    position = start(offset, key)
    while len(out) < size:
        take = min(size - len(out), PERIOD - position)
        out += TABLE[position:position + take]
        position = 0
    return bytes(out)
