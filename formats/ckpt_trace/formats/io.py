"""Reading and writing trace files (Arrow IPC file format, zstd batches).

A trace file is readable without ckpt-trace: ``pyarrow.ipc.open_file``,
``pandas.read_feather``, ``polars.read_ipc`` and DuckDB all open it and,
since version 5, read every column as it is meant (version 4 stored three
as differences, ``encoding``: this module still decodes them, and upgrades
older versions, handing readers ``SCHEMA``).

Writing is atomic: a file is written whole, with its final metadata, into a
temporary file of a random name beside the target, made O_EXCL|O_NOFOLLOW
and written through its descriptor (``atomic.AtomicFile``), which is
fsynced and renamed over the final name, then the directory is fsynced. A
writer killed at any point therefore leaves no file or a complete one under
the final name. ``TraceWriter`` spools its record batches to a private file
without a name while rows arrive and writes the trace at ``close`` in one
streaming pass (no metadata placeholder patched in place).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from .arrays import int_values, validity
from .atomic import AtomicFile, make_temporary
from .encoding import Decoder, stored_columns
from .errors import CkptTraceError, TraceFormatError
from .schema import (
    COLUMNS,
    COLUMNS_V5,
    EXTRA_METADATA,
    FORMAT_VERSION,
    METADATA_DEFAULTS,
    METADATA_KEY,
    OPTIONAL_COLUMNS,
    REQUIRED_METADATA_KEYS,
    SCHEMA,
    SCHEMA_V1,
    SCHEMA_V5,
    SCHEMAS,
    SUPPORTED_VERSIONS,
    file_schema,
    optional_field,
    upgrade,
)

DEFAULT_BATCH_ROWS = 65536

# zstd levels, chosen by measurement (formats/README.md, "Compression level": `benchmarks/trace_bytes.py
# --levels`, one run, version 5's plain columns, metadata included). A file of more than one batch is
# written at level 1, Arrow's default: on a generated 1 M-row DCP-like trace it is smaller than levels 3
# and 6 and within 3 % of level 9 (12.09 against 11.77 bytes per row) in a tenth of its time, which
# `record` spends after the traced command has ended.
ZSTD_LEVEL = 1
# A file of one batch (at most DEFAULT_BATCH_ROWS rows: a small trace) is written at level 9: on the
# 7,211-row trace `make demo` records, 12.04 bytes per row against 13.21 at level 1, for hundredths of a
# second (level 19: 11.71 for over a second).
ZSTD_LEVEL_ONE_BATCH = 9
# The spool TraceWriter keeps while rows arrive is read back once: the cheapest level.
SPOOL_ZSTD_LEVEL = 1


def _write_options(level: int, **kwargs: Any) -> ipc.IpcWriteOptions:
    return ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=level), **kwargs)


@dataclass(frozen=True)
class Trace:
    """A validated trace: ``table`` has the columns of ``SCHEMA``, then the optional ones
    (``OPTIONAL_COLUMNS``) the file holds.

    ``metadata`` is the decoded JSON object stored under ``METADATA_KEY``.
    """

    path: Path
    table: pa.Table
    metadata: Mapping[str, Any]

    @property
    def num_rows(self) -> int:
        return self.table.num_rows


RESERVE_BYTES = 16 << 20  # record: space set aside beside the trace before the command starts


def reserve_temporary(path: str | os.PathLike, reserve_bytes: int = 0) -> Path:
    """Create (empty, exclusively, under a random name) the temporary file a ``TraceWriter(path,
    temporary=...)`` will write, so a long job finds out before it starts that its output cannot be
    written. ``reserve_bytes`` are allocated in it with posix_fallocate(3), so a file system without that
    much free space is refused now (creating an empty file succeeds on a full disk); the writer truncates
    the file when it starts writing.

    Returns the temporary path (remove it if the job fails). Raises CkptTraceError with the reason.
    """
    path = Path(path)
    try:
        fd, tmp = make_temporary(path)
    except FileNotFoundError:
        raise CkptTraceError(f"cannot write {path}: directory {path.parent} does not exist") from None
    except OSError as err:
        raise CkptTraceError(f"cannot write {path}: {err.strerror}") from None
    try:
        if reserve_bytes:
            os.posix_fallocate(fd, 0, reserve_bytes)
    except OSError as err:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            free = _free_bytes(path.parent)
            raise CkptTraceError(
                f"cannot write {path}: {err.strerror} ({free / 2**20:.1f} MiB free in "
                f"{path.parent or '.'}; the trace needs at least {reserve_bytes >> 20} MiB)"
            ) from None
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # file systems without fallocate: not checked
            raise CkptTraceError(f"cannot write {path}: {err.strerror}") from None
    else:
        os.close(fd)
    return tmp


def _free_bytes(directory: Path) -> int:
    try:
        info = os.statvfs(directory if str(directory) else ".")
    except OSError:
        return 0
    return info.f_bavail * info.f_frsize


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a new temporary file beside it, fsync, rename, directory fsync;
    ``atomic.AtomicFile``).

    Raises CkptTraceError with a one-line reason on failure; ``path`` is then untouched.
    """
    output = AtomicFile(path)
    try:
        output.write(data)
    except BaseException:
        output.discard()
        raise
    output.commit()


