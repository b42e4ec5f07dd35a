"""The trace's rows joined to the checkpoint's layout: which objects (tensors, state-dict entries) the bytes were.

Each read or write row covers the bytes [offset, offset + moved) of its file
(``moved`` = ``ret``, the bytes the call moved). The layout
(``ckpt_trace.formats.layout``) tiles the checkpoint's files with objects;
a row is joined to every object whose range it overlaps (numpy
``searchsorted`` over each file's sorted objects), and each object gets the
bytes of the overlap. A row spanning several objects counts its bytes to
each, its time split in proportion to them, and one operation for each (so
operations by kind can add up to more than the rows). A file renamed after
it was written (DCP's ``.metadata.tmp`` -> ``.metadata``) is joined under its
final name: a row's path is followed through the renames that came after it.

Bytes of a layout file with no object, or on rows without a known offset,
are ``unattributed``; bytes of files outside the layout ``outside_layout``.
Object size classes: under 64 KiB, up to 1 MiB, up to 64 MiB, larger.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ckpt_trace.formats import int_values, scan
from ckpt_trace.formats.layout import KINDS, read_layout

from .summary import _codes, _group_sums, _ints, _lut

SIZE_CLASSES = (
    ("<64 KiB", 64 << 10),
    ("64 KiB-1 MiB", (1 << 20) + 1),
    ("1-64 MiB", (64 << 20) + 1),
    (">64 MiB", None),
)  # (label, exclusive upper bound)
SMALL_OBJECT_BYTES = 64 << 10
JOIN_COLUMNS = ["ts_ns", "dur_ns", "op", "path", "offset", "ret"]
TOP_OBJECTS = 10


def size_class_codes(lengths: np.ndarray) -> np.ndarray:
    """Index into ``SIZE_CLASSES`` of each object length (bytes)."""
    bounds = np.array([bound for _, bound in SIZE_CLASSES[:-1]], np.int64)
    return np.searchsorted(bounds, lengths, side="right")


def _renames(trace: str | Path) -> dict[str, tuple[np.ndarray, list[str]]]:
    """{source path: (rename times sorted, destinations)} of the trace's successful renames."""
    found: dict[str, list[tuple[int, str]]] = {}
    _, batches = scan(trace, ["ts_ns", "op", "path", "new_path", "ret"])
    for batch in batches:
        codes, names = _codes(batch.column("op"))
        rows = np.flatnonzero(_lut(names, ("rename",))[codes] & (int_values(batch.column("ret")) >= 0))
        if not len(rows):
            continue
        picked = batch.take(pa.array(rows))
        for ts, src, dst in zip(
            picked.column("ts_ns").to_pylist(), picked.column("path").to_pylist(), picked.column("new_path").to_pylist()
        ):
            if src and dst:
                found.setdefault(src, []).append((ts, dst))
    return {
        src: (np.array([t for t, _ in sorted(items)], np.int64), [d for _, d in sorted(items)])
        for src, items in found.items()
    }


