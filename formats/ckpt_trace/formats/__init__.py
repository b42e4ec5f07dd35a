"""Trace file format: the Arrow schema (the public contract), reading and writing.

This package imports nothing else of ckpt-trace; see ``formats/README.md``.

Importing it loads no pyarrow: ``errors``, ``atomic`` and ``vocabulary`` (the
exception root and the atomic-write helpers the emitted writer and reader use,
installed alone as ckpt-trace-runtime) are imported at once, every name that
needs pyarrow on first use (PEP 562 ``__getattr__``; ``_LAZY`` says which
module holds it).
"""

from typing import TYPE_CHECKING

from . import vocabulary
from .atomic import fsync_directory
from .errors import CkptTraceError, TraceFormatError
from .vocabulary import OFFSET_SOURCES

if TYPE_CHECKING:
    from .arrays import dictionary_codes, distinct, int_values, is_any_of, validity
    from .io import (
        Trace,
        TraceWriter,
        count_rows,
        read_extra_metadata,
        read_metadata,
        read_trace,
        reserve_temporary,
        scan,
        sha256_file,
        table_from_columns,
        write_bytes_atomic,
        write_trace,
    )
    from .schema import (
        COLUMNS,
        EXTRA_METADATA,
        FORMAT_VERSION,
        METADATA_KEY,
        OPTIONAL_COLUMNS,
        SCHEMA,
        SUPPORTED_VERSIONS,
        OptionalColumn,
    )
    from .streaming import write_trace_batches

_LAZY = {
    "dictionary_codes": "arrays",
    "distinct": "arrays",
    "int_values": "arrays",
    "is_any_of": "arrays",
    "validity": "arrays",
    "Trace": "io",
    "TraceWriter": "io",
    "count_rows": "io",
    "read_extra_metadata": "io",
    "read_metadata": "io",
    "read_trace": "io",
    "reserve_temporary": "io",
    "scan": "io",
    "sha256_file": "io",
    "table_from_columns": "io",
    "write_bytes_atomic": "io",
    "write_trace": "io",
    "COLUMNS": "schema",
    "EXTRA_METADATA": "schema",
    "FORMAT_VERSION": "schema",
    "METADATA_KEY": "schema",
    "OPTIONAL_COLUMNS": "schema",
    "SCHEMA": "schema",
    "SUPPORTED_VERSIONS": "schema",
    "OptionalColumn": "schema",
    "write_trace_batches": "streaming",
}

__all__ = [
    "COLUMNS",
    "EXTRA_METADATA",
    "CkptTraceError",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "OPTIONAL_COLUMNS",
    "OFFSET_SOURCES",
    "OptionalColumn",
    "SCHEMA",
    "SUPPORTED_VERSIONS",
    "Trace",
    "TraceFormatError",
    "TraceWriter",
    "count_rows",
    "dictionary_codes",
    "distinct",
    "fsync_directory",
    "int_values",
    "is_any_of",
    "read_extra_metadata",
    "read_metadata",
    "read_trace",
    "reserve_temporary",
    "scan",
    "sha256_file",
    "table_from_columns",
    "validity",
    "vocabulary",
    "write_bytes_atomic",
    "write_trace",
    "write_trace_batches",
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