_PROC_FD = Path("/proc/self/fd")


def _private_file(directory: Path, name: str, mode: int) -> tuple[int, Path | None]:
    """A new empty file in ``directory`` that only this process holds: (read-write descriptor, its name).

    Made with O_TMPFILE (open(2)): it has no name, so nothing is left behind if the process dies (name
    None). Where the file system rules that out: a random name made O_EXCL|O_NOFOLLOW
    (``atomic.make_temporary``: never an existing file, nor through a planted link), which the caller
    unlinks. Raises OSError.
    """
    if _PROC_FD.is_dir():
        try:
            return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, mode), None
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    return make_temporary(directory / name, mode)


def _refusal(path: Path, err: OSError) -> CkptTraceError:
    return CkptTraceError(f"cannot write trace {path}: {err.strerror or err}")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (identifies a trace whatever its name)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def table_from_columns(columns: Mapping[str, Any]) -> pa.Table:
    """Build a table of ``SCHEMA`` from a mapping column name -> list of values.

    The columns of version 1 are required; the request and mapping columns
    added in version 2 default to ``interface`` 'syscall' and null. Raises
    TraceFormatError when a column is missing or a value does not fit its type.
    """
    missing = [name for name in SCHEMA_V1.names if name not in columns]
    if missing:
        raise TraceFormatError(f"rows lack column {missing[0]!r}")
    rows = len(columns["ts_ns"])
    filled = {
        name: columns[name] if name in columns else (["syscall"] * rows if name == "interface" else [None] * rows)
        for name in COLUMNS
    }
    try:
        return pa.Table.from_pydict(filled, schema=SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as err:
        raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None


def conform(table: pa.Table) -> pa.Table:
    """``table`` as a version 5 file holds it: ``SCHEMA``'s columns in order, cast, then the optional
    columns (``OPTIONAL_COLUMNS``) it holds, cast to their types; every text column's chunks sharing one
    dictionary (the IPC file format allows one dictionary per column; Arrow columnar format, "Dictionary
    Messages"). Version-1-shaped tables gain the version 2 columns; other columns are left out."""
    optional = _optional_in(table.schema)
    extra = {name: table[name] for name in optional}
    table = _with_all_columns(table)
    for name, column in extra.items():
        if name not in table.column_names:
            table = table.append_column(name, column)
    return table.select(list(COLUMNS) + optional).cast(file_schema(optional)).unify_dictionaries()


def _optional_in(schema: pa.Schema) -> list[str]:
    """The optional columns ``schema`` holds, in its order."""
    return [name for name in schema.names if name in OPTIONAL_COLUMNS]


def _with_all_columns(table: pa.Table) -> pa.Table:
    """``table`` with the columns later versions added: as version 1 (``upgrade``) when it lacks
    ``interface``, else the missing ones null."""
    if "interface" not in table.column_names:
        return upgrade(table.select(list(SCHEMA_V1.names)), 1)
    for field in SCHEMA:
        if field.name not in table.column_names:
            plain = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
            table = table.append_column(field.name, pa.nulls(table.num_rows, plain))
    return table


def _final_metadata(metadata: Mapping[str, Any]) -> bytes:
    """The JSON text stored under ``METADATA_KEY``: ``metadata`` with ``format_version`` set. Raises
    TraceFormatError when a required key is missing."""
    meta = dict(metadata)
    meta["format_version"] = FORMAT_VERSION
    missing = [key for key in REQUIRED_METADATA_KEYS if key not in meta]
    if missing:
        raise TraceFormatError(f"trace metadata lacks key {missing[0]!r}")
    return json.dumps(meta, sort_keys=True).encode()


def _schema_metadata(metadata: Mapping[str, Any], other_keys: Mapping[bytes, bytes] | None) -> dict[bytes, bytes]:
    keys = dict(other_keys or {})
    keys.pop(METADATA_KEY, None)
    return {METADATA_KEY: _final_metadata(metadata), **keys}


def write_trace(
    path: str | os.PathLike,
    table: pa.Table,
    metadata: Mapping[str, Any],
    *,
    overwrite: bool = False,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    other_keys: Mapping[bytes, bytes] | None = None,
    temporary: str | os.PathLike | None = None,
) -> Path:
    """Write ``table`` (of ``SCHEMA``, and any ``OPTIONAL_COLUMNS`` it holds) and ``metadata`` atomically to
    ``path``, as the current format version.

    ``metadata`` must hold every key of ``REQUIRED_METADATA_KEYS`` except
    ``format_version``, which is set here. ``other_keys``: schema-metadata
    keys stored beside ``METADATA_KEY`` (a layout, say). ``temporary`` is a
    file ``reserve_temporary(path)`` made (written and renamed instead of a
    new one). Returns the final path.

    Raises CkptTraceError when ``path`` exists and ``overwrite`` is false,
    when a metadata key is missing, or when the file system refuses the
    write (full disk, permissions); the temporary file is removed then.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise CkptTraceError(f"{path} already exists (use {{option}} to overwrite it)", option="overwrite", switch=True)
    keys = _schema_metadata(metadata, other_keys)
    try:
        table = conform(table).combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
        raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None
    batches = table.to_batches(max_chunksize=max(1, batch_rows))
    final, _ = write_batches_atomically(
        path, table.schema, keys, batches, one_batch=table.num_rows <= max(1, batch_rows), temporary=temporary
    )
    return final


def write_batches_atomically(
    path: Path,
    schema: pa.Schema,
    keys: Mapping[bytes, bytes],
    batches: Iterable[pa.RecordBatch],
    *,
    one_batch: bool,
    temporary: str | os.PathLike | None = None,
) -> tuple[Path, int]:
    """Write ``batches`` (each of ``schema``) as an Arrow IPC file whose schema metadata is ``keys`` to ``path``
    through a temporary file renamed into place (``AtomicFile``; ``temporary``: a file ``reserve_temporary``
    made), each batch one record batch of the file, at zstd level ``ZSTD_LEVEL_ONE_BATCH`` when ``one_batch``
    and ``ZSTD_LEVEL`` otherwise: the one write of ``write_trace`` and ``write_trace_batches``. Returns (final
    path, rows written).

    Raises CkptTraceError when the file system refuses the write; TraceFormatError when a batch is not of
    ``schema`` or a text column changes dictionary between batches. In every failure, whatever ``batches``
    raises included, the temporary file is removed and ``path`` is untouched.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _refusal(path, err) from None
    output = AtomicFile(path, temporary=temporary, what="trace")
    rows = 0
    try:
        with (
            pa.OSFile(output.sink_path, "wb") as sink,
            ipc.new_file(
                sink,
                schema.with_metadata(keys),
                options=_write_options(ZSTD_LEVEL_ONE_BATCH if one_batch else ZSTD_LEVEL),
            ) as writer,
        ):
            for batch in batches:
                if not batch.schema.equals(schema):
                    raise TraceFormatError(f"rows do not fit the trace schema: {batch.schema} is not {schema}")
                try:
                    writer.write_batch(batch)
                except pa.ArrowInvalid as err:  # a dictionary replaced between batches
                    raise TraceFormatError(f"rows do not fit the trace file: {err}") from None
                rows += batch.num_rows
    except OSError as err:
        output.discard()
        raise _refusal(path, err) from None
    except BaseException:
        output.discard()
        raise
    return output.commit(), rows


def _decode_metadata(path: Path, schema: pa.Schema) -> dict:
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise TraceFormatError(
            f"{path}: not a ckpt-trace trace (schema metadata key {METADATA_KEY.decode()!r} missing)"
        )
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
    _check_metadata_types(path, meta)
    return meta


# The type of each metadata key readers use (``None`` allowed where listed); counts are never negative.
_METADATA_TYPES: dict[str, tuple[type, ...]] = {
    "creator": (str,),
    "creator_version": (str,),
    "host": (str,),
    "kernel": (str,),
    "arch": (str,),
    "backend": (str,),
    "backend_reason": (str,),
    "command": (list, type(None)),
    "start_wall_time_ns": (int,),
    "filesystems": (dict,),
    "lost_events": (int,),
    "elapsed_ns": (int,),
    "command_elapsed_ns": (int,),
    "path_filters": (list,),
    "spilled_runs": (int,),
    "truncated_paths": (int,),
    "untracked_fd_ops": (int,),
    "unreaped_requests": (int,),
    "late_events": (int,),
    "exit_code": (int,),
    "exit_signal": (int, type(None)),
    "gpu": (dict,),
    "unseen": (dict,),
    "unattributed": (dict,),
    "provenance": (list,),
    "interrupted": (str, type(None)),
}
_METADATA_COUNTS = (
    "lost_events",
    "elapsed_ns",
    "spilled_runs",
    "truncated_paths",
    "untracked_fd_ops",
    "unreaped_requests",
    "late_events",
)
_TYPE_WORDS = {str: "a string", int: "an integer", list: "a list", dict: "an object", type(None): "null"}


def _check_metadata_types(path: Path, meta: dict) -> None:
    """Raise TraceFormatError naming the key when a metadata value has the wrong type (``_METADATA_TYPES``),
    so a reader never fails later inside its arithmetic."""
    for key, kinds in _METADATA_TYPES.items():
        if key not in meta:
            continue
        value = meta[key]
        if isinstance(value, bool) or not isinstance(value, kinds):
            words = " or ".join(_TYPE_WORDS[kind] for kind in kinds)
            raise TraceFormatError(f"{path}: metadata key {key!r} is {json.dumps(value)[:40]}, not {words}")
        if key in _METADATA_COUNTS and value < 0:
            raise TraceFormatError(f"{path}: metadata key {key!r} is {value}, a negative count")
    if isinstance(meta.get("command"), list) and not all(isinstance(word, str) for word in meta["command"]):
        raise TraceFormatError(f"{path}: metadata key 'command' is not a list of strings")


def _check_columns(path: Path, schema: pa.Schema, version: int) -> None:
    fields = list(SCHEMAS[version]) + ([optional_field(name) for name in _optional_in(schema)] if version >= 5 else [])
    for field in fields:
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
        raise TraceFormatError(
            f"{path}: not a readable Arrow IPC trace file (corrupt or truncated: {_first_line(err)})"
        ) from None


def read_metadata(path: str | os.PathLike) -> dict:
    """Return the validated metadata object of the trace at ``path`` without reading rows.

    Raises TraceFormatError as ``read_trace`` does.
    """
    path = Path(path)
    reader = _open_reader(path)
    meta = _decode_metadata(path, reader.schema)
    _check_columns(path, reader.schema, meta["format_version"])
    return meta


def count_rows(path: str | os.PathLike) -> int:
    """The number of rows of the trace at ``path``, from its record batches' headers (no column is read or
    decompressed). Raises TraceFormatError as ``read_metadata`` does."""
    path = Path(path)
    try:
        with pa.OSFile(str(path)) as source:
            reader = ipc.open_file(source, options=ipc.IpcReadOptions(included_fields=[0]))
            if hasattr(reader, "count_rows"):  # pyarrow >= 17
                return reader.count_rows()
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
    except (pa.ArrowException, OSError) as err:
        raise TraceFormatError(f"{path}: not a readable trace ({_first_line(err)})") from None


def read_extra_metadata(path: str | os.PathLike) -> dict:
    """The optional metadata keys (``EXTRA_METADATA``) the trace at ``path`` holds, {key: value}; those it
    lacks are absent. Reads the schema only. Raises TraceFormatError as ``read_metadata`` does."""
    meta = read_metadata(path)
    return {key: meta[key] for key in EXTRA_METADATA if key in meta}


def read_trace(path: str | os.PathLike) -> Trace:
    """Read and validate the trace at ``path``: ``SCHEMA``'s columns, then the optional columns
    (``OPTIONAL_COLUMNS``) the file holds.

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
    optional = _optional_in(reader.schema) if version >= 5 else []
    try:
        if version == 4:
            decoder = Decoder()
            table = upgrade(
                pa.Table.from_batches(
                    [
                        _decoded(reader.get_batch(index), decoder, list(COLUMNS_V5))
                        for index in range(reader.num_record_batches)
                    ],
                    schema=SCHEMA_V5,
                ),
                version,
            )
        else:
            table = reader.read_all()
            _validate(table)  # offsets, lengths and dictionary indices checked: no later compute reads out of bounds
            names = list(SCHEMAS[version].names)
            table = upgrade(table.select(names + optional).replace_schema_metadata(None), version)
    except (pa.ArrowException, OSError) as err:
        raise TraceFormatError(f"{path}: record batches are corrupt ({_first_line(err)})") from None
    _check_values(path, table)
    return Trace(path=path, table=table, metadata=meta)


_NON_NEGATIVE = ("dur_ns", "size", "in_flight")


def _check_values(path: Path, table: pa.Table | pa.RecordBatch) -> None:
    """Values the schema's types cannot enforce: no nulls in non-nullable columns (Arrow IPC does not
    check them), no negative durations, sizes or depths. Vectorised: one pass per column present."""
    names = set(table.schema.names)
    for field in SCHEMA:
        if field.name in names and not field.nullable and table.column(field.name).null_count:
            raise TraceFormatError(f"{path}: column {field.name!r} holds nulls")
    for name in _NON_NEGATIVE:
        if name not in names:
            continue
        smallest = pc.min(table.column(name)).as_py()
        if smallest is not None and smallest < 0:
            raise TraceFormatError(f"{path}: column {name!r} holds a negative value ({smallest})")


def _loaded(load: Callable[[int], pa.RecordBatch], count: int, read_ahead: bool) -> Iterator[pa.RecordBatch]:
    """``load(0)`` .. ``load(count - 1)`` in order; with ``read_ahead``, each next one decompresses on a
    worker thread while the caller works on the current one."""
    if not read_ahead:
        yield from (load(index) for index in range(count))
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-trace-scan") as pool:
        ahead = pool.submit(load, 0) if count else None
        for index in range(count):
            assert ahead is not None  # submitted for every index below count
            whole = ahead.result()
            ahead = pool.submit(load, index + 1) if index + 1 < count else None
            yield whole


def scan(
    path: str | os.PathLike,
    columns: list[str] | tuple[str, ...] | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    on_batch: Callable[[int, int], None] | None = None,
    read_ahead: bool = True,
) -> tuple[dict, Generator[pa.RecordBatch, None, None]]:
    """(metadata, record batches) of the trace at ``path``, reading only ``columns`` one batch at a time:
    memory is bounded by a batch, not by the trace. ``columns`` None: ``SCHEMA``'s, then the optional
    columns the file holds; an optional column asked for by name comes null where the file lacks it.
    The file is read, not mapped (mapped pages
    would count as the reader's memory), by Arrow's IPC file reader, which reads and decompresses only the
    columns asked for (``IpcReadOptions.included_fields``), the next file batch on a helper thread while
    this one is worked on; a file batch longer than ``batch_rows`` comes in zero-copy slices. (pyarrow 26's
    dataset scanner over IPC files crashed the process now and then.) Batches of versions 1 to 3 come
    upgraded to the current schema, version 4 batches decoded (``encoding``: the columns a decoded one
    needs are read too); each batch's values are checked as ``read_trace`` checks them. Raises
    TraceFormatError (at once for the file, the metadata
    and the columns; while iterating for a corrupt batch). ``on_batch(done, count)`` is called once each
    of the file's ``count`` record batches has been handed out (a progress bar's feed). ``read_ahead``
    False: no helper thread, each file batch is read when the iteration reaches it (a caller that holds
    one batch of each of many traces, ``merge``, would otherwise hold two, and prefetches itself).
    """
    path = Path(path)
    meta = read_metadata(path)
    version = meta["format_version"]
    file_names = _open_reader(path).schema.names
    in_file = [name for name in file_names if name in OPTIONAL_COLUMNS] if version >= 5 else []
    asked = list(columns) if columns is not None else list(COLUMNS) + in_file
    unknown = [name for name in asked if name not in COLUMNS and name not in OPTIONAL_COLUMNS]
    if unknown:
        raise TraceFormatError(f"no column {unknown[0]!r} in the trace schema")
    wanted = [name for name in asked if name not in OPTIONAL_COLUMNS]
    logical = [name for name in wanted if name in COLUMNS_V5]  # a version 4 file's (cold_bytes: null)
    if version == 4:
        present, stored = list(logical), stored_columns(logical)
    else:
        present = [name for name in wanted if name in SCHEMAS[version].names]
        stored = list(present)
    optional_present = [name for name in asked if name in in_file]
    stored += optional_present
    present = [name for name in asked if name in set(present + optional_present)]  # in the order asked
    missing = [name for name in asked if name not in present]  # added after the file's version, or absent

    def batches() -> Generator[pa.RecordBatch, None, None]:
        decoder = Decoder() if version == 4 else None
        try:
            with pa.OSFile(str(path)) as source:
                names = ipc.open_file(source).schema.names
                options = ipc.IpcReadOptions(included_fields=sorted(names.index(name) for name in stored))
                reader = ipc.open_file(source, options=options)
                count = reader.num_record_batches

                def load(index: int) -> pa.RecordBatch:  # in file order: one worker, one batch ahead
                    whole = reader.get_batch(index)
                    return whole if decoder is None else _decoded(whole, decoder, logical)

                for index, whole in enumerate(_loaded(load, count, read_ahead)):
                    yield from _slices(
                        path,
                        whole,
                        [n for n in present if n in whole.schema.names],
                        batch_rows,
                        missing,
                        version,
                        asked,
                        validated=decoder is not None,
                    )
                    if on_batch is not None:
                        on_batch(index + 1, count)
        except (pa.ArrowException, OSError) as err:
            raise TraceFormatError(f"{path}: record batches are corrupt ({_first_line(err)})") from None

    return meta, batches()


def _decoded(batch: pa.RecordBatch, decoder: Decoder, wanted: list[str]) -> pa.RecordBatch:
    """A version 4 file batch, validated (before decoding reads it), as the logical columns ``wanted``."""
    _validate(batch)
    return decoder.decode(batch, wanted, SCHEMA)


def _slices(
    path: Path,
    whole: pa.RecordBatch,
    present: list[str],
    batch_rows: int,
    missing: list[str],
    version: int,
    wanted: list[str],
    *,
    validated: bool = False,
) -> Iterator[pa.RecordBatch]:
    """A file's record batch in checked slices of at most ``batch_rows`` rows (zero-copy)."""
    for start in range(0, max(whole.num_rows, 1), batch_rows):
        batch = whole.slice(start, batch_rows).select(present)
        if not validated:
            _validate(batch)
        if missing or version < 3:
            batch = _upgrade_batch(batch, version, wanted)
        _check_values(path, batch)
        yield batch


