"""``diff``: what changed between two recordings (operations, bytes, sizes, files, timing).

For "what did the framework upgrade change": both traces are summarised
(``analysis.summary``) and compared figure by figure; files are compared by
path, after removing each trace's longest common directory so two runs into
different scratch directories line up.
"""

from __future__ import annotations

import os
from typing import Any

from ckpt_trace.formats import Trace

from .summary import summarize


def _relative_paths(trace: Trace) -> set[str]:
    named = trace.table["path"].to_pylist() + trace.table["new_path"].to_pylist()  # rename destinations too
    paths = [p for p in named if p and p.startswith("/")]
    if not paths:
        return set()
    root = os.path.commonpath(paths) if len(set(paths)) > 1 else os.path.dirname(paths[0])
    return {os.path.relpath(p, root) for p in paths}


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
    }
