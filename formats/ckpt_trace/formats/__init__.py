"""Trace file format: the Arrow schema (the public contract), reading and writing.

This package imports nothing else of ckpt-trace; see ``formats/README.md``.
"""

from . import vocabulary
from .arrays import dictionary_codes, distinct, int_values, is_any_of, validity
from .atomic import fsync_directory
from .errors import CkptTraceError, TraceFormatError
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
from .vocabulary import OFFSET_SOURCES

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
