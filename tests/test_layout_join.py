"""The rows joined to the checkpoint's layout: a brute-force reference, and real recordings of real engines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import cli

from ckpt_trace.analysis.layout import LayoutJoin, join_trace, layout_summary
from ckpt_trace.documents import SummaryDoc, conforms
from ckpt_trace.formats import read_trace
from ckpt_trace.formats.layout import Entry, read_layout, to_table


def _reference(objects, rows):
    """Per object bytes and ops, byte by byte in Python."""
    got = {i: [0, 0] for i in range(len(objects))}
    for path, offset, moved in rows:
        for i, (opath, start, length) in enumerate(objects):
            lo, hi = max(offset, start), min(offset + moved, start + length)
            if opath == path and hi > lo:
                got[i][0] += hi - lo
                got[i][1] += 1
    return got


def test_rows_spanning_objects_count_their_bytes_to_each():
    rng = np.random.default_rng(7)
    objects, entries = [], []
    for path in ("/c/a", "/c/b"):
        offset = 0
        for i in range(40):
            length = int(rng.integers(1, 5000))
            objects.append((path, offset, length))
            entries.append(Entry(path, offset, length, f"{path}:{i}", "model", "dcp"))
            offset += length + int(rng.integers(0, 2)) * 100  # some gaps: unattributed bytes
    layout = to_table(entries)
    order = sorted(range(len(objects)), key=lambda i: (objects[i][0], objects[i][1]))
    objects = [objects[i] for i in order]
    rows = [
        (str(rng.choice(["/c/a", "/c/b", "/elsewhere"])), int(rng.integers(0, 90000)), int(rng.integers(0, 20000)))
        for _ in range(500)
    ]
    batch = pa.RecordBatch.from_pydict(
        {
            "ts_ns": np.arange(len(rows), dtype=np.int64),
            "dur_ns": np.full(len(rows), 1000, np.int64),
            "op": pa.array(["write"] * len(rows)).dictionary_encode(),
            "path": pa.array([r[0] for r in rows]).dictionary_encode(),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "ret": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    join = LayoutJoin(layout)
    join.add(batch)
    expected = _reference(objects, rows)
    assert join.bytes["write"].tolist() == [expected[i][0] for i in range(len(objects))]
    assert join.ops["write"].tolist() == [expected[i][1] for i in range(len(objects))]
    inside = sum(m for p, _, m in rows if p != "/elsewhere")
    assert join.outside["write"] == sum(m for p, _, m in rows if p == "/elsewhere")
    assert int(join.bytes["write"].sum()) + join.unattributed["write"] == inside
    total_time = join.time_ns["write"].sum() + join.unattributed_ns["write"]
    assert total_time == pytest.approx(1000 * sum(1 for p, _, m in rows if p != "/elsewhere" and m > 0))


def _strace_record(trace: Path, *command: str, timeout: float = 600):
    """``ckpt-trace record --backend strace --gpu off -o TRACE -- COMMAND``: the CompletedProcess."""
    return cli("record", "--backend", "strace", "--gpu", "off", "-o", str(trace), "--", *command, timeout=timeout)


def _record(tmp: Path, name: str, *workload: str) -> Path:
    trace = tmp / f"{name}.arrow"
    _strace_record(trace, "python", "-m", "ckpt_trace.cli", "workload", *workload, timeout=900)
    return trace


def _written_per_file(trace: Path) -> dict[str, int]:
    table = read_trace(trace).table.to_pandas()
    writes = table[(table["op"] == "write") & (table["ret"] > 0)]
    return {str(k): int(v) for k, v in writes.groupby("path", observed=True)["ret"].sum().items()}


def _all_attributed(trace: Path, data_files: list[str], direction: str) -> dict:
    """Every byte moved to or from ``data_files`` is in one object with a name and a kind, each object's
    bytes moved exactly once; returns the summary's layout."""
    join = join_trace(trace)
    objects = join.objects().to_pylist()
    column = "bytes_written" if direction == "write" else "bytes_read"
    mine = [o for o in objects if o["path"] in data_files]
    assert mine and all(o["name"] and o["kind"] != "unknown" for o in mine)
    assert all(o[column] == o["length"] for o in mine), [o for o in mine if o[column] != o["length"]][:3]
    assert sum(o[column] for o in mine) == sum(os.path.getsize(p) for p in data_files)
    assert join.unattributed[direction] == 0
    data = json.loads(cli("summary", str(trace), "--json").stdout)
    assert conforms(data, SummaryDoc) is None
    return data["layout"]


