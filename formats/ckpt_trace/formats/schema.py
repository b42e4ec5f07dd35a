"""The Arrow schema of a ckpt-trace trace: the public contract.

Columns, types and units are documented in ``formats/README.md``; this
module is the machine-readable copy. Version history:

- 1: first version.
- 2: request-level rows (io_uring, libaio) and memory-mapped I/O: columns
  ``interface``, ``queue_id``, ``request_id``, ``in_flight``, ``address`` and
  ``prot``; the string columns dictionary-encoded (a quarter of the bytes per
  row); the ``arch`` metadata key required. Version 1 files are read as
  version 2 (``upgrade``).
- 3: host<->device copies of CUDA programs (interface ``cuda``, ops
  ``copy_d2h``, ``copy_h2d``...): columns ``device`` and ``memory_kind``.
  Version 1 and 2 files are read as version 3, those columns null.
- 4: the same logical columns (``SCHEMA``), stored more compactly: ``tid``,
  ``offset`` and ``ret`` as the stored columns ``tid_delta``,
  ``offset_delta`` and ``ret_delta``, differences from what the trace
  predicts (``encoding``), and zstd at level 6 (19 for a file of one batch). Readers decode them;
  ``STORED_SCHEMA_V4`` is the file's own schema.
- 5: ``tid``, ``offset`` and ``ret`` stored plain again (the file's schema is ``SCHEMA``, as in version 3),
  so any Arrow reader gets every value right with no decoding; the optional additions ``OPTIONAL_COLUMNS``
  and ``EXTRA_METADATA`` (documented here and in ``formats/README.md``) that writers may add and readers
  accept absent. Version 4 files are decoded (``encoding``), older ones upgraded, all read as version 5.
- 6: the column ``cold_bytes`` (after ``memory_kind``): of a read, the bytes that came from storage (their
  pages were not in the page cache when the trace began); null where unknown. Versions 1 to 5 are read as
  version 6, ``cold_bytes`` null.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from .encoding import STORED_AS

FORMAT_VERSION = 6
SUPPORTED_VERSIONS = (1, 2, 3, 4, 5, 6)

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
    "arch",
)

# Metadata keys a version-1 trace may lack: readers supply these defaults.
METADATA_DEFAULTS = {"arch": "x86_64"}  # every version-1 trace was recorded on x86-64

_TEXT = pa.dictionary(pa.int32(), pa.string())  # repeated names and paths: stored once per file

SCHEMA_V1 = pa.schema(
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

SCHEMA_V2 = pa.schema(
    [
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("dur_ns", pa.int64(), nullable=False),
        pa.field("pid", pa.int32(), nullable=False),
        pa.field("tid", pa.int32(), nullable=False),
        pa.field("comm", _TEXT),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("syscall", _TEXT, nullable=False),
        pa.field("op", _TEXT, nullable=False),
        pa.field("fd", pa.int32()),
        pa.field("path", _TEXT),
        pa.field("new_path", _TEXT),
        pa.field("offset", pa.int64()),
        pa.field("offset_source", _TEXT),
        pa.field("size", pa.int64()),
        pa.field("ret", pa.int64(), nullable=False),
        pa.field("flags", pa.int64()),
        pa.field("iov_count", pa.int32()),
        pa.field("interface", _TEXT, nullable=False),
        pa.field("queue_id", pa.int64()),
        pa.field("request_id", pa.int64()),
        pa.field("in_flight", pa.int32()),
        pa.field("address", pa.int64()),
        pa.field("prot", pa.int32()),
    ]
)

SCHEMA_V5 = pa.schema(
    list(SCHEMA_V2)
    + [
        pa.field("device", pa.int32()),
        pa.field("memory_kind", _TEXT),
    ]
)

# Version 6: of a read row, the bytes whose pages were not in the page cache when the trace began (inserted
# into it during the recording, before the read ended): what came from storage. Null: unknown.
SCHEMA = pa.schema(list(SCHEMA_V5) + [pa.field("cold_bytes", pa.int64())])

# Version 4 stored three of SCHEMA_V5's columns as differences (``encoding.STORED_AS``), in the same places.
STORED_SCHEMA_V4 = pa.schema(
    [pa.field(STORED_AS.get(field.name, field.name), field.type, field.nullable) for field in SCHEMA_V5]
)

# The file schema of each version (version 4's logical schema is SCHEMA_V5, like versions 3 and 5's).
SCHEMAS = {1: SCHEMA_V1, 2: SCHEMA_V2, 3: SCHEMA_V5, 4: STORED_SCHEMA_V4, 5: SCHEMA_V5, 6: SCHEMA}
COLUMNS_V5 = tuple(SCHEMA_V5.names)
COLUMNS = tuple(SCHEMA.names)
TEXT_COLUMNS = tuple(field.name for field in SCHEMA if pa.types.is_dictionary(field.type))


@dataclass(frozen=True)
class OptionalColumn:
    """A column a version 5 trace may carry after ``SCHEMA``'s: always nullable, of ``type`` (text columns
    ``TEXT``, dictionary-encoded), its meaning in ``doc`` (units in the name, as every column)."""

    type: pa.DataType
    doc: str


# Optional columns, additions of version 5 (formats/README.md, "Optional additions in version 5"). Writers
# may store any of them after SCHEMA's columns (``TraceWriter(optional_columns=...)``, or ``write_trace``
# for those its table holds); readers accept them absent: ``read_trace`` and ``scan`` with no column list
# return those the file holds, ``scan`` asked for one by name returns it, null where the file lacks it. A
# column in neither SCHEMA nor here is not read (a newer writer's addition: ignored, not refused); one of
# these of another type is refused. Add an entry per new column: name -> OptionalColumn(type, doc), the
# type nullable, text as ``TEXT``; a column keeps its meaning forever.
OPTIONAL_COLUMNS: dict[str, OptionalColumn] = {
    "host": OptionalColumn(
        _TEXT,
        "the node a row was recorded on: the `host` of the trace it came from "
        "(`record --host LABEL` or the host name); written by `ckpt-trace merge`",
    ),
}

# Optional metadata keys of version 5, stored beside the required ones in the one JSON object under
# METADATA_KEY (readers accept them absent; ``read_extra_metadata`` returns those present). Add an entry
# per new key: name -> what it holds (type, units, since when).
EXTRA_METADATA: dict[str, str] = {
    "boot_id": "the recording machine's /proc/sys/kernel/random/boot_id (formats/README.md, schema metadata)",
    "clock": "the clock ts_ns is measured on, its value at ts_ns 0 and realtime anchor pairs (schema metadata)",
    "job": "the job a launcher named: {launcher, variable, id} (schema metadata)",
    "merged": "written by `ckpt-trace merge`: the inputs, what each host's traces lost, the clock alignment's "
    "error bound (formats/README.md, optional columns)",
    "data_compressibility": "written by `record`: how far the files the command wrote compress, sampled "
    "after it exited ({method, ratio, sampled_bytes, size_bytes, files_sampled, files_not_sampled, budget_s, "
    "elapsed_s, files}); `replay --data recorded-ratio` reproduces its ratio (formats/README.md)",
    "writeback": "written by `record`: the kernel's writeback thresholds while the command ran, least and "
    "largest of samples every 0.25 s ({source, samples, interval_s, dirty_background_bytes: {min, max}, "
    "dirty_bytes: {min, max}, settings}); `replay --writeback recorded` sets them (formats/README.md)",
    "proactive_reclaim": "written by `record`: the DAMON schemes running when it started that evict page "
    "cache ([{kdamond, operations, action, min_age_s, quota_bytes, quota_reset_interval_ms, filters}]); "
    "pages they evict and the command reads again count in cold_bytes (formats/README.md)",
    "upgraded_from": 'the trace was converted by `ckpt-trace upgrade`: {"format_version": int, "sha256": '
    "hex SHA-256 of the original file}",
}

TEXT = _TEXT  # the type of a text column (optional ones included): dictionary<int32, string>


def optional_type(name: str) -> pa.DataType:
    """The Arrow type of optional column ``name`` (KeyError when ``OPTIONAL_COLUMNS`` has none); an entry
    given as a bare type is taken as its type."""
    entry = OPTIONAL_COLUMNS[name]
    return entry.type if isinstance(entry, OptionalColumn) else entry


def optional_field(name: str) -> pa.Field:
    """The Arrow field of optional column ``name`` (KeyError when ``OPTIONAL_COLUMNS`` has none)."""
    return pa.field(name, optional_type(name), nullable=True)


def file_schema(optional: list[str] | tuple[str, ...] = ()) -> pa.Schema:
    """A version 5 file's schema: ``SCHEMA``, then the optional columns ``optional`` in that order."""
    return pa.schema(list(SCHEMA) + [optional_field(name) for name in optional])


def upgrade(table: pa.Table, version: int) -> pa.Table:
    """A table of format ``version`` as the current ``SCHEMA``: version 1 gains the request and mapping
    columns (``interface`` 'syscall', the others null) and dictionary-encoded text; versions 1 and 2 gain
    the copy columns (null); versions 1 to 5 gain ``cold_bytes`` (null: unknown), placed after
    ``memory_kind`` (any optional columns the table holds stay after it); version 6 is returned as it is."""
    if version >= 6:
        return table
    if version >= 3:
        if "cold_bytes" in table.column_names:
            return table
        return table.add_column(len(SCHEMA_V5), SCHEMA.field("cold_bytes"), pa.nulls(table.num_rows, pa.int64()))
    rows = table.num_rows
    extra = {"interface": pa.array(["syscall"] * rows, pa.string())}
    columns = []
    for field in SCHEMA:
        if field.name in table.column_names:
            column = table[field.name]
        elif field.name in extra:
            column = extra[field.name]
        else:
            column = pa.nulls(rows, field.type.value_type if pa.types.is_dictionary(field.type) else field.type)
        columns.append(column.cast(field.type))
    return pa.Table.from_arrays(columns, schema=SCHEMA.remove_metadata())
