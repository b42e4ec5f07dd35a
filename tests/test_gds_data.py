"""``gds`` writes every strategy's replay data (issue 34): unique per 4 KiB block and per file, from device
memory filled before the clock, or generated and copied as each write is issued.

Without a GPU the data path runs with its buffers on the CPU (``gds.DEVICE = "cpu"``) and a KvikIO
stand-in whose ``CuFile`` moves a tensor's bytes with pwrite(2)/pread(2): what is checked is which bytes
``GdsPath`` hands cuFile, byte for byte against posix's replay of the same trace. On a GPU with KvikIO,
``tests/test_gpu_path.py::test_gds_replays_through_cufile_and_says_which_mode`` replays through cuFile
itself with ``--verify``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import types
import zlib
from pathlib import Path

import pytest
from conftest import DCP

from ckpt_trace.replayer import replay

BLOCK = 4096


class _Done:
    def __init__(self, value: int) -> None:
        self.value = value

    def get(self) -> int:
        return self.value


class _CuFile:
    """KvikIO's ``CuFile`` for tensors in host memory: ``pwrite``/``pread`` of the first n bytes at an offset."""

    def __init__(self, path: str, flags: str) -> None:
        self.fd = os.open(path, os.O_RDWR if flags == "r+" else os.O_RDONLY)

    def pwrite(self, buf, n: int, offset: int) -> _Done:
        return _Done(os.pwrite(self.fd, buf[:n].numpy().tobytes(), offset))

    def pread(self, buf, n: int, offset: int) -> _Done:
        import torch

        data = os.pread(self.fd, n, offset)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return _Done(len(data))

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def gds_on_cpu(monkeypatch, torch_installed):
    from ckpt_trace.replayer import gds

    monkeypatch.setitem(sys.modules, "kvikio", types.SimpleNamespace(CuFile=_CuFile, __version__="stand-in"))
    monkeypatch.setattr(gds, "DEVICE", "cpu")
    monkeypatch.setattr(gds, "probe", lambda: (None, gds.GdsMode(False, "a CPU stand-in for KvikIO")))


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".ckpt-trace")
    }


@pytest.mark.slow
@pytest.mark.parametrize("made", ["before the clock", "as issued"])
def test_gds_writes_the_replay_data_posix_writes(made, gds_on_cpu, tmp_path, monkeypatch):
    if made == "as issued":  # no pregenerated data: each write's bytes generated and copied as it is issued
        monkeypatch.setenv("CKPT_TRACE_REPLAY_PREGENERATE_BYTES", "0")
    gds_report = replay(DCP, target=tmp_path / "gds", strategy="gds", verify=True, repeat=1)
    replay(DCP, target=tmp_path / "posix", strategy="posix", repeat=1)
    result = gds_report.results[0]
    assert result.verified_files == len(gds_report.plan.checks.verify_ranges) == 3
    assert "gds: a CPU stand-in for KvikIO" in result.notes
    generated = [n for n in result.notes if n.startswith("gds: ") and "as each write was issued" in n]
    assert len(generated) == (made == "as issued")
    moved = sum(p["bytes"] for p in result.to_json()["data_paths"].values())
    assert result.to_json()["data_paths"]["cufile"]["bytes"] == moved > 0
    gds_files, posix_files = _files(tmp_path / "gds"), _files(tmp_path / "posix")
    assert gds_files == posix_files  # the same bytes in every file
    whole = b"".join(gds_files.values())
    blocks = {hashlib.blake2b(whole[i : i + BLOCK], digest_size=16).digest() for i in range(0, len(whole), BLOCK)}
    data_files = [data for rel, data in gds_files.items() if rel.endswith(".distcp")]
    assert data_files and all(len(zlib.compress(data, 6)) > 0.99 * len(data) for data in data_files)
    assert len(blocks) > 0.95 * (len(whole) // BLOCK)  # the old table pattern had 251 distinct blocks
