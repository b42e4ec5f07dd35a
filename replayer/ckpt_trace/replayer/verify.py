"""``--verify``: read replayed files back and compare them with the data they must hold.

Every byte range a plan leaves written (``PlanChecks.verify_ranges``) must
hold the replay data of ``iolayer.pattern`` for its file (``data_bytes``, the
numpy reference of the generator the executors write with; the table
pattern for ``gds``, whose device buffer holds it), every byte of it (a short read is a
mismatch at the first byte missing); a packed file's ranges
(``PlanChecks.pack_verify``), read at their offset in the pack, hold the
pack's pattern there (``replayer.pack``); files written at offsets the trace
did not know are not checked (``PlanChecks.unverifiable``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer import pattern

from . import strategies
from .paths import TargetRoot
from .plan import ReplayPlan

CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class ContentMismatch:
    """The first differing byte of a file, relative to the target."""

    path: str
    offset: int


def verify_content(root: TargetRoot, plan: ReplayPlan) -> list[ContentMismatch]:
    """Compare every written range of every file under ``root`` with its pattern; return the mismatches.
    Raises ReplayError for a plan made without its verify ranges (``PlanChecks.ranges_planned``)."""
    if not plan.checks.ranges_planned:
        raise ReplayError("this plan was made without the ranges verification checks (plan with verify_ranges=True)")
    found = []
    spec = strategies.find(plan.strategy)  # a strategy writing the table pattern (gds), not the generated data
    differs = pattern.first_difference if spec is not None and spec.table_pattern else pattern.data_first_difference
    for rel, ranges in plan.checks.verify_ranges.items():
        mismatch = _check_file(root, rel, ranges, pattern.file_key(rel), differs=differs)
        if mismatch is not None:
            found.append(ContentMismatch(rel, mismatch))
    for pack, rel, base, ranges in plan.checks.pack_verify:
        mismatch = _check_file(root, pack, ranges, pattern.file_key(pack), base, differs=differs)
        if mismatch is not None:
            found.append(ContentMismatch(f"{rel} (in {pack})", mismatch))
    return found


def _check_file(root: TargetRoot, path: str, ranges: tuple[tuple[int, int], ...], key: int,
                base: int = 0, *, differs=pattern.data_first_difference) -> int | None:
    """First offset (in the original file's coordinates) where ``path`` differs from the pattern of ``key``;
    ``base``: where the original file starts in ``path`` (the pattern is ``path``'s, at its own offsets)."""
    try:
        fd = root.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        for start, end in ranges:
            for offset in range(start, end, CHUNK_BYTES):
                size = min(CHUNK_BYTES, end - offset)
                data = os.pread(fd, size, base + offset)
                first = differs(data, base + offset, key)
                if first is not None:
                    return first - base
                if len(data) < size:  # a short read: the file ends before the range does (truncated)
                    return offset + len(data)
    finally:
        os.close(fd)
    return None
