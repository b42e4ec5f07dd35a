"""Small traces made from row dicts, for the replay, planner and format tests: ``table_of`` (the trace table of
rows, columns left out taking defaults), ``trace_of`` (that table written with metadata), ``make_trace`` (any
ops) and ``synthetic`` (files created with one write each); ``META``, the metadata they write unless given;
``CREATE``: open(2) flags of a new file."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pyarrow as pa

from ckpt_trace.formats import table_from_columns, write_trace
from ckpt_trace.tracer import syscalls as sc

META = {
    "creator": "test",
    "creator_version": "0",
    "host": "h",
    "kernel": "k",
    "command": ["x"],
    "backend": "strace",
    "start_wall_time_ns": 0,
    "filesystems": {},
    "lost_events": 0,
    "arch": "x86_64",
}
CREATE = sc.O_WRONLY | sc.O_CREAT | sc.O_TRUNC
ROW_DEFAULTS = {
    "dur_ns": 1,
    "pid": 1,
    "tid": 1,
    "comm": "t",
    "rank": -1,
    "fd": None,
    "path": None,
    "new_path": None,
    "offset": None,
    "offset_source": None,
    "size": None,
    "flags": None,
    "iov_count": None,
    "ret": 0,
    "interface": "syscall",
}


def table_of(rows: list[dict], /, *, gap_ns: int = 1000, **defaults) -> pa.Table:
    """The trace table of ``rows`` (dicts column -> value, each with ``op``): a column a row leaves out takes
    ``defaults``, then ``ROW_DEFAULTS``, then null; ``ts_ns`` is the row's index times ``gap_ns`` and
    ``syscall`` its ``op`` unless the row gives them. Raises TraceFormatError where a value does not fit."""
    base = {**ROW_DEFAULTS, **defaults}
    full = [{**base, "ts_ns": index * gap_ns, "syscall": row["op"], **row} for index, row in enumerate(rows)]
    names = dict.fromkeys(["ts_ns", "syscall", "op", *base, *(name for row in full for name in row)])  # no rows: empty
    return table_from_columns({name: [row.get(name) for row in full] for name in names})


def trace_of(path: Path, rows: list[dict], meta: dict | None = None, /, *, gap_ns: int = 1000, **defaults) -> Path:
    """``table_of(rows, gap_ns=gap_ns, **defaults)`` written to ``path`` with ``meta`` (``META`` unless given)."""
    return write_trace(path, table_of(rows, gap_ns=gap_ns, **defaults), META if meta is None else meta)


def make_trace(path: Path, ops: list[dict]) -> Path:
    """A trace from op dicts (op, path, fd, offset, size, ret, ...), one process unless given."""
    return trace_of(path, ops)


def too_small_to_judge(path: Path) -> Path:
    """A trace of one file opened and 10 bytes written: too little to tell strategies apart."""
    return make_trace(
        path,
        [
            {"op": "open", "path": "/ck/a", "fd": 3, "flags": 0o101, "ret": 3},
            {"op": "write", "path": "/ck/a", "fd": 3, "offset": 0, "size": 10, "ret": 10},
        ],
    )


def written_bytes(rows: list[dict]) -> dict[str, int]:
    """Bytes each file received, by its final path (a rename carries what was written under the old name)."""
    written: dict[str, int] = defaultdict(int)
    for row in rows:
        if row["op"] in ("write", "pwrite") and row["ret"] > 0:
            written[row["path"]] += row["ret"]
        elif row["op"] == "rename" and row["ret"] == 0 and row["path"] in written:
            written[row["new_path"]] += written.pop(row["path"])
    return dict(written)


def flip_bit(path: Path, offset: int) -> None:
    """Flip the low bit of the byte at ``offset`` of ``path`` (from its end where negative)."""
    with open(path, "r+b") as f:
        f.seek(offset, 2 if offset < 0 else 0)
        byte = f.read(1)
        f.seek(offset, 2 if offset < 0 else 0)
        f.write(bytes([byte[0] ^ 0x01]))


def file_rows(name: str, nbytes: int, fd: int = 3, **write) -> list[dict]:
    """The rows of a file created (``CREATE``) on ``fd``, written ``nbytes`` at offset 0 in one call (its
    columns updated by ``write``) and closed."""
    return [
        {"op": "open", "path": name, "fd": fd, "ret": fd, "flags": CREATE},
        {"op": "write", "path": name, "fd": fd, "offset": 0, "size": nbytes, "ret": nbytes, **write},
        {"op": "close", "path": name, "fd": fd},
    ]


def synthetic(path: Path, files: dict[str, int], gap_ns: int = 1000) -> Path:
    """A trace creating each ``files`` path (absolute) with one write of that many bytes."""
    rows = [row for index, (name, size) in enumerate(files.items()) for row in file_rows(name, size, fd=3 + index)]
    return trace_of(path, rows, gap_ns=gap_ns)
