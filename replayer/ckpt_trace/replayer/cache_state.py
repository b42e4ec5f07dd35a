"""The page cache as recorded (``--cache recorded``, the default): before each run's clock, the ranges of the
pre-created files that the trace read cold are out of the page cache and those it read warm are in it.

A trace says it per read row in ``cold_bytes`` (format version 6, bcc backend: the bytes of the read whose pages
were not in the page cache when the recording began; ``tracer.page_cache``). A read with ``cold_bytes`` equal
to its length is cold, 0 warm; one partly cold (the column is a count, not which pages) has its first
``cold_bytes`` taken as cold and the rest as warm, so the totals are the recording's. Where any read of a
pre-created file has ``cold_bytes`` null (strace, a trace before version 6) the state is unknown and the
replay prepares those files cold, as ``--cache cold`` does, saying so.

Preparing a file (``prepare_recorded``): fsync(2) it (its pages were just written, dirty pages cannot be
dropped), drop all its pages (posix_fadvise(2) POSIX_FADV_DONTNEED), read the warm ranges once, then drop the
cold ranges again, widened to whole pages (reading a warm range lets readahead bring in the next pages, which
may be a cold range's). Setup: never inside the clock.
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

from .paths import TargetRoot, relative_target_path

PAGE_BYTES = mmap.PAGESIZE
_COLUMNS = ["op", "path", "offset", "ret", "size", "interface", "cold_bytes"]


@dataclass
class RecordedCache:
    """Per pre-created file (target-relative path), the byte ranges (offset, length) read cold and read warm;
    ``cold_bytes`` the distinct bytes of the files read cold (a byte read cold twice counts once: what the
    replay drops, and about what its reads take from storage), ``warm_bytes`` the distinct bytes read warm
    and never cold (what it reads in before the clock); ``known`` False when some read of those files has no
    ``cold_bytes`` (then the ranges are not used)."""

    cold: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    warm: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    cold_bytes: int = 0
    warm_bytes: int = 0
    known: bool = True

    def note(self) -> str:
        """What the results say about the state that ran."""
        if not self.known:
            return (
                "page cache unknown: replayed cold (the trace does not say which reads hit the page cache: "
                "strace, or a trace before format version 6; --cache warm replays them warm)"
            )
        return (
            f"page cache recorded: {self.cold_bytes:,} B cold (dropped before the clock), "
            f"{self.warm_bytes:,} B warm (read before the clock)"
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
        if has_cold.any():
            state.cold[name] = list(zip(rows[has_cold, 1].tolist(), rows[has_cold, 2].tolist()))
        if has_warm.any():
            state.warm[name] = list(zip(cut[has_warm].tolist(), (rows[has_warm, 3] - rows[has_warm, 2]).tolist()))
        cold = sum(length for _, length in _merged(state.cold.get(name, ())))
        state.cold_bytes += cold
        state.warm_bytes += sum(length for _, length in _merged([*state.cold.get(name, ()), *state.warm.get(name, ())]))
        state.warm_bytes -= cold
    return state


def prepare_recorded(root: TargetRoot, files: Iterable[str], state: RecordedCache) -> None:
    """Prepare each of ``files`` (target-relative, pre-created) as ``state`` says (the module docstring);
    a file ``root`` does not hold (a distributed share's, made by another process) is skipped. Raises
    ReplayError on an I/O error."""
    chunk = bytearray(4 << 20)
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
            for offset, length in _merged(state.warm.get(rel, ())):
                done = 0
                while done < length:
                    view = memoryview(chunk)[: min(len(chunk), length - done)]
                    got = os.preadv(fd, [view], offset + done)
                    if got <= 0:
                        break
                    done += got
            for offset, length in _merged(state.cold.get(rel, ())):
                start = offset // PAGE_BYTES * PAGE_BYTES
                end = -(-(offset + length) // PAGE_BYTES) * PAGE_BYTES
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError as err:
            raise ReplayError(f"cannot prepare the page cache of {rel}: {err.strerror}") from None
        finally:
            os.close(fd)


def _merged(ranges) -> list[tuple[int, int]]:
    """``ranges`` (offset, length) sorted, overlapping and touching ones joined (vectorised)."""
    pairs = np.asarray(list(ranges), np.int64).reshape(-1, 2)
    if not len(pairs):
        return []
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    ends = np.maximum.accumulate(pairs[:, 0] + pairs[:, 1])
    starts = np.flatnonzero(np.r_[True, pairs[1:, 0] > ends[:-1]])
    last = np.r_[starts[1:] - 1, len(pairs) - 1]
    return list(zip(pairs[starts, 0].tolist(), (ends[last] - pairs[starts, 0]).tolist()))
