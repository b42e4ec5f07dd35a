"""Writing a trace batch by batch straight into the file (``write_trace_batches``) and scanning without a
read-ahead thread (``scan(read_ahead=False)``): what ``merge`` uses for a job of many traces."""

from __future__ import annotations

import pyarrow as pa
import pytest
from helpers.format_rows import META, rows

from ckpt_trace.formats import (
    CkptTraceError,
    TraceFormatError,
    read_trace,
    scan,
    table_from_columns,
    write_trace,
    write_trace_batches,
)
from ckpt_trace.formats.schema import file_schema


def _batches(table: pa.Table, size: int) -> list[pa.RecordBatch]:
    """``table`` (plain text columns) as batches of the file schema, each text column over one dictionary."""
    schema = file_schema(())
    columns = []
    for field in schema:
        column = table[field.name].combine_chunks()
        if pa.types.is_dictionary(field.type):
            words = pa.array(sorted({w for w in column.to_pylist() if w is not None} | {""}), pa.string())
            index = {w: i for i, w in enumerate(words.to_pylist())}
            codes = [index.get(w, 0) for w in column.to_pylist()]
            column = pa.DictionaryArray.from_arrays(
                pa.array(
                    codes,
                    pa.int32(),
                    mask=pa.array([w is None for w in column.to_pylist()]).to_numpy(zero_copy_only=False),
                ),
                words,
            )
        columns.append(column)
    whole = pa.RecordBatch.from_arrays(columns, schema=schema)
    return [whole.slice(start, size) for start in range(0, len(whole), size)]


def test_batches_written_straight_read_back_as_the_rows_given(tmp_path):
    table = table_from_columns(rows(10))
    path, written = write_trace_batches(tmp_path / "t.arrow", iter(_batches(table, 3)), META, expected_rows=10)
    assert written == 10 and path == tmp_path / "t.arrow"
    back = read_trace(path)
    assert back.table.select(table.column_names).to_pylist() == table.to_pylist()
    assert back.metadata["lost_events"] == 3
    with pytest.raises(CkptTraceError, match="already exists"):
        write_trace_batches(path, iter([]), META)


def test_a_batch_off_the_schema_or_a_failing_producer_leaves_no_file(tmp_path):
    table = table_from_columns(rows(4))
    good = _batches(table, 2)
    with pytest.raises(TraceFormatError, match="schema"):
        write_trace_batches(tmp_path / "a.arrow", iter([good[0], good[1].drop_columns(["fd"])]), META)

    def failing():
        yield good[0]
        raise CkptTraceError("the producer failed")

    with pytest.raises(CkptTraceError, match="producer failed"):
        write_trace_batches(tmp_path / "b.arrow", failing(), META)
    # a text column whose dictionary changes between batches: the file format holds one per column
    other = good[1].set_column(
        good[1].schema.get_field_index("path"),
        file_schema(()).field("path"),
        pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["/other"])),
    )
    with pytest.raises(TraceFormatError, match="trace file"):
        write_trace_batches(tmp_path / "c.arrow", iter([good[0], other]), META)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_scan_without_read_ahead_yields_the_same_batches(tmp_path):
    write_trace(tmp_path / "t.arrow", table_from_columns(rows(20)), META, batch_rows=6)
    for batch_rows in (4, 6, 100):
        _, ahead = scan(tmp_path / "t.arrow", ["ts_ns", "path"], batch_rows=batch_rows)
        _, plain = scan(tmp_path / "t.arrow", ["ts_ns", "path"], batch_rows=batch_rows, read_ahead=False)
        assert [b.to_pylist() for b in ahead] == [b.to_pylist() for b in plain]
