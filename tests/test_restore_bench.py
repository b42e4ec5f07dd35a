"""benchmarks/restore.py: every loader leaves the saved bytes in the caller's state dict, and a loader that
leaves a wrong byte is caught (issue 36: every loader in the comparison fills the state dict a restart uses)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("restore_bench", ROOT / "benchmarks" / "restore.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return bench


@pytest.mark.slow
@pytest.mark.torch
def test_every_loader_fills_the_state_dict_and_a_flipped_byte_is_caught(tmp_path, torch_installed):
    bench = _bench()
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
    args = argparse.Namespace(queue_depth=None, buffer_size=None, load_streams=None)
    bench._import_for(loaders)
    for name in loaders:
        out = bench._fork_load(name, directory / bench.LOADERS[name].format, args, cold=False)
        assert out["wrong_count"] == 0, (name, out["wrong"])
        assert out["load_s"] > 0

    last = shards[-1]  # flip the last byte of the last shard: the last tensor's last byte
    fd = os.open(last, os.O_RDWR)
    try:
        end = os.fstat(fd).st_size - 1
        os.pwrite(fd, bytes([os.pread(fd, 1, end)[0] ^ 0xFF]), end)
    finally:
        os.close(fd)
    index = json.loads((directory / "safetensors" / "model.safetensors.index.json").read_text())
    in_last = [tensor for tensor, file in index["weight_map"].items() if file == last.name]
    for name in ("safetensors", "safetensors*"):
        out = bench._fork_load(name, directory / "safetensors", args, cold=False)
        assert out["wrong_count"] == 1 and out["wrong"][0] in in_last, (name, out)