def _validate(data: pa.RecordBatch | pa.Table) -> None:
    """``data.validate(full=True)`` at a fraction of its cost: a dictionary column's indices are checked
    against its dictionary by their smallest and largest value (one ``min_max`` per chunk) rather than one
    by one, which Arrow's full validation does (0.14 ms per 65,536-row column, a third of scanning the
    planner's columns). Raises pa.ArrowInvalid as ``validate`` does."""
    data.validate()
    for column in data.columns:
        for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else (column,):
            if not pa.types.is_dictionary(chunk.type):
                chunk.validate(full=True)  # integers: nothing beyond the cheap checks; strings: UTF-8, offsets
                continue
            chunk.dictionary.validate(full=True)
            if len(chunk) - chunk.null_count:
                bounds = pc.min_max(chunk.indices)
                if bounds["min"].as_py() < 0 or bounds["max"].as_py() >= len(chunk.dictionary):
                    raise pa.ArrowInvalid(
                        f"dictionary index out of bounds ({bounds['min']}..{bounds['max']} "
                        f"for {len(chunk.dictionary)} values)"
                    )


def _field(name: str) -> pa.Field:
    """The field of a column of ``SCHEMA`` or of ``OPTIONAL_COLUMNS``."""
    return SCHEMA.field(name) if name in COLUMNS else optional_field(name)


