"""The ``hf`` workload (``workloads/builtin/hf.py``), added as one module: recorded under strace, it wrote
``config.json``, ``model.safetensors`` and ``optimizer.pt``, each as long as the bytes written to it; the
weights file holds exactly the model's tensors (read with safetensors itself) and the config the model's shape;
a load checks every value and finds a damaged byte; without transformers it is one line and exit status 2."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import CKPT_TRACE, cli, cli_without, one_line, record
from helpers.traces import flip_bit, written_bytes

from ckpt_trace.errors import WorkloadError
from ckpt_trace.formats import read_trace
from ckpt_trace.workloads import ENGINES, run
from ckpt_trace.workloads.builtin import hf
from ckpt_trace.workloads.engines import local_state, model_config

pytestmark = pytest.mark.torch
TINY = ["--model", "gpt2-tiny", "--with-optimizer"]


@pytest.fixture
def transformers(torch_installed):
    return pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.strace
def test_a_recorded_save_writes_the_model_and_the_trainers_optimizer_file(transformers, strace_backend, tmp_path):
    import torch
    from safetensors import safe_open

    assert "hf" in ENGINES  # the table found the module; the CLI offers it
    out, trace = tmp_path / "hf", tmp_path / "save.arrow"
    record("strace", trace, f"{out}/", *CKPT_TRACE, "workload", "hf", "--out", str(out), *TINY)
    on_disk = {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*") if p.is_file()}
    assert set(on_disk) == {hf.CONFIG, hf.WEIGHTS, hf.OPTIMIZER}
    written = written_bytes(read_trace(trace).table.to_pylist())
    assert written == {str(out / name): size for name, size in on_disk.items()}

    cfg = model_config("gpt2-tiny")
    config = json.loads((out / hf.CONFIG).read_text())
    assert (config["n_layer"], config["n_embd"], config["vocab_size"]) == (cfg.n_layer, cfg.d_model, cfg.vocab)
    model = local_state(cfg, 0, 1, True)["model"]  # drawn as the save drew it, with the Adam state
    with safe_open(str(out / hf.WEIGHTS), framework="pt") as f:  # the engine's own reader, not the workload's
        assert set(f.keys()) == set(model)
        for name, tensor in model.items():
            assert torch.equal(f.get_tensor(name).view(torch.int32), tensor.view(torch.int32)), name


@pytest.mark.slow
def test_a_load_checks_every_value_and_finds_a_damaged_byte(transformers, tmp_path):
    out = tmp_path / "hf"
    cli("workload", "hf", "--out", str(out), *TINY)
    cli("workload", "hf", "--out", str(out), *TINY, "--load")
    flip_bit(out / hf.WEIGHTS, -1000)  # inside the last tensor's bytes
    proc = cli("workload", "hf", "--out", str(out), *TINY, "--load", check=False)
    assert proc.returncode == 2 and "differs from what was saved" in one_line(proc)


def test_a_load_without_a_save_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkloadError, match=r"holds no hf checkpoint \(config.json is missing"):
        run("hf", tmp_path / "empty", model="gpt2-tiny", load=True)


def test_without_transformers_the_workload_is_one_error(torch_installed, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    with pytest.raises(WorkloadError, match=r"needs transformers: pip install 'ckpt-trace\[engines\]'"):
        run("hf", tmp_path / "hf", model="gpt2-tiny")
    assert not any((tmp_path / "hf").iterdir())


@pytest.mark.slow
def test_without_transformers_the_cli_prints_one_line_and_exits_2(torch_installed, tmp_path):
    out = tmp_path / "hf"
    proc = cli_without("transformers", "workload", "hf", "--out", str(out), "--model", "gpt2-tiny")
    assert proc.returncode == 2 and "needs transformers" in one_line(proc)
    assert not out.exists()
