"""The GPU hop of a trace: host<->device copies beside the file I/O, per rank.

``copy_summary(table)`` takes a trace table (format version 3; older
versions have no copy rows) and returns, per rank (-1: no rank), the
device-to-host and host-to-device copies (count, bytes, seconds summed over
copies, pinned share of bytes), the seconds of file writes and reads, and
how much of the copy time overlapped file I/O of the same rank: the length
of the intersection of the union of copy intervals with the union of data
operation intervals, [ts_ns, ts_ns + dur_ns). Vectorised per rank; rows
are few (one per tensor copied), so the union is computed by sorting.

``copy_write_links(table)`` says which device-to-host copy fed which write: a write whose host buffer
(``address``, known for io_uring and libaio requests) overlaps the host range a device-to-host copy of
the same process filled (``address`` .. ``address + size``) before the write started is fed by the latest
such copy. Writes through plain syscalls carry no buffer address in the trace and are never linked (the
summary counts the writes whose buffer is known, so an absent link is not mistaken for none).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.formats import vocabulary as v
from ckpt_trace.ranges import union_ranges


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


def copy_write_links(table: pa.Table, block_rows: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(write row indices, copy row indices) of ``table``: each write fed by a device-to-host copy, with
    the copy that fed it (see the module docstring). Needs the columns pid, ts_ns, dur_ns, op, address,
    size, interface; compares writes with copies in blocks of ``block_rows`` writes (memory
    ``block_rows`` x copies)."""
    none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    if "address" not in table.column_names or table.num_rows == 0:
        return none
    op = table["op"].cast(pa.string())
    address = table["address"]
    has_address = pc.fill_null(pc.is_valid(address), False)
    is_copy = pc.and_(pc.equal(op, v.COPY_D2H), has_address)
    is_write = pc.and_(
        pc.and_(pc.equal(op, v.WRITE), has_address),
        pc.invert(pc.fill_null(pc.equal(table["interface"].cast(pa.string()), v.CUDA), False)),
    )
    c_rows = np.flatnonzero(is_copy.to_numpy(zero_copy_only=False))
    w_rows = np.flatnonzero(is_write.to_numpy(zero_copy_only=False))
    if len(c_rows) == 0 or len(w_rows) == 0:
        return none
    pid = table["pid"].to_numpy()
    ts = table["ts_ns"].to_numpy()
    end = ts + table["dur_ns"].to_numpy()
    addr = address.fill_null(0).to_numpy()
    size = table["size"].fill_null(0).to_numpy()
    c_lo, c_hi, c_end, c_pid = addr[c_rows], addr[c_rows] + size[c_rows], end[c_rows], pid[c_rows]
    fed_w, fed_c = [], []
    for start in range(0, len(w_rows), block_rows):
        w = w_rows[start : start + block_rows]
        lo, hi = addr[w][:, None], (addr[w] + size[w])[:, None]
        ok = (
            (c_pid[None, :] == pid[w][:, None])
            & (c_lo[None, :] < hi)
            & (c_hi[None, :] > lo)
            & (c_end[None, :] <= ts[w][:, None])
        )
        any_ok = ok.any(axis=1)
        latest = np.where(ok, c_end[None, :], np.iinfo(np.int64).min).argmax(axis=1)
        fed_w.append(w[any_ok])
        fed_c.append(c_rows[latest[any_ok]])
    return np.concatenate(fed_w), np.concatenate(fed_c)


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
    data = table.filter(
        pc.and_(
            pc.is_in(table["op"].cast(pa.string()), pa.array(sorted(v.DATA_OPS))),
            pc.invert(pc.fill_null(is_copy, False)),
        )
    )
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
            entry[name] = {
                "count": int(sel.sum()),
                "bytes": nbytes,
                "time_s": float(c_dur[sel].sum()) / 1e9,
                "pinned_share": pinned / nbytes if nbytes else 0.0,
            }
        io = d_rank == rank
        entry["write_time_s"] = float(d_dur[io & (d_op == v.WRITE)].sum()) / 1e9
        entry["read_time_s"] = float(d_dur[io & (d_op == v.READ)].sum()) / 1e9
        copy_union = union_ranges(c_ts[mine].astype(np.int64), (c_ts[mine] + c_dur[mine]).astype(np.int64))
        io_union = union_ranges(d_ts[io].astype(np.int64), (d_ts[io] + d_dur[io]).astype(np.int64))
        entry["copy_wall_s"] = float((copy_union[1] - copy_union[0]).sum()) / 1e9
        entry["copy_io_overlap_s"] = _overlap_ns(copy_union, io_union) / 1e9
        out[int(rank)] = entry
    _add_links(table, out)
    return {"copies": copies.num_rows, "ranks": out}


def _add_links(table: pa.Table, out: dict[int, dict[str, Any]]) -> None:
    """Per rank of ``out``: ``writes_with_buffer`` (writes whose host buffer the trace knows),
    ``fed_writes`` and ``fed_write_bytes`` (those fed by a device-to-host copy, ``copy_write_links``)."""
    needed = {"pid", "address", "size", "op", "ts_ns", "dur_ns", "interface", "rank"}
    if not needed <= set(table.column_names):
        return
    fed, _ = copy_write_links(table)
    rank = table["rank"].to_numpy()
    size = table["size"].fill_null(0).to_numpy()
    known = pc.and_(
        pc.equal(table["op"].cast(pa.string()), v.WRITE), pc.fill_null(pc.is_valid(table["address"]), False)
    ).to_numpy(zero_copy_only=False)
    for r, entry in out.items():
        entry["writes_with_buffer"] = int((known & (rank == r)).sum())
        mine = fed[rank[fed] == r]
        entry["fed_writes"] = len(mine)
        entry["fed_write_bytes"] = int(size[mine].sum())
