"""The Arrow schema of a ckpt-trace trace: the public contract.

Columns, types and units are documented in ``formats/README.md``; this
module is the machine-readable copy. Version history:

- 1: first version.
"""

from __future__ import annotations

import pyarrow as pa

FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)

# The one schema-metadata key; its value is a UTF-8 JSON object.
METADATA_KEY = b"ckpt_trace"

# Keys every trace's metadata object must carry.
REQUIRED_METADATA_KEYS = (
    "format_version",
    "creator",
    "creator_version",
    "host",
    "kernel",
    "command",
    "backend",
    "start_wall_time_ns",
    "filesystems",
    "lost_events",
)

# Metadata keys a trace may lack: readers supply these defaults.
METADATA_DEFAULTS = {"arch": "x86_64"}  # traces written before the key existed were all recorded on x86-64

SCHEMA = pa.schema(
    [
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64(), nullable=False),
        pa.field("pid", pa.int32(), nullable=False),
        pa.field("tid", pa.int32(), nullable=False),
        pa.field("comm", pa.string()),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("syscall", pa.string(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("fd", pa.int32()),
        pa.field("path", pa.string()),
        pa.field("new_path", pa.string()),
        pa.field("offset", pa.int64()),
        pa.field("offset_source", pa.string()),
        pa.field("size", pa.int64()),
        pa.field("ret", pa.int64(), nullable=False),
        pa.field("flags", pa.int64()),
        pa.field("iov_count", pa.int32()),
    ]
)

COLUMNS = tuple(SCHEMA.names)
