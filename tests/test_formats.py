"""Trace files: round trip, atomic writes, and one-line errors on every kind of bad file."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from helpers.format_rows import META, rows
from helpers.format_rows import write_raw as _write_raw

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import (
    FORMAT_VERSION,
    METADATA_KEY,
    SCHEMA,
    TraceFormatError,
    TraceWriter,
    read_metadata,
    read_trace,
    scan,
    table_from_columns,
    write_trace,
)
from ckpt_trace.formats.encoding import Encoder
from ckpt_trace.formats.schema import STORED_SCHEMA_V4


def test_round_trip_keeps_rows_and_metadata(tmp_path):
    path = write_trace(tmp_path / "t.arrow", table_from_columns(rows(1000)), META, batch_rows=100)
    trace = read_trace(path)
    assert trace.num_rows == 1000
    assert trace.table.column("offset").to_pylist()[999] == 999 * 4096
    assert trace.metadata["format_version"] == FORMAT_VERSION
    assert trace.metadata["lost_events"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["t.arrow"]  # no temporary file left behind


def test_file_is_plain_arrow_ipc_with_zstd(tmp_path):
    table = table_from_columns(rows(20000))
    path = write_trace(tmp_path / "t.arrow", table, META)
    reader = ipc.open_file(str(path))
    assert reader.schema.remove_metadata().equals(SCHEMA.remove_metadata())  # version 5: every column plain
    assert not [name for name in reader.schema.names if name.endswith("_delta")]
    assert json.loads(reader.schema.metadata[METADATA_KEY])["backend"] == "strace"
    assert reader.read_all().replace_schema_metadata(None).equals(read_trace(path).table)
    _write_raw(tmp_path / "plain.arrow", table, {**META, "format_version": 3})
    assert path.stat().st_size * 4 < (tmp_path / "plain.arrow").stat().st_size  # batches are compressed


def test_refuses_to_overwrite(tmp_path):
    target = tmp_path / "t.arrow"
    target.write_bytes(b"precious")
    with pytest.raises(CkptTraceError, match="already exists"):
        write_trace(target, table_from_columns(rows()), META)
    assert target.read_bytes() == b"precious"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_files_give_one_line_errors(tmp_path, damage):
    path = write_trace(tmp_path / "t.arrow", table_from_columns(rows(5000)), META)
    data = path.read_bytes()
    bad = {"truncate": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage]
    path.write_bytes(bad)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def _stored(table: pa.Table) -> pa.Table:
    """``table`` (of SCHEMA) as version 4 stores it."""
    return pa.Table.from_batches([Encoder().encode(table.combine_chunks().to_batches()[0], STORED_SCHEMA_V4)])


@pytest.mark.parametrize("version", [3, 4, 5])
@pytest.mark.parametrize("index", [-1, 1, 7])
def test_dictionary_indices_outside_the_dictionary_are_refused_by_every_reader(tmp_path, index, version):
    table = table_from_columns(rows(70_000))  # two batches of scan's 65,536 rows: the bad index in the second
    op = table["op"].combine_chunks()
    indices = pa.array([0] * 69_999 + [index], pa.int32())
    bad = pa.DictionaryArray.from_arrays(indices, op.dictionary, safe=False)  # dictionary: ["write"]
    table = table.set_column(table.schema.get_field_index("op"), table.schema.field("op"), bad)
    _write_raw(tmp_path / "d.arrow", _stored(table) if version == 4 else table, {**META, "format_version": version})
    with pytest.raises(TraceFormatError, match="corrupt") as info:
        read_trace(tmp_path / "d.arrow")
    assert "\n" not in str(info.value)
    _, batches = scan(tmp_path / "d.arrow", ["op", "ts_ns"])
    with pytest.raises(TraceFormatError, match="corrupt") as info:
        list(batches)
    assert "\n" not in str(info.value)


def test_wrong_version_is_named(tmp_path):
    _write_raw(tmp_path / "v.arrow", table_from_columns(rows()), {**META, "format_version": 99})
    with pytest.raises(TraceFormatError, match="version 99 is not supported"):
        read_trace(tmp_path / "v.arrow")


def test_missing_metadata_key_is_named(tmp_path):
    meta = {**META, "format_version": FORMAT_VERSION}
    del meta["lost_events"]
    _write_raw(tmp_path / "m.arrow", table_from_columns(rows()), meta)
    with pytest.raises(TraceFormatError, match="lacks key 'lost_events'"):
        read_metadata(tmp_path / "m.arrow")


def test_foreign_arrow_file_is_named(tmp_path):
    _write_raw(tmp_path / "f.arrow", pa.table({"x": [1, 2]}), None)
    with pytest.raises(TraceFormatError, match="metadata key 'ckpt_trace' missing"):
        read_trace(tmp_path / "f.arrow")


@pytest.mark.parametrize(
    ("version", "column"), [(3, "offset"), (4, "offset_delta"), (4, "size"), (5, "offset"), (5, "ret")]
)
def test_missing_column_is_named(tmp_path, version, column):
    table = table_from_columns(rows())
    table = (_stored(table) if version == 4 else table).drop_columns([column])
    _write_raw(tmp_path / "c.arrow", table, {**META, "format_version": version})
    with pytest.raises(TraceFormatError, match=f"column '{column}' missing"):
        read_trace(tmp_path / "c.arrow")


def test_a_version_3_file_reads_as_it_was_written(tmp_path):
    table = table_from_columns(rows(100))
    _write_raw(tmp_path / "v3.arrow", table, {**META, "format_version": 3})
    assert read_trace(tmp_path / "v3.arrow").table.equals(table.replace_schema_metadata(None))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(TraceFormatError, match="no such trace file"):
        read_trace(tmp_path / "nope.arrow")


def test_version_1_files_read_as_version_2(tmp_path):
    """A version 1 trace (plain strings, no request columns, no arch) reads with the current schema."""
    from ckpt_trace.formats.schema import SCHEMA_V1

    v1 = pa.Table.from_pydict(rows(10), schema=SCHEMA_V1)
    meta = {key: value for key, value in META.items() if key != "arch"}
    _write_raw(tmp_path / "v1.arrow", v1, {**meta, "format_version": 1})
    trace = read_trace(tmp_path / "v1.arrow")
    assert trace.table.schema.equals(SCHEMA.remove_metadata())
    assert trace.metadata["arch"] == "x86_64" and trace.table["interface"].to_pylist() == ["syscall"] * 10
    assert trace.table["path"].to_pylist() == ["/d/f"] * 10 and trace.table["queue_id"].null_count == 10


def test_text_columns_are_dictionary_encoded_and_small(tmp_path):
    table = table_from_columns(rows(100_000))
    path = write_trace(tmp_path / "t.arrow", table, META, batch_rows=8192)
    assert all(
        pa.types.is_dictionary(ipc.open_file(str(path)).schema.field(name).type)
        for name in ("comm", "syscall", "op", "path", "offset_source", "interface")
    )
    assert path.stat().st_size / 100_000 < 8  # bytes per row (each batch refers to the one dictionary)
    assert read_trace(path).table["op"].to_pylist()[-1] == "write"


@pytest.mark.parametrize(
    ("n", "extra_bytes"),
    [(50, 0), (100, 0), (250, 0), (250, 20_000)],
    ids=["one-batch", "one-full-batch", "spooled", "spooled-long-metadata"],
)
def test_trace_writer_stores_the_metadata_it_is_closed_with(tmp_path, n, extra_bytes):
    """At most one batch: written straight at close. More: spooled, then written at close in one pass.
    Each way the rows and every metadata key read back, the metadata is written once (the schema message
    and the footer, no placeholder), and nothing but the trace is left in the directory."""
    writer = TraceWriter(tmp_path / "t.arrow", batch_rows=100)
    table = table_from_columns(rows(n))
    for start in range(0, n, 30):
        writer.write(table.slice(start, 30))
        assert list(tmp_path.iterdir()) == []  # the spool has no name
    meta = {**META, "note": "x" * extra_bytes}
    path = writer.close(meta)
    trace = read_trace(path)
    assert trace.table["offset"].to_pylist() == table["offset"].to_pylist()
    assert trace.metadata["note"] == meta["note"] and trace.metadata["lost_events"] == 3
    assert ipc.open_file(str(path)).num_record_batches == -(-n // 100)
    assert [p.name for p in tmp_path.iterdir()] == ["t.arrow"]
    stored = json.dumps({**meta, "format_version": FORMAT_VERSION}, sort_keys=True).encode()
    assert path.read_bytes().count(stored) == 2  # the schema message and the footer, each once
    assert path.stat().st_size < 2 * len(stored) + 8 * 1024 + 30 * n  # no 8 KiB placeholder


def test_a_spooled_trace_has_one_dictionary_per_text_column_so_polars_reads_it(tmp_path):
    """Text values first seen in later batches are in the file's one dictionary (no dictionary deltas:
    polars refuses them, "delta dictionary batches not supported")."""
    table = table_from_columns(rows(1000))
    table = table.set_column(
        table.schema.get_field_index("path"),
        "path",
        pa.array([f"/d/f{i // 100}" if i % 7 else None for i in range(1000)]),
    )
    writer = TraceWriter(tmp_path / "t.arrow", batch_rows=128)
    for start in range(0, 1000, 90):
        writer.write(table.slice(start, 90))
    path = writer.close(META)
    reader = ipc.open_file(str(path))
    reader.read_all()  # the reader counts dictionary messages as it reads them
    assert reader.num_record_batches == 8 and reader.stats.num_dictionary_deltas == 0
    assert reader.stats.num_dictionary_batches == len([f for f in SCHEMA if pa.types.is_dictionary(f.type)])
    polars = pytest.importorskip("polars")
    assert polars.read_ipc(str(path))["path"].cast(polars.String).to_list() == table["path"].to_pylist()
    assert read_trace(path).table["path"].to_pylist() == table["path"].to_pylist()


def test_a_trace_writer_that_fails_leaves_nothing(tmp_path):
    writer = TraceWriter(tmp_path / "t.arrow", batch_rows=10)
    writer.write(table_from_columns(rows(55)))
    bad = {key: value for key, value in META.items() if key != "arch"}
    with pytest.raises(TraceFormatError, match="lacks key 'arch'"):
        writer.close(bad)
    assert list(tmp_path.iterdir()) == []
    target = tmp_path / "u.arrow"
    target.write_bytes(b"an earlier file")
    writer = TraceWriter(target, batch_rows=10, overwrite=True)
    writer.write(table_from_columns(rows(55)))
    assert read_trace(writer.close(META)).num_rows == 55 and [p.name for p in tmp_path.iterdir()] == ["u.arrow"]


_KILLED_WRITER = """
import sys
sys.path.insert(0, {tests!r})
from helpers.format_rows import META, rows
from ckpt_trace.formats import TraceWriter, table_from_columns
writer = TraceWriter(sys.argv[1], batch_rows=2000)
table = table_from_columns(rows(500))
for i in range(int(sys.argv[2])):
    writer.write(table)
    print("batch", i, flush=True)
