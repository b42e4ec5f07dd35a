"""The checkpoint's layout: parsers checked against the engines' own readers, the safe unpickler, storage."""

from __future__ import annotations

import base64
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from ckpt_trace.formats import read_trace
from ckpt_trace.formats.layout import (
    UnsafePickleError,
    add_layout,
    build_layout,
    classify,
    read_layout,
    safe_loads,
)

GOLDEN = Path(__file__).resolve().parent.parent / "traces/golden/v4-dcp-gpt2-tiny-2ranks-bcc.arrow"


def _covered_exactly(table: pa.Table, path: str) -> None:
    """The entries of ``path`` tile the file: no gap, no overlap, ending at its size."""
    rows = sorted((r["offset"], r["length"]) for r in table.to_pylist() if r["path"] == path)
    end = 0
    for offset, length in rows:
        assert offset == end, (path, offset, end)
        end += length
    assert end == os.path.getsize(path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    pytest.importorskip("torch")
    from ckpt_trace.workloads import run

    root = tmp_path_factory.mktemp("layout")
    run("dcp", root / "dcp", ranks=2, model="gpt2-tiny", with_optimizer=True)
    run("torch-save", root / "ts", model="gpt2-tiny", with_optimizer=True)
    run("safetensors", root / "st", model="gpt2-tiny", with_optimizer=True, shards=2)
    return root


@pytest.mark.torch
@pytest.mark.slow
def test_dcp_layout_is_the_checkpoints_own_metadata(saved):
    from torch.distributed.checkpoint import FileSystemReader

    layout = build_layout([str(saved / "dcp")])
    assert not layout.unknown and not layout.errors
    rows = layout.table.to_pylist()
    reference = FileSystemReader(str(saved / "dcp")).read_metadata()  # torch's own unpickling
    expected = {
        (str(saved / "dcp" / info.relative_path), info.offset, info.length): index.fqn
        for index, info in reference.storage_data.items()
    }
    found = {
        (r["path"], r["offset"], r["length"]): r["name"]
        for r in rows
        if r["format"] == "dcp" and r["kind"] != "metadata"
    }
    assert found == expected
    for data_file in sorted((saved / "dcp").glob("*.distcp")):
        _covered_exactly(layout.table, str(data_file))
    by_name = {r["name"]: r for r in rows}
    wte = by_name["model.wte.weight"]
    assert wte["kind"] == "model" and wte["dtype"] == "float32" and wte["shape"] == [1024, 128]
    assert wte["chunk_offsets"] in ([0, 0], [512, 0]) and wte["chunk_sizes"] == [512, 128]
    assert by_name["optim.state.wte.weight.exp_avg"]["kind"] == "optimizer.exp_avg"
    assert by_name["optim.state.wte.weight.exp_avg_sq"]["kind"] == "optimizer.exp_avg_sq"
    assert by_name["optim.state.wte.weight.step"]["kind"] == "optimizer.step"
    assert by_name["optim.param_groups.0.lr"]["kind"] == "optimizer.other"
    assert by_name["<dcp .metadata>"]["length"] == os.path.getsize(saved / "dcp/.metadata")


@pytest.mark.torch
@pytest.mark.slow
def test_safetensors_entries_hold_the_tensors_bytes(saved):
    from safetensors import safe_open

    layout = build_layout([str(saved / "st")])
    assert not layout.unknown and not layout.errors
    rows = layout.table.to_pylist()
    index = [r for r in rows if r["format"] == "hf_index"]
    assert [r["kind"] for r in index] == ["index"]
    tensors = 0
    for shard in sorted((saved / "st").glob("*.safetensors")):
        _covered_exactly(layout.table, str(shard))
        data = shard.read_bytes()
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118  (safe_open is not a mapping)
                (row,) = [r for r in rows if r["path"] == str(shard) and r["name"] == name]
                tensor = handle.get_tensor(name)
                assert data[row["offset"] : row["offset"] + row["length"]] == tensor.numpy().tobytes()
                assert row["shape"] == list(tensor.shape) and row["dtype"] == "float32"
                assert row["kind"] == classify(name.split("."), tensor=True)
                tensors += 1
    assert tensors == sum(1 for r in rows if r["format"] == "safetensors" and r["kind"] != "metadata")
    kinds = {r["kind"] for r in rows if r["format"] == "safetensors"}
    assert kinds == {"metadata", "model", "optimizer.exp_avg", "optimizer.exp_avg_sq"}


@pytest.mark.torch
@pytest.mark.slow
def test_torch_save_storages_map_to_state_dict_keys(saved):
    import torch

    path = saved / "ts/checkpoint.pt"
    layout = build_layout([str(path)])
    assert layout.files == {str(path): "torch_save"}
    _covered_exactly(layout.table, str(path))
    data = path.read_bytes()
    state = torch.load(path, weights_only=True)
    rows = {r["name"]: r for r in layout.table.to_pylist() if not r["name"].startswith("<")}

    def tensors(obj, prefix=()):
        if isinstance(obj, dict):
            for key, value in obj.items():
                yield from tensors(value, prefix + (str(key),))
        elif isinstance(obj, torch.Tensor):
            yield ".".join(prefix), obj

    found = dict(tensors(state))
    assert set(found) == set(rows)
    for name, tensor in found.items():
        row = rows[name]
        storage = bytes(tensor.untyped_storage())
        assert data[row["offset"] : row["offset"] + row["length"]] == storage, name
        assert row["shape"] == list(tensor.shape)
    assert rows["optim.state.wte.weight.exp_avg"]["kind"] == "optimizer.exp_avg"
    assert rows["model.wte.weight"]["kind"] == "model"


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    payload = pickle.dumps({"x": _Boom(str(marker))})
    with pytest.raises(UnsafePickleError, match="posix.system|os.system"):
        safe_loads(payload, strict=True)
    assert not marker.exists()
    lenient = safe_loads(payload, strict=False)  # torch.save files: the global is an inert record, never called
    assert not marker.exists() and type(lenient["x"]).__name__ == "Opaque"
    # A DCP directory whose .metadata is that pickle: refused, the files listed as unknown, nothing run.
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt/.metadata").write_bytes(payload)
    (tmp_path / "ckpt/__0_0.distcp").write_bytes(b"\0" * 100)
    layout = build_layout([str(tmp_path / "ckpt")])
    assert not marker.exists()
    assert "system" in layout.errors[str(tmp_path / "ckpt/.metadata")]
    assert sorted(layout.unknown) == sorted(str(p) for p in (tmp_path / "ckpt").iterdir())
    # The same inside a torch.save zip: the zip's data.pkl is read without running it.
    with zipfile.ZipFile(tmp_path / "evil.pt", "w") as archive:
        archive.writestr("evil/data.pkl", payload)
    layout = build_layout([str(tmp_path / "evil.pt")])
    assert not marker.exists() and layout.files == {str(tmp_path / "evil.pt"): "torch_save"}


def test_unrecognised_files_are_unknown_and_listed(tmp_path):
    (tmp_path / "a.bin").write_bytes(os.urandom(1000))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/b.safetensors").write_bytes(b"\xff" * 64)  # claims a format it does not have
    (tmp_path / "c.index.json").write_text("{}")
    layout = build_layout([str(tmp_path)])
    assert sorted(layout.unknown) == sorted(
        str(p) for p in (tmp_path / "a.bin", tmp_path / "sub/b.safetensors", tmp_path / "c.index.json")
    )
    assert set(layout.errors) == {str(tmp_path / "sub/b.safetensors"), str(tmp_path / "c.index.json")}
    rows = layout.table.to_pylist()
    assert {r["kind"] for r in rows} == {"unknown"} and sum(r["length"] for r in rows) == 1000 + 64 + 2


@pytest.mark.parametrize("golden", [GOLDEN, GOLDEN.with_name("v5-dcp-gpt2-tiny-2ranks-bcc.arrow")], ids=["v4", "v5"])
def test_the_layout_rides_in_the_trace_and_every_reader_gets_it(tmp_path, golden):
    (tmp_path / "a.bin").write_bytes(b"x" * 10)
    layout = build_layout([str(tmp_path / "a.bin")])
    out = tmp_path / "annotated.arrow"
    add_layout(golden, layout.table, layout.info(), out)
    before, after = read_trace(golden), read_trace(out)
    assert after.table.equals(before.table) and dict(after.metadata) == dict(before.metadata)
    table, info = read_layout(out)
    assert table.equals(layout.table) and info["unknown"] == [str(tmp_path / "a.bin")]
    assert read_layout(golden) is None
    # The documented one-liners (formats/README.md).
    schema = ipc.open_file(str(out)).schema
    plain = pa.ipc.open_stream(base64.b64decode(schema.metadata[b"ckpt_trace_layout"])).read_all()
    assert plain.column("path").to_pylist() == [str(tmp_path / "a.bin")]
    assert plain.to_pandas()["length"].tolist() == [10]
    import duckdb
    import polars as pl

    assert pl.from_arrow(plain)["kind"].to_list() == ["unknown"]
    assert duckdb.sql("select sum(length) from plain").fetchall() == [(10,)]
    # In place: the trace itself is replaced atomically, nothing else left in its directory.
    copy = tmp_path / "copy.arrow"
    shutil.copy(golden, copy)
    add_layout(copy, layout.table, layout.info())
    assert read_layout(copy)[0].num_rows == 1 and read_trace(copy).table.equals(before.table)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "annotated.arrow", "copy.arrow"]
    with pytest.raises(Exception, match="already exists"):
        add_layout(golden, layout.table, layout.info(), out)
    from ckpt_trace.formats.convert import upgrade_trace

    upgrade_trace(out, tmp_path / "upgraded.arrow")  # the layout rides along an upgrade
    assert read_layout(tmp_path / "upgraded.arrow")[0].equals(layout.table)


