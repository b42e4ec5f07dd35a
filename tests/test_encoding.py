"""Version 4's stored differences (still read: version 5 stores the columns plain): every row round-trips
exactly, whatever the batches, and regular I/O stores zeros. Version 5's writers round-trip every row too."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from helpers.format_rows import META, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_trace.formats import METADATA_KEY, SCHEMA, TraceWriter, read_trace, scan, table_from_columns, write_trace
from ckpt_trace.formats.encoding import Encoder
from ckpt_trace.formats.io import conform
from ckpt_trace.formats.schema import STORED_SCHEMA_V4

INT64 = st.integers(-(2**63), 2**63 - 1)
PIDS = st.sampled_from([1, 2, 2**31 - 1])


@st.composite
def traces(draw) -> pa.Table:
    """Rows whose pid, tid, path, offset, size and ret take any values, nulls and extremes included."""
    n = draw(st.integers(0, 60))
    pid = draw(st.lists(PIDS, min_size=n, max_size=n))
    columns = rows(n)
    columns.update(
        pid=pid,
        tid=[p + draw(st.integers(-3, 3)) if p < 2**31 - 4 else p for p in pid],
        path=draw(st.lists(st.sampled_from(["/a", "/b", "/c/d", None]), min_size=n, max_size=n)),
        offset=draw(st.lists(st.one_of(st.none(), st.integers(0, 2**20), INT64), min_size=n, max_size=n)),
        size=draw(
            st.lists(st.one_of(st.none(), st.integers(0, 2**20), st.integers(0, 2**63 - 1)), min_size=n, max_size=n)
        ),
        ret=draw(st.lists(st.one_of(st.integers(-4095, 2**20), INT64), min_size=n, max_size=n)),
    )
    return table_from_columns(columns)


def write_v4(path, table: pa.Table, batch_rows: int):
    """``table`` written as version 4 wrote it: stored differences, batch after batch, one dictionary per
    text column."""
    schema = STORED_SCHEMA_V4.with_metadata({METADATA_KEY: json.dumps({**META, "format_version": 4}).encode()})
    encoder = Encoder()
    with ipc.new_file(str(path), schema) as writer:
        for batch in conform(table).combine_chunks().to_batches(max_chunksize=batch_rows):
            writer.write_batch(encoder.encode(batch, STORED_SCHEMA_V4))
    return path


def _values(table: pa.Table) -> dict[str, list]:
    """The rows' values, text as text (the writers' dictionaries differ; their values do not)."""
    return {name: table[name].to_pylist() for name in table.column_names}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=traces(), batch_rows=st.integers(1, 17), chunk=st.integers(1, 23))
def test_every_row_round_trips_through_both_writers_and_every_reader(tmp_path_factory, table, batch_rows, chunk):
    where = tmp_path_factory.mktemp("enc")
    whole = write_trace(where / "w.arrow", table, META, batch_rows=batch_rows)
    writer = TraceWriter(where / "s.arrow", batch_rows=batch_rows)
    for start in range(0, table.num_rows, chunk):  # rows arrive in pieces that cut across batches
        writer.write(table.slice(start, chunk))
    streamed = writer.close(META)
    v4 = write_v4(where / "v4.arrow", table, batch_rows)
    plain = table.replace_schema_metadata(None)
    for path in (whole, streamed, v4):
        assert _values(read_trace(path).table) == _values(plain)
        for columns in (["ret"], ["offset", "tid"], ["tid"], ["size", "ret", "op"]):
            _, batches = scan(path, columns, batch_rows=5)
            got = pa.Table.from_batches(list(batches), schema=pa.schema([SCHEMA.field(c) for c in columns]))
            assert _values(got) == _values(plain.select(columns)), columns


def test_regular_io_is_stored_as_zeros(tmp_path):
    """Sequential writes that move every byte, an lseek to where they ended, threads of one process: the
    stored differences are 0 (but the first offset of each file)."""
    n = 1000
    columns = rows(n)  # writes of 4096 B at 0, 4096, ... by tid 11 of pid 10
    columns["op"][-1], columns["syscall"][-1], columns["size"][-1] = "lseek", "lseek", None
    columns["tid"] = [10] * n
    columns["path"] = ["/d/f" if i % 2 else "/d/g" for i in range(n)]
    columns["offset"] = [(i // 2) * 4096 for i in range(n)]
    columns["ret"][-1] = columns["offset"][-1]
    path = write_v4(tmp_path / "t.arrow", table_from_columns(columns), batch_rows=300)
    stored = ipc.open_file(str(path)).read_all()
    assert not pc.any(pc.not_equal(stored["offset_delta"], 0)).as_py()  # both files start at offset 0
    assert not pc.any(pc.not_equal(stored["ret_delta"], 0)).as_py()
    assert not pc.any(pc.not_equal(stored["tid_delta"], 0)).as_py()
    assert read_trace(path).table["offset"].to_pylist() == columns["offset"]
