"""``summary``: what a trace holds, as one JSON-able dict.

Sizes are bytes; times nanoseconds unless the key says otherwise. The
request-size histogram buckets data operations by the power of two at or
below their size (bucket ``b`` holds sizes in [b, 2b); size 0 in bucket 0).
Alignment is judged against 4 KiB, the common page and logical block size.
``writer_threads_per_rank`` is the most distinct threads that wrote for one
rank (or one process, where ranks are unknown): what ``emit`` sizes the
writer's threads by.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.formats import Trace, dictionary_codes, distinct, int_values, read_metadata, scan, validity
from ckpt_trace.formats.vocabulary import DATA_OPS, METADATA_OPS
from ckpt_trace.stats import LatencyHistogram

from .gpu import copy_summary
from .ranks import RankTimes

ALIGNMENT_BYTES = 4096


def _sum(array) -> int:
    value = pc.sum(array).as_py()
    return int(value or 0)


def names_in(column, names) -> pa.Array:
    """Boolean array: the (dictionary or plain string) ``column``'s value is in ``names``; nulls are False.
    Dictionary columns are judged on their few dictionary values, never decoded row by row."""
    names = list(names)
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = []
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            lut = np.append(np.isin(np.array(chunk.dictionary.to_pylist(), dtype=object), names), False)
            parts.append(lut[chunk.indices.fill_null(len(lut) - 1).to_numpy()])
        else:
            parts.append(
                pc.fill_null(pc.is_in(chunk, pa.array(names, pa.string())), False).to_numpy(zero_copy_only=False)
            )
    return pa.array(np.concatenate(parts) if parts else np.zeros(0, bool))


def _group_sums(codes: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Exact sums of non-negative ``values`` per code in [0, groups) (np.add.at: no float rounding above
    2**53): int64 where no sum can pass 2**63, Python integers otherwise."""
    if len(values) and int(values.max()) * len(values) >= 1 << 63:
        sums = np.zeros(groups, dtype=object)
        np.add.at(sums, codes, values.astype(object))
        return sums
    if not len(values) or int(values.max()) * len(values) < 1 << 53:  # float64 sums exact below 2**53
        return np.bincount(codes, weights=values, minlength=groups).astype(np.int64)
    sums = np.zeros(groups, np.int64)
    np.add.at(sums, codes, values)
    return sums


def _codes(column: pa.Array) -> tuple[np.ndarray, list]:
    """(each row's code, the values coded) (``formats.dictionary_codes``); a null row gets the code of a
    trailing None value."""
    codes, values = dictionary_codes(column)
    return codes, values.to_pylist() + [None]


def _lut(names: list, wanted) -> np.ndarray:
    """Per code of ``names`` (``_codes``), whether its value is one of ``wanted``."""
    wanted = set(wanted)
    return np.array([name in wanted for name in names], bool)


