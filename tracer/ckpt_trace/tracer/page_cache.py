"""Which bytes of each read came from storage: the ``cold_bytes`` column (format version 6), from the page-cache
insertions the bcc backend records (``filemap:mm_filemap_add_to_page_cache``, ``bcc_program.c``).

The rule: a page of a read's range was *cold* (not resident in the page cache when the trace began, so its
bytes came from storage) when it was inserted into the page cache during the recording before the read
ended; any other page of the range was resident at the start (*warm*). Counting only the pages inserted
*during* a read would call warm what an earlier read's readahead brought in, which was still cold with
respect to the initial state. Insertions made by a traced thread inside a write call are the write's own new
pages (left out in the kernel); pages inserted by processes the recording does not trace are not seen.

Post-processing is vectorised: per inode, the inserted pages as sorted non-overlapping runs, each with its first
insertion time; per read row, the inserted pages of its range are counted with two binary searches and the
partial first and last pages corrected, and only a read whose range holds a page first inserted after the
read ended (evicted and brought back later, rare) is counted run by run.

Read rows are matched to inodes by ``os.stat`` of their path when the trace is written (after the command
ended): a row whose path no longer names a regular file gets null (unknown), as does every row that is not a
data read (``op`` ``read``) with a known offset. Units: bytes; page indices in the kernel's page size.
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PAGE_BYTES = mmap.PAGESIZE
_INTERFACES = ("syscall", "io_uring", "libaio", "mmap", "sendfile", "copy_file_range", "splice")


def kernel_dev(st_dev: int) -> int:
    """``st_dev`` (user space's encoding) as the kernel's ``dev_t`` in tracepoints: major << 20 | minor."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


#: Raw insertion records held before they are folded into the intervals: what bounds the memory of a long
#: recording (5 int64 each, 40 MiB at this size) besides the intervals themselves.
FOLD_EVENTS = 1 << 20


@dataclass
class _Inode:
    start: np.ndarray  # sorted, non-overlapping runs of pages [start, stop) inserted during the recording
    stop: np.ndarray
    first_ts_ns: np.ndarray  # the run's pages' first insertion, on the trace's clock (ns since it began)


@dataclass
class Inserts:
    """The page-cache insertions of one recording (``aux_t`` records of kind AUX_CACHE_INSERT). ``events``
    counts the records (one per folio inserted). Records are folded, every ``FOLD_EVENTS`` of them and when
    the trace is written, into per-inode intervals: sorted non-overlapping runs of page indices, each with
    the first insertion time of its pages (a page inserted again keeps its first time). Memory is one row
    of 5 int64 per run, and a run covers a folio or more (a 64 MiB cold load on ext4 / Linux 6.18:
    16,384 pages in 953 folios), where a per-page index would hold one entry per page."""

    events: int = 0
    _parts: list[np.ndarray] = field(default_factory=list)  # rows: ts_ns (trace clock), dev, ino, first, last
    _pending: int = 0
    _runs: np.ndarray | None = None  # rows: dev, ino, start, stop (exclusive), first ts_ns; sorted, disjoint
    _index: dict[tuple[int, int], _Inode] | None = None
    _paths: dict[str, tuple[int, int] | None] = field(default_factory=dict)

    def add(self, records: np.ndarray, start_ns: int) -> None:
        """Keep ``records`` (structured ``aux_t`` records); ``start_ns`` is the trace's time 0 (ktime ns)."""
        part = np.empty((len(records), 5), np.int64)
        part[:, 0] = records["ts_ns"].astype(np.int64) - start_ns
        part[:, 1] = records["dev"]
        part[:, 2] = records["ino"].astype(np.int64)
        part[:, 3] = records["index"].astype(np.int64)
        part[:, 4] = records["last_index"].astype(np.int64)
        self._keep(part)

    def add_arrays(self, ts_ns, dev, ino, first, last) -> None:
        """Insertions given as equal-length integer arrays (ts_ns on the trace's clock; first and last page
        index of each, inclusive): for tests and tools."""
        part = np.stack([np.asarray(a, np.int64) for a in (ts_ns, dev, ino, first, last)], axis=1)
        self._keep(part.reshape(-1, 5))

    def _keep(self, part: np.ndarray) -> None:
        self._parts.append(part)
        self.events += len(part)
        self._pending += len(part)
        self._index = None
        if self._pending >= FOLD_EVENTS:
            self._fold()

    def _fold(self) -> None:
        """The held records merged into the intervals."""
        if not self._parts:
            return
        raw = np.concatenate(self._parts)
        self._parts, self._pending = [], 0
        runs = np.stack([raw[:, 1], raw[:, 2], raw[:, 3], raw[:, 4] + 1, raw[:, 0]], axis=1)
        del raw
        if self._runs is not None:
            runs = np.concatenate([self._runs, runs])
        self._runs = first_inserts(runs)

    def runs(self) -> int:
        """Intervals held (all inodes), once the held records are folded in."""
        self._built()
        return 0 if self._runs is None else len(self._runs)

    def pages(self) -> int:
        """Distinct pages inserted (all inodes)."""
        return sum(int(np.sum(inode.stop - inode.start)) for inode in self._built().values())

    def _built(self) -> dict[tuple[int, int], _Inode]:
        if self._index is not None:
            return self._index
        self._fold()
        index: dict[tuple[int, int], _Inode] = {}
        runs = self._runs
        if runs is not None and len(runs):
            dev, ino = runs[:, 0], runs[:, 1]
            bounds = np.flatnonzero(np.r_[True, (ino[1:] != ino[:-1]) | (dev[1:] != dev[:-1]), True])
            for a, b in zip(bounds[:-1], bounds[1:]):
                index[(int(dev[a]), int(ino[a]))] = _Inode(runs[a:b, 2], runs[a:b, 3], runs[a:b, 4])
        self._index = index
        return index

    def _inode_of(self, path: str) -> tuple[int, int] | None:
        if path not in self._paths:
            try:
                st = os.stat(path)
            except OSError:
                self._paths[path] = None
            else:
                self._paths[path] = (kernel_dev(st.st_dev), st.st_ino) if stat.S_ISREG(st.st_mode) else None
        return self._paths[path]

    def cold_bytes(self, table: pa.Table | pa.RecordBatch) -> pa.Array:
        """The ``cold_bytes`` column of ``table``'s rows (int64, null where unknown or not a data read)."""
        rows = table.num_rows
        out = np.zeros(rows, np.int64)
        known = np.zeros(rows, bool)
        if not rows:
            return pa.array(out, pa.int64())
        op = table.column("op")
        reads = pc.fill_null(
            pc.and_(
                pc.and_(pc.equal(op, "read"), pc.is_in(table.column("interface"), pa.array(_INTERFACES))),
                pc.and_(pc.is_valid(table.column("offset")), pc.is_valid(table.column("path"))),
            ),
            False,
        )
        picked = np.flatnonzero(np.asarray(reads))
        if not len(picked):
            return pa.array(out, pa.int64(), mask=~known)
        taken = table.take(pa.array(picked))
        offset, ret, size = (_ints(taken.column(name)) for name in ("offset", "ret", "size"))
        mapped = np.asarray(pc.fill_null(pc.equal(taken.column("interface"), "mmap"), False))
        length = np.maximum(np.where(mapped, size, ret), 0)
        end_ns = _ints(taken.column("ts_ns")) + _ints(taken.column("dur_ns"))
        paths = taken.column("path")
        paths = paths.cast(pa.string()) if pa.types.is_dictionary(paths.type) else paths
        index = self._built()
        by_inode: dict[tuple[int, int] | None, list[int]] = {}
        for position, path in enumerate(paths.to_pylist()):
            by_inode.setdefault(self._inode_of(path), []).append(position)
        for key, positions in by_inode.items():
            if key is None:
                continue
            where = np.asarray(positions)
            known[picked[where]] = True
            inode = index.get(key)
            if inode is not None:
                out[picked[where]] = _count(inode, offset[where], length[where], end_ns[where])
        return pa.array(out, pa.int64(), mask=~known)

    def annotate(self, table: pa.Table) -> pa.Table:
        """``table`` with its ``cold_bytes`` column filled (added or replaced)."""
        column = self.cold_bytes(table)
        if "cold_bytes" in table.column_names:
            return table.set_column(table.column_names.index("cold_bytes"), "cold_bytes", column)
        return table.append_column("cold_bytes", column)


def _ints(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An integer column as int64 numpy, nulls as 0."""
    return np.asarray(pc.fill_null(column, 0).to_numpy(), np.int64)


def first_inserts(runs: np.ndarray) -> np.ndarray:
    """Page runs (rows: dev, ino, start, stop (exclusive), ts_ns; any order, overlapping or not) as the first
    insertion time of each page: sorted non-overlapping runs with the same columns, each page keeping the
    smallest ts_ns of the runs that hold it, adjacent runs of one inode with equal times merged.

    Vectorised: runs sorted by inode and start; a run that overlaps no other (the usual case: each folio is
    inserted once) is kept as it is; the runs of each overlapping cluster are cut at their ends into pieces,
    spread over the pieces they cover, and each piece keeps its earliest run (``_first_of_pieces``). Memory
    is a few int64 per run or piece, never per page."""
    if not len(runs):
        return runs.reshape(0, 5)
    runs = runs[np.lexsort((runs[:, 4], runs[:, 2], runs[:, 1], runs[:, 0]))]
    dev, ino, start, stop = runs[:, 0], runs[:, 1], runs[:, 2], runs[:, 3]
    opens = np.r_[True, (dev[1:] != dev[:-1]) | (ino[1:] != ino[:-1])]  # a new inode
    inode = np.cumsum(opens) - 1
    span = int(stop.max()) + 1
    if (int(inode[-1]) + 1) * span < 1 << 62:
        # a run opens a cluster when it starts where every earlier run of its inode has ended
        reach = np.maximum.accumulate(inode * span + stop)
        opens[1:] |= inode[1:] * span + start[1:] >= reach[:-1]
        del reach
        cluster = np.cumsum(opens) - 1
        alone = np.bincount(cluster)[cluster] == 1
        del cluster
    else:  # page indices too large to rank inodes and pages in one int64: every run goes through the pieces
        alone = np.zeros(len(runs), bool)
    del inode, opens
    if not alone.all():
        runs = np.concatenate([runs[alone], _first_of_pieces(runs[~alone])])
        runs = runs[np.lexsort((runs[:, 2], runs[:, 1], runs[:, 0]))]
    # adjacent runs of one inode inserted at the same time: one run
    dev, ino, start, stop, ts = (runs[:, i] for i in range(5))
    joined = (dev[1:] == dev[:-1]) & (ino[1:] == ino[:-1]) & (start[1:] == stop[:-1]) & (ts[1:] == ts[:-1])
    if not joined.any():
        return runs
    first = np.flatnonzero(np.r_[True, ~joined])
    last = np.r_[first[1:], len(runs)] - 1
    merged = runs[first]
    merged[:, 3] = stop[last]
    return merged


def _first_of_pieces(runs: np.ndarray) -> np.ndarray:
    """``first_inserts`` of overlapping runs: each inode's pages cut at the runs' ends into pieces, each run
    spread over the pieces it covers, each piece keeping its earliest run (rows as ``first_inserts``')."""
    order = np.lexsort((runs[:, 1], runs[:, 0]))
    keys = runs[order, :2]
    lead = np.r_[True, np.any(keys[1:] != keys[:-1], axis=1)]
    inode = np.empty(len(runs), np.int64)
    inode[order] = np.cumsum(lead) - 1
    keys = keys[lead]
    coords = np.unique(np.r_[runs[:, 2], runs[:, 3]])
    width = len(coords) + 1
    key_start = inode * width + np.searchsorted(coords, runs[:, 2])
    key_stop = inode * width + np.searchsorted(coords, runs[:, 3])
    cuts = np.unique(np.r_[key_start, key_stop])  # each inode's piece boundaries, in order
    lo, hi = np.searchsorted(cuts, key_start), np.searchsorted(cuts, key_stop)
    count = hi - lo  # pieces each run covers (>= 1: start < stop)
    piece = np.repeat(lo, count) + (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count))
    ts = np.repeat(runs[:, 4], count)
    order = np.lexsort((ts, piece))  # by piece, earliest first
    piece, ts = piece[order], ts[order]
    lead = np.r_[True, piece[1:] != piece[:-1]]
    piece, ts = piece[lead], ts[lead]
    owner = cuts[piece] // width
    start, stop = coords[cuts[piece] % width], coords[cuts[piece + 1] % width]
    return np.stack([keys[owner, 0], keys[owner, 1], start, stop, ts], axis=1)


def _count(inode: _Inode, offset: np.ndarray, length: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Cold bytes of reads of ``length`` bytes at ``offset`` ending at ``end_ns`` against one inode's inserted
    page runs (see the module docstring)."""
    start, stop, first_ts = inode.start, inode.stop, inode.first_ts_ns
    runs = len(start)
    if not runs:
        return np.zeros(len(offset), np.int64)
    has = length > 0
    p0 = offset // PAGE_BYTES
    p1 = np.where(has, (offset + np.maximum(length, 1) - 1) // PAGE_BYTES, p0)  # last page, inclusive
    lo = np.searchsorted(stop, p0, "right")  # the first run ending after p0
    hi = np.searchsorted(start, p1, "right")  # runs starting at or before p1
    size = np.r_[0, np.cumsum(stop - start)]
    inserted = size[hi] - size[lo]
    # the first and last runs' pages outside the range
    first_run, last_run = np.minimum(lo, runs - 1), np.maximum(hi - 1, 0)
    some = hi > lo
    inserted -= np.where(some, np.maximum(p0 - start[first_run], 0), 0)
    inserted -= np.where(some, np.maximum(stop[last_run] - (p1 + 1), 0), 0)
    # A page of the range first inserted after the read ended was resident when it was read: such reads
    # (rare) are counted run by run below.
    late = np.zeros(len(offset), bool)
    span = np.flatnonzero(has & some)
    if len(span):  # the latest first insertion of each range: reduceat over [lo, hi) pairs, interleaved
        bounds = np.stack([lo[span], hi[span]], axis=1).ravel()
        latest = np.maximum.reduceat(np.r_[first_ts, np.iinfo(np.int64).min], bounds)[0::2]
        late[span] = latest > end_ns[span]
    cold = inserted * PAGE_BYTES
    # the first and last pages' bytes outside the read, where those pages are inserted
    first_in = some & (start[first_run] <= p0) & (p0 < stop[first_run])
    last_in = some & (start[last_run] <= p1) & (p1 < stop[last_run])
    cold -= np.where(first_in, offset - p0 * PAGE_BYTES, 0)
    cold -= np.where(last_in, (p1 + 1) * PAGE_BYTES - (offset + length), 0)
    for i in np.flatnonzero(late):
        kept = slice(lo[i], hi[i])
        chosen = first_ts[kept] <= end_ns[i]
        begin = np.maximum(start[kept][chosen] * PAGE_BYTES, offset[i])
        end = np.minimum(stop[kept][chosen] * PAGE_BYTES, offset[i] + length[i])
        cold[i] = int(np.sum(np.maximum(end - begin, 0)))
    return np.where(has, cold, 0)
