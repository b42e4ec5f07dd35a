"""The ``torchsnapshot`` workload (``workloads/builtin/torchsnapshot.py``), added as one module: recorded under
strace, it wrote exactly the files torchsnapshot's own manifest names, each as long as the bytes written to it;
its load restores every value through torchsnapshot and finds a damaged byte; the engine's own restore, outside
the workload, gets the state back bitwise; without torchsnapshot it is one line and exit status 2."""

from __future__ import annotations

import sys

import pytest
from conftest import CKPT_TRACE, cli, cli_without, one_line, record
from helpers.traces import flip_bit, written_bytes

from ckpt_trace.errors import WorkloadError
from ckpt_trace.formats import read_trace
from ckpt_trace.workloads import ENGINES, run
from ckpt_trace.workloads.builtin import torchsnapshot as workload

pytestmark = pytest.mark.torch
TINY = ["--model", "gpt2-tiny", "--with-optimizer"]


@pytest.fixture
def engine(torch_installed):
    return pytest.importorskip("torchsnapshot")


@pytest.mark.slow
@pytest.mark.strace
def test_a_recorded_take_writes_the_files_its_manifest_names(engine, strace_backend, tmp_path):
    assert "torchsnapshot" in ENGINES  # the table found the module; the CLI offers it
    out, trace = tmp_path / "snap", tmp_path / "take.arrow"
    record("strace", trace, f"{out}/", *CKPT_TRACE, "workload", "torchsnapshot", "--out", str(out), *TINY)
    on_disk = {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*") if p.is_file()}
    manifest = engine.Snapshot(path=str(out)).get_manifest()
    named = {entry.location for entry in manifest.values() if getattr(entry, "location", None)}
    assert set(on_disk) == named | {workload.METADATA}  # nothing more, nothing less than the engine's account
    tensors = [e for e in manifest.values() if type(e).__name__ == "TensorEntry"]
    assert len(tensors) == 4 * len([k for k in manifest if k.startswith("0/model/")])  # weight, step, 2 moments
    for location in {e.location for e in tensors}:  # a batched file ends where its last tensor ends
        assert on_disk[location] == max(e.byte_range[1] for e in tensors if e.location == location)
    written = written_bytes(read_trace(trace).table.to_pylist())
    assert written == {str(out / name): size for name, size in on_disk.items()}


@pytest.mark.slow
def test_a_load_restores_every_value_and_finds_a_damaged_byte(engine, tmp_path):
    import torch

    out = tmp_path / "snap"
    cli("workload", "torchsnapshot", "--out", str(out), *TINY)
    cli("workload", "torchsnapshot", "--out", str(out), *TINY, "--load")
    saved = workload.snapshot_state(torch, "gpt2-tiny", True)
    target = {
        k: engine.StateDict(**v) for k, v in workload.snapshot_state(torch, "gpt2-tiny", True, empty=True).items()
    }
    engine.Snapshot(path=str(out)).restore(app_state=target)  # the engine's own restore, outside the workload
    for name, tensor in saved["model"].items():
        assert torch.equal(target["model"][name].view(torch.int32), tensor.view(torch.int32)), name
    assert target["optim"]["param_groups"] == saved["optim"]["param_groups"]

    batched = max((p for p in out.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    flip_bit(batched, 5000)
    proc = cli("workload", "torchsnapshot", "--out", str(out), *TINY, "--load", check=False)
    assert proc.returncode == 2 and "differs from what was saved" in one_line(proc)


def test_a_load_without_a_finished_take_is_refused(tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(WorkloadError, match=r"holds no torchsnapshot checkpoint \(.snapshot_metadata is missing"):
        run("torchsnapshot", tmp_path / "half", model="gpt2-tiny", load=True)


def test_without_torchsnapshot_the_workload_is_one_error(torch_installed, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torchsnapshot", None)  # import torchsnapshot raises ImportError
    with pytest.raises(WorkloadError, match=r"needs torchsnapshot: pip install 'ckpt-trace\[engines\]'"):
        run("torchsnapshot", tmp_path / "snap", model="gpt2-tiny")
    assert not any((tmp_path / "snap").iterdir())


@pytest.mark.slow
def test_without_torchsnapshot_the_cli_prints_one_line_and_exits_2(torch_installed, tmp_path):
    out = tmp_path / "snap"
    proc = cli_without("torchsnapshot", "workload", "torchsnapshot", "--out", str(out), "--model", "gpt2-tiny")
    assert proc.returncode == 2 and "needs torchsnapshot" in one_line(proc)
    assert not out.exists()  # the directory the command made is gone again
