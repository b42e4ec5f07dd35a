"""Reading and writing trace files (Arrow IPC file format, zstd batches).

A trace file is readable without ckpt-trace: ``pyarrow.ipc.open_file``,
``pandas.read_feather``, ``polars.read_ipc`` and DuckDB all open it.

Writing is atomic: rows go to a hidden temporary file beside the target,
which is fsynced and renamed over the final name, then the directory is
fsynced (rename(2), fsync(2)). A writer killed at any point therefore
leaves either no file or a complete one under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from .errors import CkptTraceError, TraceFormatError
from .schema import (
    COLUMNS,
    FORMAT_VERSION,
    METADATA_DEFAULTS,
    METADATA_KEY,
    REQUIRED_METADATA_KEYS,
    SCHEMA,
    SCHEMA_V1,
    SCHEMAS,
    SUPPORTED_VERSIONS,
    upgrade,
)

DEFAULT_BATCH_ROWS = 65536


@dataclass(frozen=True)
class Trace:
    """A validated trace: ``table`` has exactly the columns of ``SCHEMA``.

    ``metadata`` is the decoded JSON object stored under ``METADATA_KEY``.
    """

    path: Path
    table: pa.Table
    metadata: Mapping[str, Any]

    @property
    def num_rows(self) -> int:
        return self.table.num_rows


def fsync_directory(directory: str | os.PathLike) -> None:
    """fsync(2) a directory, so a rename or a new entry in it survives a crash. Raises OSError."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def reserve_temporary(path: str | os.PathLike) -> Path:
    """Create (empty, exclusively) the temporary file ``write_trace`` and ``write_bytes_atomic`` will write
    for ``path``, so a long job finds out before it starts that its output cannot be written.

    Returns the temporary path (remove it if the job fails). Raises CkptTraceError with the reason.
    """
    path = Path(path)
    tmp = _temporary_name(path)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    except OSError as err:
        raise CkptTraceError(f"cannot write {path}: {err.strerror}") from None
    return tmp


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename, directory fsync).

    Raises CkptTraceError with a one-line reason on failure; ``path`` is then untouched.
    """
    path = Path(path)
    tmp = _temporary_name(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CkptTraceError(f"cannot write {path}: {err.strerror or err}") from None


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (identifies a trace whatever its name)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def table_from_columns(columns: Mapping[str, list]) -> pa.Table:
    """Build a table of ``SCHEMA`` from a mapping column name -> list of values.

    The columns of version 1 are required; the request and mapping columns
    added in version 2 default to ``interface`` 'syscall' and null. Raises
    TraceFormatError when a column is missing or a value does not fit its type.
    """
    missing = [name for name in SCHEMA_V1.names if name not in columns]
    if missing:
        raise TraceFormatError(f"rows lack column {missing[0]!r}")
    rows = len(columns["ts_ns"])
    filled = {name: columns[name] if name in columns else (["syscall"] * rows if name == "interface" else [None] * rows)
              for name in COLUMNS}
    try:
        return pa.Table.from_pydict(filled, schema=SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as err:
        raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None


def conform(table: pa.Table) -> pa.Table:
    """``table`` as ``SCHEMA``: the columns in order, cast, and every text column's chunks sharing one
    dictionary (the IPC file format allows one dictionary per column; Arrow columnar format, "Dictionary
    Messages"). Version-1-shaped tables gain the version 2 columns."""
    if "interface" not in table.column_names:
        table = upgrade(table.select([name for name in SCHEMA_V1.names]), 1)
    return table.select(list(COLUMNS)).cast(SCHEMA).unify_dictionaries()


def write_trace(
    path: str | os.PathLike,
    table: pa.Table,
    metadata: Mapping[str, Any],
    *,
    overwrite: bool = False,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Path:
    """Write ``table`` (of ``SCHEMA``) and ``metadata`` atomically to ``path``.

    ``metadata`` must hold every key of ``REQUIRED_METADATA_KEYS`` except
    ``format_version``, which is set here. Returns the final path.

    Raises CkptTraceError when ``path`` exists and ``overwrite`` is false,
    when a metadata key is missing, or when the file system refuses the
    write (full disk, permissions); the temporary file is removed then.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise CkptTraceError(f"{path} already exists (use --force to overwrite it)")
    meta = dict(metadata)
    meta["format_version"] = FORMAT_VERSION
    missing = [key for key in REQUIRED_METADATA_KEYS if key not in meta]
    if missing:
        raise TraceFormatError(f"trace metadata lacks key {missing[0]!r}")
    schema = SCHEMA.with_metadata({METADATA_KEY: json.dumps(meta, sort_keys=True).encode()})
    try:
        table = conform(table).replace_schema_metadata(schema.metadata)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
        raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None
    tmp = _temporary_name(path)
    options = ipc.IpcWriteOptions(compression="zstd")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema, options=options) as writer:
            writer.write_table(table, max_chunksize=max(1, batch_rows))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CkptTraceError(f"cannot write trace {path}: {err.strerror or err}") from None
    return path


def _decode_metadata(path: Path, schema: pa.Schema) -> dict:
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise TraceFormatError(f"{path}: not a ckpt-trace trace (schema metadata key {METADATA_KEY.decode()!r} missing)")
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TraceFormatError(f"{path}: metadata key {METADATA_KEY.decode()!r} is not valid JSON") from None
    if not isinstance(meta, dict):
        raise TraceFormatError(f"{path}: metadata key {METADATA_KEY.decode()!r} is not a JSON object")
    version = meta.get("format_version")
    if version == 1:
        for key, value in METADATA_DEFAULTS.items():
            meta.setdefault(key, value)
    missing = [key for key in REQUIRED_METADATA_KEYS if key not in meta]
    if missing:
        raise TraceFormatError(f"{path}: trace metadata lacks key {missing[0]!r}")
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise TraceFormatError(f"{path}: trace format version {version!r} is not supported (supported: {supported})")
    return meta


def _check_columns(path: Path, schema: pa.Schema, version: int) -> None:
    for field in SCHEMAS[version]:
        index = schema.get_field_index(field.name)
        if index < 0:
            raise TraceFormatError(f"{path}: column {field.name!r} missing")
        found = schema.field(index).type
        if found != field.type:
            raise TraceFormatError(f"{path}: column {field.name!r} has type {found}, expected {field.type}")


def _open_reader(path: Path) -> ipc.RecordBatchFileReader:
    if not path.exists():
        raise TraceFormatError(f"{path}: no such trace file")
    if path.is_dir():
        raise TraceFormatError(f"{path}: is a directory, not a trace file")
    try:
        return ipc.open_file(pa.memory_map(str(path), "r"))
    except (pa.ArrowException, OSError) as err:
        raise TraceFormatError(f"{path}: not a readable Arrow IPC trace file (corrupt or truncated: "
                               f"{_first_line(err)})") from None


def read_metadata(path: str | os.PathLike) -> dict:
    """Return the validated metadata object of the trace at ``path`` without reading rows.

    Raises TraceFormatError as ``read_trace`` does.
    """
    path = Path(path)
    reader = _open_reader(path)
    meta = _decode_metadata(path, reader.schema)
    _check_columns(path, reader.schema, meta["format_version"])
    return meta


def read_trace(path: str | os.PathLike) -> Trace:
    """Read and validate the trace at ``path``.

    Raises TraceFormatError with a one-line message naming what is wrong:
    a missing file, a file that is not Arrow IPC (corrupt or truncated),
    a missing metadata key, an unsupported format version, a missing
    column or a column of the wrong type.
    """
    path = Path(path)
    reader = _open_reader(path)
    meta = _decode_metadata(path, reader.schema)
    version = meta["format_version"]
    _check_columns(path, reader.schema, version)
    try:
        table = reader.read_all()
        table.validate(full=True)  # offsets and lengths checked, so no later compute reads out of bounds
        table = upgrade(table.select(list(SCHEMAS[version].names)), version)
    except (pa.ArrowException, OSError) as err:
        raise TraceFormatError(f"{path}: record batches are corrupt ({_first_line(err)})") from None
    _check_values(path, table)
    return Trace(path=path, table=table, metadata=meta)


_NON_NEGATIVE = ("dur_ns", "size", "in_flight")


def _check_values(path: Path, table: pa.Table) -> None:
    """Values the schema's types cannot enforce: no nulls in non-nullable columns (Arrow IPC does not
    check them), no negative durations, sizes or depths. Vectorised: one pass per column."""
    for field in SCHEMA:
        if not field.nullable and table.column(field.name).null_count:
            raise TraceFormatError(f"{path}: column {field.name!r} holds nulls")
    for name in _NON_NEGATIVE:
        smallest = pc.min(table.column(name)).as_py()
        if smallest is not None and smallest < 0:
            raise TraceFormatError(f"{path}: column {name!r} holds a negative value ({smallest})")


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
