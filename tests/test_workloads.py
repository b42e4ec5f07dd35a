"""Built-in workloads write real checkpoints; recording and replaying a DCP save from several ranks."""

from __future__ import annotations

import pytest
from conftest import CKPT_TRACE, cli, record

from ckpt_trace.formats import read_trace
from ckpt_trace.workloads import run
from ckpt_trace.workloads.models import MODELS, parameter_count, parameter_shapes

pytestmark = pytest.mark.torch


def test_gpt2_shapes_match_the_published_parameter_counts():
    # GPT-2 small has 124,439,808 and medium 354,823,168 parameters (Hugging Face GPT2Model).
    assert parameter_count(MODELS["gpt2-small"]) == 124_439_808
    assert parameter_count(MODELS["gpt2-medium"]) == 354_823_168
    assert len(parameter_shapes(MODELS["gpt2-medium"])) == 2 + 24 * 12 + 2


def test_dcp_recording_has_every_rank_and_replays_to_identical_sizes(torch_installed, backend, tmp_path):
    import torch.distributed.checkpoint as dcp

    out = tmp_path / "ck"
    trace = tmp_path / "dcp.arrow"
    record(
        backend,
        trace,
        f"{out}/",
        *CKPT_TRACE,
        "workload",
        "dcp",
        "--out",
        str(out),
        "--ranks",
        "2",
        "--model",
        "gpt2-tiny",
        "--with-optimizer",
    )
    rows = read_trace(trace).table.to_pylist()
    writes = [r for r in rows if r["op"] == "write"]
    assert {r["rank"] for r in writes} == {0, 1}
    assert len({r["pid"] for r in writes}) == 2
    assert any(r["op"] == "rename" and r["new_path"] == f"{out}/.metadata" for r in rows)
    assert any(r["op"] == "fsync" for r in rows)
    metadata = dcp.FileSystemReader(str(out)).read_metadata()
    assert "model.wte.weight" in metadata.state_dict_metadata

    target = tmp_path / "replay"
    cli("replay", str(trace), "--target", str(target))
    for path in (p for p in out.iterdir() if p.is_file()):
        assert (target / str(path).lstrip("/")).stat().st_size == path.stat().st_size, path.name


def test_dcp_saves_n_times_in_a_row_and_the_trace_shows_each_commit(torch_installed, backend, tmp_path):
    """``--saves 3``: three DCP saves by the same ranks into one directory, each overwriting the last (a job
    that checkpoints every few steps): the recording shows three commits of ``.metadata`` and each rank's
    data file written three times over, and the checkpoint left loads back. ``--saves`` is refused with
    ``--load`` and by workloads that do not take it, in one line."""
    import json

    out = tmp_path / "ck"
    trace = tmp_path / "dcp.arrow"
    args = ["workload", "dcp", "--out", str(out), "--ranks", "2", "--model", "gpt2-tiny"]
    record(backend, trace, f"{out}/", *CKPT_TRACE, *args, "--saves", "3")
    rows = read_trace(trace).table.to_pylist()
    commits = [r for r in rows if r["op"] == "rename" and r["new_path"] == f"{out}/.metadata"]
    assert len(commits) == 3
    data_files = sorted(p for p in out.iterdir() if p.suffix == ".distcp")
    assert len(data_files) == 2
    for path in data_files:
        written = sum(r["ret"] for r in rows if r["op"] == "write" and r["path"] == str(path))
        assert written == 3 * path.stat().st_size, path.name
    loaded = json.loads(cli(*args[:-4], "--model", "gpt2-tiny", "--ranks", "2", "--load", "--json").stdout)
    assert loaded["phase"] == "load" and loaded["saves"] == 1
    for refused in (
        [*args, "--load", "--saves", "2"],
        ["workload", "torch-save", "--out", str(tmp_path / "ts"), "--saves", "2"],
    ):
        proc = cli(*refused, check=False)
        assert proc.returncode == 2 and "--saves applies to a save of dcp only" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_torch_save_and_safetensors_are_loadable(torch_installed, tmp_path):
    import torch
    from safetensors.torch import load_file

    run("torch-save", tmp_path / "ts", model="gpt2-tiny", with_optimizer=True)
    state = torch.load(tmp_path / "ts/checkpoint.pt", weights_only=False)
    assert state["model"]["wte.weight"].shape == (1024, 128)
    assert set(state["optim"]["state"]["wte.weight"]) == {"step", "exp_avg", "exp_avg_sq"}
    run("safetensors", tmp_path / "st", model="gpt2-tiny", with_optimizer=True)
    flat = load_file(str(tmp_path / "st/model.safetensors"))
    assert len(flat) == 3 * len(parameter_shapes(MODELS["gpt2-tiny"]))


def test_torch_save_can_write_one_file_per_layer(torch_installed, tmp_path):
    import torch

    run("torch-save", tmp_path / "fl", model="gpt2-tiny", with_optimizer=True, file_per_layer=True)
    names = sorted(p.name for p in (tmp_path / "fl").iterdir())
    assert names == ["layer_000.pt", "layer_001.pt", "layer_other.pt"]
    layer = torch.load(tmp_path / "fl/layer_001.pt", weights_only=False)
    assert all(name.startswith("h.1.") for name in layer["model"]) and len(layer["model"]) == 12
    assert set(layer["optim"]["state"]) == set(layer["model"])


@pytest.mark.parametrize(
    "engine,extra",
    [
        ("dcp", ["--ranks", "2"]),
        ("emitted", ["--ranks", "2"]),
        ("torch-save", []),
        ("torch-save", ["--mmap"]),
        ("safetensors", []),
        ("safetensors", ["--shards", "4"]),
        ("libaio", []),
        ("memmap", []),
    ],
    ids=["dcp", "emitted", "torch-load", "torch-load-mmap", "safetensors", "safetensors-shards", "libaio", "memmap"],
)
def test_every_engine_loads_back_what_it_saved(torch_installed, tmp_path, engine, extra):
    import json

    out = tmp_path / "ck"
    common = ["--out", str(out), "--model", "gpt2-tiny", "--with-optimizer"]
    ranks = [a for a in extra if a != "--mmap"]  # what the save takes too (--ranks, --shards)
    saved = json.loads(cli("workload", engine, *common, *ranks, "--json").stdout)
    loaded = json.loads(cli("workload", engine, *common, *extra, "--load", "--json").stdout)
    assert saved["phase"] == "save" and loaded["phase"] == "load" and saved["bytes"] == loaded["bytes"] > 0
    assert 0 < loaded["io_s"] <= loaded["elapsed_s"]


def test_a_load_finds_a_damaged_checkpoint(torch_installed, tmp_path):
    out = tmp_path / "st"
    cli("workload", "safetensors", "--out", str(out), "--model", "gpt2-tiny")
    path = out / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1000] ^= 0xFF  # inside the last tensor's bytes
    path.write_bytes(bytes(data))
    proc = cli("workload", "safetensors", "--out", str(out), "--model", "gpt2-tiny", "--load", check=False)
    assert proc.returncode == 2 and "differs from what was saved" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("engine,name", [("libaio", "model.aio.bin"), ("memmap", "model.mmap.bin")])
def test_libaio_and_memmap_loads_find_a_damaged_byte(torch_installed, tmp_path, engine, name):
    out = tmp_path / "ck"
    cli("workload", engine, "--out", str(out), "--model", "gpt2-tiny")
    path = out / name
    with open(path, "r+b") as f:
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 0x01]))
    proc = cli("workload", engine, "--out", str(out), "--model", "gpt2-tiny", "--load", check=False)
    assert proc.returncode == 2 and "differs from what was saved" in proc.stderr
