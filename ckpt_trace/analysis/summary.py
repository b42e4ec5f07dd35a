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
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.formats import Trace, scan
from ckpt_trace.stats import LatencyHistogram

from .gpu import copy_summary

ALIGNMENT_BYTES = 4096
DATA_OPS = ("read", "write")
METADATA_OPS = ("open", "close", "lseek", "fsync", "fdatasync", "sync_file_range", "ftruncate", "fallocate",
                "rename", "unlink", "mkdir", "dup", "fcntl")


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
            parts.append(lut[chunk.indices.fill_null(len(lut) - 1).to_numpy(zero_copy_only=False)])
        else:
            parts.append(pc.fill_null(pc.is_in(chunk, pa.array(names, pa.string())), False)
                         .to_numpy(zero_copy_only=False))
    return pa.array(np.concatenate(parts) if parts else np.zeros(0, bool))


def distinct(column) -> list:
    """The distinct non-null values of a (dictionary or plain) column, decoding only the dictionary."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: set = set()
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            out.update(chunk.dictionary.take(pc.unique(chunk.indices.drop_null())).to_pylist())
        else:
            out.update(pc.unique(chunk.drop_null()).to_pylist())
    return list(out)


def _group_sums(codes: np.ndarray, values: np.ndarray, groups: int) -> np.ndarray:
    """Exact sums of non-negative ``values`` per code in [0, groups) (np.add.at: no float rounding above
    2**53): int64 where no sum can pass 2**63, Python integers otherwise."""
    if len(values) and int(values.max()) * len(values) >= 1 << 63:
        sums = np.zeros(groups, dtype=object)
        np.add.at(sums, codes, values.astype(object))
        return sums
    sums = np.zeros(groups, np.int64)
    np.add.at(sums, codes, values)
    return sums


def _ops_table(table: pa.Table) -> dict[str, dict[str, int]]:
    """Per op: count, bytes moved (data ops) and time, from the op column's dictionary codes."""
    op = table["op"].combine_chunks()
    if not pa.types.is_dictionary(op.type):
        op = pc.dictionary_encode(op)
    names = op.dictionary.to_pylist()
    codes = op.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    counts = np.bincount(codes, minlength=len(names))
    moved_sums = _group_sums(codes, np.maximum(table["ret"].to_numpy(), 0), len(names))
    time_sums = _group_sums(codes, table["dur_ns"].to_numpy(), len(names))
    out: dict[str, dict[str, int]] = {}
    for code, name in enumerate(names):
        if counts[code]:
            mine = out.setdefault(name, {"count": 0, "bytes": 0, "time_ns": 0})  # a name may repeat
            mine["count"] += int(counts[code])
            mine["bytes"] += int(moved_sums[code]) if name in DATA_OPS else 0
            mine["time_ns"] += int(time_sums[code])
    return dict(sorted(out.items(), key=lambda item: -item[1]["count"]))


_POWERS = 1 << np.arange(63, dtype=np.int64)  # bucket b (index k) holds sizes in [2**k, 2**(k+1))