class LayoutJoin:
    """Folds trace batches into per-object figures against ``layout`` (``LAYOUT_SCHEMA``), following
    ``renames`` (``_renames``). Memory: a few arrays per object; the trace is never held."""

    def __init__(self, layout: pa.Table, renames: dict | None = None) -> None:
        order = np.lexsort((layout.column("offset").to_numpy(), np.array(layout.column("path").to_pylist(), object)))
        self.layout = layout.take(pa.array(order))
        paths = self.layout.column("path").to_pylist()
        self.starts = self.layout.column("offset").to_numpy().astype(np.int64)
        self.ends = self.starts + self.layout.column("length").to_numpy().astype(np.int64)
        self.spans: dict[str, tuple[int, int]] = {}
        for index, path in enumerate(paths):
            first, _ = self.spans.get(path, (index, index))
            self.spans[path] = (first, index + 1)
        self.renames = renames or {}
        n = self.layout.num_rows
        self.bytes = {"write": np.zeros(n, np.int64), "read": np.zeros(n, np.int64)}
        self.ops = {"write": np.zeros(n, np.int64), "read": np.zeros(n, np.int64)}
        self.time_ns = {"write": np.zeros(n, np.float64), "read": np.zeros(n, np.float64)}
        self.unattributed = {"write": 0, "read": 0}
        self.unattributed_ns = {"write": 0.0, "read": 0.0}
        self.outside = {"write": 0, "read": 0}
        self.total = {"write": 0, "read": 0}
        self.total_ns = {"write": 0, "read": 0}

    def _final(self, path: str | None, ts: np.ndarray) -> list[tuple[np.ndarray, str | None]]:
        """(row mask, final path) groups of rows of ``path`` at times ``ts``, through later renames."""
        if path not in self.renames:
            return [(np.ones(len(ts), bool), path)]
        times, targets = self.renames[path]
        after = np.searchsorted(times, ts, side="right")  # the first rename after each row
        groups = []
        for index in np.unique(after).tolist():
            mask = after == index
            if index >= len(times):
                groups.append((mask, path))
                continue
            later = self._final(targets[index], np.full(1, times[index], np.int64))[0][1]
            groups.append((mask, later))
        return groups

    def add(self, batch: pa.RecordBatch) -> None:
        """Fold one batch of ``JOIN_COLUMNS`` in."""
        op_codes, op_names = _codes(batch.column("op"))
        for direction in ("write", "read"):
            rows = np.flatnonzero(_lut(op_names, (direction,))[op_codes])
            if not len(rows):
                continue
            moved = np.maximum(int_values(batch.column("ret"))[rows], 0)
            dur = int_values(batch.column("dur_ns"))[rows]
            self.total[direction] += int(moved.sum())
            self.total_ns[direction] += int(dur.sum())
            ts = int_values(batch.column("ts_ns"))[rows]
            offset, known = _ints(batch.column("offset"))
            offset, known = offset[rows], known[rows]
            path_codes, path_names = _codes(batch.column("path"))
            path_codes = path_codes[rows]
            order = np.argsort(path_codes, kind="stable")  # one sort, then each path's rows are a slice
            bounds = np.flatnonzero(np.diff(path_codes[order])) + 1
            for group in np.split(order, bounds) if len(order) else []:
                code = int(path_codes[group[0]])
                for mask, final in self._final(path_names[code], ts[group]):
                    self._join(direction, final, group[mask], offset, known, moved, dur)

    def _join(
        self,
        direction: str,
        path: str | None,
        picked: np.ndarray,
        offset: np.ndarray,
        known: np.ndarray,
        moved: np.ndarray,
        dur: np.ndarray,
    ) -> None:
        if path not in self.spans:
            self.outside[direction] += int(moved[picked].sum())
            return
        unplaced = picked[~known[picked]]
        self.unattributed[direction] += int(moved[unplaced].sum())
        self.unattributed_ns[direction] += float(dur[unplaced].sum())
        picked = picked[known[picked] & (moved[picked] > 0)]
        if not len(picked):
            return
        first_object, stop = self.spans[path]
        starts, ends = self.starts[first_object:stop], self.ends[first_object:stop]
        row_start = offset[picked]
        row_end = row_start + moved[picked]
        first = np.searchsorted(ends, row_start, side="right")  # the first object ending after the row starts
        last = np.searchsorted(starts, row_end, side="left") - 1  # the last one starting before it ends
        count = np.maximum(last - first + 1, 0)
        rep = np.repeat(np.arange(len(picked)), count)
        within = np.arange(len(rep)) - np.repeat(np.cumsum(count) - count, count)
        local = first[rep] + within
        overlap = np.minimum(row_end[rep], ends[local]) - np.maximum(row_start[rep], starts[local])
        share = overlap / moved[picked][rep]
        span = stop - first_object
        self.bytes[direction][first_object:stop] += _group_sums(local, overlap, span)
        self.ops[direction][first_object:stop] += np.bincount(local, minlength=span)
        self.time_ns[direction][first_object:stop] += np.bincount(
            local, weights=dur[picked][rep] * share, minlength=span
        )
        covered = np.bincount(rep, weights=overlap, minlength=len(picked)).astype(np.int64)
        left = moved[picked] - covered
        self.unattributed[direction] += int(left.sum())
        self.unattributed_ns[direction] += float((dur[picked] * left / moved[picked]).sum())

    def objects(self) -> pa.Table:
        """The layout with this join's figures per object: ``bytes_written``, ``bytes_read``, ``write_ops``,
        ``read_ops``, ``time_ns`` (both directions, shared in proportion to bytes), ``size_class``."""
        lengths = self.layout.column("length").to_numpy()
        classes = [SIZE_CLASSES[i][0] for i in size_class_codes(lengths).tolist()]
        return (
            self.layout.append_column("bytes_written", pa.array(self.bytes["write"]))
            .append_column("bytes_read", pa.array(self.bytes["read"]))
            .append_column("write_ops", pa.array(self.ops["write"]))
            .append_column("read_ops", pa.array(self.ops["read"]))
            .append_column("time_ns", pa.array(np.rint(self.time_ns["write"] + self.time_ns["read"]).astype(np.int64)))
            .append_column("size_class", pa.array(classes, pa.string()))
        )

    def result(self, info: dict | None = None, top: int = TOP_OBJECTS) -> dict[str, Any]:
        """The join as a JSON-able dict (``documents``' ``layout`` object of ``summary``)."""
        table = self.objects()
        rows = table.select(
            [
                "path",
                "offset",
                "length",
                "name",
                "kind",
                "bytes_written",
                "bytes_read",
                "write_ops",
                "read_ops",
                "time_ns",
                "size_class",
            ]
        ).to_pylist()
        written, read = self.bytes["write"], self.bytes["read"]
        time_ns = self.time_ns["write"] + self.time_ns["read"]
        lengths = table.column("length").to_numpy()
        kinds = np.array(table.column("kind").to_pylist(), object)
        classes = size_class_codes(lengths)

        def group(mask: np.ndarray) -> dict[str, Any]:
            return {
                "objects": int(mask.sum()),
                "object_bytes": int(lengths[mask].sum()),
                "bytes_written": int(written[mask].sum()),
                "bytes_read": int(read[mask].sum()),
                "write_ops": int(self.ops["write"][mask].sum()),
                "read_ops": int(self.ops["read"][mask].sum()),
                "time_ns": int(round(float(time_ns[mask].sum()))),
            }

        by_kind = [{"kind": kind, **group(kinds == kind)} for kind in KINDS if (kinds == kind).any()]
        by_class = [
            {"size_class": label, **group(classes == i)}
            for i, (label, _) in enumerate(SIZE_CLASSES)
            if (classes == i).any()
        ]
        moved = written + read
        touched = np.flatnonzero(moved > 0)
        largest = sorted(touched.tolist(), key=lambda i: (-int(lengths[i]), i))[:top]
        costliest = sorted(touched.tolist(), key=lambda i: (-float(time_ns[i]), i))[:top]
        total_time = float(time_ns.sum())
        small = float(time_ns[lengths < SMALL_OBJECT_BYTES].sum())
        info = info or {}
        return {
            "objects": table.num_rows,
            "files": len(self.spans),
            "formats": sorted(set(table.column("format").to_pylist())),
            "unknown_files": list(info.get("unknown", [])),
            "errors": dict(info.get("errors", {})),
            "complete": bool(info.get("complete", True)),
            "bytes_written": self.total["write"],
            "bytes_read": self.total["read"],
            "attributed_bytes_written": int(written.sum()),
            "attributed_bytes_read": int(read.sum()),
            "unattributed_bytes_written": self.unattributed["write"],
            "unattributed_bytes_read": self.unattributed["read"],
            "outside_layout_bytes_written": self.outside["write"],
            "outside_layout_bytes_read": self.outside["read"],
            "by_kind": by_kind,
            "by_size_class": by_class,
            "small_object_bytes": SMALL_OBJECT_BYTES,
            "small_object_time_share": small / total_time if total_time else 0.0,
            "largest": [rows[i] for i in largest],
            "costliest": [rows[i] for i in costliest],
        }