def test_classify_names_kinds_by_key_path():
    assert classify(("optim", "state", "h.0.attn.c_attn.weight", "exp_avg_sq"), tensor=True) == "optimizer.exp_avg_sq"
    assert classify(["optimizer", "state", "3", "step"], tensor=True) == "optimizer.step"
    assert classify(["optim", "param_groups", "0", "lr"], tensor=False) == "optimizer.other"
    assert classify(["model", "h", "0", "mlp", "c_fc", "weight"], tensor=True) == "model"
    assert classify(["transformer", "wte", "weight"], tensor=True) == "model"
    assert classify(["model", "layer", "_extra_state"], tensor=False) == "extra"
    assert classify(("lr_scheduler", "last_epoch"), tensor=False) == "extra"
    assert classify(["optim", "exp_avg_sq", "wte", "weight"], tensor=True) == "optimizer.exp_avg_sq"


@pytest.mark.torch
@pytest.mark.slow
def test_workload_dcp_with_optimizer_saves_a_real_adam_state_after_one_step(saved, tmp_path):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(saved / "dcp"), str(tmp_path / "full.pt"))  # torch's own reader, one process
    state = torch.load(tmp_path / "full.pt", weights_only=False)
    group = state["optim"]["param_groups"][0]
    assert group["betas"] == (0.9, 0.95) and "maximize" in group and "fused" in group  # torch.optim.Adam's own keys
    assert "wte.weight" in group["params"]  # get_state_dict keys optimizer state by FQN
    entry = state["optim"]["state"]["wte.weight"]
    assert float(entry["step"]) == 1.0
    gradient = entry["exp_avg"] / (1 - 0.9)  # one step: exp_avg = (1 - beta1) g, exp_avg_sq = (1 - beta2) g^2
    assert torch.allclose(entry["exp_avg_sq"], (1 - 0.95) * gradient**2, rtol=1e-4, atol=1e-12)
    assert state["model"]["wte.weight"].shape == (1024, 128)


