"""``ckpt_trace.writer.load_state_dict``: a one-process restore without DCP's planner fills the state dict as
``dcp.load`` with ``CheckpointReader`` does, byte for byte, and hands every state dict it does not plan to
``dcp.load`` itself (issue 36: DCP's own per-item cost was a third of a warm restore of 610 tensors)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    import torch
    import torch.distributed.checkpoint as dcp
    from writer_state import many_small_state, objects_equal_bitwise, plain_state, zeros_like_state
except ImportError:  # skipped (or failed under CI) through the torch_installed fixture
    torch = dcp = None

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def _nested() -> dict:
    """A model and its optimizer state as nested dicts of whole tensors, as ``state_dict()`` returns them
    flattened by name: 600 small tensors beside 4 large ones, and bf16 and int64 in a second level."""
    generator = torch.Generator().manual_seed(11)
    return {
        "model": many_small_state(small=600, large=4, large_elements=1 << 18),
        "optim": {
            "exp_avg": {"w": torch.randn(333, 17, generator=generator).to(torch.bfloat16)},
            "step": {"w": torch.tensor(12, dtype=torch.int64)},
        },
    }


def _save(path: Path, state: dict) -> None:
    from ckpt_trace.writer import CheckpointWriter

    dcp.save(state, storage_writer=CheckpointWriter(path))


def _drop(path: Path) -> None:
    """Evict the checkpoint's data files from the page cache (POSIX_FADV_DONTNEED, after fsync)."""
    for file in path.iterdir():
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@pytest.mark.parametrize("cache", ["warm", "cold"])
def test_load_state_dict_fills_what_dcp_load_fills_without_its_planner(tmp_path, torch_installed, cache):
    from ckpt_trace.writer import CheckpointReader, load_state_dict

    path = tmp_path / "ckpt"
    state = _nested()
    _save(path, state)
    ways = {}
    for way in ("direct", "dcp.load"):
        target = zeros_like_state(state)
        if cache == "warm":
            for file in path.iterdir():
                file.read_bytes()
        else:
            _drop(path)
        if way == "direct":
            reader = load_state_dict(target, path)
            assert reader.last_load_stats["planner"] == "direct"
        else:
            reader = CheckpointReader(path)
            dcp.load(target, storage_reader=reader)
        assert objects_equal_bitwise(state, target), way
        ways[way] = reader.last_load_stats
    direct, through_dcp = ways["direct"], ways["dcp.load"]
    # the same items read the same way: every tensor's bytes, none twice
    wanted = direct["direct_bytes"] + direct["buffered_bytes"]
    assert wanted == through_dcp["direct_bytes"] + through_dcp["buffered_bytes"]
    assert wanted == sum(t.numel() * t.element_size() for t in _leaves(state))
    if cache == "warm":
        assert direct["mapped_bytes"] == wanted


def _leaves(state: dict):
    for value in state.values():
        if isinstance(value, dict):
            yield from _leaves(value)
        else:
            yield value


def test_state_dicts_it_does_not_plan_go_through_dcp_load(tmp_path, torch_installed):
    """Non-tensor values, views (not whole tensors as stored), a changed shape, a key the checkpoint lacks:
    ``dcp.load``'s path, its result or its error."""
    from ckpt_trace.writer import load_state_dict

    path = tmp_path / "ckpt"
    state = plain_state()
    _save(path, state)
    target = zeros_like_state(state)
    assert load_state_dict(target, path).last_load_stats["planner"] == "dcp"
    assert objects_equal_bitwise(state, target)

    only_tensors = {"f32": torch.zeros(300, 257), "i8": torch.zeros(77, 3, dtype=torch.int8)}
    assert load_state_dict(only_tensors, path).last_load_stats["planner"] == "direct"
    assert torch.equal(only_tensors["f32"], state["f32"]) and torch.equal(only_tensors["i8"], state["i8"])

    # A changed shape, a key the checkpoint lacks (DCP raises), a changed dtype (DCP casts): the same outcome
    for other in (
        {"f32": torch.zeros(300, 256)},
        {"absent": torch.zeros(3)},
        {"f32": torch.zeros(300, 257, dtype=torch.float64)},
    ):
        expected, raised = zeros_like_state(other), None
        try:
            dcp.load(expected, storage_reader=_reader(path))
        except dcp.api.CheckpointException as error:
            raised = type(error)
        found = zeros_like_state(other)
        if raised is not None:
            with pytest.raises(raised):
                load_state_dict(found, path)
            continue
        assert load_state_dict(found, path).last_load_stats["planner"] == "dcp"
        assert objects_equal_bitwise(expected, found) and found["f32"].dtype == torch.float64


