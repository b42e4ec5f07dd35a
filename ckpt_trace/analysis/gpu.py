"""The GPU hop of a trace: host<->device copies beside the file I/O, per rank.

``copy_summary(table)`` takes a trace table (format version 3; older
versions have no copy rows) and returns, per rank (-1: no rank), the
device-to-host and host-to-device copies (count, bytes, seconds summed over
copies, pinned share of bytes), the seconds of file writes and reads, and
how much of the copy time overlapped file I/O of the same rank: the length
of the intersection of the union of copy intervals with the union of data
operation intervals, [ts_ns, ts_ns + dur_ns). Vectorised per rank; rows
are few (one per tensor copied), so the union is computed by sorting.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.formats import vocabulary as v


def union_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the disjoint sorted intervals covering the given [start, end) ones (touching ones
    merge): a sort by start, then a running maximum of ends."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]
    return s[new], np.maximum.reduceat(e, np.flatnonzero(new))


def _overlap_ns(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Total length of the intersection of two unions of disjoint sorted intervals."""
    (a_s, a_e), (b_s, b_e) = a, b
    total, j = 0, 0
    for s, e in zip(a_s.tolist(), a_e.tolist()):
        while j < len(b_s) and b_e[j] <= s:
            j += 1
        k = j
        while k < len(b_s) and b_s[k] < e:
            total += max(0, min(e, int(b_e[k])) - max(s, int(b_s[k])))
            k += 1
    return total


def copy_summary(table: pa.Table) -> dict[str, Any]:
    """{"ranks": {rank: {...}}, "copies": n} for the copy rows of ``table``; {"copies": 0} without any.

    Per rank: ``d2h``/``h2d`` each {"count", "bytes", "time_s", "pinned_share"},
    ``write_time_s``, ``read_time_s`` (summed over data operations),
    ``copy_wall_s`` (the union of copy intervals) and ``copy_io_overlap_s``
    (of that union, the time file I/O of the same rank was also under way).
    """
    if "interface" not in table.column_names or "memory_kind" not in table.column_names:
        return {"copies": 0}
    is_copy = pc.equal(table["interface"].cast(pa.string()), v.CUDA)
    copies = table.filter(pc.fill_null(is_copy, False))
    if copies.num_rows == 0:
        return {"copies": 0}
    data = table.filter(pc.and_(pc.is_in(table["op"].cast(pa.string()), pa.array(sorted(v.DATA_OPS))),
                                pc.invert(pc.fill_null(is_copy, False))))
    out: dict[int, dict[str, Any]] = {}
    c_rank = copies["rank"].to_numpy()
    c_op = np.asarray(copies["op"].cast(pa.string()).to_pylist(), dtype=object)
    c_mem = np.asarray(copies["memory_kind"].cast(pa.string()).fill_null("unknown").to_pylist(), dtype=object)
    c_size = copies["size"].fill_null(0).to_numpy()
    c_ts, c_dur = copies["ts_ns"].to_numpy(), copies["dur_ns"].to_numpy()
    d_rank = data["rank"].to_numpy()
    d_op = np.asarray(data["op"].cast(pa.string()).to_pylist(), dtype=object)
    d_ts, d_dur = data["ts_ns"].to_numpy(), data["dur_ns"].to_numpy()
    for rank in sorted(set(c_rank.tolist())):
        mine = c_rank == rank
        entry: dict[str, Any] = {}
        for name, op in (("d2h", v.COPY_D2H), ("h2d", v.COPY_H2D)):
            sel = mine & (c_op == op)
            nbytes = int(c_size[sel].sum())
            pinned = int(c_size[sel & (c_mem == v.MEMORY_PINNED)].sum())
            entry[name] = {"count": int(sel.sum()), "bytes": nbytes, "time_s": float(c_dur[sel].sum()) / 1e9,
                           "pinned_share": pinned / nbytes if nbytes else 0.0}
        io = d_rank == rank
        entry["write_time_s"] = float(d_dur[io & (d_op == v.WRITE)].sum()) / 1e9
        entry["read_time_s"] = float(d_dur[io & (d_op == v.READ)].sum()) / 1e9
        copy_union = union_intervals(c_ts[mine].astype(np.int64), (c_ts[mine] + c_dur[mine]).astype(np.int64))
        io_union = union_intervals(d_ts[io].astype(np.int64), (d_ts[io] + d_dur[io]).astype(np.int64))
        entry["copy_wall_s"] = float((copy_union[1] - copy_union[0]).sum()) / 1e9
        entry["copy_io_overlap_s"] = _overlap_ns(copy_union, io_union) / 1e9
        out[int(rank)] = entry
    return {"copies": copies.num_rows, "ranks": out}
