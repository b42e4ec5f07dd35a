"""Range algebra on sorted disjoint [start, end) lists (``ckpt_trace.ranges``), against sets of the units covered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ckpt_trace.ranges import intersect_ranges, merge_ranges, subtract_ranges, widen_ranges

RANGES = st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 700)), max_size=12).map(
    lambda pairs: merge_ranges([(start, start + length) for start, length in pairs])
)


def _units(ranges) -> set[int]:
    return {u for start, end in ranges for u in range(start, end)}


def _well_formed(ranges) -> bool:
    return all(start < end for start, end in ranges) and all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))


@given(RANGES, RANGES)
def test_intersect_and_subtract_are_the_sets(a, b):
    both, outside = intersect_ranges(a, b), subtract_ranges(a, b)
    assert _units(both) == _units(a) & _units(b) and _well_formed(both)
    assert _units(outside) == _units(a) - _units(b) and _well_formed(outside)


@given(RANGES, st.sampled_from([1, 7, 512, 4096]))
def test_widened_ranges_are_the_smallest_aligned_cover(a, unit):
    wide = widen_ranges(a, unit)
    expected = {u for block in {u // unit for u in _units(a)} for u in range(block * unit, (block + 1) * unit)}
    assert _units(wide) == expected and _well_formed(wide)
