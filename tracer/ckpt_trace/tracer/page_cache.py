"""Which bytes of each read came from storage: the ``cold_bytes`` column (format version 6), from the page-cache
insertions the bcc backend records (``filemap:mm_filemap_add_to_page_cache``, ``bcc_program.c``).

The rule: a page of a read's range was *cold* (not resident in the page cache when the trace began, so its
bytes came from storage) when it was inserted into the page cache during the recording before the read
ended; any other page of the range was resident at the start (*warm*). Counting only the pages inserted
*during* a read would call warm what an earlier read's readahead brought in, which was still cold with
respect to the initial state. Insertions made by a traced thread inside a write call are the write's own new
pages (left out in the kernel); pages inserted by processes the recording does not trace are not seen.

Post-processing is vectorised: per inode, the distinct inserted page indices sorted, each with its first
insertion time; per read row, the inserted pages of its range are counted with two binary searches and the
partial first and last pages corrected, and only a read whose range holds a page first inserted after the
read ended (evicted and brought back later, rare) is counted page by page.

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


@dataclass
class _Inode:
    pages: np.ndarray  # sorted distinct page indices inserted during the recording
    first_ts_ns: np.ndarray  # each one's first insertion, on the trace's clock (ns since it began)


@dataclass
class Inserts:
    """The page-cache insertions of one recording (``aux_t`` records of kind AUX_CACHE_INSERT), kept as arrays
    until the trace is written. ``events`` counts the records (one per folio inserted)."""

    events: int = 0
    _parts: list[np.ndarray] = field(default_factory=list)  # rows: ts_ns (trace clock), dev, ino, first, last
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
        self._parts.append(part)
        self.events += len(records)
        self._index = None

    def add_arrays(self, ts_ns, dev, ino, first, last) -> None:
        """Insertions given as equal-length integer arrays (ts_ns on the trace's clock): for tests and tools."""
        part = np.stack([np.asarray(a, np.int64) for a in (ts_ns, dev, ino, first, last)], axis=1)
        self._parts.append(part.reshape(-1, 5))
        self.events += len(part)
        self._index = None

    def pages(self) -> int:
        """Distinct pages inserted (all inodes)."""
        return sum(len(inode.pages) for inode in self._built().values())

    def _built(self) -> dict[tuple[int, int], _Inode]:
        if self._index is not None:
            return self._index
        index: dict[tuple[int, int], _Inode] = {}
        if self._parts:
            data = np.concatenate(self._parts)
            count = data[:, 4] - data[:, 3] + 1
            rows = np.repeat(np.arange(len(data)), count)  # one entry per page inserted
            starts = np.cumsum(count) - count
            page = data[rows, 3] + (np.arange(len(rows)) - starts[rows])
            ts, dev, ino = data[rows, 0], data[rows, 1], data[rows, 2]
            order = np.lexsort((ts, page, ino, dev))  # by inode, page, then time: the first of each page leads
            ts, dev, ino, page = ts[order], dev[order], ino[order], page[order]
            lead = np.ones(len(page), bool)
            lead[1:] = (page[1:] != page[:-1]) | (ino[1:] != ino[:-1]) | (dev[1:] != dev[:-1])
            ts, dev, ino, page = ts[lead], dev[lead], ino[lead], page[lead]
            bounds = np.flatnonzero(np.r_[True, (ino[1:] != ino[:-1]) | (dev[1:] != dev[:-1]), True])
            for a, b in zip(bounds[:-1], bounds[1:]):
                index[(int(dev[a]), int(ino[a]))] = _Inode(page[a:b], ts[a:b])
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


def _count(inode: _Inode, offset: np.ndarray, length: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Cold bytes of reads of ``length`` bytes at ``offset`` ending at ``end_ns`` against one inode's inserted
    pages (see the module docstring)."""
    pages, first_ts = inode.pages, inode.first_ts_ns
    has = length > 0
    p0 = offset // PAGE_BYTES
    p1 = np.where(has, (offset + np.maximum(length, 1) - 1) // PAGE_BYTES, p0)
    lo = np.searchsorted(pages, p0, "left")
    hi = np.searchsorted(pages, p1, "right")
    inserted = hi - lo
    # A page of the range first inserted after the read ended was resident when it was read: such reads
    # (rare) are counted page by page below.
    late = np.zeros(len(offset), bool)
    span = np.flatnonzero(has & (inserted > 0))
    if len(span):  # the latest first insertion of each range: reduceat over [lo, hi) pairs, interleaved
        bounds = np.stack([lo[span], hi[span]], axis=1).ravel()
        latest = np.maximum.reduceat(np.r_[first_ts, np.iinfo(np.int64).min], bounds)[0::2]
        late[span] = latest > end_ns[span]
    cold = inserted * PAGE_BYTES
    # the first and last pages' bytes outside the read, where those pages are inserted
    first_in = (lo < len(pages)) & (pages[np.minimum(lo, len(pages) - 1)] == p0)
    last_in = (hi > 0) & (pages[np.maximum(hi - 1, 0)] == p1)
    cold -= np.where(first_in, offset - p0 * PAGE_BYTES, 0)
    cold -= np.where(last_in, (p1 + 1) * PAGE_BYTES - (offset + length), 0)
    for i in np.flatnonzero(late):
        chosen = pages[lo[i] : hi[i]][first_ts[lo[i] : hi[i]] <= end_ns[i]]
        start = np.maximum(chosen * PAGE_BYTES, offset[i])
        stop = np.minimum((chosen + 1) * PAGE_BYTES, offset[i] + length[i])
        cold[i] = int(np.sum(stop - start))
    return np.where(has, cold, 0)
