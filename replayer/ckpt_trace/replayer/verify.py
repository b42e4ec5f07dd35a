"""``--verify``: read replayed files back and compare them with the data they must hold.

Every byte range a plan leaves written (``PlanChecks.verify_ranges``) must
hold the replay data of ``iolayer.pattern`` for its file (``data_bytes``, the
numpy reference of the generator every strategy's executor writes with,
``gds``'s included), every byte of it (a short read is a
mismatch at the first byte missing); a packed file's ranges
(``PlanChecks.pack_verify``), read at their offset in the pack, hold the
pack's pattern there (``replayer.pack``); files written at offsets the trace
did not know are not checked (``PlanChecks.unverifiable``). Under ``posix``, which makes in-kernel copies
by their recorded call (``DataPath.kernel_copies``), a range a copy wrote holds its source's data at
the source's offsets instead (``copied_ranges``), checked as such unless a later write overlaps it.
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from dataclasses import dataclass

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer import pattern

from .optable import KCOPIES, WRITE
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
    differs = pattern.data_first_difference  # every strategy writes the replay data (gds too)
    copies, overwritten = copied_ranges(plan) if plan.strategy == "posix" else ({}, {})
    for rel, ranges in plan.checks.verify_ranges.items():
        pieces = copies.get(rel, [])
        if pieces:
            ranges = _minus(ranges, [(dst, dst + size) for dst, size, _, _ in pieces])
        mismatch = _check_file(root, rel, ranges, pattern.file_key(rel), differs=differs)
        for dst, size, src, src_offset in pieces:
            if mismatch is None and src_offset is not None and not _overlaps(overwritten.get(rel, []), dst, size):
                mismatch = _check_copy(root, rel, dst, size, pattern.file_key(src), src_offset, differs)
        if mismatch is not None:
            found.append(ContentMismatch(rel, mismatch))
    for pack, rel, base, ranges in plan.checks.pack_verify:
        mismatch = _check_file(root, pack, ranges, pattern.file_key(pack), base, differs=differs)
        if mismatch is not None:
            found.append(ContentMismatch(f"{rel} (in {pack})", mismatch))
    return found


def _check_file(
    root: TargetRoot,
    path: str,
    ranges: tuple[tuple[int, int], ...],
    key: int,
    base: int = 0,
    *,
    differs=pattern.data_first_difference,
) -> int | None:
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


def copied_ranges(plan: ReplayPlan) -> tuple[dict[str, list[tuple]], dict[str, list[tuple[int, int]]]]:
    """The ranges in-kernel copies write when made by their call (``engine.Executor``): per
    destination path, (offset, size, source path, source offset or None) pieces; and per path the ranges other
    writes after them cover (bytes a copy wrote may be overwritten). A splice's bytes come from the splices
    into the worker's pipe before it, first in first out."""
    t = plan.ops
    copies: dict[str, list[tuple]] = defaultdict(list)
    later: dict[str, list[tuple[int, int]]] = defaultdict(list)
    rows = [r for r in range(len(t)) if t.kcopy[r]]
    if not rows:
        return {}, {}
    first_copy: dict[str, int] = {}
    pipes: dict[int, deque] = defaultdict(deque)  # worker -> [source path, source offset, bytes] in its pipe
    paired_write = set()

    def final(r: int, path: str) -> str:  # a source's data is that of its final name (renamed files keep it)
        fid = plan.files.handle_files.get(int(t.handle[r]))
        return plan.files.file_paths.get(fid, path) if fid is not None else path

    for r in rows:
        name, path = KCOPIES[t.kcopy[r]], t.paths[t.path[r]] if t.path[r] >= 0 else None
        offset = int(t.offset[r]) if t.offset[r] >= 0 else None
        if r in paired_write or path is None:
            continue
        pair = (
            t.kind[r] != WRITE
            and r + 1 < len(t)
            and t.worker[r + 1] == t.worker[r]
            and t.kcopy[r + 1] == t.kcopy[r]
            and t.kind[r + 1] == WRITE
            and t.ts_ns[r + 1] == t.ts_ns[r]
        )
        if pair:
            paired_write.add(r + 1)
            dst = t.paths[t.path[r + 1]] if t.path[r + 1] >= 0 else None
            if dst is not None and t.offset[r + 1] >= 0:
                copies[dst].append((int(t.offset[r + 1]), max(int(t.size[r + 1]), 0), final(r, path), offset))
                first_copy.setdefault(dst, r + 1)
        elif name == "splice" and t.kind[r] != WRITE:
            pipes[int(t.worker[r])].append([final(r, path), offset, max(int(t.size[r]), 0)])
        elif name == "splice" and offset is not None:  # out of the pipe: its bytes are the oldest in it
            fifo, need, at = pipes[int(t.worker[r])], max(int(t.size[r]), 0), offset
            if sum(piece[2] for piece in fifo) < need:
                continue  # replayed as a plain write (its source not in the plan)
            while need:
                src, src_offset, held = fifo[0]
                n = min(held, need)
                copies[path].append((at, n, src, src_offset))
                first_copy.setdefault(path, r)
                fifo[0] = [src, None if src_offset is None else src_offset + n, held - n]
                if fifo[0][2] == 0:
                    fifo.popleft()
                need, at = need - n, at + n
    if copies:
        writes = [
            r
            for r in range(len(t))
            if t.kind[r] == WRITE
            and not t.kcopy[r]
            and t.path[r] >= 0
            and t.paths[t.path[r]] in first_copy
            and r > first_copy[t.paths[t.path[r]]]
        ]
        for r in writes:
            start = int(t.offset[r]) if t.offset[r] >= 0 else 0
            later[t.paths[t.path[r]]].append((start, start + max(int(t.size[r]), 0) if t.offset[r] >= 0 else 1 << 62))
    return dict(copies), dict(later)


def _minus(ranges, cut: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``ranges`` without the intervals of ``cut``."""
    out = list(ranges)
    for lo, hi in cut:
        kept = []
        for start, end in out:
            if end <= lo or start >= hi:
                kept.append((start, end))
                continue
            if start < lo:
                kept.append((start, lo))
            if end > hi:
                kept.append((hi, end))
        out = kept
    return tuple(out)


def _overlaps(ranges: list[tuple[int, int]], offset: int, size: int) -> bool:
    return any(start < offset + size and offset < end for start, end in ranges)


def _check_copy(root: TargetRoot, path: str, offset: int, size: int, key: int, src_offset: int, differs) -> int | None:
    """First offset of ``path``'s ``size`` bytes at ``offset`` that differs from the data of ``key`` (the copy's
    source) at ``src_offset``."""
    try:
        fd = root.open(path, os.O_RDONLY)
    except OSError:
        return offset
    try:
        for done in range(0, size, CHUNK_BYTES):
            n = min(CHUNK_BYTES, size - done)
            data = os.pread(fd, n, offset + done)
            first = differs(data, src_offset + done, key)
            if first is not None:
                return offset + first - src_offset
            if len(data) < n:
                return offset + done + len(data)
    finally:
        os.close(fd)
    return None
