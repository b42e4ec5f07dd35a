"""Reading and writing trace files (Arrow IPC file format, zstd batches).

A trace file is readable without ckpt-trace: ``pyarrow.ipc.open_file``,
``pandas.read_feather``, ``polars.read_ipc`` and DuckDB all open it. Since
version 4, three columns are stored as differences (``encoding``): this
module writes them encoded and hands readers the decoded ``SCHEMA``.

Writing is atomic: rows go to a hidden temporary file beside the target,
which is fsynced and renamed over the final name, then the directory is
fsynced (rename(2), fsync(2)). A writer killed at any point therefore
leaves either no file or a complete one under the final name.
"""

from __future__ import annotations

import errno
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

from .atomic import AtomicFile, fsync_directory, make_temporary
from .encoding import Decoder, Encoder, stored_columns
from .errors import CkptTraceError, TraceFormatError
from .schema import (
    COLUMNS,
    FORMAT_VERSION,
    METADATA_DEFAULTS,
    METADATA_KEY,
    OPTIONAL_COLUMNS,
    REQUIRED_METADATA_KEYS,
    SCHEMA,
    SCHEMA_V1,
    SCHEMAS,
    STORED_SCHEMA,
    SUPPORTED_VERSIONS,
    TEXT_COLUMNS,
    upgrade,
)

DEFAULT_BATCH_ROWS = 65536

