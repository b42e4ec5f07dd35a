"""The layout inside a trace file: one more schema-metadata key.

``ckpt_trace_layout`` holds the layout table as an Arrow IPC *stream*
(zstd-compressed buffers), base64-encoded (schema metadata values are
bytes, and some readers hand them back as text); the stream's own schema
metadata carries ``ckpt_trace_layout`` too, a UTF-8 JSON object of what
went into it (``build.Layout.info``). Any Arrow reader gets it back in one
line (``formats/README.md``):
``pa.ipc.open_stream(base64.b64decode(schema.metadata[b"ckpt_trace_layout"])).read_all()``.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ..atomic import fd_path, fsync_directory, make_temporary
from ..errors import CkptTraceError, TraceFormatError
from ..io import ZSTD_LEVEL, ZSTD_LEVEL_ONE_BATCH, read_metadata
from .table import LAYOUT_SCHEMA

LAYOUT_METADATA_KEY = b"ckpt_trace_layout"


def encode_layout(table: pa.Table, info: dict | None = None) -> bytes:
    """``table`` (``LAYOUT_SCHEMA``) and ``info`` as the base64 text stored under ``LAYOUT_METADATA_KEY``."""
    table = table.cast(LAYOUT_SCHEMA).replace_schema_metadata(
        {LAYOUT_METADATA_KEY: json.dumps(info or {}, sort_keys=True).encode()}
    )
    sink = pa.BufferOutputStream()
    options = ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=9))
    with ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes())


def decode_layout(blob: bytes) -> tuple[pa.Table, dict]:
    """(table, info) of an ``encode_layout`` text. Raises TraceFormatError when it does not decode."""
    try:
        table = ipc.open_stream(base64.b64decode(blob, validate=True)).read_all()
        table.validate(full=True)
        info = json.loads((table.schema.metadata or {}).get(LAYOUT_METADATA_KEY, b"{}"))
    except (ValueError, pa.ArrowException, json.JSONDecodeError) as err:
        raise TraceFormatError(
            f"the trace's layout does not decode ({str(err).splitlines()[0] if str(err) else err})"
        ) from None
    for column in LAYOUT_SCHEMA:
        if column.name not in table.column_names:
            raise TraceFormatError(f"the trace's layout lacks column {column.name!r}")
    return table.select(LAYOUT_SCHEMA.names).cast(LAYOUT_SCHEMA), info


def read_layout(path: str | os.PathLike) -> tuple[pa.Table, dict] | None:
    """(layout table, info) stored in the trace at ``path``, or None when it has none. Reads the schema only.
    Raises TraceFormatError for a file that is not a trace or a layout that does not decode."""
    path = Path(path)
    read_metadata(path)  # a trace, of a supported version
    with pa.OSFile(str(path)) as source:
        schema = ipc.open_file(source).schema
    blob = (schema.metadata or {}).get(LAYOUT_METADATA_KEY)
    return None if blob is None else decode_layout(blob)


def add_layout(
    trace: str | os.PathLike,
    table: pa.Table,
    info: dict | None = None,
    output: str | os.PathLike | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Write ``trace`` with ``table`` stored as its layout (replacing any layout it had) to ``output``
    (default: ``trace`` itself, replaced). The record batches are copied as they are stored; the file is
    written to a temporary file beside the output (``atomic.make_temporary``: a random name, O_EXCL, O_NOFOLLOW), fsynced and renamed over the
    output, then the directory is fsynced, so a crash leaves the old file or the new one.

    Raises CkptTraceError when ``output`` exists (other than ``trace``) and ``overwrite`` is false, or when
    the file system refuses; TraceFormatError when ``trace`` is not a readable trace."""
    source_path = Path(trace)
    target = Path(output) if output is not None else source_path
    if target.exists() and not overwrite and target.resolve() != source_path.resolve():
        raise CkptTraceError(
            f"{target} already exists (use {{option}} to overwrite it)", option="overwrite", switch=True
        )
    read_metadata(source_path)
    blob = encode_layout(table, info)
    try:
        reader = ipc.open_file(pa.memory_map(str(source_path), "r"))
    except (pa.ArrowException, OSError) as err:
        raise TraceFormatError(f"{source_path}: not a readable trace ({err})") from None
    metadata = dict(reader.schema.metadata or {})
    metadata[LAYOUT_METADATA_KEY] = blob
    schema = reader.schema.with_metadata(metadata)
    level = ZSTD_LEVEL_ONE_BATCH if reader.num_record_batches <= 1 else ZSTD_LEVEL  # as io writes traces
    options = ipc.IpcWriteOptions(compression=pa.Codec("zstd", compression_level=level), emit_dictionary_deltas=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = make_temporary(target)  # random name beside the target, O_EXCL | O_NOFOLLOW
    try:
        with pa.OSFile(fd_path(fd, tmp), "wb") as sink, ipc.new_file(sink, schema, options=options) as writer:
            for index in range(reader.num_record_batches):
                writer.write_batch(reader.get_batch(index))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, target)
        fsync_directory(target.parent)
    except (OSError, pa.ArrowException) as err:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise CkptTraceError(f"cannot write {target}: {getattr(err, 'strerror', None) or err}") from None
    return target
