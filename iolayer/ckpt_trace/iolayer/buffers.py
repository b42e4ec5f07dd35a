"""Page-aligned memory for O_DIRECT, and the one synthetic content every writer of ours produces.

O_DIRECT needs the buffer address, the file offset and the length aligned to
the logical block size (open(2), section "O_DIRECT"); anonymous mmap memory is
page-aligned, which covers 512 B and 4 KiB devices.

The content: ``pattern_buffer(n)`` repeats ``pattern.TABLE`` so that the bytes
for offset ``o`` of a file with pattern key ``k`` start at
``pattern.start(o, k)`` and any ``n`` bytes from there are contiguous. The
replayer, the bench and ``--verify`` all use it; a write at a page-aligned
offset starts at a page-aligned address, as O_DIRECT requires.
"""

from __future__ import annotations

import ctypes
import mmap

from . import pattern

PAGE_BYTES = mmap.PAGESIZE


class AlignedBuffer:
    """``size_bytes`` of anonymous, page-aligned memory (the mapping is rounded up to whole pages).

    ``ptr`` is its address for io_uring and pwrite; ``mmap`` the writable
    buffer object; ``view()`` a memoryview (release it before ``close``).
    ``prefault()`` touches every page, so first-touch faults happen before a
    clock starts. ``close()`` only after every request using it has completed.
    """

    def __init__(self, size_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.mmap = mmap.mmap(-1, max(PAGE_BYTES, -(-size_bytes // PAGE_BYTES) * PAGE_BYTES))
        # The ctypes export is dropped at once, so the mmap can be closed later.
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.mmap))

    def view(self) -> memoryview:
        return memoryview(self.mmap)

    def fill(self, block: bytes) -> AlignedBuffer:
        """Write ``block`` over the buffer again and again (which also faults every page in)."""
        for start in range(0, len(self.mmap), len(block)):
            chunk = min(len(block), len(self.mmap) - start)
            self.mmap[start : start + chunk] = block[:chunk]
        return self

    def prefault(self) -> AlignedBuffer:
        """Touch every page (writes a zero byte to each), so no page fault lands inside a timed region."""
        for start in range(0, len(self.mmap), PAGE_BYTES):
            self.mmap[start] = 0
        return self

    def close(self) -> None:
        self.mmap.close()

    def __enter__(self) -> AlignedBuffer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def pattern_buffer(size_bytes: int) -> AlignedBuffer:
    """A buffer of ``size_bytes + pattern.PERIOD`` bytes (rounded up to whole periods) repeating
    ``pattern.TABLE``: the ``size_bytes`` bytes for any offset and key start at ``pattern.start``."""
    total = -(-(size_bytes + pattern.PERIOD) // pattern.PERIOD) * pattern.PERIOD
    return AlignedBuffer(total).fill(pattern.TABLE)