def join_trace(trace: str | Path, layout: pa.Table | None = None, *, batch_rows: int = 1 << 20) -> LayoutJoin | None:
    """A ``LayoutJoin`` of the trace file at ``trace`` against ``layout`` (default: the layout stored in it;
    None when it has none). Reads the trace twice in batches (renames, then the data rows)."""
    if layout is None:
        stored = read_layout(trace)
        if stored is None:
            return None
        layout = stored[0]
    join = LayoutJoin(layout, _renames(trace))
    _, batches = scan(trace, JOIN_COLUMNS, batch_rows=batch_rows)
    for batch in batches:
        join.add(batch)
    return join


def layout_summary(trace: str | Path) -> dict[str, Any] | None:
    """The ``layout`` part of ``summary``: bytes, operations and time by kind and by object size class, the
    largest and costliest objects, the share of time on objects under 64 KiB; None without a layout."""
    stored = read_layout(trace)
    if stored is None:
        return None
    table, info = stored
    join = join_trace(trace, table)
    return join.result(info) if join is not None else None


def objects_of_files(join: LayoutJoin, paths: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """{path: its objects with their figures, in file order} for ``paths`` (the report's per-file view)."""
    table = join.objects()
    wanted = set(paths)
    found: dict[str, list[dict[str, Any]]] = {}
    for row in table.select(
        [
            "path",
            "offset",
            "length",
            "name",
            "kind",
            "dtype",
            "bytes_written",
            "bytes_read",
            "write_ops",
            "read_ops",
            "time_ns",
        ]
    ).to_pylist():
        if row["path"] in wanted:
            found.setdefault(row["path"], []).append(row)
    return found


def touched_files(trace: str | Path) -> list[str]:
    """Files the trace's rows read or wrote, and the destinations of its renames (sorted, as recorded)."""
    found: set[str] = set()
    _, batches = scan(trace, ["op", "path", "new_path"])
    for batch in batches:
        codes, names = _codes(batch.column("op"))
        data = _lut(names, ("read", "write"))[codes]
        if data.any():
            found.update(p for p in batch.column("path").filter(pa.array(data)).unique().to_pylist() if p)
        renamed = _lut(names, ("rename",))[codes]
        if renamed.any():
            found.update(p for p in batch.column("new_path").filter(pa.array(renamed)).unique().to_pylist() if p)
    return sorted(found)


def annotate(
    trace: str | Path,
    checkpoint: Iterable[str | Path],
    output: str | Path | None = None,
    *,
    overwrite: bool = False,
    time_limit_s: float = 60.0,
) -> dict[str, Any]:
    """Build the layout of the files under ``checkpoint`` (directories or files) and store it in ``trace``
    (in place, or written to ``output``). Returns what was done: files parsed, unknown, errors, objects,
    elapsed seconds. Raises CkptTraceError (TraceFormatError for a bad trace, or a path that does not exist)."""
    from ckpt_trace.errors import CkptTraceError
    from ckpt_trace.formats.layout import add_layout, build_layout

    paths = [str(Path(p).absolute()) for p in checkpoint]
    for path in paths:
        if not Path(path).exists():
            raise CkptTraceError(f"{{option}} {path}: no such file or directory", option="checkpoint")
    layout = build_layout(paths, time_limit_s=time_limit_s)
    written = add_layout(trace, layout.table, layout.info(), output, overwrite=overwrite)
    return {
        "trace": str(written),
        "objects": layout.table.num_rows,
        "covered_files": len(set(layout.table.column("path").to_pylist())),
        **layout.info(),
    }


def annotate_recording(trace: str | Path, *, time_limit_s: float = 60.0) -> dict[str, Any]:
    """After ``record``: the layout of the checkpoint files the traced command read or wrote, stored in
    ``trace`` when any was recognised; the other files of those files' directories that the command touched
    are listed as unknown. Returns what ``annotate`` returns, with ``stored`` false (and nothing written)
    when no checkpoint file was recognised."""
    import time as _time

    from ckpt_trace.formats.layout import add_layout, build_layout, candidate_files

    started = _time.monotonic()
    files = candidate_files(touched_files(trace))
    layout = build_layout(files, time_limit_s=max(0.0, time_limit_s - (_time.monotonic() - started)), expand_dirs=False)
    if not layout.files:
        return {
            "trace": str(trace),
            "stored": False,
            "objects": 0,
            "covered_files": 0,
            "elapsed_s": _time.monotonic() - started,
            "files": {},
            "unknown": [],
            "errors": layout.errors,
            "complete": layout.complete,
        }
    directories = {str(Path(p).parent) for p in layout.files}
    keep = pa.array([str(Path(p).parent) in directories for p in layout.table.column("path").to_pylist()])
    table = layout.table.filter(keep)
    layout.unknown = [p for p in layout.unknown if str(Path(p).parent) in directories]
    layout.elapsed_s = _time.monotonic() - started
    add_layout(trace, table, layout.info())
    return {
        "trace": str(trace),
        "stored": True,
        "objects": table.num_rows,
        "covered_files": len(set(table.column("path").to_pylist())),
        **layout.info(),
    }


def layout_report(trace: str | Path, paths: Iterable[str], objects_per_file: int = 12) -> dict[str, Any] | None:
    """The report's view of the layout: ``summary`` (``LayoutJoin.result``) and ``files`` {path: its objects
    with their figures, the ``objects_per_file`` that moved most bytes, in file order; ``more`` counts the
    rest}; None without a layout."""
    stored = read_layout(trace)
    if stored is None:
        return None
    table, info = stored
    join = join_trace(trace, table)
    if join is None:
        return None
    files = {}
    for path, objects in objects_of_files(join, paths).items():
        ranked = sorted(objects, key=lambda o: -(o["bytes_written"] + o["bytes_read"]))
        kept = sorted(ranked[:objects_per_file], key=lambda o: o["offset"])
        files[path] = {"objects": kept, "more": len(objects) - len(kept), "count": len(objects)}
    return {"summary": join.result(info), "files": files}


def _per_object(join: LayoutJoin) -> dict[tuple, dict[str, Any]]:
    """{(name, chunk offsets): figures summed over the files holding it} of the named objects of ``join``."""
    found: dict[tuple, dict[str, Any]] = {}
    for row in (
        join.objects()
        .select(
            [
                "name",
                "kind",
                "chunk_offsets",
                "length",
                "bytes_written",
                "bytes_read",
                "write_ops",
                "read_ops",
                "time_ns",
            ]
        )
        .to_pylist()
    ):
        if row["name"] is None:
            continue
        key = (row["name"], tuple(row["chunk_offsets"] or ()))
        mine = found.setdefault(
            key,
            {
                "name": row["name"],
                "chunk_offsets": list(key[1]) or None,
                "kind": row["kind"],
                "length": 0,
                "bytes": 0,
                "ops": 0,
                "time_ns": 0,
            },
        )
        mine["length"] += row["length"]
        mine["bytes"] += row["bytes_written"] + row["bytes_read"]
        mine["ops"] += row["write_ops"] + row["read_ops"]
        mine["time_ns"] += row["time_ns"]
    return found


def diff_layouts(path_a: str | Path, path_b: str | Path, top: int = 20) -> dict[str, Any] | None:
    """Which objects moved differently between two traces of the same model: objects matched by name and chunk
    offsets (whatever their files are called); ``moved_differently`` lists those whose bytes moved or
    operations differ (most bytes first, at most ``top``; ``moved_differently_count`` counts them all), with
    each side's bytes, operations and time; ``by_kind`` the bytes, operations and time per kind on each side;
    ``only_in_a``/``only_in_b`` objects one layout lacks. None when neither trace has a layout; a side without
    one is named in ``missing``."""
    joins = {side: join_trace(path) for side, path in (("a", path_a), ("b", path_b))}
    if all(join is None for join in joins.values()):
        return None
    join_a, join_b = joins["a"], joins["b"]
    if join_a is None or join_b is None:
        return {"missing": [side for side, join in joins.items() if join is None]}
    a, b = _per_object(join_a), _per_object(join_b)
    changed = []
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if x["bytes"] != y["bytes"] or x["ops"] != y["ops"]:
            changed.append(
                {
                    "name": x["name"],
                    "chunk_offsets": x["chunk_offsets"],
                    "kind": x["kind"],
                    "length": x["length"],
                    "a": {k: x[k] for k in ("bytes", "ops", "time_ns")},
                    "b": {k: y[k] for k in ("bytes", "ops", "time_ns")},
                }
            )
    changed.sort(
        key=lambda c: (-abs(c["b"]["bytes"] - c["a"]["bytes"]), -abs(c["b"]["ops"] - c["a"]["ops"]), c["name"])
    )
    by_kind = {}
    for kind in KINDS:
        sides = {}
        for side, objects in (("a", a), ("b", b)):
            mine = [o for o in objects.values() if o["kind"] == kind]
            sides[side] = {
                "objects": len(mine),
                "bytes": sum(o["bytes"] for o in mine),
                "ops": sum(o["ops"] for o in mine),
                "time_ns": sum(o["time_ns"] for o in mine),
            }
        if sides["a"]["objects"] or sides["b"]["objects"]:
            by_kind[kind] = sides
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    return {
        "missing": [],
        "objects_a": len(a),
        "objects_b": len(b),
        "moved_differently_count": len(changed),
        "moved_differently": changed[:top],
        "only_in_a": [a[k]["name"] for k in only_a[:top]],
        "only_in_a_count": len(only_a),
        "only_in_b": [b[k]["name"] for k in only_b[:top]],
        "only_in_b_count": len(only_b),
        "by_kind": by_kind,
    }
