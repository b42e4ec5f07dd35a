"""The deterministic content every writer of ours produces, so what lands on disk can be checked.

Two contents. **The replay's data** (``fill``, ``data_bytes``): incompressible
bytes, unique per 4 KiB block of every file, a pure function of a 64-bit file
key (``file_key``) and the file offset, generated in C (``_ring.c``'s
``ckr_fill``, a counter-mode SplitMix64 generator seeded per block) into each
write's buffer just before it is issued: storage that deduplicates blocks or
compresses cannot make one strategy look faster than another.
``data_bytes`` is the same function in numpy, the reference ``--verify`` and
the tests compare with.

**The table pattern** (the bench, and the GDS replay's device buffer):

The byte at offset ``o`` of a file with key ``k`` is ``TABLE[(o + PAGE * (k % 251)) % PERIOD]``:
``TABLE`` is a fixed pseudo-random table of ``PERIOD`` bytes (251 pages, a
prime count, so no file layout aliases it). Keys shift the pattern by whole pages, so a write at a
page-aligned offset starts at a page-aligned address of a pattern buffer
(``buffers.pattern_buffer``), as O_DIRECT requires. A piece written at the
wrong offset, or into the wrong file, holds other bytes than ``expected``.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np

PAGE = 4096
PAGES = 251
PERIOD = PAGE * PAGES
TABLE = random.Random(20261121).randbytes(PERIOD)


def file_key(path: str) -> int:
    """Content key of a target-relative path: 63 bits of its BLAKE2b hash (a non-negative int64)."""
    digest = hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def start(offset: int, key: int) -> int:
    """Index into a pattern buffer where the table pattern's bytes for ``offset`` of a file with ``key`` begin."""
    return (offset + PAGE * (key % PAGES)) % PERIOD


#: The replay data's generator, as _ring.c's ckr_fill: SplitMix64's constants.
GOLDEN, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
BLOCK = 4096


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def data_bytes(offset: int, size: int, key: int) -> bytes:
    """The replay data of [offset, offset + size) of a file with ``key``, computed in numpy (the reference for
    ``fill``): word j (8 bytes, little-endian) of 4 KiB block b is mix(seed + j * GOLDEN), with
    seed = mix(key ^ mix(b * GOLDEN + 1)) and mix SplitMix64's finalizer."""
    if size <= 0:
        return b""
    first, last = offset >> 3, (offset + size + 7) >> 3
    words = np.arange(first, last, dtype=np.uint64)
    blocks = words >> np.uint64(9)
    with np.errstate(over="ignore"):
        seeds = _mix(np.uint64(key & (2**64 - 1)) ^ _mix(blocks * GOLDEN + np.uint64(1)))
        values = _mix(seeds + (words & np.uint64(511)) * GOLDEN)
    raw = values.astype("<u8").tobytes()
    skip = offset - (first << 3)
    return raw[skip : skip + size]


def fill(address: int, size: int, key: int, offset: int) -> None:
    """Write the replay data of [offset, offset + size) of the file with ``key`` to memory at ``address``
    (``size`` writable bytes there), in C. Raises ring.RingUnavailable when the I/O library is not built."""
    from .ring import library

    library().ckr_fill(address, size, key & (2**64 - 1), offset)


def generated(offset: int, size: int, key: int) -> bytes:
    """``data_bytes``, generated in C (``fill``; about 80x numpy's speed): what ``--verify`` compares with."""
    out = bytearray(size)
    if size:
        import ctypes

        fill(ctypes.addressof((ctypes.c_char * size).from_buffer(out)), size, key, offset)
    return bytes(out)


def data_first_difference(data: bytes, offset: int, key: int) -> int | None:
    """Offset of the first byte of ``data`` (read at ``offset`` of a file with ``key``) that differs from the
    replay data, or None when all match."""
    want = generated(offset, len(data), key)
    if data == want:
        return None
    return offset + _first_unequal(data, want)


def _first_unequal(data: bytes, want: bytes) -> int:
    n = min(len(data), len(want))
    unequal = np.flatnonzero(np.frombuffer(data, np.uint8, n) != np.frombuffer(want, np.uint8, n))
    return int(unequal[0]) if len(unequal) else n


def expected(offset: int, size: int, key: int) -> bytes:
    """The pattern bytes of [offset, offset + size) of a file with ``key``."""
    out = bytearray()
    position = start(offset, key)
    while len(out) < size:
        take = min(size - len(out), PERIOD - position)
        out += TABLE[position : position + take]
        position = 0
    return bytes(out)


def first_difference(data: bytes, offset: int, key: int) -> int | None:
    """Offset of the first byte of ``data`` (read at ``offset`` of a file with ``key``) that differs
    from the pattern, or None when all match."""
    want = expected(offset, len(data), key)
    if data == want:
        return None
    return offset + _first_unequal(data, want)
