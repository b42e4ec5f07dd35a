"""Page-aligned memory for O_DIRECT, and the one synthetic content every writer of ours produces.

O_DIRECT needs the buffer address, the file offset and the length aligned to
the logical block size (open(2), section "O_DIRECT"); anonymous mmap memory is
page-aligned, which covers 512 B and 4 KiB devices.

The memory is private and, from 2 MiB up, asked for transparent huge pages
(madvise(2) ``MADV_HUGEPAGE``; Documentation/admin-guide/mm/transhuge.rst).
An O_DIRECT request is built from the buffer's physical pages, and a device
takes at most ``queue/max_segments`` runs of contiguous pages per request
(virtio-blk here: 254). Scattered 4 KiB pages, which a process gets once it
has freed memory, split one 4 MiB write into 4-5 device requests. Measured on
the project's VM (2026-11-29, /sys/block/vda/stat around each of 4 saves of
1.49 GB by one process, 4 MiB staging buffers): shared 4 KiB pages gave 370
requests for the first save and 548-1,764 for the later ones, which ran at
813-1,194 MB/s against 1,147-1,264 MB/s for the first; with huge pages every
save took 370-371 requests and ran at 1,157-1,478 MB/s.

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
HUGE_PAGE_BYTES = 2 << 20  # the PMD size of x86-64 and 4 KiB-page arm64: where asking for huge pages is worth it


class AlignedBuffer:
    """``size_bytes`` of private anonymous, page-aligned memory (the mapping is rounded up to whole pages;
    from ``HUGE_PAGE_BYTES`` up, transparent huge pages are asked for unless ``huge_pages`` is False, see the
    module docstring: False imitates what malloc(3) gives an application, 4 KiB pages faulted one by one).

    ``ptr`` is its address for io_uring and pwrite; ``mmap`` the writable
    buffer object; ``view()`` a memoryview (release it before ``close``).
    ``prefault()`` touches every page, so first-touch faults happen before a
    clock starts. ``close()`` only after every request using it has completed.
    """

    def __init__(self, size_bytes: int, *, huge_pages: bool = True) -> None:
        self.size_bytes = size_bytes
        length = max(PAGE_BYTES, -(-size_bytes // PAGE_BYTES) * PAGE_BYTES)
        self.mmap = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if huge_pages and length >= HUGE_PAGE_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self.mmap.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # EINVAL: a kernel built without transparent huge pages; 4 KiB pages then
                pass
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