@pytest.mark.torch
@pytest.mark.strace
@pytest.mark.slow
def test_a_recorded_dcp_save_attributes_every_written_byte(torch_installed, strace_backend, tmp_path):
    out = tmp_path / "dcp"
    trace = _record(
        tmp_path, "dcp", "dcp", "--out", str(out), "--ranks", "2", "--model", "gpt2-tiny", "--with-optimizer"
    )
    table, info = read_layout(trace)
    assert info["files"] == {str(out / ".metadata"): "dcp"} and not info["unknown"]
    data_files = sorted(str(p) for p in out.glob("*.distcp"))
    written = _written_per_file(trace)
    assert sum(written[p] for p in data_files) == sum(os.path.getsize(p) for p in data_files)
    layout = _all_attributed(trace, data_files + [str(out / ".metadata")], "write")  # .metadata via its rename
    kinds = {entry["kind"]: entry for entry in layout["by_kind"]}
    assert set(kinds) >= {"model", "optimizer.exp_avg", "optimizer.exp_avg_sq", "optimizer.step", "metadata"}
    assert (
        kinds["model"]["bytes_written"]
        == kinds["optimizer.exp_avg"]["bytes_written"]
        == kinds["optimizer.exp_avg_sq"]["bytes_written"]
    )
    assert (
        sum(k["bytes_written"] for k in layout["by_kind"])
        == layout["attributed_bytes_written"]
        == sum(written[p] for p in data_files) + os.path.getsize(out / ".metadata")
    )
    assert sum(c["bytes_written"] for c in layout["by_size_class"]) == layout["attributed_bytes_written"]
    text = cli("summary", str(trace)).stdout
    assert "Checkpoint objects by kind" in text and "optimizer.exp_avg_sq" in text


@pytest.mark.torch
@pytest.mark.strace
@pytest.mark.slow
def test_torch_save_and_its_load_and_a_safetensors_save(torch_installed, strace_backend, tmp_path):
    out = tmp_path / "ts"
    save = _record(tmp_path, "save", "torch-save", "--out", str(out), "--model", "gpt2-tiny", "--with-optimizer")
    _all_attributed(save, [str(out / "checkpoint.pt")], "write")
    load = _record(
        tmp_path, "load", "torch-save", "--load", "--out", str(out), "--model", "gpt2-tiny", "--with-optimizer"
    )
    join = join_trace(load)
    objects = [o for o in join.objects().to_pylist() if o["path"] == str(out / "checkpoint.pt")]
    tensors = [o for o in objects if o["kind"] != "metadata"]
    assert tensors and all(o["bytes_read"] >= o["length"] for o in tensors)  # torch.load reads every storage
    assert join.unattributed["read"] == 0
    diff = json.loads(cli("diff", str(save), str(load), "--json").stdout)["layout"]
    assert (
        0 < diff["by_kind"]["model"]["a"]["bytes"] <= diff["by_kind"]["model"]["b"]["bytes"]
    )  # each storage written once, read at least once
    assert diff["objects_a"] == diff["objects_b"] and not diff["only_in_a_count"]
    st = tmp_path / "st"
    saved = _record(
        tmp_path, "st", "safetensors", "--out", str(st), "--model", "gpt2-tiny", "--with-optimizer", "--shards", "2"
    )
    layout = _all_attributed(saved, sorted(str(p) for p in st.glob("*.safetensors")), "write")
    assert {"model", "optimizer.exp_avg", "optimizer.exp_avg_sq", "metadata", "index"} == {
        k["kind"] for k in layout["by_kind"]
    }


@pytest.mark.strace
@pytest.mark.slow
def test_unknown_files_say_unknown_and_nothing_breaks(strace_backend, tmp_path):
    target = tmp_path / "blob.bin"
    trace = tmp_path / "plain.arrow"
    proc = _strace_record(trace, "python", "-c", f"open({str(target)!r}, 'wb').write(b'x' * 12345)")
    assert "no checkpoint file recognised" in proc.stderr
    assert read_layout(trace) is None and layout_summary(trace) is None
    assert json.loads(cli("summary", str(trace), "--json").stdout)["layout"] is None
    done = json.loads(
        cli("annotate", str(trace), "--checkpoint", str(tmp_path), "-o", str(tmp_path / "a.arrow"), "--json").stdout
    )
    assert str(target) in done["unknown"] and not done["files"]
    layout = json.loads(cli("summary", str(tmp_path / "a.arrow"), "--json").stdout)["layout"]
    assert str(target) in layout["unknown_files"]
    assert layout["by_kind"][0]["kind"] == "unknown" and any(k["bytes_written"] == 12345 for k in layout["by_kind"])
    assert "unknown files" in cli("summary", str(tmp_path / "a.arrow")).stdout


GOLDEN = Path(__file__).resolve().parent.parent / "traces/golden/v4-dcp-gpt2-tiny-2ranks-bcc.arrow"


