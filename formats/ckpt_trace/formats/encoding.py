"""Version 4's stored columns: ``tid``, ``offset`` and ``ret`` kept as differences from what the trace predicts.

Read only: version 5 stores these columns plain again (readers that did not decode the differences read
wrong values without noticing, issue 32); ``Decoder`` reads version 4 files, ``Encoder`` remains to write
version 4 files for the tests and the size benchmark.

A recorded trace repeats itself: a thread's ``tid`` is usually its process's
``pid``; a read or write usually starts where the same process's previous
operation on the same file ended; a read or write usually moves every byte
it asked for (``ret == size``), and ``lseek`` returns the position it sets
(``ret == offset``). Arrow IPC compresses each column's buffers alone
(zstd), so it cannot see that one column repeats another, nor that an
offset grows by the previous size. Version 4 therefore stores three columns
as the difference from their prediction, which is 0 where the trace is
regular and compresses to almost nothing:

================  ====================================================================
stored column     the logical column it holds
================  ====================================================================
``tid_delta``     ``tid - pid`` (int32 arithmetic, wrapping)
``offset_delta``  ``offset - predicted``, null where ``offset`` is null. ``predicted``:
                  the rows with an offset form one stream per (``pid``, ``path``) over
                  the whole file, in row order (a null ``path`` is one stream per
                  ``pid``); the first row of a stream predicts 0, every later one
                  ``previous offset + previous size`` (a null size counts as 0)
``ret_delta``     ``ret - coalesce(size, offset, 0)``
================  ====================================================================

All arithmetic is on int64 (int32 for ``tid``) and wraps, so every value
round-trips exactly. The other columns are stored as they are. Streams run
across record batches, so batches must be decoded in file order, each with
the state the previous ones left (``Decoder``); a whole-table reader
(pandas, polars) decodes with a group-by and a cumulative sum
(``formats/README.md`` shows it).

Measured on the trace ``make demo`` records (DCP saves, half of its rows ``lseek``): 12.5
bytes per row as version 3 stored it, 7.9 as version 4 (``benchmarks/trace_bytes.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrays import int_values, validity

# logical column -> the stored column holding it
STORED_AS = {"tid": "tid_delta", "offset": "offset_delta", "ret": "ret_delta"}
LOGICAL_OF = {stored: logical for logical, stored in STORED_AS.items()}

# logical column -> the stored columns its decoding reads
_NEEDS = {
    "tid": ("tid_delta", "pid"),
    "offset": ("offset_delta", "pid", "path", "size"),
    "ret": ("ret_delta", "offset_delta", "pid", "path", "size"),
}


def stored_columns(logical: Iterable[str]) -> list[str]:
    """The stored columns (of a version 4 file) that decoding the ``logical`` columns reads, in first-needed
    order: a column not stored as a difference is read as itself."""
    out: list[str] = []
    for name in logical:
        for stored in _NEEDS.get(name, (name,)):
            if stored not in out:
                out.append(stored)
    return out


def _filled(column: pa.Array) -> np.ndarray:
    """An integer column (or a dictionary column's indices) as int64 numpy, nulls as 0."""
    if column.null_count:
        column = pc.fill_null(column, 0)
    return int_values(column).astype(np.int64)


class _Streams:
    """The (``pid``, ``path``) streams of offset rows and where each last ended, carried from batch to batch.

    Path identity is the path's text: a codec numbers each distinct path the first time one of its
    dictionaries shows it, so two dictionaries that order their values differently group the same rows.
    """

    def __init__(self) -> None:
        self._path_ids: dict[str, int] = {}
        self._dictionary: pa.Array | None = None
        self._dictionary_ids = np.zeros(0, np.int64)
        self._keys = np.zeros(0, np.int64)  # sorted stream keys seen so far
        self._ends = np.zeros(0, np.int64)  # where each stream's last row ended (offset + size)

    def _path_id(self, path: pa.Array) -> np.ndarray:
        """Per row, the number of its path's text (0 for null)."""
        if not pa.types.is_dictionary(path.type):
            path = pc.dictionary_encode(path)
        dictionary = path.dictionary
        known = 0 if self._dictionary is None else len(self._dictionary)
        if not (
            self._dictionary is not None
            and len(dictionary) >= known
            and dictionary.slice(0, known).equals(self._dictionary)
        ):
            known = 0  # not an extension of the last one: number it again (same text, same number)
            self._dictionary_ids = np.zeros(0, np.int64)
        fresh = [
            self._path_ids.setdefault(value, len(self._path_ids) + 1) if value is not None else 0
            for value in dictionary.slice(known).to_pylist()
        ]
        self._dictionary_ids = np.concatenate([self._dictionary_ids, np.asarray(fresh, np.int64)])
        self._dictionary = dictionary
        indices = path.indices
        ids = self._dictionary_ids[_filled(indices)] if len(self._dictionary_ids) else np.zeros(len(path), np.int64)
        return np.where(validity(indices), ids, 0)

    def order(self, pid: pa.Array, path: pa.Array, has_offset: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows with an offset in stream order, their stream keys, whether each is its stream's first row
        in this batch)."""
        rows = np.flatnonzero(has_offset)
        key = (_filled(pid)[rows] << 32) | self._path_id(path)[rows]
        sorter = np.argsort(key, kind="stable")
        rows, key = rows[sorter], key[sorter]
        first = np.ones(len(rows), bool)
        first[1:] = key[1:] != key[:-1]
        return rows, key, first

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(where each of ``keys`` is or would go among the known streams, whether it is known)."""
        at = np.searchsorted(self._keys, keys)
        hit = at < len(self._keys)
        hit[hit] = self._keys[at[hit]] == keys[hit]
        return at, hit

    def carried(self, keys: np.ndarray) -> np.ndarray:
        """Where each stream of ``keys`` ended in earlier batches (0 for a new stream)."""
        at, hit = self._find(keys)
        out = np.zeros(len(keys), np.int64)
        out[hit] = self._ends[at[hit]]
        return out

    def update(self, key: np.ndarray, first: np.ndarray, end: np.ndarray) -> None:
        """Remember each stream's last end in this batch (``key``, ``end`` in stream order)."""
        last = np.ones(len(key), bool)
        last[:-1] = first[1:]
        keys, ends = key[last], end[last]
        at, hit = self._find(keys)
        self._ends[at[hit]] = ends[hit]
        if (~hit).any():
            merged_keys = np.concatenate([self._keys, keys[~hit]])
            merged_ends = np.concatenate([self._ends, ends[~hit]])
            sorter = np.argsort(merged_keys, kind="stable")
            self._keys, self._ends = merged_keys[sorter], merged_ends[sorter]


def _previous_in_stream(values: np.ndarray, first: np.ndarray, carried: np.ndarray) -> np.ndarray:
    """Per row in stream order, the previous row's value in its stream, ``carried`` for a stream's first row."""
    out = np.empty(len(values), np.int64)
    out[1:] = values[:-1]
    out[first] = carried
    return out


class Encoder:
    """Turns record batches of ``SCHEMA`` into version 4's stored columns, batch after batch in file order.

    Call order: ``Encoder()`` once per file, then ``encode(batch)`` for each batch in the order it is
    written (the offset streams continue from batch to batch). Called by ``write_trace`` and
    ``TraceWriter.write``.
    """

    def __init__(self) -> None:
        self._streams = _Streams()

    def encode(self, batch: pa.RecordBatch, stored_schema: pa.Schema) -> pa.RecordBatch:
        """``batch`` (every column of ``SCHEMA``) as a batch of ``stored_schema``."""
        with np.errstate(over="ignore"):
            pid = batch.column("pid")
            offset_column, size_column = batch.column("offset"), batch.column("size")
            has_offset, has_size = validity(offset_column), validity(size_column)
            offset, size = _filled(offset_column), _filled(size_column)
            rows, key, first = self._streams.order(pid, batch.column("path"), has_offset)
            end = offset[rows] + size[rows]
            predicted = _previous_in_stream(end, first, self._streams.carried(key[first]))
            self._streams.update(key, first, end)
            offset_delta = np.zeros(len(offset), np.int64)
            offset_delta[rows] = offset[rows] - predicted
            ret = _filled(batch.column("ret"))
            ret_delta = ret - np.where(has_size, size, offset)  # offset is 0 where null
            tid_delta = (_filled(batch.column("tid")) - _filled(pid)).astype(np.int32)
        stored = {
            "tid_delta": pa.array(tid_delta, pa.int32()),
            "offset_delta": pa.array(offset_delta, pa.int64(), mask=~has_offset),
            "ret_delta": pa.array(ret_delta, pa.int64()),
        }
        return pa.RecordBatch.from_arrays(
            [stored[field.name] if field.name in stored else batch.column(field.name) for field in stored_schema],
            schema=stored_schema,
        )


class Decoder:
    """Turns version 4's stored columns back into ``SCHEMA``'s, batch after batch in file order.

    Call order: ``Decoder()`` once per file, then ``decode(batch, wanted)`` for every record batch of the file
    in order (a stream's offsets continue from the batch before). Called by ``read_trace`` and ``scan``.
    """

    def __init__(self) -> None:
        self._streams = _Streams()

    def decode(self, batch: pa.RecordBatch, wanted: list[str], schema: pa.Schema) -> pa.RecordBatch:
        """The logical columns ``wanted`` (fields of ``schema``) of a stored batch holding at least
        ``stored_columns(wanted)``."""
        out: dict[str, pa.Array] = {}
        with np.errstate(over="ignore"):
            if "offset" in wanted or "ret" in wanted:
                delta_column, size_column = batch.column("offset_delta"), batch.column("size")
                has_offset, has_size = validity(delta_column), validity(size_column)
                delta, size = _filled(delta_column), _filled(size_column)
                rows, key, first = self._streams.order(batch.column("pid"), batch.column("path"), has_offset)
                # offset_k = delta_k + offset_(k-1) + size_(k-1) in a stream: a cumulative sum per stream
                step = delta[rows] + _previous_in_stream(size[rows], first, self._streams.carried(key[first]))
                total = np.cumsum(step)
                starts = np.flatnonzero(first)
                before = np.repeat(total[starts] - step[starts], np.diff(np.append(starts, len(step))))
                offset = np.zeros(len(delta), np.int64)
                offset[rows] = total - before
                self._streams.update(key, first, offset[rows] + size[rows])
                out["offset"] = pa.array(offset, pa.int64(), mask=~has_offset)
                if "ret" in wanted:
                    out["ret"] = pa.array(
                        _filled(batch.column("ret_delta")) + np.where(has_size, size, offset), pa.int64()
                    )
            if "tid" in wanted:
                tid = (_filled(batch.column("tid_delta")) + _filled(batch.column("pid"))).astype(np.int32)
                out["tid"] = pa.array(tid, pa.int32())
        arrays = [out[name] if name in out else batch.column(name) for name in wanted]
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([schema.field(name) for name in wanted]))