print("closing", flush=True)
writer.close(META)
print("closed", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", ["batch 0", "batch 7", "batch 39", "closing", "closed"])
def test_a_writer_killed_at_any_point_leaves_no_file_or_a_whole_one(tmp_path, kill_after):
    """SIGKILL (no cleanup runs) while rows are spooled, while the file is written at close, after it: the
    output is absent or reads whole; while spooling nothing at all is left (the spool has no name)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "out" / "t.arrow"
    out.parent.mkdir()
    code = _KILLED_WRITER.format(tests=str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", code, str(out), "40"], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.strip() == kill_after:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait()
    names = sorted(p.name for p in out.parent.iterdir())
    if out.exists():
        assert read_trace(out).num_rows == 40 * 500
    left = [name for name in names if name != "t.arrow"]
    if kill_after.startswith("batch"):
        assert names == []  # rows were only spooled, into a file without a name
    else:  # a kill inside close's write may leave its random-named temporary file, never a partial trace
        assert all(name.startswith(".t.arrow.") and name.endswith(".tmp") for name in left), left
    if kill_after == "closed":
        assert names == ["t.arrow"]


@pytest.mark.parametrize("encoded", [False, True])
def test_dictionary_codes_map_every_row_to_its_value_and_nulls_past_the_end(encoded):
    """The one text-column lookup (summary, report): code i is values[i], a null row's code is len(values)."""
    from ckpt_trace.formats import dictionary_codes

    column = pa.array(["write", None, "read", "write", None, "fsync"])
    if encoded:
        column = column.dictionary_encode()
    codes, values = dictionary_codes(column.slice(1))  # an offset into the buffers, as a batch's slice has
    names = values.to_pylist() + [None]
    assert [names[c] for c in codes.tolist()] == [None, "read", "write", None, "fsync"]
