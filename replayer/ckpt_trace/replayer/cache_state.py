"""The page cache as recorded (``--cache recorded``, the default): before each run's clock, the ranges of the
pre-created files that the trace read cold are out of the page cache and those it read warm are in it.

A trace says it per read row in ``cold_bytes`` (format version 6, bcc backend: the bytes of the read whose pages
were not in the page cache when the recording began; ``tracer.page_cache``). A read with ``cold_bytes`` equal
to its length is cold, 0 warm; one partly cold (the column is a count, not which pages) has its first
``cold_bytes`` taken as cold and the rest as warm, so the totals are the recording's. Where any read of a
pre-created file has ``cold_bytes`` null (strace, a trace before version 6) the state is unknown and the
replay prepares those files cold, as ``--cache cold`` does, saying so.

Preparing a file (``prepare_recorded``): fsync(2) it (its pages were just written, dirty pages cannot be
dropped), drop all its pages (posix_fadvise(2) POSIX_FADV_DONTNEED), read the warm ranges once (readahead on:
the page cache holds them in large folios, as after the reads or writes that made them warm), then take the
cold ranges out. Reading a warm range lets readahead bring in the next pages, which may be a cold range's, and a
large folio (up to ``LARGEST_FOLIO_BYTES``, naturally aligned) that straddles a cold range's edge is never
dropped by a DONTNEED of that range (the kernel drops only whole folios inside the range it is given: of the
cold ranges of a warm GPT-2-small DCP load, every page stayed resident that way). So each cold range's
window, widened to ``LARGEST_FOLIO_BYTES`` boundaries, is dropped whole, the warm bytes of the window are read
again through a descriptor with POSIX_FADV_RANDOM (no readahead: exactly those pages, one page per folio), and
the cold ranges, widened to whole pages, are dropped once more. What of them is still resident after that is
counted (cachestat(2), ``RecordedCache.resident_cold_bytes``) and said in the note.

Last, once every file is prepared, the warm ranges are checked again (cachestat(2)) and a range that lost
pages is read again (without readahead: only its missing pages come from storage): the kernel may evict pages
while the other files are prepared. On the development VM a DAMON scheme (``kdamond``, ``paddr`` operations,
action ``pageout`` on unmapped file pages idle for 12 aggregation intervals of 5 s, at most 128 MiB/s) took
whole folios of just-read files in about one preparation of three (reclaim counters unmoved), and a replay then
read them from storage inside the clock. The warm bytes still missing after that pass are counted
(``RecordedCache.missing_warm_bytes``) and said. Setup: never inside the clock.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import scan
from ckpt_trace.iolayer.pagecache import resident_pages
from ckpt_trace.ranges import covered_bytes, intersect_ranges, merge_ranges, subtract_ranges, widen_ranges

from .paths import TargetRoot, relative_target_path

PAGE_BYTES = mmap.PAGESIZE


def _largest_folio_bytes() -> int:
    """The largest page-cache folio: a PMD-sized huge page (the kernel's MAX_PAGECACHE_ORDER is at most
    HPAGE_PMD_ORDER; /sys/kernel/mm/transparent_hugepage/hpage_pmd_size), 2 MiB where that file is missing."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20


LARGEST_FOLIO_BYTES = _largest_folio_bytes()
_COLUMNS = ["op", "path", "offset", "ret", "size", "interface", "cold_bytes"]


@dataclass
class RecordedCache:
    """Per pre-created file (target-relative path), the byte ranges [start, end) read cold and read warm (each
    sorted and disjoint); ``cold_bytes`` the distinct bytes of the files read cold (a byte read cold twice
    counts once: what the replay drops, and about what its reads take from storage), ``warm_bytes`` the distinct bytes read warm
    and never cold (what it reads in before the clock); ``known`` False when some read of those files has no
    ``cold_bytes`` (then the ranges are not used). ``resident_cold_bytes``: of the cold ranges (whole pages),
    the most bytes still in the page cache after a ``prepare_recorded`` (None: not prepared, or cachestat(2)
    missing); ``missing_warm_bytes`` likewise, of the warm ranges, the most bytes not in it."""

    cold: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    warm: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    cold_bytes: int = 0
    warm_bytes: int = 0
    known: bool = True
    resident_cold_bytes: int | None = None
    missing_warm_bytes: int | None = None

    def note(self) -> str:
        """What the results say about the state that ran."""
        if not self.known:
            return (
                "page cache unknown: replayed cold (the trace does not say which reads hit the page cache: "
                "strace, or a trace before format version 6; --cache warm replays them warm)"
            )
        resident = (
            f"; {self.resident_cold_bytes:,} B of the cold pages stayed in the page cache"
            if self.resident_cold_bytes
            else ""
        )
        if self.missing_warm_bytes:
            resident += f"; {self.missing_warm_bytes:,} B of the warm pages were not in it when the clock started"
        return (
            f"page cache recorded: {self.cold_bytes:,} B cold (dropped before the clock), "
            f"{self.warm_bytes:,} B warm (read before the clock){resident}"
        )