# zstd level of the record batches of a file of several batches, rather than Arrow's default (1): the demo
# trace's stored rows take 7.4 bytes per row at level 6 against 8.0 at levels 1 and 3 (ad hoc, one run);
# writing a million rows takes about 0.2 s more than version 3 did (0.29 against 0.10 s, encoding included).
ZSTD_LEVEL = 6
# A file of one batch (at most DEFAULT_BATCH_ROWS rows: a small trace) pays a fixed cost of about 7.5 KB
# (the schema and the metadata, twice; the dictionaries) that a 7,000-row trace feels as a byte per row, and
# compressing one batch at level 19 costs at most about 0.8 s (12 us per row, ad hoc): 6.7 against 7.2
# bytes per row on the 7,310-row trace `make demo` records.
ZSTD_LEVEL_ONE_BATCH = 19


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
            raise CkptTraceError(f"cannot write {path}: {err.strerror} ({free / 2**20:.1f} MiB free in "
                                 f"{path.parent or '.'}; the trace needs at least {reserve_bytes >> 20} MiB)") from None
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
    temporary: str | os.PathLike | None = None,
) -> Path:
    """Write ``table`` (of ``SCHEMA``) and ``metadata`` atomically to ``path``.

    ``metadata`` must hold every key of ``REQUIRED_METADATA_KEYS`` except
    ``format_version``, which is set here. Returns the final path.

    ``temporary`` is a file ``reserve_temporary(path)`` made (written and
    renamed instead of a new one).

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
    schema = STORED_SCHEMA.with_metadata({METADATA_KEY: json.dumps(meta, sort_keys=True).encode()})
    try:
        table = conform(table).combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
        raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None
    encoder = Encoder()
    options = _write_options(ZSTD_LEVEL_ONE_BATCH if table.num_rows <= max(1, batch_rows) else ZSTD_LEVEL)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CkptTraceError(f"cannot write trace {path}: {err.strerror or err}") from None
    output = AtomicFile(path, temporary=temporary, what="trace")  # ``temporary``: reserve_temporary's
    try:
        with pa.OSFile(output.sink_path, "wb") as sink, ipc.new_file(sink, schema, options=options) as writer:
            for batch in table.to_batches(max_chunksize=max(1, batch_rows)):
                writer.write_batch(encoder.encode(batch, STORED_SCHEMA))
    except OSError as err:
        output.discard()
        raise CkptTraceError(f"cannot write trace {path}: {err.strerror or err}") from None
    except BaseException:
        output.discard()
        raise
    return output.commit()


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
            reader = ipc.open_file(source, options=ipc.IpcReadOptions(included_fields=[0]))
            if hasattr(reader, "count_rows"):  # pyarrow >= 17
                return reader.count_rows()
            return sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
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
        if version >= 4:
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
    asked = list(columns) if columns is not None else list(COLUMNS)
    unknown = [name for name in asked if name not in COLUMNS and name not in OPTIONAL_COLUMNS]
    if unknown:
        raise TraceFormatError(f"no column {unknown[0]!r} in the trace schema")
    optional = [name for name in asked if name in OPTIONAL_COLUMNS]  # read as stored, null where absent
    wanted = [name for name in asked if name not in OPTIONAL_COLUMNS]
    if version >= 4:
        present, missing, stored = wanted, [], stored_columns(wanted)
    else:
        present = [name for name in wanted if name in SCHEMAS[version].names]
        missing = [name for name in wanted if name not in present]  # added after the file's version
        stored = present
    if optional and version >= 4:
        file_names = _open_reader(path).schema.names
        stored = stored + [name for name in optional if name in file_names]
        present = present + optional  # appended to each decoded batch by _with_optional

    def batches() -> Iterator[pa.RecordBatch]:
        decoder = Decoder() if version >= 4 else None
        try:
            with pa.OSFile(str(path)) as source:
                names = ipc.open_file(source).schema.names
                options = ipc.IpcReadOptions(included_fields=sorted(names.index(name) for name in stored))
                reader = ipc.open_file(source, options=options)
                count = reader.num_record_batches

                def load(index: int) -> pa.RecordBatch:  # in file order: one worker, one batch ahead
                    whole = reader.get_batch(index)
                    return whole if decoder is None else _with_optional(_decoded(whole, decoder, wanted), whole,
                                                                        optional)

                with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-trace-scan") as pool:
                    ahead = pool.submit(load, 0) if count else None
                    for index in range(count):
                        whole = ahead.result()  # the next one decompresses while this one is worked on
                        ahead = pool.submit(load, index + 1) if index + 1 < count else None
                        for batch in _slices(path, whole, present, batch_rows, missing, version, wanted,
                                             validated=decoder is not None):
                            yield _ordered(batch, asked) if optional else batch
                        if on_batch is not None:
                            on_batch(index + 1, count)
        except (pa.ArrowException, OSError) as err:
            raise TraceFormatError(f"{path}: record batches are corrupt ({_first_line(err)})") from None

    return meta, batches()


def _with_optional(batch: pa.RecordBatch, whole: pa.RecordBatch, optional: list[str]) -> pa.RecordBatch:
    """``batch`` with the ``optional`` columns of the file batch ``whole`` appended (null where it lacks one)."""
    for name in optional:
        kind = OPTIONAL_COLUMNS[name]
        if name in whole.schema.names:
            column = whole.column(name)
            if pa.types.is_dictionary(column.type):
                _validate(pa.RecordBatch.from_arrays([column], names=[name]))
        else:
            column = pa.nulls(whole.num_rows, kind.value_type if pa.types.is_dictionary(kind) else kind).cast(kind)
        batch = batch.append_column(pa.field(name, kind), column)
    return batch


def _ordered(batch: pa.RecordBatch, asked: list[str]) -> pa.RecordBatch:
    """``batch`` with the columns ``asked`` in that order; an optional column it lacks (a file older than
    version 5 batches) null."""
    out = batch
    for name in asked:
        if name not in out.schema.names:
            kind = OPTIONAL_COLUMNS[name]
            out = out.append_column(pa.field(name, kind), pa.nulls(out.num_rows, kind.value_type).cast(kind))
    return out.select(asked)


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
    stays bounded by a batch; each batch is stored as version 4 encodes it
    (``encoding.Encoder``). A trace of one batch is written whole by
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
                 batch_rows: int = DEFAULT_BATCH_ROWS, optional_columns: tuple[str, ...] = (),
                 temporary: str | os.PathLike | None = None) -> None:
        self.path = Path(path)
        unknown = [name for name in optional_columns if name not in OPTIONAL_COLUMNS]
        if unknown:
            raise TraceFormatError(f"no optional column {unknown[0]!r} in the trace schema")
        # Optional columns (version 5 additions) go after SCHEMA's, stored as they are.
        self._optional = [pa.field(name, OPTIONAL_COLUMNS[name]) for name in optional_columns]
        self._stored_schema = pa.schema(list(STORED_SCHEMA) + self._optional)
        self._text = TEXT_COLUMNS + tuple(f.name for f in self._optional if pa.types.is_dictionary(f.type))
        if self.path.exists() and not overwrite:
            raise CkptTraceError(f"{self.path} already exists (use --force to overwrite it)")
        self.batch_rows = max(1, batch_rows)
        self.rows = 0
        self._marker = os.urandom(12).hex()
        self._placeholder = self._padded({"pending": self._marker}, self._RESERVED_BYTES)
        # Each dictionary starts with "": Arrow takes an empty dictionary followed by a longer one for a
        # replacement, which the file format refuses, where a non-empty prefix makes a delta.
        self._values: dict[str, list[str]] = {name: [""] for name in self._text}
        self._index: dict[str, dict[str, int]] = {name: {"": 0} for name in self._text}
        self._pending: list[pa.Table] = []  # rows not yet written: fewer than batch_rows, text as strings
        self._pending_rows = 0
        self._encoder = Encoder()
        self._writer: ipc.RecordBatchFileWriter | None = None  # opened by the first batch, or by close
        self._level = ZSTD_LEVEL
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CkptTraceError(f"cannot write trace {self.path}: {err.strerror or err}") from None
        self._output = AtomicFile(self.path, temporary=temporary, what="trace")  # ``temporary``: reserve_temporary's
        try:
            self._sink = pa.OSFile(self._output.sink_path, "wb")
        except OSError as err:
            self._output.discard()
            raise CkptTraceError(f"cannot write trace {self.path}: {err.strerror or err}") from None

    @property
    def _tmp(self) -> Path:
        """The temporary file being written (renamed over ``path`` by ``close``)."""
        return self._output.tmp

    def _open(self, metadata: bytes, level: int) -> None:
        self._level = level
        self._writer = ipc.new_file(self._sink, self._stored_schema.with_metadata({METADATA_KEY: metadata}),
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
        fields = list(SCHEMA) + self._optional
        try:
            arrays = [table[f.name].cast(pa.string()) if f.name in self._text else table[f.name].cast(f.type)
                      for f in fields]
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as err:
            raise TraceFormatError(f"rows do not fit the trace schema: {err}") from None
        self._pending.append(pa.Table.from_arrays(arrays, names=[f.name for f in fields]))
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
            batch = self._encoder.encode(pa.RecordBatch.from_arrays(arrays, schema=SCHEMA), STORED_SCHEMA)
            for f in self._optional:
                column = head[f.name]
                batch = batch.append_column(f, self._encode(f.name, column) if f.name in self._text
                                            else column.combine_chunks())
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
        except OSError as err:
            self._output.discard()
            raise CkptTraceError(f"cannot write trace {self.path}: {err.strerror or err}") from None
        except BaseException:
            self._output.discard()
            raise
        return self._output.commit()

    def _patch(self, final: bytes) -> None:
        """Overwrite the placeholder where the file holds it: the schema message and the footer."""
        size = os.fstat(self._output.fd).st_size
        with open(self._output.sink_path, "r+b") as handle:
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
        final = AtomicFile(self.path, what="trace")
        schema = self._stored_schema.with_metadata({METADATA_KEY: json.dumps(meta, sort_keys=True).encode()})
        try:
            reader = ipc.open_file(pa.memory_map(self._output.sink_path, "r"))
            with pa.OSFile(final.sink_path, "wb") as sink, ipc.new_file(sink, schema, options=_write_options(
                    self._level, emit_dictionary_deltas=True)) as writer:
                for i in range(reader.num_record_batches):
                    writer.write_batch(reader.get_batch(i))
        except BaseException:
            final.discard()
            raise
        self._output.discard()
        self._output = final

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
        self._output.discard()


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
