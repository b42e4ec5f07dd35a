"""The deterministic content every writer of ours produces, so what lands on disk can be checked.

The byte at offset ``o`` of a file with key ``k`` is ``TABLE[(o + PAGE * k) % PERIOD]``:
``TABLE`` is a fixed pseudo-random table of ``PERIOD`` bytes (251 pages, a
prime count, so no file layout aliases it) and ``k`` (0-250) comes from the
file's final path. Keys shift the pattern by whole pages, so a write at a
page-aligned offset starts at a page-aligned address of a pattern buffer
(``buffers.pattern_buffer``), as O_DIRECT requires. A piece written at the
wrong offset, or into the wrong file, holds other bytes than ``expected``.
"""

from __future__ import annotations

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
    """Index into a pattern buffer where the bytes for ``offset`` of a file with ``key`` begin."""
    return (offset + PAGE * key) % PERIOD


def expected(offset: int, size: int, key: int) -> bytes:
    """The pattern bytes of [offset, offset + size) of a file with ``key``."""
    out = bytearray()
    position = start(offset, key)
    while len(out) < size:
        take = min(size - len(out), PERIOD - position)
        out += TABLE[position:position + take]
        position = 0
    return bytes(out)


def first_difference(data: bytes, offset: int, key: int) -> int | None:
    """Offset of the first byte of ``data`` (read at ``offset`` of a file with ``key``) that differs
    from the pattern, or None when all match."""
    want = expected(offset, len(data), key)
    if data == want:
        return None
    return offset + next((i for i, (a, b) in enumerate(zip(data, want)) if a != b), min(len(data), len(want)))
