"""The ``torchsnapshot`` workload (``workloads/builtin/torchsnapshot.py``), added as one module: recorded under
strace, it wrote exactly the files torchsnapshot's own manifest names, each as long as the bytes written to it;
its load restores every value through torchsnapshot and finds a damaged byte; the engine's own restore, outside
the workload, gets the state back bitwise; without torchsnapshot it is one line and exit status 2."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import pytest
from conftest import cli, one_line

from ckpt_trace.errors import WorkloadError
from ckpt_trace.formats import read_trace
from ckpt_trace.workloads import ENGINES, run
from ckpt_trace.workloads.builtin import torchsnapshot as workload

pytestmark = pytest.mark.torch
TINY = ["--model", "gpt2-tiny", "--with-optimizer"]


@pytest.fixture
def engine(torch_installed):
    return pytest.importorskip("torchsnapshot")


def _written_bytes(rows: list[dict]) -> dict[str, int]:
    """Bytes each file received, by its final path (a rename carries what was written under the old name)."""
    written: dict[str, int] = defaultdict(int)
    for row in rows:
        if row["op"] in ("write", "pwrite") and row["ret"] > 0:
            written[row["path"]] += row["ret"]
        elif row["op"] == "rename" and row["ret"] == 0 and row["path"] in written:
            written[row["new_path"]] += written.pop(row["path"])
    return dict(written)


@pytest.mark.slow
@pytest.mark.strace
def test_a_recorded_take_writes_the_files_its_manifest_names(engine, strace_backend, tmp_path):
    assert "torchsnapshot" in ENGINES  # the table found the module; the CLI offers it
    out, trace = tmp_path / "snap", tmp_path / "take.arrow"
    cli("record", "--backend", "strace", "-o", str(trace), "--path-filter", f"{out}/", "--", sys.executable, "-m",
        "ckpt_trace.cli", "workload", "torchsnapshot", "--out", str(out), *TINY)  # fmt: skip
    on_disk = {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*") if p.is_file()}
    manifest = engine.Snapshot(path=str(out)).get_manifest()
    named = {entry.location for entry in manifest.values() if getattr(entry, "location", None)}
    assert set(on_disk) == named | {workload.METADATA}  # nothing more, nothing less than the engine's account
    tensors = [e for e in manifest.values() if type(e).__name__ == "TensorEntry"]
    assert len(tensors) == 4 * len([k for k in manifest if k.startswith("0/model/")])  # weight, step, 2 moments
    for location in {e.location for e in tensors}:  # a batched file ends where its last tensor ends
        assert on_disk[location] == max(e.byte_range[1] for e in tensors if e.location == location)
    written = _written_bytes(read_trace(trace).table.to_pylist())
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
    with open(batched, "r+b") as f:
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 0x01]))
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
    hide = "import runpy, sys; sys.modules['torchsnapshot'] = None; runpy.run_module('ckpt_trace.cli', run_name='__main__')"
    out = tmp_path / "snap"
    proc = subprocess.run(
        [sys.executable, "-c", hide, "workload", "torchsnapshot", "--out", str(out), "--model", "gpt2-tiny"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2 and "needs torchsnapshot" in one_line(proc)
    assert not out.exists()  # the directory the command made is gone again