def _histogram(data: pa.Table) -> list[dict[str, int]]:
    """Data operations per power-of-two size bucket: vectorised (one exact searchsorted over the 63 powers)."""
    sizes = data["size"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    is_write = names_in(data["op"], ("write",)).to_numpy(zero_copy_only=False)
    # 0: size 0; k+1: bucket 2**k. frexp's exponent e has 2**(e-1) <= size < 2**e; the float rounding of sizes
    # above 2**53 can move it by one, which the exact integer comparison below puts back.
    positive = sizes > 0
    index = np.where(positive, np.frexp(sizes.astype(np.float64))[1], 0).astype(np.int64)
    low = np.left_shift(np.int64(1), np.clip(index - 1, 0, 62))
    index -= positive & (low > sizes)
    index = np.minimum(index, 63)
    writes = np.bincount(index[is_write], minlength=64)
    reads = np.bincount(index[~is_write], minlength=64)
    moved = _group_sums(index, sizes, 64)
    return [{"bucket_bytes": 0 if k == 0 else int(_POWERS[k - 1]), "read": int(reads[k]), "write": int(writes[k]),
             "bytes": int(moved[k])} for k in np.flatnonzero(writes + reads).tolist()]


def _alignment(data: pa.Table) -> dict[str, Any]:
    with_offset = data.filter(pc.is_valid(data["offset"]))
    unaligned_offsets = _sum(pc.cast(pc.not_equal(pc.bit_wise_and(with_offset["offset"], ALIGNMENT_BYTES - 1), 0), pa.int64()))
    sizes = data["size"].fill_null(0)
    unaligned_sizes = _sum(pc.cast(pc.not_equal(pc.bit_wise_and(sizes, ALIGNMENT_BYTES - 1), 0), pa.int64()))
    total = data.num_rows
    return {
        "alignment_bytes": ALIGNMENT_BYTES,
        "unaligned_offsets": unaligned_offsets,
        "unaligned_sizes": unaligned_sizes,
        "ops_with_known_offset": with_offset.num_rows,
        "ops_with_unknown_offset": total - with_offset.num_rows,
        "unaligned_offset_share": unaligned_offsets / with_offset.num_rows if with_offset.num_rows else 0.0,
        "unaligned_size_share": unaligned_sizes / total if total else 0.0,
    }


SUMMARY_COLUMNS = ("ts_ns", "dur_ns", "pid", "tid", "rank", "op", "path", "offset", "size", "ret", "interface",
                   "in_flight", "memory_kind")


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
        self.writer_threads: set[tuple[int, int]] = set()  # (rank, or -(pid+1) without one; tid) that wrote

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        if table.num_rows == 0:
            return
        self.rows += table.num_rows
        self.end_ns = max(self.end_ns, _sum(pc.max(pc.add(table["ts_ns"], table["dur_ns"]))))
        for op, entry in _ops_table(table).items():
            mine = self.ops.setdefault(op, {"count": 0, "bytes": 0, "time_ns": 0})
            for key in mine:
                mine[key] += entry[key]
        self.files.update(distinct(table["path"]))
        self.pids.update(pc.unique(table["pid"]).to_pylist())
        self.tids.update(pc.unique(table["tid"]).to_pylist())
        self.ranks.update(pc.unique(table["rank"]).to_pylist())
        self.failed += _sum(pc.cast(pc.less(table["ret"], 0), pa.int64()))
        meta = table.filter(names_in(table["op"], METADATA_OPS))
        self.meta_ops += meta.num_rows
        self.meta_time_ns += _sum(meta["dur_ns"])
        data = table.filter(names_in(table["op"], DATA_OPS))
        if data.num_rows:
            self._add_data(data)
        if "memory_kind" in table.column_names:
            copies = table.filter(names_in(table["interface"], ("cuda",)))
            if copies.num_rows:
                self.copies.append(copies)

    def _add_data(self, data: pa.Table) -> None:
        moved = pc.max_element_wise(data["ret"], 0)
        is_write = names_in(data["op"], ("write",))
        self.data_ops += data.num_rows
        self.data_time_ns += _sum(data["dur_ns"])
        self.written += _sum(pc.if_else(is_write, moved, 0))
        writes = data.filter(is_write)
        if writes.num_rows:
            rank, pid, tid = (writes[c].to_numpy().astype(np.int64) for c in ("rank", "pid", "tid"))
            owner = np.where(rank >= 0, rank, -pid - 1) + (1 << 30)  # > 0: ranks and pids are below 2**30
            keys = pc.unique(pa.array(np.left_shift(owner, 32) | tid)).to_numpy()  # hashed: few distinct
            self.writer_threads.update(zip((np.right_shift(keys, 32) - (1 << 30)).tolist(),
                                           (keys & 0xFFFFFFFF).tolist()))
        self.read += _sum(pc.if_else(is_write, 0, moved))
        for entry in _histogram(data):
            mine = self.histogram.setdefault(entry["bucket_bytes"], {"bucket_bytes": entry["bucket_bytes"], "read": 0,
                                                                     "write": 0, "bytes": 0})
            for key in ("read", "write", "bytes"):
                mine[key] += entry[key]
        alignment = _alignment(data)
        self.known_offsets += alignment["ops_with_known_offset"]
        self.unaligned_offsets += alignment["unaligned_offsets"]
        self.unaligned_sizes += alignment["unaligned_sizes"]
        present = sorted(i for i in distinct(data["interface"]) if i)
        for interface in present:
            rows = data if len(present) == 1 else data.filter(names_in(data["interface"], (interface,)))
            r_moved = pc.max_element_wise(rows["ret"], 0)
            r_write = names_in(rows["op"], ("write",))
            mine = self.interfaces.setdefault(interface, {"ops": 0, "bytes_written": 0, "bytes_read": 0,
                                                          "latency": LatencyHistogram(),
                                                          "depths": np.zeros(0, np.int64)})
            mine["ops"] += rows.num_rows
            mine["bytes_written"] += _sum(pc.if_else(r_write, r_moved, 0))
            mine["bytes_read"] += _sum(pc.if_else(r_write, 0, r_moved))
            mine["latency"].add(rows["dur_ns"].to_numpy())
            depths = rows["in_flight"].drop_null().to_numpy()
            if len(depths):  # requests in flight at submission: exact counts per depth (bounded by the deepest)
                counts = np.bincount(depths.astype(np.int64))
                held = mine["depths"]
                size = max(len(held), len(counts))
                mine["depths"] = np.pad(held, (0, size - len(held))) + np.pad(counts, (0, size - len(counts)))

    def result(self) -> dict[str, Any]:
        interfaces = {}
        for name in sorted(self.interfaces):
            mine = self.interfaces[name]
            entry = {"ops": mine["ops"], "bytes_written": mine["bytes_written"], "bytes_read": mine["bytes_read"],
                     "latency_ns": mine["latency"].percentiles_ns()}
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
            "ops": dict(sorted(self.ops.items(), key=lambda item: -item[1]["count"])),
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
    return {"trace": str(path), "backend": md.get("backend"), "command": md.get("command"), **figures,
            "lost_events": int(md.get("lost_events", 0)), "filesystems": md.get("filesystems", {}),
            "unseen": md.get("unseen", {}), "gpu": gpu}


def summarize(trace: Trace) -> dict[str, Any]:
    """Summary of ``trace``: operations by type, bytes, files, processes and ranks, sizes, alignment, time split,
    per I/O interface, and the GPU copies per rank (``analysis.gpu``). Works batch by batch
    (``summarize_file`` reads a trace file that way without loading it)."""
    acc = Accumulator()
    for batch in trace.table.to_batches():
        acc.add(batch)
    gpu = copy_summary(trace.table) if acc.copies else {"copies": 0}
    return summary_document(trace.path, trace.metadata, acc.result(), gpu)


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
    meta, batches = scan(path, SUMMARY_COLUMNS, batch_rows=batch_rows, on_batch=on_batch(progress, "reading"))
    acc = Accumulator()
    for batch in batches:
        acc.add(batch)
    return summary_document(path, meta, acc.result(), gpu_summary(path, acc, batch_rows))


def gpu_summary(path, acc: Accumulator, batch_rows: int = 1 << 20) -> dict[str, Any]:
    """``copy_summary`` of the copies ``acc`` collected from the trace file at ``path``, with the data
    operations of the ranks that copied (read again in batches): {"copies": 0} when there were none."""
    if not acc.copies:
        return {"copies": 0}
    copies = pa.concat_tables(acc.copies)
    ranks = pa.array(sorted(set(copies["rank"].to_pylist())), pa.int32())
    columns = ["ts_ns", "dur_ns", "rank", "op", "interface", "memory_kind", "size"]
    _, again = scan(path, columns, batch_rows=batch_rows)
    parts = [b.filter(pc.and_(pc.is_in(b.column("rank"), value_set=ranks),
                              names_in(b.column("op"), DATA_OPS)))
             for b in again]
    io = pa.Table.from_batches(parts) if parts else None
    both = pa.concat_tables([copies.select(columns)] + ([io.select(columns)] if io is not None else []),
                            promote_options="permissive")
    return copy_summary(both)