def _batches(trace) -> Iterable[pa.RecordBatch]:
    if trace.table is not None:
        table = trace.table
        missing = [name for name in _COLUMNS if name not in table.column_names]
        for name in missing:
            table = table.append_column(name, pa.nulls(table.num_rows, pa.int64()))
        return table.select(_COLUMNS).to_batches()
    return scan(trace.path, _COLUMNS)[1]


def _ints(column) -> np.ndarray:
    return np.asarray(pc.fill_null(column, 0).to_numpy(zero_copy_only=False), np.int64)


def recorded_cache(trace, strip_prefix: str | None, files: Iterable[str]) -> RecordedCache:
    """The recorded state of the pre-created ``files`` (target-relative) from ``trace`` (a ``formats.Trace``;
    read batch by batch when its table is not loaded). Raises TraceFormatError for a corrupt trace."""
    names = sorted(set(files))
    number = {name: i for i, name in enumerate(names)}
    rel_of: dict[str, int] = {}
    parts: list[np.ndarray] = []
    state = RecordedCache()
    for batch in _batches(trace):
        reads = pc.fill_null(pc.and_(pc.equal(batch.column("op"), "read"), pc.is_valid(batch.column("offset"))), False)
        batch = batch.filter(reads)
        if not batch.num_rows:
            continue
        paths = batch.column("path")
        paths = paths if pa.types.is_dictionary(paths.type) else pc.dictionary_encode(paths)
        words = paths.dictionary.cast(pa.string()).to_pylist()
        for word in words:
            if word is not None and word not in rel_of:
                rel = relative_target_path(word, strip_prefix)
                rel_of[word] = number.get(rel, -1) if rel is not None else -1
        lut = np.asarray([rel_of.get(word, -1) if word is not None else -1 for word in words] or [-1], np.int64)
        file = np.where(np.asarray(paths.indices.is_valid()), lut[_ints(paths.indices)], -1)
        mapped = np.asarray(pc.fill_null(pc.equal(batch.column("interface"), "mmap"), False))
        offset = _ints(batch.column("offset"))
        length = np.maximum(np.where(mapped, _ints(batch.column("size")), _ints(batch.column("ret"))), 0)
        keep = (file >= 0) & (length > 0)
        known = np.asarray(pc.is_valid(batch.column("cold_bytes")))[keep]
        if not known.all():
            state.known = False
        cold = np.minimum(np.maximum(_ints(batch.column("cold_bytes")), 0), length)[keep]
        parts.append(np.stack([file[keep], offset[keep], cold, length[keep]], axis=1)[known])
    if not parts:
        return state
    rows = np.concatenate(parts)
    cut = rows[:, 1] + rows[:, 2]
    for index in np.unique(rows[:, 0]):
        mine = rows[:, 0] == index
        has_cold, has_warm = mine & (rows[:, 2] > 0), mine & (rows[:, 3] > rows[:, 2])
        name = names[int(index)]
        cold = merge_ranges(list(zip(rows[has_cold, 1].tolist(), cut[has_cold].tolist())))
        warm = merge_ranges(list(zip(cut[has_warm].tolist(), (rows[has_warm, 1] + rows[has_warm, 3]).tolist())))
        if cold:
            state.cold[name] = cold
        if warm:
            state.warm[name] = warm
        state.cold_bytes += covered_bytes(cold)
        state.warm_bytes += covered_bytes(cold + warm) - covered_bytes(cold)
    return state


