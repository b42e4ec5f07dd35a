"""Unions of byte ranges, vectorised: shared by the replayer (aggregation, ``--verify``'s ranges) and the
analysis (``diff``'s written ranges)."""

from __future__ import annotations

import numpy as np


def merge_grouped_ranges(groups: np.ndarray, starts: np.ndarray,
                         ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
