"""export (Perfetto JSON, Parquet by rank) and diff on real recordings."""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest
from conftest import DCP, ODD, cli

from ckpt_trace.formats import read_trace


@pytest.mark.slow
def test_perfetto_export_has_named_tracks_and_paired_async_events(tmp_path):
    out = tmp_path / "trace.json"
    cli("export", str(DCP), "--format", "perfetto", "-o", str(out))
    data = json.loads(out.read_text())
    table = read_trace(DCP).table
    events = data["traceEvents"]
    begins = [e for e in events if e["ph"] == "b"]
    ends = [e for e in events if e["ph"] == "e"]
    assert len(begins) == len(ends) == table.num_rows
    assert {e["id"] for e in begins} == {e["id"] for e in ends}
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert any("rank 0" in n for n in names) and any("rank 1" in n for n in names)
    first = min(begins, key=lambda e: e["ts"])
    row = table.sort_by("ts_ns").slice(0, 1).to_pylist()[0]
    assert first["ts"] == row["ts_ns"] / 1000 and first["args"]["path"] == row["path"]
    assert data["otherData"]["ckpt_trace"]["backend"] == "bcc"


@pytest.mark.slow
def test_parquet_export_is_partitioned_by_rank_and_complete(tmp_path):
    out = tmp_path / "pq"
    cli("export", str(DCP), "--format", "parquet", "-o", str(out))
    assert {p.name for p in out.iterdir() if p.is_dir()} >= {"rank=0", "rank=1"}
    dataset = ds.dataset(out, format="parquet", partitioning="hive")
    original = read_trace(DCP).table
    assert dataset.count_rows() == original.num_rows
    assert sorted(dataset.to_table(columns=["ts_ns"])["ts_ns"].to_pylist()) == sorted(original["ts_ns"].to_pylist())
    assert json.loads((out / "_ckpt_trace.json").read_text())["format_version"] == 1
    again = cli("export", str(DCP), "--format", "parquet", "-o", str(out), check=False)
    assert again.returncode == 2 and "is not empty" in again.stderr
    forced = cli("export", str(DCP), "--format", "parquet", "-o", str(out), "--force", check=False)
    assert forced.returncode == 2 and "holds an earlier export" in forced.stderr  # rows would double
    assert ds.dataset(out, format="parquet", partitioning="hive").count_rows() == original.num_rows


@pytest.mark.slow
def test_parquet_export_into_a_busy_directory_removes_nothing(tmp_path):
    """--force allows a non-empty directory, `-o .` included: the user's files stay, the export is complete."""
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    proc = cli("export", str(DCP), "--format", "parquet", "-o", ".", "--force", cwd=tmp_path)
    assert "Traceback" not in proc.stderr and keep.read_text() == "mine"
    dataset = ds.dataset(tmp_path / "rank=0", format="parquet")
    assert dataset.count_rows() > 0 and (tmp_path / "_ckpt_trace.json").exists()


@pytest.mark.slow
def test_diff_reports_what_changed(tmp_path):
    data = json.loads(cli("diff", str(ODD), str(DCP), "--json").stdout)
    a, b = read_trace(ODD).table, read_trace(DCP).table
    assert data["totals"]["rows"] == {
        "a": a.num_rows,
        "b": b.num_rows,
        "change": b.num_rows - a.num_rows,
        "ratio": b.num_rows / a.num_rows,
    }
    assert data["ops"]["write"]["b"] == sum(op == "write" for op in b["op"].to_pylist())
    assert "a.final" in data["files_only_in_a"] and ".metadata" in data["files_only_in_b"]
    same = json.loads(cli("diff", str(DCP), str(DCP), "--json").stdout)
    assert all(entry["change"] == 0 for entry in same["totals"].values())
    assert same["files_only_in_a"] == same["files_only_in_b"] == []
    table = cli("diff", str(ODD), str(DCP)).stdout
    assert "ops: write" in table and "files only in A" in table


@pytest.mark.slow
def test_perfetto_export_of_a_selection_keeps_trace_row_ids(tmp_path):
    out = tmp_path / "rank1.json"
    data = json.loads(
        cli("export", str(DCP), "--format", "perfetto", "-o", str(out), "--rank", "1", "--op", "write", "--json").stdout
    )
    table = read_trace(DCP).table
    rows = table.to_pylist()
    wanted = [i for i, r in enumerate(rows) if r["rank"] == 1 and r["op"] == "write"]
    events = json.loads(out.read_text())["traceEvents"]
    begins = [e for e in events if e["ph"] == "b"]
    assert sorted(e["id"] for e in begins) == wanted and data["events"] == len(events)
    for event in begins[:50]:  # each event's id is its row in the whole trace: the same operation
        row = rows[event["id"]]
        assert event["ts"] == row["ts_ns"] / 1000 and event["args"]["offset"] == row["offset"]


@pytest.mark.slow
def test_perfetto_export_refuses_what_a_browser_cannot_open_before_writing(tmp_path):
    out = tmp_path / "all.json"
    rows = read_trace(DCP).num_rows
    proc = cli("export", str(DCP), "--format", "perfetto", "-o", str(out), "--max-ops", "100", check=False)
    assert proc.returncode == 2 and f"the selection holds {rows:,} operations" in proc.stderr
    assert "--rank" in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_parquet_export_of_a_selection(tmp_path):
    out = tmp_path / "pq"
    cli("export", str(DCP), "--format", "parquet", "-o", str(out), "--rank", "0")
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"rank=0"}
    table = read_trace(DCP).table
    dataset = ds.dataset(out, format="parquet", partitioning="hive")
    assert dataset.count_rows() == sum(r == 0 for r in table["rank"].to_pylist())
