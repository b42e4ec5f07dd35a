"""Reading and writing trace files (Arrow IPC file format, zstd batches).

A trace file is readable without ckpt-trace: ``pyarrow.ipc.open_file``,
``pandas.read_feather``, ``polars.read_ipc`` and DuckDB all open it and,
since version 5, read every column as it is meant (version 4 stored three
as differences, ``encoding``: this module still decodes them and upgrades
older versions, handing readers ``SCHEMA``).

Writing is atomic: rows go to a hidden temporary file beside the target,
which is fsynced and renamed over the final name, then the directory is
fsynced (rename(2), fsync(2)). A writer killed at any point therefore
leaves either no file or a complete one under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from .encoding import Decoder, stored_columns
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
    TEXT_COLUMNS,
    upgrade,
)

DEFAULT_BATCH_ROWS = 65536

# zstd levels, chosen by measurement (formats/README.md, "Compression level"; one run each, version 5's
# plain columns): a file of more than one batch is written at level 1, Arrow's default: on a generated
# 1 M-row DCP-like trace level 1 is the smallest of 1, 3, 6 and 9 but for 9 (12.1 against 11.8 bytes per
# row) and the fastest (0.3 against 1.6 us per row), and `record` writes the file after the command ends,
# so a 10 M-row trace would wait 13 s more at level 9.
ZSTD_LEVEL = 1
# A file of one batch (at most DEFAULT_BATCH_ROWS rows: a small trace) is written at level 9: on the
# 7,211-row trace `make demo` records, 11.6 bytes per row against 12.8 at level 1, for 0.07 s against
# 0.02 s (level 19: 11.3 for 1.3 s).
ZSTD_LEVEL_ONE_BATCH = 9


def _write_options(level: int, **kwargs: Any) -> ipc.IpcWriteOptions:
    return ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=level), **kwargs)


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
    table = _with_all_columns(table)
    return table.select(list(COLUMNS)).cast(SCHEMA).unify_dictionaries()


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
        table = conform(table).combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
        raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None
    tmp = _temporary_name(path)
    options = _write_options(ZSTD_LEVEL_ONE_BATCH if table.num_rows <= max(1, batch_rows) else ZSTD_LEVEL)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema, options=options) as writer:
            for batch in table.to_batches(max_chunksize=max(1, batch_rows)):
                writer.write_batch(batch)
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


def count_rows(path: str | os.PathLike) -> int:
    """The number of rows of the trace at ``path``, from its record batches' headers (no column is read or
    decompressed). Raises TraceFormatError as ``read_metadata`` does."""
    path = Path(path)
    try:
        with pa.OSFile(str(path)) as source:
            return ipc.open_file(source, options=ipc.IpcReadOptions(included_fields=[0])).count_rows()
    except (pa.ArrowException, OSError) as err:
        raise TraceFormatError(f"{path}: not a readable trace ({_first_line(err)})") from None


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
        if version == 4:
            decoder = Decoder()
            table = pa.Table.from_batches([_decoded(reader.get_batch(index), decoder, list(COLUMNS))
                                           for index in range(reader.num_record_batches)], schema=SCHEMA)
        else:
            table = reader.read_all()
            _validate(table)  # offsets, lengths and dictionary indices checked: no later compute reads out of bounds
            table = upgrade(table.select(list(SCHEMAS[version].names)), version)
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


def scan(path: str | os.PathLike, columns: list[str] | tuple[str, ...] | None = None, *,
         batch_rows: int = DEFAULT_BATCH_ROWS,
         on_batch: Callable[[int, int], None] | None = None) -> tuple[dict, Iterator[pa.RecordBatch]]:
    """(metadata, record batches) of the trace at ``path``, reading only ``columns`` (all when None) one batch
    at a time: memory is bounded by a batch, not by the trace. The file is read, not mapped (mapped pages
    would count as the reader's memory), by Arrow's IPC file reader, which reads and decompresses only the
    columns asked for (``IpcReadOptions.included_fields``), the next file batch on a helper thread while
    this one is worked on; a file batch longer than ``batch_rows`` comes in zero-copy slices. (pyarrow 26's
    dataset scanner over IPC files crashed the process now and then.) Version 1 batches come upgraded to
    the current schema, version 4 batches decoded (``encoding``: the columns a decoded one needs are read
    too); each batch's values are checked as ``read_trace`` checks them. Raises
    TraceFormatError (at once for the file, the metadata
    and the columns; while iterating for a corrupt batch). ``on_batch(done, count)`` is called once each
    of the file's ``count`` record batches has been handed out (a progress bar's feed).
    """
    path = Path(path)
    meta = read_metadata(path)
    version = meta["format_version"]
    wanted = list(columns) if columns is not None else list(COLUMNS)
    unknown = [name for name in wanted if name not in COLUMNS]
    if unknown:
        raise TraceFormatError(f"no column {unknown[0]!r} in the trace schema")
    if version == 4:
        present, missing, stored = wanted, [], stored_columns(wanted)
    else:
        present = [name for name in wanted if name in SCHEMAS[version].names]
        missing = [name for name in wanted if name not in present]  # added after the file's version
        stored = present

    def batches() -> Iterator[pa.RecordBatch]:
        decoder = Decoder() if version == 4 else None
        try:
            with pa.OSFile(str(path)) as source:
                names = ipc.open_file(source).schema.names
                options = ipc.IpcReadOptions(included_fields=sorted(names.index(name) for name in stored))
                reader = ipc.open_file(source, options=options)
                count = reader.num_record_batches

                def load(index: int) -> pa.RecordBatch:  # in file order: one worker, one batch ahead
                    whole = reader.get_batch(index)
                    return whole if decoder is None else _decoded(whole, decoder, wanted)

                with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-trace-scan") as pool:
                    ahead = pool.submit(load, 0) if count else None
                    for index in range(count):
                        whole = ahead.result()  # the next one decompresses while this one is worked on
                        ahead = pool.submit(load, index + 1) if index + 1 < count else None
                        yield from _slices(path, whole, present, batch_rows, missing, version, wanted,
                                           validated=decoder is not None)
                        if on_batch is not None:
                            on_batch(index + 1, count)
        except (pa.ArrowException, OSError) as err:
            raise TraceFormatError(f"{path}: record batches are corrupt ({_first_line(err)})") from None

    return meta, batches()


def _decoded(batch: pa.RecordBatch, decoder: Decoder, wanted: list[str]) -> pa.RecordBatch:
    """A version 4 file batch, validated (before decoding reads it), as the logical columns ``wanted``."""
    _validate(batch)
    return decoder.decode(batch, wanted, SCHEMA)


def _slices(path: Path, whole: pa.RecordBatch, present: list[str], batch_rows: int, missing: list[str],
            version: int, wanted: list[str], *, validated: bool = False) -> Iterator[pa.RecordBatch]:
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
                    raise pa.ArrowInvalid(f"dictionary index out of bounds ({bounds['min']}..{bounds['max']} "
                                          f"for {len(chunk.dictionary)} values)")


def _upgrade_batch(batch: pa.RecordBatch, version: int, wanted: list[str]) -> pa.RecordBatch:
    """A batch of an older version with the current types and the columns ``wanted``, in that order."""
    full = upgrade(pa.Table.from_batches([batch]).select(
        [name for name in SCHEMAS[version].names if name in batch.schema.names] or []), version) \
        if all(name in batch.schema.names for name in SCHEMAS[version].names) else None
    columns = []
    for name in wanted:
        field = SCHEMA.field(name)
        if full is not None:
            columns.append(full[name].combine_chunks())
        elif name in batch.schema.names:
            columns.append(batch.column(name).cast(field.type))
        elif name == "interface":
            columns.append(pa.array(["syscall"] * batch.num_rows, pa.string()).cast(field.type))
        else:
            columns.append(pa.nulls(batch.num_rows, field.type.value_type if pa.types.is_dictionary(field.type)
                                    else field.type).cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema([SCHEMA.field(name) for name in wanted]))


class TraceWriter:
    """Writes a trace batch by batch in bounded memory, atomically like ``write_trace``.

    Call order: ``TraceWriter(path, overwrite=...)``, ``write(table)`` any
    number of times (tables or batches of ``SCHEMA``'s columns, text columns
    as strings or dictionaries), then ``close(metadata)``, which returns the
    final path; ``abort()`` after a failure removes what was written.

    Text columns are encoded against one dictionary per column that grows
    as values arrive; each batch carries the dictionary so far and the file
    stores only what is new (IPC dictionary deltas, which the file format
    allows). Rows are held until a whole batch of ``batch_rows`` has come
    (zstd compresses a full batch better than many small ones), so memory
    stays bounded by a batch. A trace of one batch is written whole by
    ``close``, metadata and all, at zstd level ``ZSTD_LEVEL_ONE_BATCH``. For
    a longer one the metadata is known only at the end, so the schema is written
    with a fixed-size placeholder (8 KiB) that ``close`` overwrites in place, in the
    schema message and in the footer; metadata longer than the placeholder
    is written by copying the file once more, batch by batch.

    Raises CkptTraceError when ``path`` exists and ``overwrite`` is false, or
    when the file system refuses the write; TraceFormatError for rows that do
    not fit the schema or metadata that lacks a required key.
    """

    _RESERVED_BYTES = 8 << 10  # metadata that does not fit costs one more copy of the file (``_rewrite``)

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False,
                 batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise CkptTraceError(f"{self.path} already exists (use --force to overwrite it)")
        self.batch_rows = max(1, batch_rows)
        self.rows = 0
        self._tmp = _temporary_name(self.path)
        self._marker = os.urandom(12).hex()
        self._placeholder = self._padded({"pending": self._marker}, self._RESERVED_BYTES)
        # Each dictionary starts with "": Arrow takes an empty dictionary followed by a longer one for a
        # replacement, which the file format refuses, where a non-empty prefix makes a delta.
        self._values: dict[str, list[str]] = {name: [""] for name in TEXT_COLUMNS}
        self._index: dict[str, dict[str, int]] = {name: {"": 0} for name in TEXT_COLUMNS}
        self._pending: list[pa.Table] = []  # rows not yet written: fewer than batch_rows, text as strings
        self._pending_rows = 0
        self._writer: ipc.RecordBatchFileWriter | None = None  # opened by the first batch, or by close
        self._level = ZSTD_LEVEL
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._sink = pa.OSFile(str(self._tmp), "wb")
        except OSError as err:
            self._tmp.unlink(missing_ok=True)
            raise CkptTraceError(f"cannot write trace {self.path}: {err.strerror or err}") from None

    def _open(self, metadata: bytes, level: int) -> None:
        self._level = level
        self._writer = ipc.new_file(self._sink, SCHEMA.with_metadata({METADATA_KEY: metadata}),
                                    options=_write_options(level, emit_dictionary_deltas=True,
                                                           unify_dictionaries=False))

    @staticmethod
    def _padded(obj: dict, size: int) -> bytes:
        text = json.dumps(obj, sort_keys=True).encode()
        return text + b" " * (size - len(text)) if len(text) <= size else text

    def _encode(self, name: str, column: pa.ChunkedArray | pa.Array) -> pa.Array:
        """``column`` as indices into this writer's growing dictionary of ``name``."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        column = column.cast(pa.string())
        index, values = self._index[name], self._values[name]
        for value in pc.unique(column.drop_null()).to_pylist():
            if value not in index:
                index[value] = len(values)
                values.append(value)
        dictionary = pa.array(values, pa.string())
        indices = pc.index_in(column, value_set=dictionary).cast(pa.int32())
        return pa.DictionaryArray.from_arrays(indices, dictionary)

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        """Append rows (of ``SCHEMA``'s columns; rows of an older version's shape gain the later columns' defaults)."""
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        table = _with_all_columns(table)
        try:
            arrays = [table[f.name].cast(pa.string()) if f.name in TEXT_COLUMNS else table[f.name].cast(f.type)
                      for f in SCHEMA]
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
            raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None
        self._pending.append(pa.Table.from_arrays(arrays, names=list(COLUMNS)))
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        while self._pending_rows >= self.batch_rows:
            self._flush()

    def _flush(self) -> None:
        """Write up to ``batch_rows`` of the pending rows as one record batch."""
        pending = pa.concat_tables(self._pending)
        head, rest = pending.slice(0, self.batch_rows), pending.slice(self.batch_rows)
        try:
            arrays = [self._encode(f.name, head[f.name]) if f.name in TEXT_COLUMNS else head[f.name].combine_chunks()
                      for f in SCHEMA]
            batch = pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
            raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None
        try:
            if self._writer is None:  # more rows than one batch: the metadata comes at close, into a placeholder
                self._open(self._placeholder, ZSTD_LEVEL)
            self._writer.write_batch(batch)
        except OSError as err:
            self.abort()
            raise CkptTraceError(f"cannot write trace {self.path}: {err.strerror or err}") from None
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def close(self, metadata: Mapping[str, Any]) -> Path:
        """Finish the file with ``metadata`` (every ``REQUIRED_METADATA_KEYS`` key but ``format_version``),
        fsync it and rename it over ``path``. Returns the final path."""
        meta = dict(metadata)
        meta["format_version"] = FORMAT_VERSION
        missing = [key for key in REQUIRED_METADATA_KEYS if key not in meta]
        if missing:
            self.abort()
            raise TraceFormatError(f"trace metadata lacks key {missing[0]!r}")
        try:
            one_batch = self._writer is None  # every row is pending: the file is one batch, the metadata known
            if one_batch:
                self._open(json.dumps(meta, sort_keys=True).encode(), ZSTD_LEVEL_ONE_BATCH)
            if self._pending_rows:
                self._flush()
            self._writer.close()
            self._sink.close()
            final = self._padded(meta, self._RESERVED_BYTES)
            if not one_batch and len(final) == len(self._placeholder):
                self._patch(final)
            elif not one_batch:
                self._rewrite(meta)
            fd = os.open(self._tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self._tmp, self.path)
            fsync_directory(self.path.parent)
        except OSError as err:
            self._tmp.unlink(missing_ok=True)
            raise CkptTraceError(f"cannot write trace {self.path}: {err.strerror or err}") from None
        return self.path

    def _patch(self, final: bytes) -> None:
        """Overwrite the placeholder where the file holds it: the schema message and the footer."""
        size = self._tmp.stat().st_size
        with open(self._tmp, "r+b") as handle:
            found = 0
            for start, length in ((0, min(size, 4 * self._RESERVED_BYTES)),
                                  (max(0, size - 4 * self._RESERVED_BYTES), min(size, 4 * self._RESERVED_BYTES))):
                handle.seek(start)
                window = handle.read(length)
                at = window.find(self._placeholder)
                while at >= 0:
                    handle.seek(start + at)
                    handle.write(final)
                    found += 1
                    window = window[:at] + final + window[at + len(final):]
                    at = window.find(self._placeholder)
            if found < 2:  # the schema message and the footer both hold it; anything else is a surprise
                raise OSError(5, "trace metadata placeholder not found where Arrow writes the schema")

    def _rewrite(self, meta: dict) -> None:
        """Copy the rows into a new file whose schema carries ``meta`` (metadata too long to patch)."""
        final_tmp = self._tmp.with_name(self._tmp.name + "-meta")
        schema = SCHEMA.with_metadata({METADATA_KEY: json.dumps(meta, sort_keys=True).encode()})
        reader = ipc.open_file(pa.memory_map(str(self._tmp), "r"))
        with pa.OSFile(str(final_tmp), "wb") as sink, ipc.new_file(sink, schema, options=_write_options(
                self._level, emit_dictionary_deltas=True)) as writer:
            for i in range(reader.num_record_batches):
                writer.write_batch(reader.get_batch(i))
        os.replace(final_tmp, self._tmp)

    def abort(self) -> None:
        """Remove what this writer wrote (never ``path`` itself)."""
        try:
            if self._writer is not None:
                self._writer.close()
        except (pa.ArrowException, OSError):
            pass
        try:
            self._sink.close()
        except (pa.ArrowException, OSError):
            pass
        self._tmp.unlink(missing_ok=True)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