def _synthetic_layout(trace: Path, object_bytes: int) -> pa.Table:
    """Objects of ``object_bytes`` tiling every file the trace wrote, up to the end of its last write."""
    table = read_trace(trace).table.to_pandas()
    writes = table[(table["op"] == "write") & (table["ret"] > 0) & table["offset"].notna()]
    ends = (writes["offset"] + writes["ret"]).groupby(writes["path"], observed=True).max()
    entries = []
    for path, end in ends.items():
        for i, start in enumerate(range(0, int(end), object_bytes)):
            entries.append(
                Entry(
                    str(path),
                    start,
                    min(object_bytes, int(end) - start),
                    f"{Path(path).name}.t{i}",
                    "model" if i % 2 else "optimizer.exp_avg",
                    "dcp",
                )
            )
    return to_table(entries)


@pytest.mark.slow
def test_report_diff_and_emit_use_the_layout(tmp_path):
    from ckpt_trace.formats.layout import add_layout

    a, b = tmp_path / "a.arrow", tmp_path / "b.arrow"
    add_layout(GOLDEN, _synthetic_layout(GOLDEN, 48 << 10), {"unknown": []}, a)
    add_layout(GOLDEN, _synthetic_layout(GOLDEN, 1 << 20), {"unknown": []}, b)
    cli("report", str(a), "-o", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert "Checkpoint objects" in page and "__0_0.distcp.t1" in page and "Objects by kind" in page
    same = json.loads(cli("diff", str(a), str(a), "--json").stdout)["layout"]
    assert same["moved_differently_count"] == 0 and same["objects_a"] == same["objects_b"] > 0
    other = json.loads(cli("diff", str(a), str(b), "--json").stdout)["layout"]
    assert other["only_in_a_count"] > 0 and other["moved_differently_count"] > 0  # t0 is 48 KiB in A, 1 MiB in B
    changed = {entry["name"]: entry for entry in other["moved_differently"]}
    assert any(name.endswith(".t0") and c["a"]["bytes"] < c["b"]["bytes"] for name, c in changed.items())
    assert "Objects that moved differently" in cli("diff", str(a), str(b)).stdout
    assert json.loads(cli("diff", str(GOLDEN), str(GOLDEN), "--json").stdout)["layout"] is None
    cli("emit", str(a), "-o", str(tmp_path / "w.py"))
    header = (tmp_path / "w.py").read_text()
    assert "Small objects: every object smaller than a staging buffer (threshold buffer_bytes" in header
    assert "objects under 64 KiB" in header
    cli("emit", str(GOLDEN), "-o", str(tmp_path / "plain.py"))
    assert "no checkpoint layout" in (tmp_path / "plain.py").read_text()


@pytest.mark.torch
@pytest.mark.strace
@pytest.mark.slow
def test_a_recorded_hugging_face_save_pretrained(torch_installed, strace_backend, tmp_path):
    pytest.importorskip("transformers")  # pip install 'ckpt-trace[layout]'
    out = tmp_path / "hf"
    script = (
        "from transformers import GPT2Config, GPT2LMHeadModel\n"
        "config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64)\n"
        f"GPT2LMHeadModel(config).save_pretrained({str(out)!r}, max_shard_size='100KB')\n"
    )
    trace = tmp_path / "hf.arrow"
    cli(
        "record",
        "--backend",
        "strace",
        "--gpu",
        "off",
        "--path-filter",
        f"{out}/",
        "-o",
        str(trace),
        "--",
        "python",
        "-c",
        script,
        timeout=900,
    )
    table, info = read_layout(trace)
    shards = sorted(str(p) for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and set(info["files"]) == set(shards) | {str(out / "model.safetensors.index.json")}
    assert sorted(info["unknown"]) == sorted(str(out / n) for n in ("config.json", "generation_config.json"))
    layout = _all_attributed(trace, shards, "write")
    kinds = {k["kind"]: k for k in layout["by_kind"]}
    assert set(kinds) == {"model", "metadata", "index", "unknown"}
    assert kinds["unknown"]["bytes_written"] == sum(os.path.getsize(p) for p in info["unknown"])


@pytest.mark.slow
def test_a_filtered_trace_keeps_the_layout(tmp_path):
    from ckpt_trace.formats.layout import add_layout

    annotated = tmp_path / "a.arrow"
    layout = _synthetic_layout(GOLDEN, 48 << 10)
    add_layout(GOLDEN, layout, {"unknown": []}, annotated)
    cli("filter", str(annotated), "-o", str(tmp_path / "rank0.arrow"), "--rank", "0")
    table, _ = read_layout(tmp_path / "rank0.arrow")
    assert table.equals(layout)
    whole, part = layout_summary(annotated), layout_summary(tmp_path / "rank0.arrow")
    assert 0 < part["attributed_bytes_written"] < whole["attributed_bytes_written"]