def _reader(path: Path):
    from ckpt_trace.writer import CheckpointReader

    return CheckpointReader(path)


def test_a_flipped_byte_fails_the_direct_load_naming_the_item(tmp_path, torch_installed):
    """The checks are the reader's: a flipped byte in a tensor planned directly raises CheckpointError
    naming the item and the file, warm (the mapped copy) and cold."""
    from ckpt_trace.errors import CheckpointError
    from ckpt_trace.writer import load_state_dict
    from ckpt_trace.writer.format import read_metadata

    path = tmp_path / "ckpt"
    state = {"w": torch.randn(1000, 300), "b": torch.randn(77)}
    _save(path, state)
    stored = {index.fqn: item for index, item in read_metadata(path).storage_data.items()}["w"]
    data = path / stored.relative_path
    with open(data, "r+b") as handle:
        handle.seek(stored.offset + stored.size_bytes // 2)
        byte = handle.read(1)
        handle.seek(stored.offset + stored.size_bytes // 2)
        handle.write(bytes([byte[0] ^ 0x01]))
    for cache in ("warm", "cold"):
        if cache == "warm":
            data.read_bytes()
        else:
            _drop(path)
        with pytest.raises(CheckpointError, match=f"checkpoint item w in {data}.*corrupt"):
            load_state_dict({"w": torch.zeros(1000, 300), "b": torch.zeros(77)}, path)


@pytest.mark.parametrize("may_split", [True, False])
def test_the_warm_copys_runs_cover_every_byte_once_in_file_order_and_balance(torch_installed, may_split):
    """``load._balanced_runs`` (the mapped copy's threads): the runs hold every byte of every part once, in
    file order, with addresses advanced with offsets; at most ``count`` runs; split parts make them equal to
    a byte, whole parts leave each run within one part of its share."""
    import random

    from ckpt_trace.writer.load import _balanced_runs

    rng = random.Random(3)
    for _ in range(500):
        sizes = [rng.choice([1, 7, 4096, 65_536, 3 << 20]) for _ in range(rng.randint(1, 14))]
        count = rng.randint(1, 5)
        offsets = [sum(sizes[:i]) + 64 * i for i in range(len(sizes))]  # gaps between items, as on disk
        parts = [(i, 10**9 + offsets[i], offsets[i], size, bool(i % 2)) for i, size in enumerate(sizes)]
        runs = _balanced_runs(parts, count, may_split)
        assert 1 <= len(runs) <= count
        flat = [part for run in runs for part in run]
        covered: dict[int, int] = {}
        for k, dst, offset, size, check in flat:
            assert dst - offset == 10**9 and check == bool(k % 2)  # address and offset advanced together
            assert offset == offsets[k] + covered.get(k, 0)  # each part's pieces in order, none twice
            covered[k] = covered.get(k, 0) + size
        assert covered == dict(enumerate(sizes)) and [p[0] for p in flat] == sorted(p[0] for p in flat)
        loads = [sum(p[3] for p in run) for run in runs]
        if may_split and len(runs) == min(count, sum(sizes)):
            assert max(loads) - min(loads) <= 1, (sizes, count, loads)
        elif not may_split:
            assert max(loads) <= sum(sizes) / count + max(sizes), (sizes, count, loads)


def test_the_mapped_copy_leaves_large_scratch_to_preadvs_batches(tmp_path, torch_installed, monkeypatch):
    """Destinations that cannot take the bytes as stored (strided: each item lands in a scratch tensor
    first) past ``_MAPPED_SCRATCH_BYTES`` in one file: the warm file is read by preadv(2) batches, which
    hold one batch of scratch at a time, not by the mapped copy, which would hold them all; every byte
    right either way."""
    from ckpt_trace.writer import CheckpointReader, load

    path = tmp_path / "ckpt"
    generator = torch.Generator().manual_seed(5)
    state = {f"w{i}": torch.randn(256, 300, generator=generator) for i in range(4)}
    _save(path, state)
    for limit, mapped in ((1 << 30, True), (300 * 1024, False)):  # one item's scratch is 300 KiB
        monkeypatch.setattr(load, "_MAPPED_SCRATCH_BYTES", limit)
        target = {k: torch.zeros(256, 600)[:, ::2] for k in state}
        for file in path.iterdir():
            file.read_bytes()
        reader = CheckpointReader(path)
        dcp.load(target, storage_reader=reader)
        assert all(torch.equal(target[k], state[k]) for k in state)
        stats = reader.last_load_stats
        assert stats["direct_bytes"] == 0 and (stats["mapped_bytes"] > 0) == mapped
        assert (stats["buffered_reads"] > 0) == (not mapped)
