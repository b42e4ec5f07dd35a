"""Rows of the trace schema and its metadata, for the format tests: ``rows(n)`` (n 4 KiB pwrite64 rows),
``META``, and ``write_raw`` (a table written as it is, no encoding or checks)."""

from __future__ import annotations

import json

import pyarrow.ipc as ipc

from ckpt_trace.formats import METADATA_KEY

from . import traces

META = {  # the replay tests' metadata with a file system, a start time and lost events to read back
    **traces.META,
    "start_wall_time_ns": 1,
    "filesystems": {"/": {"type": "ext4", "block_size": 4096}},
    "lost_events": 3,
}


def rows(n: int = 3) -> dict[str, list]:
    return {
        "ts_ns": list(range(n)),
        "dur_ns": [5] * n,
        "pid": [10] * n,
        "tid": [11] * n,
        "comm": ["python3"] * n,
        "rank": [0] * n,
        "syscall": ["pwrite64"] * n,
        "op": ["write"] * n,
        "fd": [3] * n,
        "path": ["/d/f"] * n,
        "new_path": [None] * n,
        "offset": [i * 4096 for i in range(n)],
        "offset_source": ["explicit"] * n,
        "size": [4096] * n,
        "ret": [4096] * n,
        "flags": [None] * n,
        "iov_count": [None] * n,
    }


def write_raw(path, table, meta):
    """Write ``table`` as it is (no encoding, no checks) with ``meta`` as the trace metadata."""
    schema = table.schema.with_metadata({METADATA_KEY: json.dumps(meta).encode()} if meta is not None else {})
    with ipc.new_file(str(path), schema) as writer:
        writer.write_table(table.replace_schema_metadata(schema.metadata))
