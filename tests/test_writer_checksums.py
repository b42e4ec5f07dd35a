"""The emitted writer's checkpoints carry a checksum per item, checked on load (issue 38, finding 7).

Before: one flipped byte in a data file, or 1 MiB appended to it, loaded with no error.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

try:
    import torch
    import torch.distributed.checkpoint as dcp
except ImportError:  # skipped (or failed under CI) through the torch_installed fixture
    torch = dcp = None

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state() -> dict:
    generator = torch.Generator().manual_seed(3)
    return {"alpha.weight": torch.randn(300, 257, generator=generator),
            "beta.bias": torch.randn(4099, generator=generator).to(torch.bfloat16),
            "step": 7, "notes": {"text": "a pickled value"}}


def _zeros(state: dict) -> dict:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _save(path: Path, **options) -> None:
    from ckpt_trace.writer import CheckpointWriter, WriterOptions

    dcp.save(_state(), storage_writer=CheckpointWriter(path, WriterOptions(**options)))


def _load(path: Path, **options) -> dict:
    from ckpt_trace.writer import CheckpointReader, WriterOptions

    target = _zeros(_state())
    dcp.load(target, storage_reader=CheckpointReader(path, WriterOptions(**options)))
    return target


def _stored(path: Path) -> dict:
    with open(path / "ckpt-trace.metadata", "rb") as handle:
        metadata = pickle.load(handle)["metadata"]
    return {index.fqn: item for index, item in metadata.storage_data.items()}


def _error(path: Path, **options) -> str:
    with pytest.raises(dcp.api.CheckpointException) as caught:
        _load(path, **options)
    return str(caught.value)


@pytest.mark.torch
@pytest.mark.parametrize("load_direct_io", [True, False], ids=["o-direct-stream", "buffered-in-place"])
@pytest.mark.parametrize("victim", ["alpha.weight", "beta.bias", "notes.text"])
def test_a_flipped_byte_fails_the_load_naming_the_item_and_file(tmp_path, torch_installed, load_direct_io, victim):
    path = tmp_path / "ckpt"
    _save(path, load_direct_io=load_direct_io)
    stored = _stored(path)
    assert all(item.checksum is not None and item.checksum_kind for item in stored.values())
    loaded = _load(path, load_direct_io=load_direct_io)
    assert torch.equal(loaded["alpha.weight"], _state()["alpha.weight"])
    item = stored[victim]
    data = path / item.relative_path
    with open(data, "r+b") as handle:
        handle.seek(item.offset + item.size_bytes // 2)
        byte = handle.read(1)
        handle.seek(item.offset + item.size_bytes // 2)
        handle.write(bytes([byte[0] ^ 0x10]))
    message = _error(path, load_direct_io=load_direct_io)
    assert "corrupt" in message and victim in message and str(data) in message, message
    _load(path, load_direct_io=load_direct_io, checksums=False)  # the opt-out loads it


@pytest.mark.torch
def test_a_data_file_with_a_mebibyte_appended_fails_the_load(tmp_path, torch_installed):
    path = tmp_path / "ckpt"
    _save(path)
    data = next(path.glob("*.data"))
    with open(data, "ab") as handle:
        handle.write(b"\0" * (1 << 20))
    message = _error(path)
    assert "extended" in message and str(data) in message, message
    _load(path, checksums=False)
