"""Small traces made from op dicts, for the replay tests: ``make_trace`` (any ops) and ``synthetic`` (files
created with one write each), both with the same metadata ``META``; ``CREATE``: open(2) flags of a new file."""

from __future__ import annotations

from pathlib import Path

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


def make_trace(path: Path, ops: list[dict]) -> Path:
    """A trace from op dicts (op, path, fd, offset, size, ret, ...), one process unless given."""
    defaults = {
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
    }
    columns: dict[str, list] = {}
    for index, op in enumerate(ops):
        row = {**defaults, "ts_ns": op.get("ts_ns", index * 1000), "syscall": op["op"], **op}
        row.setdefault("ret", 0)
        for key, value in row.items():
            columns.setdefault(key, []).append(value)
    return write_trace(path, table_from_columns(columns), META)


def synthetic(path: Path, files: dict[str, int], gap_ns: int = 1000) -> Path:
    """A trace creating each ``files`` path (absolute) with one write of that many bytes."""
    rows = []
    for index, (name, size) in enumerate(files.items()):
        fd = 3 + index
        rows += [
            {"op": "open", "path": name, "fd": fd, "ret": fd, "flags": 0o1 | 0o100 | 0o1000},
            {"op": "write", "path": name, "fd": fd, "offset": 0, "size": size, "ret": size},
            {"op": "close", "path": name, "fd": fd},
        ]
    defaults = {
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
    }
    columns: dict[str, list] = {}
    for index, row in enumerate(rows):
        row = {**defaults, "ts_ns": index * gap_ns, "syscall": row["op"], **row}
        for key, value in row.items():
            columns.setdefault(key, []).append(value)
    return write_trace(path, table_from_columns(columns), META)
