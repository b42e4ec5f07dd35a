"""``summary``: what a trace holds, as one JSON-able dict.

Sizes are bytes; times nanoseconds unless the key says otherwise. The
request-size histogram buckets data operations by the power of two at or
below their size (bucket ``b`` holds sizes in [b, 2b); size 0 in bucket 0).
Alignment is judged against 4 KiB, the common page and logical block size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.formats import Trace
from ckpt_trace.stats import percentiles_ns

from .gpu import copy_summary

ALIGNMENT_BYTES = 4096
DATA_OPS = ("read", "write")
METADATA_OPS = ("open", "close", "lseek", "fsync", "fdatasync", "sync_file_range", "ftruncate", "fallocate",
                "rename", "unlink", "mkdir", "dup", "fcntl")


def _sum(array) -> int:
    value = pc.sum(array).as_py()
    return int(value or 0)


def _ops_table(table: pa.Table) -> dict[str, dict[str, int]]:
    moved = pc.max_element_wise(table["ret"], 0)
    counted = table.append_column("moved", moved)
    grouped = counted.group_by("op").aggregate([("op", "count"), ("moved", "sum"), ("dur_ns", "sum")])
    out = {}
    for row in grouped.to_pylist():
        is_data = row["op"] in DATA_OPS
        out[row["op"]] = {"count": row["op_count"], "bytes": row["moved_sum"] if is_data else 0,
                          "time_ns": row["dur_ns_sum"]}
    return dict(sorted(out.items(), key=lambda item: -item[1]["count"]))


_POWERS = 1 << np.arange(63, dtype=np.int64)  # bucket b (index k) holds sizes in [2**k, 2**(k+1))


def _histogram(data: pa.Table) -> list[dict[str, int]]:
    """Data operations per power-of-two size bucket: vectorised (one exact searchsorted over the 63 powers)."""
    sizes = data["size"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    is_write = pc.fill_null(pc.equal(data["op"].cast(pa.string()), "write"), False).to_numpy(zero_copy_only=False)
    index = np.where(sizes > 0, np.searchsorted(_POWERS, sizes, side="right"), 0)  # 0: size 0; k+1: bucket 2**k
    writes = np.bincount(index[is_write], minlength=64)
    reads = np.bincount(index[~is_write], minlength=64)
    moved = np.zeros(64, np.int64)  # exact int64 sums (float weights would round above 2**53)
    summed = pa.table({"k": index, "s": sizes}).group_by("k").aggregate([("s", "sum")])
    moved[summed["k"].to_numpy()] = summed["s_sum"].to_numpy()
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
        "ops_with_known_offset": with_offset.num_rows,
        "ops_with_unknown_offset": total - with_offset.num_rows,
        "unaligned_offset_share": unaligned_offsets / with_offset.num_rows if with_offset.num_rows else 0.0,
        "unaligned_size_share": unaligned_sizes / total if total else 0.0,
    }


def _interfaces(data: pa.Table) -> dict[str, dict[str, Any]]:
    """Per I/O interface (syscall, io_uring, libaio, mmap): data operations, bytes, latency percentiles
    (submission to completion for requests) and, for queued requests, the distribution of requests in flight
    at submission (power-of-two buckets)."""
    out = {}
    interfaces = pc.unique(data["interface"].cast(pa.string())).to_pylist()
    for interface in sorted(i for i in interfaces if i):
        rows = data.filter(pc.equal(data["interface"], interface))
        moved = pc.max_element_wise(rows["ret"], 0)
        is_write = pc.equal(rows["op"], "write")
        entry = {"ops": rows.num_rows, "bytes_written": _sum(pc.if_else(is_write, moved, 0)),
                 "bytes_read": _sum(pc.if_else(is_write, 0, moved)),
                 "latency_ns": percentiles_ns(rows["dur_ns"].to_numpy())}
        depths = rows["in_flight"].drop_null().to_numpy()
        if len(depths):
            buckets = np.left_shift(1, np.floor(np.log2(np.maximum(depths, 1))).astype(np.int64))
            values, counts = np.unique(buckets, return_counts=True)
            entry["in_flight"] = {"p50": int(np.median(depths)), "max": int(depths.max()),
                                  "histogram": {str(int(b)): int(c) for b, c in zip(values, counts)}}
        out[interface] = entry
    return out


def summarize(trace: Trace) -> dict[str, Any]:
    """Summary of ``trace``: operations by type, bytes, files, processes and ranks, sizes, alignment, time split."""
    table = trace.table
    data = table.filter(pc.is_in(table["op"], pa.array(DATA_OPS)))
    meta = table.filter(pc.is_in(table["op"], pa.array(METADATA_OPS)))
    writes = data.filter(pc.equal(data["op"], "write"))
    reads = data.filter(pc.equal(data["op"], "read"))
    ranks = sorted(r for r in pc.unique(table["rank"]).to_pylist() if r is not None and r >= 0)
    end_ns = _sum(pc.max(pc.add(table["ts_ns"], table["dur_ns"]))) if table.num_rows else 0
    md = trace.metadata
    return {
        "trace": str(trace.path),
        "backend": md.get("backend"),
        "command": md.get("command"),
        "rows": table.num_rows,
        "duration_ns": end_ns,
        "bytes_written": _sum(pc.max_element_wise(writes["ret"], 0)),
        "bytes_read": _sum(pc.max_element_wise(reads["ret"], 0)),
        "files": len(pc.unique(pc.drop_null(table["path"]))),
        "processes": len(pc.unique(table["pid"])),
        "threads": len(pc.unique(table["tid"])),
        "ranks": ranks,
        "ops": _ops_table(table),
        "data_ops": data.num_rows,
        "metadata_ops": meta.num_rows,
        "data_time_ns": _sum(data["dur_ns"]),
        "metadata_time_ns": _sum(meta["dur_ns"]),
        "size_histogram": _histogram(data),
        "alignment": _alignment(data),
        "failed_ops": _sum(pc.cast(pc.less(table["ret"], 0), pa.int64())),
        "lost_events": int(md.get("lost_events", 0)),
        "filesystems": md.get("filesystems", {}),
        "interfaces": _interfaces(data),
        "unseen": md.get("unseen", {}),
        "gpu": copy_summary(table),
    }
