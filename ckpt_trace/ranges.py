"""Unions of half-open ranges [start, end) (bytes of a file, nanoseconds of a timeline): the one place they are
computed, for the replayer (aggregation, coverage, verified ranges), the analysis (``diff``'s written ranges,
the GPU overlap of copies and I/O) and the tracer (bytes of a mapping its page rows cover).

- ``merge_grouped_ranges``: per group, vectorised (numpy arrays in, arrays out);
- ``union_ranges``: one group, vectorised;
- ``merge_ranges``: one group, as a list of (start, end) pairs;
- ``covered_bytes``: the length of the union;
- ``widen_ranges``, ``intersect_ranges``, ``subtract_ranges``: on sorted disjoint (start, end) lists, as
  ``merge_ranges`` gives them (the page-cache preparation of a replay: ``replayer.cache_state``).

Touching ranges merge ([0, 4) and [4, 8) make [0, 8)); empty ones are dropped.
"""

from __future__ import annotations

import numpy as np


def merge_grouped_ranges(
    groups: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group, the union of [start, end) ranges, vectorised: (group, start, end) of each merged range,
    by group then start; touching ranges merge. Ranges are sorted by (group, start) (by group alone when
    each group's starts already rise, as a checkpoint's writes do), and one running maximum of the ends
    over all groups, each group lifted above the previous one, finds where a new merged range begins."""
    keep = ends > starts
    groups, starts, ends = groups[keep], starts[keep], ends[keep]
    if not len(groups):
        return groups, starts, ends
    if np.any(groups[1:] < groups[:-1]):  # (an aggregation's groups come in order: no copies then)
        small = int(groups.min()) >= 0 and int(groups.max()) < 2**15  # int16: numpy's stable sort is a radix sort
        order = np.argsort(groups.astype(np.int16) if small else groups, kind="stable")
        groups, starts, ends = groups[order], starts[order], ends[order]
        del order
    same = groups[1:] == groups[:-1]
    if np.any(same & (starts[1:] < starts[:-1])):
        order = np.lexsort((starts, groups))
        groups, starts, ends = groups[order], starts[order], ends[order]
        same = groups[1:] == groups[:-1]
    dense = np.r_[0, np.cumsum(~same)]  # the group's index among the groups present
    span = int(ends.max()) + 1
    if span * (int(dense[-1]) + 1) < 2**62:
        reach = np.maximum.accumulate(ends + dense * span) - dense * span  # running end within the group
    else:  # too large to lift: per group
        reach = np.concatenate([np.maximum.accumulate(part) for part in np.split(ends, np.flatnonzero(~same) + 1)])
    first = np.flatnonzero(np.r_[True, ~same | (starts[1:] > reach[:-1])])
    last = np.r_[first[1:] - 1, len(starts) - 1]
    return groups[first], starts[first], reach[last]


def union_ranges(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the disjoint, sorted ranges covering the given [start, end) ones (int64 arrays)."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    _, merged_starts, merged_ends = merge_grouped_ranges(np.zeros(len(starts), np.int64), starts, ends)
    return merged_starts, merged_ends


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of half-open ranges [start, end) as a sorted list of disjoint (start, end) pairs."""
    if not ranges:
        return []
    starts, ends = (np.array(column, np.int64) for column in zip(*ranges))
    merged_starts, merged_ends = union_ranges(starts, ends)
    return list(zip(merged_starts.tolist(), merged_ends.tolist()))


def covered_bytes(ranges: list[tuple[int, int]]) -> int:
    """How many distinct units (bytes) the ranges [start, end) cover together."""
    return sum(end - start for start, end in merge_ranges(ranges))


def widen_ranges(ranges: list[tuple[int, int]], unit: int) -> list[tuple[int, int]]:
    """Each [start, end) widened outward to multiples of ``unit``, then merged (``merge_ranges``)."""
    return merge_ranges([(start // unit * unit, -(-end // unit) * unit) for start, end in ranges])


def intersect_ranges(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``a`` inside ``b`` (both sorted and disjoint), sorted and disjoint, by one sweep."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract_ranges(a: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``a`` outside ``holes`` (both sorted and disjoint), sorted and disjoint, by one sweep."""
    out, j = [], 0
    for start, end in a:
        while j < len(holes) and holes[j][1] <= start:
            j += 1
        k = j
        while k < len(holes) and holes[k][0] < end:
            if holes[k][0] > start:
                out.append((start, holes[k][0]))
            start = max(start, holes[k][1])
            k += 1
        if end > start:
            out.append((start, end))
    return out