@pytest.mark.torch
def test_a_torchsnapshot_manifest_maps_every_tensor(tmp_path):
    torch = pytest.importorskip("torch")
    torchsnapshot = pytest.importorskip("torchsnapshot")  # pip install 'ckpt-trace[layout]'

    model = torch.nn.Linear(64, 32)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    torchsnapshot.Snapshot.take(path=str(tmp_path / "snap"), app_state={"model": model, "optim": optimizer})
    layout = build_layout([str(tmp_path / "snap")])
    assert set(layout.files.values()) == {"torchsnapshot"} and not layout.unknown and not layout.errors
    rows = {r["name"]: r for r in layout.table.to_pylist()}
    expected = {
        "0/model/weight": model.weight,
        "0/model/bias": model.bias,
        "0/optim/state/0/exp_avg": optimizer.state[model.weight]["exp_avg"],
        "0/optim/state/0/exp_avg_sq": optimizer.state[model.weight]["exp_avg_sq"],
    }
    for name, tensor in expected.items():
        row = rows[name]
        data = Path(row["path"]).read_bytes()[row["offset"] : row["offset"] + row["length"]]
        assert data == tensor.detach().numpy().tobytes(), name
        assert row["shape"] == list(tensor.shape) and row["dtype"] == "float32"
    assert rows["0/model/weight"]["kind"] == "model"
    assert rows["0/optim/state/0/exp_avg_sq"]["kind"] == "optimizer.exp_avg_sq"
    assert rows["0/optim/state/0/step"]["kind"] == "optimizer.step"
    for path in {r["path"] for r in rows.values()}:
        _covered_exactly(layout.table, path)


def test_the_time_bound_stops_parsing_and_says_so(tmp_path):
    header = b'{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    for i in range(3):
        (tmp_path / f"m{i}.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    assert build_layout([str(tmp_path)]).complete
    layout = build_layout([str(tmp_path)], time_limit_s=0.0)
    assert not layout.complete and not layout.info()["complete"]
    assert len(layout.unknown) == 3 and all("time bound" in why for why in layout.errors.values())


class _Pickled:
    """An object of a class the layout table does not know, pickled as DeepSpeed's are (NEWOBJ, then BUILD)."""

    def __init__(self) -> None:
        self.step = 3


def test_unknown_objects_made_by_newobj_and_state_dicts_with_attributes_read_inertly():
    """DeepSpeed's torch.save files hold objects of its own classes (protocol 2: NEWOBJ then BUILD) and
    state dicts (OrderedDicts carrying ``_metadata``): both read as inert records, nothing imported."""
    import collections

    state = collections.OrderedDict(w=1)
    state._metadata = {"": {"version": 1}}
    payload = pickle.dumps({"state": state, "obj": _Pickled()}, protocol=2)
    loaded = safe_loads(payload, strict=False)
    assert dict(loaded["state"]) == {"w": 1} and loaded["state"]._metadata == {"": {"version": 1}}
    assert type(loaded["obj"]).__name__ == "Opaque" and loaded["obj"].step == 3
    assert type(loaded["obj"])._name == "_Pickled"
