"""Pure planning of the checkpoint's byte layout: where each item goes, and which reads serve which items.

No torch and no I/O here, so the layout is testable on its own.

Write side: a rank's items are split over ``writer_threads`` data files by
size (largest first onto the least-loaded file, as DCP's
``_split_by_size_and_type`` does) and laid end to end, each item starting at
a multiple of ``item_align_bytes`` so the reader can view its bytes as any
dtype. A file's size is its last item's end rounded up to ``align_bytes``:
every write is then a whole, aligned staging buffer.

Read side (O_DIRECT): a file's wanted byte ranges become one stream of
aligned reads of at most ``buffer_bytes``, in file order.
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


def plan_files(
    items: Sequence[tuple[Hashable, int]], files: int, *, align_bytes: int, item_align_bytes: int
) -> list[FileLayout]:
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


def plan_stream(
    wanted: Sequence[tuple[int, int]], *, piece_bytes: int, align_bytes: int, file_size_bytes: int
) -> list[tuple[int, int]]:
    """The (file offset, size_bytes) reads that bring every wanted (offset, size_bytes > 0) range of one file
    into memory: the ranges, widened to ``align_bytes`` and never past ``file_size_bytes`` rounded up to it,
    merged where they touch and cut into reads of at most ``piece_bytes`` (a multiple of ``align_bytes``),
    in file order. Every read is aligned, as O_DIRECT requires (open(2), NOTES)."""
    limit = align_up(file_size_bytes, align_bytes)
    extents: list[list[int]] = []
    for offset, size in sorted(wanted):
        start, end = align_down(offset, align_bytes), min(limit, align_up(offset + size, align_bytes))
        if extents and start <= extents[-1][1]:
            extents[-1][1] = max(extents[-1][1], end)
        else:
            extents.append([start, end])
    return [(pos, min(piece_bytes, end - pos)) for start, end in extents for pos in range(start, end, piece_bytes)]