def _upgrade_batch(batch: pa.RecordBatch, version: int, wanted: list[str]) -> pa.RecordBatch:
    """A batch of an older version (or lacking optional columns) with the current types and the columns
    ``wanted``, in that order: those it lacks as their version-1 defaults or null."""
    full = (
        upgrade(
            pa.Table.from_batches([batch]).select(
                [name for name in SCHEMAS[version].names if name in batch.schema.names] or []
            ),
            version,
        )
        if all(name in batch.schema.names for name in SCHEMAS[version].names)
        else None
    )
    columns = []
    for name in wanted:
        field = _field(name)
        if full is not None and name in full.column_names:
            columns.append(full[name].combine_chunks())
        elif name in batch.schema.names:
            columns.append(batch.column(name).cast(field.type))
        elif name == "interface":
            columns.append(pa.array(["syscall"] * batch.num_rows, pa.string()).cast(field.type))
        else:
            columns.append(
                pa.nulls(
                    batch.num_rows, field.type.value_type if pa.types.is_dictionary(field.type) else field.type
                ).cast(field.type)
            )
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema([_field(name) for name in wanted]))


class TraceWriter:
    """Writes a trace batch by batch in bounded memory, atomically like ``write_trace``.

    Call order: ``TraceWriter(path, overwrite=..., optional_columns=...)``,
    ``write(table)`` any number of times (tables or batches of ``SCHEMA``'s
    columns, text columns as strings or dictionaries), then
    ``close(metadata)``, which returns the final path; ``abort()`` after a
    failure removes what was written (never ``path`` itself).

    Rows are held until more than a batch of ``batch_rows`` has come (zstd
    compresses a full batch better than many small ones); each full batch is
    then spooled: appended, as an Arrow IPC stream at zstd level
    ``SPOOL_ZSTD_LEVEL``, to a private file of the output's directory that
    has no name (``_private_file``), so memory stays bounded by a batch and
    a writer killed at any point leaves nothing behind. Text columns are
    encoded against one dictionary per column that grows as values arrive.
    ``close`` writes the trace in one streaming pass, batch by batch out of
    the spool, with the metadata it is given written once (no placeholder),
    every text column's batches referring to its one final dictionary (no
    dictionary deltas, which polars refuses), into a temporary file renamed
    over ``path`` as ``write_trace`` does. A trace of at most one batch never touches the
    spool and is written at zstd level ``ZSTD_LEVEL_ONE_BATCH``, a longer one
    at ``ZSTD_LEVEL``.

    ``optional_columns``: the ``OPTIONAL_COLUMNS`` the file stores, in that
    order (None: those the first rows written hold); rows lacking one store
    null. ``temporary``: the file ``reserve_temporary(path)`` made, which
    ``close`` writes and renames (``abort`` removes it).

    Raises CkptTraceError when ``path`` exists and ``overwrite`` is false, or
    when the file system refuses the write; TraceFormatError for rows that do
    not fit the schema (or hold an optional column the file does not store)
    or metadata that lacks a required key.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        overwrite: bool = False,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        optional_columns: Iterable[str] | None = None,
        temporary: str | os.PathLike | None = None,
    ) -> None:
        self.path = Path(path)
        self._temporary = temporary  # reserve_temporary's file, written and renamed by close
        self._declared: pa.Schema | None = None  # the file's schema, once its optional columns are known
        if optional_columns is not None:
            optional_columns = tuple(optional_columns)
            unknown = [name for name in optional_columns if name not in OPTIONAL_COLUMNS]
            if unknown:
                raise TraceFormatError(f"no optional column {unknown[0]!r} in the trace schema")
        if self.path.exists() and not overwrite:
            raise CkptTraceError(
                f"{self.path} already exists (use {{option}} to overwrite it)", option="overwrite", switch=True
            )
        self.overwrite = overwrite
        self.batch_rows = max(1, batch_rows)
        self.rows = 0
        self._text: tuple[str, ...] = ()
        self._values: dict[str, list[str]] = {}
        self._index: dict[str, dict[str, int]] = {}
        self._pending: list[pa.Table] = []  # rows not yet spooled, text as strings
        self._pending_rows = 0
        self._spooled = 0  # batches in the spool
        self._spool_writer: ipc.RecordBatchStreamWriter | None = None
        self._spool_sink: pa.PythonFile | None = None
        self._spool_fd = -1
        if optional_columns is not None:
            self._set_schema(optional_columns)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._spool_fd, named = _private_file(self.path.parent, self.path.name, 0o600)
            if named is not None:
                named.unlink()  # read back through the descriptor: the spool needs no name
        except OSError as err:
            self.abort()
            raise CkptTraceError(f"cannot write trace {self.path}: {err.strerror or err}") from None

    @property
    def _schema(self) -> pa.Schema:
        if self._declared is None:
            self._set_schema(())
        return self._declared

    def _set_schema(self, optional: Iterable[str]) -> None:
        self._declared = file_schema(tuple(optional))
        self._text = tuple(field.name for field in self._schema if pa.types.is_dictionary(field.type))
        # Each dictionary starts with "": Arrow takes an empty dictionary followed by a longer one for a
        # replacement, where a non-empty prefix makes a delta (the spool's stream carries deltas).
        self._values = {name: [""] for name in self._text}
        self._index = {name: {"": 0} for name in self._text}
        self._luts: dict[str, tuple] = {}  # per text column: the last chunk dictionary's numbers (``_encode``)

    def _encode(self, name: str, column: pa.ChunkedArray | pa.Array) -> pa.Array:
        """``column`` (dictionary chunks, ``write`` made them so) as indices into this writer's growing
        dictionary of ``name``: each chunk's dictionary is looked up once (a table of its values' numbers,
        kept while the next chunk brings the same dictionary) and its indices renumbered through it, so no
        value is decoded row by row."""
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        index, values = self._index[name], self._values[name]
        parts = []
        for chunk in chunks:
            if not pa.types.is_dictionary(chunk.type):
                chunk = pc.dictionary_encode(chunk.cast(pa.string()))
            words = chunk.dictionary
            key = (words.buffers()[-1].address if words.buffers()[-1] is not None else 0, len(words), words.offset)
            cached = self._luts.get(name)
            if cached is None or cached[0] != key or not cached[2].equals(words):
                lut = np.empty(len(words), np.int64)
                for i, word in enumerate(words.cast(pa.string()).to_pylist()):
                    if word is None:
                        lut[i] = -1
                        continue
                    number = index.get(word)
                    if number is None:
                        number = index[word] = len(values)
                        values.append(word)
                    lut[i] = number
                self._luts[name] = cached = (key, lut, words)
            lut = cached[1]
            valid = validity(chunk.indices)
            numbers = (
                lut[int_values(chunk.indices.fill_null(0)).astype(np.int64)]
                if len(lut)
                else np.full(len(chunk), -1, np.int64)
            )
            null = ~valid | (numbers < 0)
            # 0, not -1, under a null: Arrow ignores it, but polars refuses any index outside the dictionary
            parts.append(pa.array(np.where(null, 0, numbers).astype(np.int32), pa.int32(), mask=null))
        indices = pa.concat_arrays(parts) if parts else pa.array([], pa.int32())
        return pa.DictionaryArray.from_arrays(indices, pa.array(values, pa.string()))

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        """Append rows (of ``SCHEMA``'s columns and the file's optional ones; rows of an older version's
        shape gain the later columns' defaults)."""
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        optional = _optional_in(table.schema)
        if self._declared is None:
            self._set_schema(optional)
        undeclared = [name for name in optional if self._schema.get_field_index(name) < 0]
        if undeclared:
            raise TraceFormatError(
                f"rows hold optional column {undeclared[0]!r}, which this trace does not store "
                "(TraceWriter(optional_columns=...))"
            )
        extra = {name: table[name] for name in optional}
        table = _with_all_columns(table)
        arrays = []
        try:
            for field in self._schema:
                column = table[field.name] if field.name in table.column_names else extra.get(field.name)
                if column is None:
                    plain = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
                    column = pa.nulls(table.num_rows, plain)
                arrays.append(_as_dictionary(column) if field.name in self._text else column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
            raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None
        self._pending.append(pa.Table.from_arrays(arrays, names=self._schema.names))
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        while self._pending_rows > self.batch_rows:
            self._spool(self._next_batch())

    def _next_batch(self) -> pa.RecordBatch:
        """Up to ``batch_rows`` of the pending rows as one record batch of the file's schema."""
        pending = pa.concat_tables(self._pending)
        head, rest = pending.slice(0, self.batch_rows), pending.slice(self.batch_rows)
        try:
            arrays = [
                self._encode(f.name, head[f.name]) if f.name in self._text else head[f.name].combine_chunks()
                for f in self._schema
            ]
            batch = pa.RecordBatch.from_arrays(arrays, schema=self._schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
            raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows
        return batch

    def _spool(self, batch: pa.RecordBatch) -> None:
        try:
            if self._spool_writer is None:
                self._spool_sink = pa.PythonFile(os.fdopen(os.dup(self._spool_fd), "wb", buffering=1 << 20), mode="w")
                self._spool_writer = ipc.new_stream(
                    self._spool_sink,
                    self._schema,
                    options=_write_options(SPOOL_ZSTD_LEVEL, emit_dictionary_deltas=True, unify_dictionaries=False),
                )
            writer = self._spool_writer
            assert writer is not None  # made just above
            writer.write_batch(batch)
        except OSError as err:
            self.abort()
            raise CkptTraceError(f"cannot write trace {self.path}: {err.strerror or err}") from None
        self._spooled += 1

    def _unspooled(self) -> Iterator[pa.RecordBatch]:
        """The spooled batches in order, each text column over its final dictionary (one per column)."""
        dictionaries = {name: pa.array(self._values[name], pa.string()) for name in self._text}
        os.lseek(self._spool_fd, 0, os.SEEK_SET)
        with os.fdopen(os.dup(self._spool_fd), "rb", buffering=1 << 20) as handle:
            for batch in ipc.open_stream(pa.PythonFile(handle, mode="r")):
                # a batch's indices point into a prefix of the final dictionary (dictionaries only grow)
                arrays = [
                    pa.DictionaryArray.from_arrays(column.indices, dictionaries[field.name])
                    if field.name in dictionaries
                    else column
                    for field, column in zip(self._schema, batch.columns)
                ]
                yield pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    def close(self, metadata: Mapping[str, Any], *, other_keys: Mapping[bytes, bytes] | None = None) -> Path:
        """Write the file with ``metadata`` (every ``REQUIRED_METADATA_KEYS`` key but ``format_version``) and
        ``other_keys`` (schema-metadata keys stored beside ``METADATA_KEY``), fsync it and rename it over
        ``path``. Returns the final path."""
        try:
            keys = _schema_metadata(metadata, other_keys)
        except TraceFormatError:
            self.abort()
            raise
        output = None
        try:
            if self._spooled:
                while self._pending_rows:
                    self._spool(self._next_batch())
                assert self._spool_writer is not None and self._spool_sink is not None  # made by the first _spool
                self._spool_writer.close()
                self._spool_sink.close()  # flushed: read back through another descriptor
                self._spool_writer = self._spool_sink = None
                level, batches = ZSTD_LEVEL, self._unspooled()
            else:  # at most one batch: written straight
                level, batches = ZSTD_LEVEL_ONE_BATCH, [self._next_batch()] if self._pending_rows else []
            output = AtomicFile(self.path, temporary=self._temporary, what="trace")
            self._temporary = None  # AtomicFile's now
            with (
                pa.OSFile(output.sink_path, "wb") as sink,
                ipc.new_file(sink, self._schema.with_metadata(keys), options=_write_options(level)) as writer,
            ):
                for batch in batches:
                    writer.write_batch(batch)
        except OSError as err:
            if output is not None:
                output.discard()
            self.abort()
            raise _refusal(self.path, err) from None
        except BaseException:
            if output is not None:
                output.discard()
            self.abort()
            raise
        self.abort()  # the spool's descriptor
        return output.commit()

    def abort(self) -> None:
        """Remove what this writer wrote (never ``path`` itself): its spool, which has no name, goes with
        its descriptor; the reserved ``temporary`` file, if ``close`` did not take it."""
        if self._temporary is not None:
            Path(self._temporary).unlink(missing_ok=True)
            self._temporary = None
        if self._spool_writer is not None:
            try:
                self._spool_writer.close()
            except (pa.ArrowException, OSError):
                pass
            self._spool_writer = None
        if self._spool_sink is not None:
            try:
                self._spool_sink.close()
            except (pa.ArrowException, OSError, ValueError):
                pass
            self._spool_sink = None
        if self._spool_fd >= 0:
            os.close(self._spool_fd)
            self._spool_fd = -1


_TEXT_DICTIONARY = pa.dictionary(pa.int32(), pa.string())


def _as_dictionary(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A text column as ``dictionary<int32, string>`` (dictionary input kept, its chunks' dictionaries as they
    are; plain text dictionary-encoded), so pending rows never decode their text."""
    if pa.types.is_dictionary(column.type):
        return column.cast(_TEXT_DICTIONARY)
    return pc.dictionary_encode(column.cast(pa.string())).cast(_TEXT_DICTIONARY)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