def prepare_recorded(root: TargetRoot, files: Iterable[str], state: RecordedCache) -> None:
    """Prepare each of ``files`` (target-relative, pre-created) as ``state`` says (the module docstring) and set
    ``state.resident_cold_bytes`` and ``state.missing_warm_bytes``; a file ``root`` does not hold (a
    distributed share's, made by another process) is skipped. Raises ReplayError on an I/O error."""
    chunk = bytearray(4 << 20)
    resident: int | None = 0
    wanted: dict[str, list[tuple[int, int]]] = {}
    for rel in files:
        try:
            fd = root.open(rel, os.O_RDONLY)
        except FileNotFoundError:
            continue
        except OSError as err:
            raise ReplayError(f"cannot prepare the page cache of {rel}: {err.strerror}") from None
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            warm = state.warm.get(rel, [])
            cold = widen_ranges(state.cold.get(rel, []), PAGE_BYTES)
            _read_ranges(fd, warm, chunk)
            wanted[rel] = subtract_ranges(warm, cold)
            if cold:
                windows = widen_ranges(cold, LARGEST_FOLIO_BYTES)
                _drop(fd, windows)
                exact = root.open(rel, os.O_RDONLY)
                try:
                    os.posix_fadvise(exact, 0, 0, os.POSIX_FADV_RANDOM)
                    _read_ranges(exact, subtract_ranges(intersect_ranges(warm, windows), cold), chunk)
                finally:
                    os.close(exact)
                _drop(fd, cold)
                stayed = _resident_bytes(fd, cold)
                resident = None if stayed is None or resident is None else resident + stayed
        except OSError as err:
            raise ReplayError(f"cannot prepare the page cache of {rel}: {err.strerror}") from None
        finally:
            os.close(fd)
    missing = top_up(root, wanted, chunk)
    for name, value in (("resident_cold_bytes", resident), ("missing_warm_bytes", missing)):
        previous = getattr(state, name)  # the most any preparation left (each run prepares again)
        setattr(state, name, value if value is None or previous is None else max(previous, value))


def top_up(root: TargetRoot, wanted: dict[str, list[tuple[int, int]]], chunk: bytearray) -> int | None:
    """Read again, without readahead, each range of ``wanted`` (per target-relative file: [start, end) byte
    ranges, sorted and disjoint) that lost pages since it was read; returns the bytes (whole pages) still not
    in the page cache after that, None where cachestat(2) is missing. Raises ReplayError on an I/O error."""
    missing = 0
    for rel, ranges in wanted.items():
        if not ranges:
            continue
        try:
            fd = root.open(rel, os.O_RDONLY)
        except OSError as err:
            raise ReplayError(f"cannot prepare the page cache of {rel}: {err.strerror}") from None
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for start, end in ranges:
                gone = _missing_bytes(fd, start, end)
                if gone is None:
                    return None
                if gone:
                    _read_ranges(fd, [(start, end)], chunk)
                    missing += _missing_bytes(fd, start, end) or 0
        except OSError as err:
            raise ReplayError(f"cannot prepare the page cache of {rel}: {err.strerror}") from None
        finally:
            os.close(fd)
    return missing


def _missing_bytes(fd: int, start: int, end: int) -> int | None:
    """The bytes (whole pages) of [start, end) not in the page cache (cachestat(2); None where missing)."""
    cached = resident_pages(fd, start, end - start)
    return None if cached is None else (-(-end // PAGE_BYTES) - start // PAGE_BYTES - cached) * PAGE_BYTES


def _resident_bytes(fd: int, ranges: list[tuple[int, int]]) -> int | None:
    """The bytes (whole pages) of the [start, end) ``ranges`` in the page cache (cachestat(2); None where
    missing)."""
    total = 0
    for start, end in ranges:
        cached = resident_pages(fd, start, end - start)
        if cached is None:
            return None
        total += cached * PAGE_BYTES
    return total


def _drop(fd: int, ranges: list[tuple[int, int]]) -> None:
    """Drop the clean pages of each [start, end) from the page cache (posix_fadvise(2) POSIX_FADV_DONTNEED)."""
    for start, end in ranges:
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)


def _read_ranges(fd: int, ranges: list[tuple[int, int]], chunk: bytearray) -> None:
    """Read each [start, end) of ``ranges`` once through ``chunk`` (up to the end of the file)."""
    for start, end in ranges:
        done = start
        while done < end:
            got = os.preadv(fd, [memoryview(chunk)[: min(len(chunk), end - done)]], done)
            if got <= 0:
                break
            done += got
