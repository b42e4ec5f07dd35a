"""``diff``: what changed between two recordings (operations, bytes, sizes, files, timing).

For "what did the framework upgrade change": both traces are summarised
(``analysis.summary``, one pass over each file in record batches) and compared figure by figure; files are compared by
path, after removing each trace's longest common directory so two runs into
different scratch directories line up.

The data written and the data read are compared too, by what ends up where rather than by
calls: per file, the union of the byte ranges its successful writes covered
(requests, system calls and pages written back through mappings alike). Two
recordings of the same save match when every file got the same ranges, so a
replay under another strategy (fewer, larger, aligned writes) of a recorded
save matches the recording; the verdict is one line.

A replay of a load trace writes the files the load found (pre-created before its clock) and then reads them,
so a recording of that replay writes files the load only read. A file written only in one trace (B, say)
that the other (A) read without writing, and that B wrote before it first read it, is counted as a
pre-created input (``precreated_in_b``), not as a difference: the closed loop record(replay(load)) compares
equal on the data written, and the reads are compared as for any trace. A file B wrote after reading it, or
that A never read, still differs.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.formats import distinct, scan
from ckpt_trace.ranges import merge_grouped_ranges

from .summary import SUMMARY_COLUMNS, Accumulator, Progress, gpu_summary, names_in, on_batch, summary_document

COMPACT_ROWS = 1 << 22  # write ranges held before they are merged into unions (64 MiB of int64 triples)


class _Written:
    """Per written file (path at the time of the write), the union of the byte ranges its successful writes
    covered, gathered batch by batch: each batch's ranges are merged (``ranges.merge_grouped_ranges``) and
    held as (file, start, end) until COMPACT_ROWS of them, then merged with the unions so far, so memory
    grows with the disjoint ranges, not the writes."""

    def __init__(self, op: str = "write") -> None:
        self.op = op  # "write": the ranges written; "read": those read (bytes returned)
        self.ids: dict[str, int] = {}
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.pending_rows = 0
        self.unions: dict[int, np.ndarray] = {}
        self.first_ns = np.zeros(0, np.int64)  # per file code: the start of its first such operation

    def add(self, batch: pa.RecordBatch) -> None:
        get = batch.column
        keep = pc.and_(
            pc.and_(names_in(get("op"), (self.op,)), pc.greater(get("ret"), 0)),
            pc.and_(pc.is_valid(get("offset")), pc.is_valid(get("path"))),
        )
        rows = batch.select(["path", "offset", "ret", "ts_ns"]).filter(keep)  # only the columns used are filtered
        if rows.num_rows == 0:
            return
        paths = rows.column("path")
        if not pa.types.is_dictionary(paths.type):
            paths = pc.dictionary_encode(paths)
        lut = np.array([self.ids.setdefault(v, len(self.ids)) for v in paths.dictionary.to_pylist()], np.int64)
        files = lut[paths.indices.to_numpy().astype(np.int64)]
        starts = rows.column("offset").to_numpy().astype(np.int64)
        if len(self.first_ns) < len(self.ids):
            self.first_ns = np.r_[self.first_ns, np.full(len(self.ids) - len(self.first_ns), np.iinfo(np.int64).max)]
        np.minimum.at(self.first_ns, files, np.asarray(pc.fill_null(rows.column("ts_ns"), 0).to_numpy(), np.int64))
        # The batch's own unions first (a batch's sort stays in cache): a checkpoint's writes, sequential
        # per file, leave a few ranges per file and batch.
        merged = merge_grouped_ranges(files, starts, starts + rows.column("ret").to_numpy())
        self.pending.append(merged)
        self.pending_rows += len(merged[0])
        if self.pending_rows >= COMPACT_ROWS:
            self._compact()

    def _compact(self) -> None:
        if not self.pending:
            return
        held = [
            (np.full(len(ranges), file, np.int64), ranges[:, 0], ranges[:, 1]) for file, ranges in self.unions.items()
        ]
        parts = held + self.pending
        self.pending, self.pending_rows = [], 0
        files, starts, ends = merge_grouped_ranges(*(np.concatenate([p[i] for p in parts]) for i in range(3)))
        del parts, held
        bounds = np.flatnonzero(files[1:] != files[:-1]) + 1
        self.unions = {
            int(files[lo]): np.stack([starts[lo:hi], ends[lo:hi]], axis=1)
            for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(files)])
        }

    def result(self) -> dict[str, np.ndarray]:
        self._compact()
        names = {code: name for name, code in self.ids.items()}
        return {names[file]: ranges for file, ranges in self.unions.items()}

    def first(self) -> dict[str, int]:
        """Per file, the start (ns) of its first such operation."""
        never = np.iinfo(np.int64).max  # a path of the batches' dictionaries with no such operation
        return {
            name: int(self.first_ns[code])
            for name, code in self.ids.items()
            if code < len(self.first_ns) and self.first_ns[code] != never
        }


class _Paths:
    """Every path a trace names (rename destinations too), and those of its data operations."""

    def __init__(self) -> None:
        self.named: set[str] = set()
        self.data: set[str] = set()

    def add(self, batch: pa.RecordBatch) -> None:
        for column in ("path", "new_path"):
            self.named.update(distinct(batch.column(column)))
        data = batch.filter(names_in(batch.column("op"), ("read", "write")))
        self.data.update(distinct(data.column("path")))

    def relative(self) -> set[str]:
        """The paths relative to the common directory of the files read or written (of all paths when no data
        moved); the directories above that one (a replay target's) are left out."""
        paths = {p for p in self.named if p and p.startswith("/")}
        if not paths:
            return set()
        anchors = sorted(p for p in self.data if p and p.startswith("/")) or sorted(paths)
        root = os.path.commonpath(anchors) if len(set(anchors)) > 1 else os.path.dirname(anchors[0])
        relative = {os.path.relpath(p, root) for p in paths}
        return {p for p in relative if p != "." and not p.startswith("..")}


def _read(
    path, batch_rows: int, progress: Progress | None = None, label: str = ""
) -> tuple[dict[str, Any], set[str], _Written, _Written]:
    """One pass over the trace file in record batches: (its summary, its relative paths, its writes, its
    reads)."""
    meta, batches = scan(
        path, (*SUMMARY_COLUMNS, "new_path"), batch_rows=batch_rows, on_batch=on_batch(progress, label)
    )
    acc, paths, written, read = Accumulator(), _Paths(), _Written(), _Written("read")
    for batch in batches:
        acc.add(batch)
        paths.add(batch)
        written.add(batch)
        read.add(batch)
    summary = summary_document(path, meta, acc.result(), gpu_summary(path, acc, batch_rows))
    return summary, paths.relative(), written, read


def _relative(ranges: dict[str, Any]) -> dict[str, Any]:
    """``ranges`` keyed by path relative to the common directory of its absolute paths (others left out)."""
    paths = [p for p in ranges if p.startswith("/")]
    if not paths:
        return {}
    root = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(paths[0])
    return {os.path.relpath(p, root): ranges[p] for p in paths}


def leave_out_inputs(entry: dict[str, Any], writes: dict[str, _Written], reads: dict[str, _Written]) -> dict[str, Any]:
    """``entry`` (``compare_written`` of the data written) with the files written only in one trace that the
    other read without writing, and that this one wrote before it first read them, moved from
    ``written_only_in_X`` to ``precreated_in_X`` (a replay's pre-created inputs: the module docstring), their
    bytes out of ``bytes_X`` and ``files_X``, and ``match`` recomputed. ``writes`` and ``reads``: per side
    (``a``, ``b``), the trace's writes and reads."""
    entry = dict(entry)
    for side, other in (("a", "b"), ("b", "a")):
        written, first_write = _relative(writes[side].result()), _relative(writes[side].first())
        first_read, read_other = _relative(reads[side].first()), _relative(reads[other].result())
        inputs = [
            path
            for path in entry[f"written_only_in_{side}"]
            if path in read_other and path in first_read and first_write.get(path, first_read[path]) < first_read[path]
        ]
        entry[f"precreated_in_{side}"] = inputs
        entry[f"written_only_in_{side}"] = [p for p in entry[f"written_only_in_{side}"] if p not in inputs]
        entry[f"files_{side}"] -= len(inputs)
        entry[f"bytes_{side}"] -= int(sum((written[p][:, 1] - written[p][:, 0]).sum() for p in inputs))
    entry["match"] = not (entry["differing"] or entry["written_only_in_a"] or entry["written_only_in_b"])
    return entry


def compare_written(written_a: dict[str, np.ndarray], written_b: dict[str, np.ndarray]) -> dict[str, Any]:
    """Whether two traces' written ranges (per file, sorted disjoint [start, end) rows) cover the same byte
    ranges of the same files (paths relative to each trace's common directory of written files): ``match``,
    counts, the bytes each wrote, and per differing file its bytes in each and the first offset where their
    ranges part."""
    ra, rb = _relative(written_a), _relative(written_b)
    differing = []
    for path in sorted(set(ra) & set(rb)):
        x, y = ra[path], rb[path]
        if x.shape != y.shape or not np.array_equal(x, y):
            at = first_difference(x, y)
            differing.append(
                {
                    "path": path,
                    "bytes_a": int((x[:, 1] - x[:, 0]).sum()),
                    "bytes_b": int((y[:, 1] - y[:, 0]).sum()),
                    "first_difference": at,
                }
            )
    only_a, only_b = sorted(set(ra) - set(rb)), sorted(set(rb) - set(ra))
    total = {
        side: int(sum((r[:, 1] - r[:, 0]).sum() for r in ranges.values())) for side, ranges in (("a", ra), ("b", rb))
    }
    return {
        "match": not (differing or only_a or only_b),
        "files_a": len(ra),
        "files_b": len(rb),
        "bytes_a": total["a"],
        "bytes_b": total["b"],
        "differing": differing,
        "written_only_in_a": only_a,
        "written_only_in_b": only_b,
    }


def first_difference(x: np.ndarray, y: np.ndarray) -> int:
    """The first byte offset covered by one of two sets of sorted, disjoint [start, end) ranges (rows) and not
    by the other: where their coverage parts (not where the first differing range starts: [0, 100) and
    [0, 50) part at byte 50). Raises ValueError when they cover the same bytes."""
    points = np.unique(np.concatenate([x.ravel(), y.ravel()]))

    def covered(ranges: np.ndarray) -> np.ndarray:
        if not len(ranges):
            return np.zeros(len(points), bool)
        index = np.searchsorted(ranges[:, 0], points, side="right") - 1
        return (index >= 0) & (points < ranges[np.maximum(index, 0), 1])

    parted = np.flatnonzero(covered(x) != covered(y))
    if not len(parted):
        raise ValueError("the ranges cover the same bytes")
    return int(points[parted[0]])


def written_verdict(entry: dict[str, Any], what: str = "written") -> str:
    """The one line ``diff`` says about the data written (``what="read"``: read)."""
    inputs = [
        f"{len(entry[key]):,} files {side.upper()} wrote before reading and {other} only read: a replay's inputs, "
        "left out"
        for side, other, key in (("a", "B", "precreated_in_a"), ("b", "A", "precreated_in_b"))
        if entry.get(key)
    ]
    if entry["match"]:
        return (
            f"data {what}: the same in A and B: {entry['files_a']:,} files, {entry['bytes_a']:,} bytes, "
            "at the same offsets" + "".join(f" ({note})" for note in inputs)
        )
    parts = []
    if entry["differing"]:
        first = entry["differing"][0]
        parts.append(
            f"{len(entry['differing'])} files differ (first {first['path']} from byte {first['first_difference']:,})"
        )
    for side in ("a", "b"):
        only = entry[f"written_only_in_{side}"]
        if only:
            parts.append(f"{len(only)} {what} only in {side.upper()} ({only[0]}{', ...' if len(only) > 1 else ''})")
    return f"data {what}: different: {'; '.join(parts + inputs)}"


def _change(old: float, new: float) -> dict[str, Any]:
    return {"a": old, "b": new, "change": new - old, "ratio": (new / old) if old else None}


def diff_files(
    path_a: str | os.PathLike, path_b: str | os.PathLike, *, batch_rows: int = 1 << 20, progress: Progress | None = None
) -> dict[str, Any]:
    """Figures of the traces at ``path_a`` and ``path_b`` side by side: totals, ops by type, request sizes,
    files, and the data written. Each file is read once, in record batches of ``batch_rows`` rows: memory
    grows with the distinct paths and the disjoint written ranges, not the rows. Raises TraceFormatError."""
    sa, paths_a, writes_a, reads_a = _read(path_a, batch_rows, progress, "reading A")
    sb, paths_b, writes_b, reads_b = _read(path_b, batch_rows, progress, "reading B")
    writes, reads = {"a": writes_a, "b": writes_b}, {"a": reads_a, "b": reads_b}
    totals = {
        key: _change(sa[key], sb[key])
        for key in (
            "rows",
            "duration_ns",
            "bytes_written",
            "bytes_read",
            "files",
            "processes",
            "threads",
            "data_ops",
            "metadata_ops",
            "data_time_ns",
            "metadata_time_ns",
            "failed_ops",
            "lost_events",
        )
    }
    ops = {
        op: _change(sa["ops"].get(op, {}).get("count", 0), sb["ops"].get(op, {}).get("count", 0))
        for op in sorted(set(sa["ops"]) | set(sb["ops"]))
    }
    buckets_a = {e["bucket_bytes"]: e["read"] + e["write"] for e in sa["size_histogram"]}
    buckets_b = {e["bucket_bytes"]: e["read"] + e["write"] for e in sb["size_histogram"]}
    sizes = {
        bucket: _change(buckets_a.get(bucket, 0), buckets_b.get(bucket, 0))
        for bucket in sorted(set(buckets_a) | set(buckets_b))
    }
    return {
        "a": str(path_a),
        "b": str(path_b),
        "totals": totals,
        "ops": ops,
        "size_histogram": sizes,
        "unaligned_offset_share": _change(
            sa["alignment"]["unaligned_offset_share"], sb["alignment"]["unaligned_offset_share"]
        ),
        "files_only_in_a": sorted(paths_a - paths_b),
        "files_only_in_b": sorted(paths_b - paths_a),
        "data_written": leave_out_inputs(compare_written(writes_a.result(), writes_b.result()), writes, reads),
        "data_read": compare_written(reads_a.result(), reads_b.result()),
        "layout": _layout_diff(path_a, path_b),
    }


def _layout_diff(path_a, path_b) -> dict[str, Any] | None:
    """``analysis.layout.diff_layouts``: which checkpoint objects moved differently (None without layouts)."""
    from .layout import diff_layouts  # it builds on analysis.summary, as this module does

    return diff_layouts(path_a, path_b)
