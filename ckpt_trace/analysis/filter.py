"""``filter``: a smaller valid trace of one rank, one phase, one set of files or operations.

Reads the trace in Arrow record batches (``formats.scan``), keeps the rows
every given condition holds for (vectorised per batch: text conditions are
evaluated once per dictionary value, then taken by index), and writes them
with ``formats.TraceWriter``: memory is bounded by a batch, not the trace.
The output keeps the input's metadata and adds ``provenance``: the source
trace, its SHA-256, the conditions and the rows read and kept.

Conditions (all optional, combined with AND):

- ``ranks``: "0-7,12" (ranks -1, no rank, with "-1");
- ``pids``: "1234,1240";
- ``path_glob``: a shell glob on the ``path`` column (``*``, ``?``, ``[...]``;
  ``*`` crosses ``/``); rows without a path (ring calls, copies) are left out;
- ``ops``: "write,fsync" (names of ``formats.vocabulary``);
- ``time``: "10s..20s", "..1.5s", "200ms..": [start, end) since the trace
  started, with units ns, us, ms, s, min.

Raises CkptTraceError for a condition it cannot read, an unknown op name,
an output that exists (without ``overwrite``) or cannot be written;
TraceFormatError for a bad input trace.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import TraceWriter, scan, sha256_file, vocabulary
from ckpt_trace.formats.layout import LAYOUT_METADATA_KEY, encode_layout, read_layout

from .summary import Progress, on_batch

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "min": 60_000_000_000}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|min)?\s*")


def parse_duration_ns(text: str) -> int:
    """'10s' -> 10_000_000_000, '1.5ms' -> 1_500_000, '250' (ns) -> 250. Raises CkptTraceError."""
    match = _DURATION.fullmatch(text)
    if not match:
        raise CkptTraceError(f"not a time: {text!r} (use e.g. 10s, 250ms, 1.5min)")
    return int(float(match.group(1)) * _UNITS_NS[match.group(2) or "ns"])


def parse_window(text: str) -> tuple[int | None, int | None]:
    """'10s..20s' -> (10e9, 20e9) ns; either side may be empty. Raises CkptTraceError."""
    if ".." not in text:
        raise CkptTraceError(f"not a time window: {text!r} (use START..END, e.g. 10s..20s, ..5s, 30s..)")
    start, end = (part.strip() for part in text.split("..", 1))
    window = (parse_duration_ns(start) if start else None, parse_duration_ns(end) if end else None)
    if window[0] is not None and window[1] is not None and window[1] <= window[0]:
        raise CkptTraceError(f"empty time window {text!r}: the end is not after the start")
    return window


def glob_regex(pattern: str) -> str:
    """A shell glob as an anchored RE2 regular expression: ``*`` any run of characters (``/`` included),
    ``?`` one character, ``[...]`` a class (``[!...]`` negated), everything else literal."""
    out, i = ["^"], 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out) + "$"


INT32_BOUNDS = (-(2**31), 2**31 - 1)  # the rank and pid columns' type (formats.SCHEMA: int32)


def parse_intervals(text: str, what: str, bounds: tuple[int, int] = INT32_BOUNDS) -> list[tuple[int, int]]:
    """'0-3,8,-1' -> [(-1, -1), (0, 3), (8, 8)]: closed intervals, merged and sorted, cut to ``bounds`` (the
    column's type), never expanded into their values (``--rank 0-100000000`` is one interval). Raises
    CkptTraceError for text that is not a list, a range whose end is before its start, or a value wholly
    outside ``bounds`` (no row can hold it)."""
    low, high = bounds
    intervals: list[tuple[int, int]] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        match = re.fullmatch(r"(-?\d{1,30})(?:-(\d{1,30}))?", part)
        if not match:
            raise CkptTraceError(f"not a {what} list: {text!r} (use e.g. 0-7,12)")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if last < first:
            raise CkptTraceError(f"not a {what} range: {part!r} (the end is before the start)")
        if last < low or first > high:
            raise CkptTraceError(f"no {what} can be {part} (a {what} is between {low:,} and {high:,})")
        intervals.append((max(first, low), min(last, high)))
    if not intervals:
        raise CkptTraceError(f"no {what} given in {text!r}")
    intervals.sort()
    merged = [intervals[0]]
    for first, last in intervals[1:]:
        if first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def parse_ints(text: str, what: str) -> list[int]:
    """'0-3,8,-1' -> [-1, 0, 1, 2, 3, 8] (for short lists; ``parse_intervals`` for conditions). Raises
    CkptTraceError, also for lists of more than a million values."""
    intervals = parse_intervals(text, what)
    if sum(last - first + 1 for first, last in intervals) > 1_000_000:
        raise CkptTraceError(f"{what} list {text!r} holds more than a million values")
    return [value for first, last in intervals for value in range(first, last + 1)]


def interval_mask(intervals: list[tuple[int, int]]) -> Callable[[pa.Array], pa.Array]:
    """A function: column -> boolean mask of the values inside any of ``intervals`` (vectorised: one is_in
    over the single values, one comparison pair per wider interval)."""
    singles = pa.array([first for first, last in intervals if first == last], pa.int64())
    spans = [(first, last) for first, last in intervals if first != last]

    def mask(column: pa.Array) -> pa.Array:
        keep = pc.is_in(column, value_set=singles.cast(column.type)) if len(singles) else None
        for first, last in spans:
            inside = pc.and_(
                pc.greater_equal(column, pa.scalar(first, column.type)),
                pc.less_equal(column, pa.scalar(last, column.type)),
            )
            keep = inside if keep is None else pc.or_(keep, inside)
        return pc.fill_null(keep, False)

    return mask


@dataclass(frozen=True)
class Conditions:
    """What ``filter_trace`` keeps; None: no condition on that column."""

    ranks: str | None = None
    pids: str | None = None
    path_glob: str | None = None
    ops: str | None = None
    time: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if value is not None}


def _text_mask(column: pa.Array, test: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """``test`` (string array -> bool array) of each row of a dictionary or string column; nulls False."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        hits = pc.fill_null(test(column.dictionary), False)
        mask = pc.take(hits, column.indices)
    else:
        mask = test(column)
    return pc.fill_null(mask, False)


def batch_mask(conditions: Conditions) -> Callable[[pa.RecordBatch], pa.Array]:
    """batch -> keep mask (boolean array), the conditions parsed once: the rows ``filter_trace`` keeps.
    Raises CkptTraceError for a condition that does not parse."""
    tests: list[Callable[[pa.RecordBatch], pa.Array]] = []
    if conditions.ranks is not None:
        ranks = interval_mask(parse_intervals(conditions.ranks, "rank"))
        tests.append(lambda b: ranks(b.column("rank")))
    if conditions.pids is not None:
        pids = interval_mask(parse_intervals(conditions.pids, "pid"))
        tests.append(lambda b: pids(b.column("pid")))
    if conditions.ops is not None:
        names = [name.strip() for name in conditions.ops.split(",") if name.strip()]
        unknown = [name for name in names if name not in vocabulary.OPS]
        if unknown or not names:
            raise CkptTraceError(
                f"unknown op {unknown[0] if unknown else conditions.ops!r} (ops: {', '.join(sorted(vocabulary.OPS))})"
            )
        wanted = pa.array(names, pa.string())
        tests.append(lambda b: _text_mask(b.column("op"), lambda values: pc.is_in(values, value_set=wanted)))
    if conditions.path_glob is not None:
        regex = glob_regex(conditions.path_glob)
        tests.append(lambda b: _text_mask(b.column("path"), lambda values: pc.match_substring_regex(values, regex)))
    if conditions.time is not None:
        start, end = parse_window(conditions.time)

        def in_window(b: pa.RecordBatch) -> pa.Array:
            ts = b.column("ts_ns")
            mask = pc.greater_equal(ts, start) if start is not None else pa.scalar(True)
            if end is not None:
                mask = pc.and_(mask, pc.less(ts, end))
            return mask if isinstance(mask, pa.Array) else pa.array([True] * len(b))

        tests.append(in_window)

    def mask(batch: pa.RecordBatch) -> pa.Array:
        keep = pa.array([True] * batch.num_rows) if not tests else tests[0](batch)
        for test in tests[1:]:
            keep = pc.and_(keep, test(batch))
        return keep

    return mask


def filter_trace(
    trace_path: str | os.PathLike,
    output: str | os.PathLike,
    conditions: Conditions,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write the rows of ``trace_path`` that meet ``conditions`` to ``output``; return {"output", "rows_in",
    "rows_out", "conditions"}. ``progress`` (``analysis.summary.Progress``) follows the file's batches."""
    trace_path, output = Path(trace_path), Path(output)
    mask = batch_mask(conditions)  # parse errors before anything is read or written
    if output.resolve() == trace_path.resolve():
        raise CkptTraceError(f"{output} is the trace being filtered: choose another output")
    meta, batches = scan(trace_path, on_batch=on_batch(progress, "filtering"))
    writer = TraceWriter(output, overwrite=overwrite)
    rows_in = rows_out = 0
    try:
        for batch in batches:
            kept = batch.filter(mask(batch))
            rows_in += batch.num_rows
            rows_out += kept.num_rows
            if kept.num_rows:
                writer.write(kept)
        provenance = {
            "filtered_from": str(trace_path),
            "source_sha256": sha256_file(trace_path),
            "conditions": conditions.to_json(),
            "rows_in": rows_in,
            "rows_out": rows_out,
        }
        metadata = {**meta, "provenance": [*meta.get("provenance", []), provenance]}
        layout = read_layout(trace_path)  # the same checkpoint's files: the filtered rows keep their meaning
        other_keys = {LAYOUT_METADATA_KEY: encode_layout(*layout)} if layout is not None else None
        path = writer.close(metadata, other_keys=other_keys)
    except BaseException:
        writer.abort()
        raise
    return {"output": str(path), "rows_in": rows_in, "rows_out": rows_out, "conditions": conditions.to_json()}
