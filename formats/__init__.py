"""Trace file format: the Arrow schema (the public contract), reading and writing.

This package imports nothing else of ckpt-trace; see ``formats/README.md``.
"""

from .errors import CkptTraceError, TraceFormatError
from .io import Trace, read_metadata, read_trace, sha256_file, table_from_columns, write_bytes_atomic, write_trace
from .schema import (
    COLUMNS,
    FORMAT_VERSION,
    METADATA_KEY,
    OFFSET_SOURCES,
    SCHEMA,
    SUPPORTED_VERSIONS,
)

__all__ = [
    "COLUMNS",
    "CkptTraceError",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "OFFSET_SOURCES",
    "SCHEMA",
    "SUPPORTED_VERSIONS",
    "Trace",
    "TraceFormatError",
    "read_metadata",
    "read_trace",
    "sha256_file",
    "table_from_columns",
    "write_bytes_atomic",
    "write_trace",
]
