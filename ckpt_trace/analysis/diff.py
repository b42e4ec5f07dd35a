"""``diff``: what changed between two recordings (operations, bytes, sizes, files, timing).

For "what did the framework upgrade change": both traces are summarised
(``analysis.summary``) and compared figure by figure; files are compared by
path, after removing each trace's longest common directory so two runs into
different scratch directories line up.

The data written is compared too, by what ends up where rather than by
calls: per file, the union of the byte ranges its successful writes covered
(requests, system calls and pages written back through mappings alike). Two
recordings of the same save match when every file got the same ranges, so a
replay under another strategy (fewer, larger, aligned writes) of a recorded
save matches the recording; the verdict is one line.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.formats import Trace

from .summary import summarize


def _relative_paths(trace: Trace) -> set[str]:
    """Every path the trace names, relative to the common directory of the files it read or wrote (of all
    its paths when it moved no data); the directories above that one (a replay target's) are left out."""
    table = trace.table
    named = table["path"].to_pylist() + table["new_path"].to_pylist()  # rename destinations too
    paths = {p for p in named if p and p.startswith("/")}
    if not paths:
        return set()
    data = table.filter(pc.is_in(table["op"], pa.array(["read", "write"])))["path"].unique().to_pylist()
    anchors = [p for p in data if p and p.startswith("/")] or sorted(paths)
    root = os.path.commonpath(anchors) if len(set(anchors)) > 1 else os.path.dirname(anchors[0])
    relative = {os.path.relpath(p, root) for p in paths}
    return {p for p in relative if p != "." and not p.startswith("..")}


def written_ranges(trace: Trace) -> dict[str, np.ndarray]:
    """Per written file (path at the time of the write), the union of the byte ranges its successful writes
    covered: an (n, 2) int64 array of sorted, disjoint [start, end) rows. Vectorised over the trace's write
    rows: a sort by file and offset, then a running maximum of range ends within each file."""
    table = trace.table
    keep = pc.and_(pc.and_(pc.equal(table["op"], "write"), pc.greater(table["ret"], 0)),
                   pc.and_(pc.is_valid(table["offset"]), pc.is_valid(table["path"])))
    rows = table.filter(keep).select(["path", "offset", "ret"])
    if rows.num_rows == 0:
        return {}
    paths = pc.dictionary_encode(rows["path"].cast(pa.string())).combine_chunks()
    file_ids = paths.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    starts = rows["offset"].to_numpy()
    ends = starts + rows["ret"].to_numpy()
    order = np.lexsort((starts, file_ids))
    file_ids, starts, ends = file_ids[order], starts[order], ends[order]
    bounds = np.flatnonzero(np.diff(file_ids)) + 1
    out = {}
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(file_ids)]):
        s, e = starts[lo:hi], np.maximum.accumulate(ends[lo:hi])
        new = np.r_[True, s[1:] > e[:-1]]  # a range starts where it begins past every earlier end
        first = np.flatnonzero(new)
        last = np.r_[first[1:] - 1, len(s) - 1]
        out[paths.dictionary[int(file_ids[lo])].as_py()] = np.stack([s[first], e[last]], axis=1)
    return out


def _relative(ranges: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    paths = [p for p in ranges if p.startswith("/")]
    if not paths:
        return {}
    root = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(paths[0])
    return {os.path.relpath(p, root): ranges[p] for p in paths}


def compare_written(a: Trace, b: Trace) -> dict[str, Any]:
    """Whether ``a`` and ``b`` wrote the same byte ranges of the same files (paths relative to each trace's
    common directory of written files): ``match``, counts, the bytes each wrote, and per differing file
    its bytes in each and the first offset where their ranges part."""
    ra, rb = _relative(written_ranges(a)), _relative(written_ranges(b))
    differing = []
    for path in sorted(set(ra) & set(rb)):
        x, y = ra[path], rb[path]
        if x.shape != y.shape or not np.array_equal(x, y):
            n = min(len(x), len(y))
            parted = np.flatnonzero(np.any(x[:n] != y[:n], axis=1))
            at = int(min(x[parted[0]][0], y[parted[0]][0])) if len(parted) else int(x[n - 1][1] if n else 0)
            differing.append({"path": path, "bytes_a": int((x[:, 1] - x[:, 0]).sum()),
                              "bytes_b": int((y[:, 1] - y[:, 0]).sum()), "first_difference": at})
    only_a, only_b = sorted(set(ra) - set(rb)), sorted(set(rb) - set(ra))
    total = {side: int(sum((r[:, 1] - r[:, 0]).sum() for r in ranges.values()))
             for side, ranges in (("a", ra), ("b", rb))}
    return {"match": not (differing or only_a or only_b), "files_a": len(ra), "files_b": len(rb),
            "bytes_a": total["a"], "bytes_b": total["b"], "differing": differing,
            "written_only_in_a": only_a, "written_only_in_b": only_b}


def written_verdict(entry: dict[str, Any]) -> str:
    """The one line ``diff`` says about the data written."""
    if entry["match"]:
        return (f"data written: the same in A and B: {entry['files_a']:,} files, {entry['bytes_a']:,} bytes, "
                "at the same offsets")
    parts = []
    if entry["differing"]:
        first = entry["differing"][0]
        parts.append(f"{len(entry['differing'])} files differ (first {first['path']} from byte "
                     f"{first['first_difference']:,})")
    for side in ("a", "b"):
        only = entry[f"written_only_in_{side}"]
        if only:
            parts.append(f"{len(only)} written only in {side.upper()} ({only[0]}{', ...' if len(only) > 1 else ''})")
    return f"data written: different: {'; '.join(parts)}"


def _change(old: float, new: float) -> dict[str, Any]:
    return {"a": old, "b": new, "change": new - old, "ratio": (new / old) if old else None}


def diff_traces(a: Trace, b: Trace) -> dict[str, Any]:
    """Figures of trace ``a`` and ``b`` side by side: totals, ops by type, request sizes, files."""
    sa, sb = summarize(a), summarize(b)
    totals = {key: _change(sa[key], sb[key]) for key in
              ("rows", "duration_ns", "bytes_written", "bytes_read", "files", "processes", "threads", "data_ops",
               "metadata_ops", "data_time_ns", "metadata_time_ns", "failed_ops", "lost_events")}
    ops = {op: _change(sa["ops"].get(op, {}).get("count", 0), sb["ops"].get(op, {}).get("count", 0))
           for op in sorted(set(sa["ops"]) | set(sb["ops"]))}
    buckets_a = {e["bucket_bytes"]: e["read"] + e["write"] for e in sa["size_histogram"]}
    buckets_b = {e["bucket_bytes"]: e["read"] + e["write"] for e in sb["size_histogram"]}
    sizes = {bucket: _change(buckets_a.get(bucket, 0), buckets_b.get(bucket, 0))
             for bucket in sorted(set(buckets_a) | set(buckets_b))}
    paths_a, paths_b = _relative_paths(a), _relative_paths(b)
    return {
        "a": str(a.path), "b": str(b.path), "totals": totals, "ops": ops, "size_histogram": sizes,
        "unaligned_offset_share": _change(sa["alignment"]["unaligned_offset_share"],
                                          sb["alignment"]["unaligned_offset_share"]),
        "files_only_in_a": sorted(paths_a - paths_b), "files_only_in_b": sorted(paths_b - paths_a),
        "data_written": compare_written(a, b),
    }
