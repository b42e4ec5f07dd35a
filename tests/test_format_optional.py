"""Version 5's optional additions: columns (``OPTIONAL_COLUMNS``) and metadata keys (``EXTRA_METADATA``)
that writers may store and readers accept absent."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from helpers.format_rows import META, rows
from helpers.format_rows import write_raw as _write_raw

from ckpt_trace.formats import (
    EXTRA_METADATA,
    OPTIONAL_COLUMNS,
    TraceFormatError,
    TraceWriter,
    read_extra_metadata,
    read_trace,
    scan,
    table_from_columns,
    write_trace,
)
from ckpt_trace.formats.schema import SCHEMA, OptionalColumn, file_schema


@pytest.fixture
def extra_column(monkeypatch):
    """A test-only optional int64 column beside the table's real entries."""
    monkeypatch.setitem(OPTIONAL_COLUMNS, "test_extra_bytes", OptionalColumn(pa.int64(), "test column"))
    return "test_extra_bytes"


def test_every_optional_column_and_metadata_key_is_documented():
    readme = (__import__("conftest").REPO / "formats" / "README.md").read_text()
    for name, entry in OPTIONAL_COLUMNS.items():
        assert isinstance(entry, OptionalColumn) and entry.doc and f"`{name}`" in readme, name
    for key, doc in EXTRA_METADATA.items():
        assert doc and f"`{key}`" in readme, key


def test_optional_columns_round_trip_through_both_writers_and_every_reader(tmp_path, extra_column):
    table = table_from_columns(rows(300))
    values = [i if i % 7 else None for i in range(300)]
    with_extra = table.append_column(extra_column, pa.array(values, pa.int64())).append_column(
        "host", pa.array(["n1"] * 150 + ["n2"] * 150)
    )
    whole = write_trace(tmp_path / "w.arrow", with_extra, META, batch_rows=64)
    writer = TraceWriter(tmp_path / "s.arrow", batch_rows=64)
    for start in range(0, 300, 50):
        writer.write(with_extra.slice(start, 50))
    streamed = writer.close(META)
    for path in (whole, streamed):
        assert ipc.open_file(str(path)).schema.names[len(SCHEMA) :] == [extra_column, "host"]
        trace = read_trace(path)
        assert trace.table.column_names == list(SCHEMA.names) + [extra_column, "host"]
        assert trace.table[extra_column].to_pylist() == values and trace.table["host"].to_pylist()[-1] == "n2"
        _, batches = scan(path, ["offset", extra_column], batch_rows=40)
        got = pa.Table.from_batches(list(batches))
        assert got.column_names == ["offset", extra_column] and got[extra_column].to_pylist() == values
        _, batches = scan(path)
        assert pa.Table.from_batches(list(batches)).column_names == list(SCHEMA.names) + [extra_column, "host"]
        _, batches = scan(path, ["host", "ts_ns", extra_column], batch_rows=1000)
        assert pa.Table.from_batches(list(batches)).column_names == ["host", "ts_ns", extra_column]


def test_a_trace_without_them_reads_as_before_and_scan_gives_them_null(tmp_path, extra_column):
    path = write_trace(tmp_path / "t.arrow", table_from_columns(rows(10)), META)
    assert read_trace(path).table.column_names == list(SCHEMA.names)
    _, batches = scan(path, ["ts_ns", extra_column, "host"])
    got = pa.Table.from_batches(list(batches))
    assert got[extra_column].null_count == 10 and got["host"].null_count == 10
    assert got.schema.field("host").type == OPTIONAL_COLUMNS["host"].type


def test_trace_writer_stores_the_declared_ones_null_where_rows_lack_them(tmp_path, extra_column):
    writer = TraceWriter(tmp_path / "t.arrow", batch_rows=4, optional_columns=[extra_column])
    writer.write(table_from_columns(rows(5)))
    writer.write(table_from_columns(rows(5)).append_column(extra_column, pa.array([1] * 5, pa.int64())))
    with pytest.raises(TraceFormatError, match="'host'"):
        writer.write(table_from_columns(rows(1)).append_column("host", pa.array(["n"])))
    trace = read_trace(writer.close(META))
    assert trace.table[extra_column].to_pylist() == [None] * 5 + [1] * 5
    with pytest.raises(TraceFormatError, match="no optional column 'nope'"):
        TraceWriter(tmp_path / "u.arrow", optional_columns=["nope"])


def test_an_optional_column_of_another_type_is_refused_and_unknown_columns_are_ignored(tmp_path, extra_column):
    table = table_from_columns(rows(5))
    _write_raw(
        tmp_path / "bad.arrow", table.append_column(extra_column, pa.array(["x"] * 5)), {**META, "format_version": 5}
    )
    with pytest.raises(TraceFormatError, match=f"column '{extra_column}' has type string, expected int64"):
        read_trace(tmp_path / "bad.arrow")
    _write_raw(
        tmp_path / "new.arrow",
        table.append_column("from_a_newer_writer", pa.array([1] * 5)),
        {**META, "format_version": 5},
    )
    assert read_trace(tmp_path / "new.arrow").table.column_names == list(SCHEMA.names)
    assert file_schema([extra_column]).names[-1] == extra_column


def test_extra_metadata_is_stored_in_the_one_key_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setitem(EXTRA_METADATA, "test_key", "a test key")
    path = write_trace(
        tmp_path / "t.arrow", table_from_columns(rows(3)), {**META, "test_key": {"a": 1}, "undocumented": 2}
    )
    assert read_extra_metadata(path) == {"test_key": {"a": 1}}
    assert list(ipc.open_file(str(path)).schema.metadata) == [b"ckpt_trace"]
    plain = write_trace(tmp_path / "p.arrow", table_from_columns(rows(3)), META)
    assert read_extra_metadata(plain) == {}
