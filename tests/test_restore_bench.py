"""benchmarks/restore.py: every loader leaves the saved bytes in the caller's state dict, and a loader that
leaves a wrong byte is caught (issue 36: every loader in the comparison fills the state dict a restart uses)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.benchmarks import load_benchmark

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.torch
def test_every_loader_fills_the_state_dict_and_a_flipped_byte_is_caught(tmp_path, torch_installed):
    bench = load_benchmark("restore")
    loaders, _ = bench._loaders(argparse.Namespace(loaders=",".join(bench.LOADERS)))
    formats = sorted({bench.LOADERS[name].format for name in loaders})
    directory = tmp_path / "hf-sharded"
    saved = bench.run_child(
        str(ROOT / "benchmarks" / "restore.py"),
        "save",
        "hf-sharded",
        directory,
        "--formats",
        ",".join(formats),
        "--quick",
    )
    manifest = json.loads((directory / bench.MANIFEST).read_text())
    assert saved["bytes"] == manifest["bytes"] > 0
    shards = bench._safetensors_files(directory / "safetensors")
    assert len(shards) > 1 and (directory / "safetensors" / "model.safetensors.index.json").exists()
    # The loads fork (restore.py's _fork_load) from a fresh interpreter, as the benchmark's own parent does:
    # forking the test process itself, whose other tests leave threads behind, deadlocked a child once.
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    proc = subprocess.run(
        [sys.executable, str(driver), str(ROOT), str(directory), ",".join(loaders)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in loaders:
        out = found["clean"][name]
        assert out["wrong_count"] == 0, (name, out["wrong"])
        assert out["load_s"] > 0
    # load_state_dict planned the plain tensors itself, without dcp.load
    assert found["clean"]["emitted-no-dcp"]["stats"]["planner"] == "direct"
    index = json.loads((directory / "safetensors" / "model.safetensors.index.json").read_text())
    in_last = [tensor for tensor, file in index["weight_map"].items() if file == shards[-1].name]
    for name in ("safetensors", "safetensors*"):
        out = found["flipped"][name]
        assert out["wrong_count"] == 1 and out["wrong"][0] in in_last, (name, out)


_DRIVER = """
import argparse, importlib.util, json, os, sys
from pathlib import Path

root, directory, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(",")
sys.path.insert(0, str(root / "benchmarks"))
spec = importlib.util.spec_from_file_location("restore_bench", root / "benchmarks" / "restore.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
args = argparse.Namespace(queue_depth=None, buffer_size=None, load_streams=None)
bench._import_for(names)
found = {"clean": {}, "flipped": {}}
for name in names:
    found["clean"][name] = bench._fork_load(name, directory / bench.LOADERS[name].format, args, cold=False)
last = bench._safetensors_files(directory / "safetensors")[-1]  # the last tensor's last byte, flipped
fd = os.open(last, os.O_RDWR)
try:
    end = os.fstat(fd).st_size - 1
    os.pwrite(fd, bytes([os.pread(fd, 1, end)[0] ^ 0xFF]), end)
finally:
    os.close(fd)
for name in ("safetensors", "safetensors*"):
    found["flipped"][name] = bench._fork_load(name, directory / "safetensors", args, cold=False)
print(json.dumps(found, default=str))
"""
