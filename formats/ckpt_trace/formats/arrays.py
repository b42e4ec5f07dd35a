"""A trace column's values and validity as numpy, read from its Arrow buffers.

Every reader of a trace (summary, planning) turns integer columns into numpy
arrays batch by batch. ``Array.to_numpy`` would import pandas on its first
call (about 0.4 s of a command's start) and, with ``zero_copy_only=False``,
copy even where it need not; these read the buffers directly (Arrow columnar
format: a values buffer, and a validity bitmap whose bit i, least
significant first, says row i is not null).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def int_values(column: pa.Array) -> np.ndarray:
    """A zero-copy numpy view of an integer column's values (or a dictionary column's indices); the slot
    of a null row holds an unspecified value (mask it with ``validity``)."""
    return np.frombuffer(column.buffers()[1], dtype=np.dtype(str(column.type)), count=len(column) + column.offset)[
        column.offset :
    ]


def validity(column: pa.Array) -> np.ndarray:
    """Per row, whether it is not null: bool array of ``len(column)``."""
    if not column.null_count:
        return np.ones(len(column), bool)
    bits = np.unpackbits(np.frombuffer(column.buffers()[0], np.uint8), bitorder="little")
    return bits[column.offset : column.offset + len(column)].astype(bool)


def dictionary_codes(column: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(each row's code, the values coded) of a string or dictionary column: a dictionary column's own
    indices and dictionary, else its dictionary encoding; a null row's code is ``len(values)`` (one past
    the last value), so a lookup table of ``len(values) + 1`` entries maps every row, its last entry for
    nulls. The one way every reader (summary, report, planner) turns a text column into integer codes."""
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    indices, values = column.indices, column.dictionary
    codes = int_values(indices).astype(np.intp, copy=False)
    if indices.null_count:
        codes = np.where(validity(indices), codes, len(values))
    return codes, values


def distinct(column: pa.Array | pa.ChunkedArray) -> list:
    """The distinct non-null values of a (dictionary or plain) column, decoding only the dictionary."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: set = set()
    for chunk in chunks:
        if pa.types.is_dictionary(chunk.type):
            out.update(chunk.dictionary.take(pc.unique(chunk.indices.drop_null())).to_pylist())
        else:
            out.update(pc.unique(chunk.drop_null()).to_pylist())
    return list(out)


#: Up to this many choices, ``is_any_of`` compares once per choice; beyond, it asks ``np.isin``.
_FEW_CHOICES = 16


def is_any_of(values: np.ndarray, choices) -> np.ndarray:
    """Per element of ``values`` (an integer array), whether it equals one of ``choices`` (a few integer
    codes): ``np.isin`` without its sort or lookup table, one vectorised comparison per choice. For 200,000
    int8 codes against 4 choices: about 0.05 ms, against 3 ms for ``np.isin`` (numpy 2.4)."""
    choices = np.asarray(choices).ravel().tolist()
    if len(choices) > _FEW_CHOICES:
        return np.isin(values, choices)
    out = np.zeros(np.shape(values), bool)
    for choice in choices:
        out |= values == choice
    return out
