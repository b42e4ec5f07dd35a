"""Pure planning of the checkpoint's byte layout: where each item goes, and which reads serve which items.

No torch and no I/O here, so the layout is testable on its own.

Write side: a rank's items are split over ``writer_threads`` data files by
size (largest first onto the least-loaded file, as DCP's
``_split_by_size_and_type`` does) and laid end to end, each item starting at
a multiple of ``item_align_bytes`` so the reader can view its bytes as any
dtype. A file's size is its last item's end rounded up to ``align_bytes``:
every write is then a whole, aligned staging buffer.

Read side: a file's wanted items, by offset, are grouped into windows; a
window is one aligned byte range holding whole items, read into one buffer
with requests of at most ``buffer_bytes``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


def align_up(value: int, align: int) -> int:
    return -(-value // align) * align


def align_down(value: int, align: int) -> int:
    return value // align * align


@dataclass(frozen=True)
class Placement:
    """One item's place: ``key`` (the caller's), ``file_index``, ``offset`` and ``size_bytes`` in that file."""

    key: Hashable
    file_index: int
    offset: int
    size_bytes: int


@dataclass(frozen=True)
class FileLayout:
    """One data file: its placements in offset order and its size (a multiple of the alignment)."""

    file_index: int
    placements: tuple[Placement, ...]
    size_bytes: int


def plan_files(items: Sequence[tuple[Hashable, int]], files: int, *, align_bytes: int,
               item_align_bytes: int) -> list[FileLayout]:
    """Lay ``items`` ((key, size_bytes) pairs) out over ``files`` data files.

    Returns one FileLayout per non-empty file; items keep their input order
    within a file, so small non-tensor items written first stay first.
    """
    bins: list[list[tuple[Hashable, int]]] = [[] for _ in range(max(1, files))]
    loads = [0] * len(bins)
    order = sorted(range(len(items)), key=lambda i: -items[i][1])
    chosen: dict[int, int] = {}
    for i in order:
        target = min(range(len(bins)), key=loads.__getitem__)
        chosen[i] = target
        loads[target] += items[i][1]
    for i, item in enumerate(items):
        bins[chosen[i]].append(item)
    layouts = []
    for file_index, members in enumerate(b for b in bins if b):
        offset, placements = 0, []
        for key, size in members:
            offset = align_up(offset, item_align_bytes)
            placements.append(Placement(key, file_index, offset, size))
            offset += size
        layouts.append(FileLayout(file_index, tuple(placements), align_up(offset, align_bytes)))
    return layouts


@dataclass(frozen=True)
class ReadWindow:
    """One aligned byte range ``[start, end)`` of a file, read with requests of at most ``request_bytes``.

    ``members`` are the caller's (key, offset, size_bytes) triples wholly inside it.
    """

    start: int
    end: int
    members: tuple[tuple[Hashable, int, int], ...]

    @property
    def size_bytes(self) -> int:
        return self.end - self.start

    def requests(self, request_bytes: int) -> list[tuple[int, int]]:
        """(file offset, size_bytes) of each read request, in order."""
        return [(pos, min(request_bytes, self.end - pos)) for pos in range(self.start, self.end, request_bytes)]


def plan_reads(wanted: Sequence[tuple[Hashable, int, int]], *, window_bytes: int, align_bytes: int,
               file_size_bytes: int) -> list[ReadWindow]:
    """Group wanted (key, offset, size_bytes > 0) items of one file into aligned windows.

    A window grows while its span stays within ``window_bytes``; an item larger
    than that gets a window of its own. Windows never pass ``file_size_bytes``
    rounded up to the alignment.
    """
    limit = align_up(file_size_bytes, align_bytes)
    windows: list[ReadWindow] = []
    start = end = 0
    members: list[tuple[Hashable, int, int]] = []
    for key, offset, size in sorted(wanted, key=lambda m: m[1]):
        item_end = min(limit, align_up(offset + size, align_bytes))
        if members and max(end, item_end) - start > window_bytes:
            windows.append(ReadWindow(start, end, tuple(members)))
            members = []
        if not members:
            start = align_down(offset, align_bytes)
            end = start
        members.append((key, offset, size))
        end = max(end, item_end)
    if members:
        windows.append(ReadWindow(start, end, tuple(members)))
    return windows