def _ints(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of a nullable integer column, zero-copy (a null's value is unspecified)."""
    return int_values(column), validity(column)


def _added(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two count arrays added element by element, the shorter padded with zeros."""
    size = max(len(a), len(b))
    return np.pad(a, (0, size - len(a))) + np.pad(b, (0, size - len(b)))


def _exact_sum(values: np.ndarray) -> int:
    """The exact sum of non-negative integers (int64 while it cannot overflow, Python integers past 2**63)."""
    if not len(values):
        return 0
    if int(values.max()) * len(values) < 1 << 63:
        return int(values.sum())
    return sum(values.astype(object).tolist())


def _size_buckets(sizes: np.ndarray, is_write: np.ndarray) -> list[dict[str, int]]:
    """Data operations per power-of-two size bucket, from their sizes (bytes, 0 for unknown) and whether each
    is a write: vectorised (the exponent bits of each size as a float64, IEEE 754: floor(log2) + 1 but for
    a size that rounds up to the next power of two, which one exact integer comparison corrects)."""
    positive = sizes > 0
    index = np.where(positive, (sizes.astype(np.float64).view(np.int64) >> 52) - 1022, 0)
    if len(sizes) and int(sizes.max()) >= 1 << 53:  # below 2**53 every size converts exactly: no rounding up
        low = np.left_shift(np.int64(1), np.clip(index - 1, 0, 62))
        index -= positive & (low > sizes)
    index = np.minimum(index, 63)
    writes = np.bincount(index[is_write], minlength=64)
    reads = np.bincount(index[~is_write], minlength=64)
    moved = _group_sums(index, sizes, 64)
    return [
        {
            "bucket_bytes": 0 if k == 0 else int(_POWERS[k - 1]),
            "read": int(reads[k]),
            "write": int(writes[k]),
            "bytes": int(moved[k]),
        }
        for k in np.flatnonzero(writes + reads).tolist()
    ]


_POWERS = 1 << np.arange(63, dtype=np.int64)  # bucket b (index k) holds sizes in [2**k, 2**(k+1))


SUMMARY_COLUMNS = (
    "ts_ns",
    "dur_ns",
    "pid",
    "tid",
    "rank",
    "op",
    "path",
    "offset",
    "size",
    "ret",
    "interface",
    "in_flight",
    "memory_kind",
)


class Accumulator:
    """The summary's figures, batch by batch: sums, counts, distinct values, and per interface a latency
    histogram (``stats.LatencyHistogram``) and counts per depth in flight; the trace itself is never held
    (memory: the distinct paths, pids and tids, and fixed-size histograms)."""

    def __init__(self) -> None:
        self.rows = self.end_ns = self.failed = 0
        self.ops: dict[str, dict[str, int]] = {}
        self.files: set[str] = set()
        self.pids: set[int] = set()
        self.tids: set[int] = set()
        self.ranks: set[int] = set()
        self.data_ops = self.data_time_ns = self.written = self.read = 0
        self.histogram: dict[int, dict[str, int]] = {}
        self.known_offsets = self.unaligned_offsets = self.unaligned_sizes = 0
        self.interfaces: dict[str, dict[str, Any]] = {}
        self.meta_ops = self.meta_time_ns = 0
        self.copies: list[pa.Table] = []
        self.copy_order: list[int] = []  # each copies table's batch order
        self.writer_threads: set[tuple[int, int]] = set()  # (rank, or -(pid+1) without one; tid) that wrote

    def add(self, batch: pa.RecordBatch | pa.Table, order: int | None = None) -> None:
        """Fold one record batch (or every batch of a table) in: numpy over the batch's columns, text
        judged on each dictionary's few values, nothing copied but what a figure needs. ``order``: the
        batch's place in the trace, where accumulators share a trace's batches (``accumulate``)."""
        if isinstance(batch, pa.Table):
            for part in batch.to_batches():
                self.add(part)
            return
        place: int = self.rows if order is None else order
        n = batch.num_rows
        if n == 0:
            return
        self.rows += n
        op_codes, op_names = _codes(batch.column("op"))
        ts, dur, ret = (int_values(batch.column(name)) for name in ("ts_ns", "dur_ns", "ret"))  # never null
        self.end_ns = max(self.end_ns, int((ts + dur).max()))
        moved_all = np.maximum(ret, 0)
        counts = np.bincount(op_codes, minlength=len(op_names))
        for code in np.flatnonzero(counts).tolist():
            name = op_names[code]
            if name is None:
                continue
            mine = self.ops.setdefault(name, {"count": 0, "bytes": 0, "time_ns": 0})  # a name may repeat
            rows = op_codes == code
            mine["count"] += int(counts[code])
            mine["bytes"] += _exact_sum(moved_all[rows]) if name in DATA_OPS else 0
            mine["time_ns"] += _exact_sum(dur[rows])
        self.files.update(distinct(batch.column("path")))
        self._add_identities(*(int_values(batch.column(name)) for name in ("rank", "pid", "tid")))
        self.failed += int((ret < 0).sum())
        meta = _lut(op_names, METADATA_OPS)[op_codes]
        self.meta_ops += int(meta.sum())
        self.meta_time_ns += _exact_sum(dur[meta])
        data = _lut(op_names, DATA_OPS)[op_codes]
        if data.any():
            is_write = _lut(op_names, ("write",))[op_codes][data]
            self._add_data(batch, data, is_write, moved_all[data], dur[data])
        if "memory_kind" in batch.schema.names:
            interface_codes, interface_names = _codes(batch.column("interface"))
            cuda = _lut(interface_names, ("cuda",))
            if cuda.any():
                copies = cuda[interface_codes]
                if copies.any():
                    self.copies.append(pa.Table.from_batches([batch.filter(pa.array(copies))]))
                    self.copy_order.append(place)

    def _add_identities(self, rank: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> None:
        """The distinct ranks, pids and tids of a batch (never null): one hashed unique of the three packed
        into one 64-bit key (rank + 1 in 20 bits, pid and tid in 22 each: Linux's PID_MAX_LIMIT is 2**22)
        where they fit, else one per column."""
        if (
            len(rank)
            and int(rank.min()) >= -1
            and int(rank.max()) < (1 << 20) - 1
            and int(pid.min()) >= 0
            and int(pid.max()) < 1 << 22
            and int(tid.min()) >= 0
            and int(tid.max()) < 1 << 22
        ):
            keys = (((rank.astype(np.int64) + 1) << 44) | (pid.astype(np.int64) << 22) | tid).astype(np.uint64)
            keys = int_values(pc.unique(pa.Array.from_buffers(pa.uint64(), len(keys), [None, pa.py_buffer(keys)])))
            self.ranks.update(((keys >> np.uint64(44)).astype(np.int64) - 1).tolist())
            self.pids.update(((keys >> np.uint64(22)) & np.uint64((1 << 22) - 1)).tolist())
            self.tids.update((keys & np.uint64((1 << 22) - 1)).tolist())
            return
        for values, seen in ((rank, self.ranks), (pid, self.pids), (tid, self.tids)):
            seen.update(
                int_values(
                    pc.unique(
                        pa.Array.from_buffers(
                            pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)]
                        )
                    )
                ).tolist()
            )

    def _add_data(
        self, batch: pa.RecordBatch, data: np.ndarray, is_write: np.ndarray, moved: np.ndarray, dur: np.ndarray
    ) -> None:
        """The data operations (``data``: the batch's rows that are reads or writes)."""
        self.data_ops += len(moved)
        self.data_time_ns += _exact_sum(dur)
        self.written += _exact_sum(moved[is_write])
        self.read += _exact_sum(moved[~is_write])
        if is_write.any():
            wrote = np.flatnonzero(data)[is_write]  # one gather per column, not two
            rank, pid, tid = (int_values(batch.column(c))[wrote].astype(np.int64) for c in ("rank", "pid", "tid"))
            owner = np.where(rank >= 0, rank, -pid - 1) + (1 << 30)  # > 0: ranks and pids are below 2**30
            keys = np.ascontiguousarray(np.left_shift(owner, 32) | tid, np.int64)
            wrapped = pa.Array.from_buffers(
                pa.int64(), len(keys), [None, pa.py_buffer(keys)]
            )  # pa.array imports pandas
            keys = int_values(pc.unique(wrapped))  # hashed: few distinct
            self.writer_threads.update(
                zip((np.right_shift(keys, 32) - (1 << 30)).tolist(), (keys & 0xFFFFFFFF).tolist())
            )
        size, size_valid = _ints(batch.column("size"))
        sizes = np.where(size_valid[data], size[data], 0).astype(np.int64)
        for entry in _size_buckets(sizes, is_write):
            self._add_bucket(entry)
        offset, offset_valid = _ints(batch.column("offset"))
        known = offset_valid & data  # over the whole batch: masks, no gathers
        self.known_offsets += int(np.count_nonzero(known))
        self.unaligned_offsets += int(np.count_nonzero(known & ((offset & (ALIGNMENT_BYTES - 1)) != 0)))
        self.unaligned_sizes += int(((sizes & (ALIGNMENT_BYTES - 1)) != 0).sum())
        interface_codes, interface_names = _codes(batch.column("interface"))
        interface_codes = interface_codes[data]
        depth, depth_valid = _ints(batch.column("in_flight"))
        depth, depth_valid = depth[data], depth_valid[data]
        for code in np.flatnonzero(np.bincount(interface_codes, minlength=len(interface_names))).tolist():
            interface = interface_names[code]
            if not interface:
                continue
            rows = interface_codes == code
            mine = self._interface(interface)
            mine["ops"] += int(rows.sum())
            mine["bytes_written"] += _exact_sum(moved[rows & is_write])
            mine["bytes_read"] += _exact_sum(moved[rows & ~is_write])
            mine["latency"].add(dur[rows])
            depths = depth[rows & depth_valid]
            if len(depths):  # requests in flight at submission: exact counts per depth (bounded by the deepest)
                mine["depths"] = _added(mine["depths"], np.bincount(depths.astype(np.int64)))

    def _add_bucket(self, entry: dict[str, int]) -> None:
        """Add one size bucket's counts and bytes (``_size_buckets``' entries) to the histogram."""
        mine = self.histogram.setdefault(
            entry["bucket_bytes"], {"bucket_bytes": entry["bucket_bytes"], "read": 0, "write": 0, "bytes": 0}
        )
        for key in ("read", "write", "bytes"):
            mine[key] += entry[key]

    def _interface(self, name: str) -> dict[str, Any]:
        """The figures of one I/O interface, made empty on first use."""
        return self.interfaces.setdefault(
            name,
            {
                "ops": 0,
                "bytes_written": 0,
                "bytes_read": 0,
                "latency": LatencyHistogram(),
                "depths": np.zeros(0, np.int64),
            },
        )

    def merge(self, other: Accumulator) -> None:
        """Fold in what ``other`` accumulated from other batches of the same trace: exact (sums, unions,
        maxima, histograms), so the result does not depend on how batches were shared out."""
        self.rows += other.rows
        self.end_ns = max(self.end_ns, other.end_ns)
        self.failed += other.failed
        for op, entry in other.ops.items():
            mine = self.ops.setdefault(op, {"count": 0, "bytes": 0, "time_ns": 0})
            for key in mine:
                mine[key] += entry[key]
        self.files |= other.files
        self.pids |= other.pids
        self.tids |= other.tids
        self.ranks |= other.ranks
        self.writer_threads |= other.writer_threads
        for name in (
            "data_ops",
            "data_time_ns",
            "written",
            "read",
            "known_offsets",
            "unaligned_offsets",
            "unaligned_sizes",
            "meta_ops",
            "meta_time_ns",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for entry in other.histogram.values():
            self._add_bucket(entry)
        for interface, entry in other.interfaces.items():
            mine = self._interface(interface)
            for key in ("ops", "bytes_written", "bytes_read"):
                mine[key] += entry[key]
            mine["latency"].merge(entry["latency"])
            mine["depths"] = _added(mine["depths"], entry["depths"])
        tagged = sorted(
            zip(
                self.copy_order + other.copy_order,
                range(len(self.copies) + len(other.copies)),
                self.copies + other.copies,
            ),
            key=lambda item: item[:2],
        )
        self.copy_order = [order for order, _, _ in tagged]
        self.copies = [table for _, _, table in tagged]

    def result(self) -> dict[str, Any]:
        interfaces = {}
        for name in sorted(self.interfaces):
            mine = self.interfaces[name]
            entry = {
                "ops": mine["ops"],
                "bytes_written": mine["bytes_written"],
                "bytes_read": mine["bytes_read"],
                "latency_ns": mine["latency"].percentiles_ns(),
            }
            counts = mine["depths"]
            if counts.sum():
                entry["in_flight"] = _depth_figures(counts)
            interfaces[name] = entry
        total = self.data_ops
        return {
            "rows": self.rows,
            "duration_ns": self.end_ns,
            "bytes_written": self.written,
            "bytes_read": self.read,
            "files": len(self.files),
            "processes": len(self.pids),
            "threads": len(self.tids),
            "ranks": sorted(r for r in self.ranks if r is not None and r >= 0),
            "ops": dict(sorted(self.ops.items(), key=lambda item: (-item[1]["count"], item[0]))),
            "data_ops": total,
            "metadata_ops": self.meta_ops,
            "data_time_ns": self.data_time_ns,
            "metadata_time_ns": self.meta_time_ns,
            "size_histogram": [self.histogram[key] for key in sorted(self.histogram)],
            "alignment": {
                "alignment_bytes": ALIGNMENT_BYTES,
                "ops_with_known_offset": self.known_offsets,
                "ops_with_unknown_offset": total - self.known_offsets,
                "unaligned_offset_share": self.unaligned_offsets / self.known_offsets if self.known_offsets else 0.0,
                "unaligned_size_share": self.unaligned_sizes / total if total else 0.0,
            },
            "failed_ops": self.failed,
            "interfaces": interfaces,
            "writer_threads_per_rank": max(Counter(owner for owner, _ in self.writer_threads).values(), default=1),
        }


def _depth_figures(counts: np.ndarray) -> dict[str, Any]:
    """Median (numpy's: the mean of the two middle ones for an even count, truncated), max and power-of-two
    histogram of requests in flight, from exact counts per depth (depth 0 counted in bucket 1)."""
    total = int(counts.sum())
    cumulative = np.cumsum(counts)
    lower = int(np.searchsorted(cumulative, (total + 1) // 2))
    upper = int(np.searchsorted(cumulative, total // 2 + 1))
    depths = np.flatnonzero(counts)
    buckets: dict[str, int] = {}
    for depth in depths.tolist():
        bucket = 1 << int(np.floor(np.log2(max(depth, 1))))
        buckets[str(bucket)] = buckets.get(str(bucket), 0) + int(counts[depth])
    return {"p50": int((lower + upper) / 2), "max": int(depths.max()), "histogram": buckets}


def summary_document(path, md: dict, figures: dict, gpu: dict) -> dict[str, Any]:
    return {
        "trace": str(path),
        "backend": md.get("backend"),
        "command": md.get("command"),
        **figures,
        "lost_events": int(md.get("lost_events", 0)),
        "filesystems": md.get("filesystems", {}),
        "unseen": md.get("unseen", {}),
        "gpu": gpu,
        "interrupted": md.get("interrupted"),
        **({"writeback": md["writeback"]} if isinstance(md.get("writeback"), dict) else {}),
        **({"proactive_reclaim": md["proactive_reclaim"]} if isinstance(md.get("proactive_reclaim"), list) else {}),
        **({"mapped_uncovered_bytes": int(md["mapped_uncovered_bytes"])} if "mapped_uncovered_bytes" in md else {}),
    }


def mapped_uncovered_line(uncovered_bytes: int) -> str:
    """The one line ``record`` and ``summary`` print when bytes mapped from files are covered by no row."""
    return (
        f"{uncovered_bytes:,} bytes ({uncovered_bytes / 2**20:.1f} MiB) mapped from files are covered by no "
        "row: this kernel's page tracepoints did not show how they were touched (mapped_uncovered_bytes)"
    )


def summarize(trace: Trace) -> dict[str, Any]:
    """Summary of ``trace``: operations by type, bytes, files, processes and ranks, sizes, alignment, time split,
    per I/O interface, and the GPU copies per rank (``analysis.gpu``). Works batch by batch
    (``summarize_file`` reads a trace file that way without loading it)."""
    acc = Accumulator()
    times = RankTimes(default_host=str(trace.metadata.get("host")))
    for batch in trace.table.to_batches():
        acc.add(batch)
        times.add(batch)
    gpu = copy_summary(trace.table) if acc.copies else {"copies": 0}
    document = {**summary_document(trace.path, dict(trace.metadata), acc.result(), gpu), **times.result()}
    from .layout import layout_summary  # it builds on this module's helpers

    document["layout"] = layout_summary(trace.path) if trace.path.is_file() else None
    return document


Progress = Callable[[str, int, int], None]
"""A progress sink: ``progress(label, done, total)`` as each of a pass's ``total`` file batches is read."""


def on_batch(progress: Progress | None, label: str) -> Callable[[int, int], None] | None:
    """``formats.scan``'s ``on_batch`` feeding ``progress`` under ``label`` (None without a sink)."""
    return None if progress is None else (lambda done, total: progress(label, done, total))


def summarize_file(path, *, batch_rows: int = 1 << 20, progress: Progress | None = None) -> dict[str, Any]:
    """``summarize`` of the trace file at ``path``, read in record batches of ``batch_rows`` rows
    (``formats.scan``) with only the columns the summary needs: memory is bounded by a batch plus the
    summary's own state, never the whole trace. Traces with GPU copies are read a second time for the data
    operations of the ranks that copied (the copy/I/O overlap). ``progress`` (``Progress``) sees the first
    pass. Raises TraceFormatError for a bad trace."""
    merged = "merged" in read_metadata(path)  # a merged trace's host column (an optional column)
    meta, batches = scan(
        path,
        SUMMARY_COLUMNS + (("host",) if merged else ()),
        batch_rows=batch_rows,
        on_batch=on_batch(progress, "reading"),
    )
    times = RankTimes(default_host=str(meta.get("host")))
    acc = accumulate(_folded(batches, times))
    document = {**summary_document(path, meta, acc.result(), gpu_summary(path, acc, batch_rows)), **times.result()}
    from .layout import layout_summary  # it builds on this module's helpers

    document["layout"] = layout_summary(path)  # None without a layout
    return document


def _folded(batches, times: RankTimes):
    """``batches``, each folded into ``times`` (per rank and per host: ``analysis.ranks``) on its way."""
    for batch in batches:
        times.add(batch)
        yield batch


#: Threads folding batches in (``accumulate``): numpy and Arrow compute release the GIL for most of the work.
SUMMARY_THREADS = 2


def accumulate(batches, threads: int = SUMMARY_THREADS) -> Accumulator:
    """One ``Accumulator`` of every batch, folded by ``threads`` accumulators on as many threads (batch i
    by accumulator i mod ``threads``, one batch each at a time: at most ``threads`` batches in memory),
    then merged (``Accumulator.merge``: the same result as one accumulator's)."""
    if threads <= 1:
        acc = Accumulator()
        for index, batch in enumerate(batches):
            acc.add(batch, order=index)
        return acc
    accs = [Accumulator() for _ in range(threads)]
    running: list = [None] * threads
    with ThreadPoolExecutor(threads, thread_name_prefix="ckpt-trace-summary") as pool:
        for index, batch in enumerate(batches):
            slot = index % threads
            if running[slot] is not None:
                running[slot].result()
            running[slot] = pool.submit(accs[slot].add, batch, index)
        for future in running:
            if future is not None:
                future.result()
    for other in accs[1:]:
        accs[0].merge(other)
    return accs[0]


def gpu_summary(path, acc: Accumulator, batch_rows: int = 1 << 20) -> dict[str, Any]:
    """``copy_summary`` of the copies ``acc`` found in the trace file at ``path``: the copies and the data
    operations of the ranks that copied are read again in batches, with the columns only this needs (the
    host buffers' ``pid``/``address``, for copy-to-write links), so a trace without copies never reads
    them: {"copies": 0} when there were none."""
    if not acc.copies:
        return {"copies": 0}
    ranks = pa.array(sorted({r for table in acc.copies for r in table["rank"].to_pylist()}), pa.int32())
    columns = ["ts_ns", "dur_ns", "rank", "op", "interface", "memory_kind", "size", "pid", "address"]
    _, again = scan(path, columns, batch_rows=batch_rows)
    parts = [
        b.filter(
            pc.and_(
                pc.is_in(b.column("rank"), value_set=ranks),
                pc.or_(names_in(b.column("op"), DATA_OPS), names_in(b.column("interface"), ("cuda",))),
            )
        )
        for b in again
    ]
    return copy_summary(pa.Table.from_batches(parts))
