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
    return {
        "alpha.weight": torch.randn(300, 257, generator=generator),
        "beta.bias": torch.randn(4099, generator=generator).to(torch.bfloat16),
        # over 16 MiB (read alone, not batched): read cold, its CRC is extended piece by piece while the next
        # piece is read
        "gamma.weight": torch.randn(2, 2_200_001, generator=generator),
        "step": 7,
        "notes": {"text": "a pickled value"},
    }


def _zeros(state: dict, scratch: bool = False) -> dict:
    """Destinations for a load; with ``scratch``, tensors the reader cannot fill in place (every other
    element of a wider tensor: not contiguous), so their bytes land in a scratch tensor first and are copied."""
    if scratch:
        return {
            k: torch.zeros((*v.shape[:-1], 2 * v.shape[-1]), dtype=v.dtype)[..., ::2]
            if isinstance(v, torch.Tensor)
            else v
            for k, v in state.items()
        }
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _save(path: Path, **options) -> None:
    from ckpt_trace.writer import CheckpointWriter, WriterOptions

    dcp.save(_state(), storage_writer=CheckpointWriter(path, WriterOptions(**options)))


def _load(path: Path, scratch: bool = False, warm: bool = False, **options) -> dict:
    """Load ``path`` into zeroed destinations; ``warm``: every file read first, so the page cache holds it,
    and the reader's stats must say it read them buffered (as the default policy does with cached files)."""
    from ckpt_trace.writer import CheckpointReader, WriterOptions

    if warm:
        for file in path.iterdir():
            file.read_bytes()
    target = _zeros(_state(), scratch)
    reader = CheckpointReader(path, WriterOptions(**options))
    try:
        dcp.load(target, storage_reader=reader)
    finally:  # the cache was asked before any read, so a load that fails says it too
        assert not warm or reader.last_load_stats["resident_bytes"] > 0
    if warm:
        from ckpt_trace import config

        stats = reader.last_load_stats
        assert stats["direct_bytes"] == 0 and stats["buffered_bytes"] > 0
        # copied out of a mapping (``READER_MAPPED_COPY``, the default), else read by preadv(2)
        assert (
            (stats["mapped_bytes"] == stats["buffered_bytes"])
            if config.READER_MAPPED_COPY
            else (stats["mapped_bytes"] == 0)
        )
    return target


def _stored(path: Path) -> dict:
    with open(path / "ckpt-trace.metadata", "rb") as handle:
        metadata = pickle.load(handle)["metadata"]
    return {index.fqn: item for index, item in metadata.storage_data.items()}


def _error(path: Path, scratch: bool = False, warm: bool = False, **options) -> str:
    with pytest.raises(dcp.api.CheckpointException) as caught:
        _load(path, scratch, warm, **options)
    return str(caught.value)


def _flip(path: Path, item, at: int) -> Path:
    data = path / item.relative_path
    with open(data, "r+b") as handle:
        handle.seek(item.offset + at)
        byte = handle.read(1)
        handle.seek(item.offset + at)
        handle.write(bytes([byte[0] ^ 0x10]))
    return data


# The reader's paths: the O_DIRECT stream (copied out of the arena into the destination), buffered reads
# straight into the destination by two threads (load_streams=2, the default), and either of them through a
# scratch tensor (destinations not contiguous); the checks run on the reader's worker thread (``Verifier``);
# and the default policy on files the page cache holds (read first: ``warm``), whose reading threads check
# their own pieces: copied out of a mapping in C (the default), or read by preadv(2) (``mapped=False``).
PATHS = {
    "o-direct-stream": dict(load_direct_io=True),
    "auto-warm": dict(warm=True),
    "auto-warm-scratch": dict(warm=True, scratch=True),
    "auto-warm-preadv": dict(warm=True, mapped=False),
    "auto-warm-preadv-scratch": dict(warm=True, scratch=True, mapped=False),
    "buffered-in-place": dict(load_direct_io=False),
    "o-direct-scratch": dict(load_direct_io=True, scratch=True),
    "buffered-scratch": dict(load_direct_io=False, scratch=True),
    "buffered-one-stream": dict(load_direct_io=False, load_streams=1),
}


@pytest.mark.torch
@pytest.mark.parametrize("read_path", list(PATHS))
@pytest.mark.parametrize("victim", ["alpha.weight", "beta.bias", "gamma.weight", "notes.text"])
def test_a_flipped_byte_fails_the_load_naming_the_item_and_file(
    tmp_path, torch_installed, read_path, victim, monkeypatch
):
    from ckpt_trace import config

    path = tmp_path / "ckpt"
    options = dict(PATHS[read_path])
    scratch = options.pop("scratch", False)
    warm = options.pop("warm", False)
    monkeypatch.setattr(config, "READER_MAPPED_COPY", int(options.pop("mapped", True)))
    _save(path, **options)
    stored = _stored(path)
    assert all(item.checksum is not None and item.checksum_kind for item in stored.values())
    loaded = _load(path, scratch, warm, **options)
    assert torch.equal(loaded["alpha.weight"], _state()["alpha.weight"])
    assert torch.equal(loaded["beta.bias"], _state()["beta.bias"])
    assert torch.equal(loaded["gamma.weight"], _state()["gamma.weight"])
    assert scratch != loaded["alpha.weight"].is_contiguous()
    item = stored[victim]
    for at in (0, item.size_bytes // 2, item.size_bytes - 1):  # first, middle and last byte
        data = _flip(path, item, at)
        message = _error(path, scratch, warm, **options)
        assert "corrupt" in message and victim in message and str(data) in message, message
        assert f"(bytes {item.offset:,}+{item.size_bytes:,})" in message, message
        line = message.strip().splitlines()[-1]  # DCP wraps the error with its traceback: the one line is last
        assert line.startswith(f"ckpt_trace.errors.CheckpointError: checkpoint item {victim} in {data} "), line
        if victim != "notes.text":  # (a pickle with a flipped byte may not unpickle)
            _load(path, scratch, warm, checksums=False, **options)  # the opt-out loads it
        _flip(path, item, at)  # restored: loads again
        _load(path, scratch, warm, **options)


@pytest.mark.torch
def test_the_verifier_raises_the_first_failure_in_order_and_stops_the_next_submit():
    from ckpt_trace.errors import CheckpointError
    from ckpt_trace.writer.checksum import Verifier

    ran = []

    def check(n, bad):
        def run():
            ran.append(n)
            if bad:
                raise CheckpointError(f"item {n} is corrupt")

        return run

    verifier = Verifier(limit_bytes=10)
    try:
        verifier.submit(check(0, False))
        verifier.submit(check(1, True), held_bytes=8)
        verifier.submit(check(2, True))
        with pytest.raises(CheckpointError, match="item 1 is corrupt"):  # over the limit: waits for the oldest,
            verifier.submit(check(3, False), held_bytes=8)  # finds item 1 failed: the load stops
        with pytest.raises(CheckpointError, match="item 1 is corrupt"):  # item 2 failed too; 1 is reported
            verifier.finish()
        with pytest.raises(CheckpointError, match="item 1 is corrupt"):
            verifier.submit(check(4, False))
    finally:
        verifier.close()
    assert ran[:3] == [0, 1, 2] and 4 not in ran


def test_the_benchmark_pairs_verdict_uses_a_distribution_free_interval_of_the_median():
    from helpers.benchmarks import load_benchmark

    bench = load_benchmark("emitted_writer")
    mid, low, high, coverage = bench.median_interval([0.03, -0.02, 0.01, 0.2, 0.04])
    assert (mid, low, high) == (0.03, -0.02, 0.2) and coverage == pytest.approx(1 - 2 / 32)  # n=5: the range
    assert bench.verdict(low, high) == "within noise"
    values = [0.01 * i for i in range(1, 11)]  # n=10: x(2)..x(9), 97.9 % (x(3)..x(8) would cover 89 %)
    mid, low, high, coverage = bench.median_interval(values)
    assert (low, high) == (0.02, 0.09) and coverage == pytest.approx(1 - 2 * 11 / 1024)
    assert bench.verdict(low, high) == "costs" and bench.verdict(-0.05, -0.01) == "faster with checksums"


@pytest.mark.torch
@pytest.mark.parametrize("one_pass", [False, True], ids=["checksum-thread", "one-pass"])
def test_the_save_checksums_match_an_independent_crc_of_each_item_while_buffers_are_reused(
    tmp_path, torch_installed, monkeypatch, one_pass
):
    """Small staging buffers, two of them: each is refilled many times while the checksum thread, slowed to
    lag behind the copies, still reads earlier pieces; every stored value must still be the checksum of the
    item's own bytes of the kind it records (computed here from the tensor by another package: zlib's
    CRC-32, or the crc32c package directly). ``one-pass``: the staging copies checksum as they copy
    (``staging.one_pass_crc32``), pieces cut at any byte by the 8 KiB buffers, and no thread is used."""
    import zlib

    import ckpt_trace.writer.staging as staging
    from ckpt_trace import config

    monkeypatch.setattr(config, "ONE_PASS_CHECKS", int(one_pass))
    if one_pass and staging.one_pass_crc32() is None:
        pytest.skip("no one-pass checksum and copy here (needs CRC-32 checkpoints, ISA-L, AVX-512 and VPCLMULQDQ)")
    real = staging.update_checksum
    threads = set()

    def lagging(value, piece):
        import threading

        threads.add(threading.current_thread().name)
        for _ in range(20):  # work, not a sleep: the thread falls behind the copies
            real(0, piece)
        return real(value, piece)

    monkeypatch.setattr(staging, "update_checksum", lagging)
    generator = torch.Generator().manual_seed(5)
    state = {f"t{i}": torch.randn(n, generator=generator) for i, n in enumerate([70_001, 5, 40_000, 123_457, 3])}
    path = tmp_path / "ckpt"
    from ckpt_trace.writer import CheckpointWriter, WriterOptions

    dcp.save(state, storage_writer=CheckpointWriter(path, WriterOptions(buffer_bytes=8192, queue_depth=2)))
    stored = _stored(path)
    for name, tensor in state.items():
        data = tensor.numpy().tobytes()
        if stored[name].checksum_kind == "crc32c":
            expected = pytest.importorskip("crc32c").crc32c(data)
        else:
            assert stored[name].checksum_kind == "crc32", stored[name].checksum_kind
            expected = zlib.crc32(data)
        assert stored[name].checksum == expected, name
    # the large items went through the thread, or nothing did
    assert any(name.startswith("ckpt-trace-crc") for name in threads) != one_pass


@pytest.mark.torch
@pytest.mark.parametrize("call_bytes", [1, 1000, 4096, 1 << 20])
def test_a_warm_reads_pieces_cover_each_view_once_in_order_and_extend_to_the_items_checksum(
    tmp_path, torch_installed, call_bytes
):
    """``load._preadv_full`` with ``landed``: what the warm read checks a piece at a time. The pieces each
    view is told of, joined, are that view's bytes of the file (pread(2) of the same range by Python's own
    file object), and the running CRC over them is ``checksum`` of the whole."""
    import os

    from ckpt_trace.writer import checksum as checksums
    from ckpt_trace.writer.load import _preadv_full

    data = os.urandom(10_000)
    path = tmp_path / "data"
    path.write_bytes(data)
    sizes = [3000, 0, 1, 4096, 2903]  # an empty view, a one-byte view; 10,000 bytes in all
    views = [memoryview(bytearray(size)) for size in sizes]
    parts: dict[int, list[bytes]] = {}
    order: list[int] = []
    running = dict.fromkeys(range(len(views)), 0)

    def landed(index: int, part: memoryview) -> None:
        order.append(index)
        parts.setdefault(index, []).append(bytes(part))
        running[index] = checksums.extend(running[index], part, checksums.KIND)

    fd = os.open(path, os.O_RDONLY)
    try:
        calls = _preadv_full(fd, path, views, 0, call_bytes, landed)
    finally:
        os.close(fd)
    assert order == sorted(order)  # in file order
    offset = 0
    with open(path, "rb") as handle:
        for index, size in enumerate(sizes):
            expected = handle.read(size)
            assert bytes(views[index]) == expected == data[offset : offset + size]
            assert b"".join(parts.get(index, [])) == expected
            assert index in parts or size == 0
            if size:
                whole = checksums.checksum(torch.frombuffer(bytearray(expected), dtype=torch.uint8))
                assert running[index] == whole
            offset += size
    assert calls >= -(-len(data) // call_bytes)


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["crc32", "crc32c"])
def test_each_kind_is_recorded_as_asked_and_checked_on_load(tmp_path, torch_installed, kind):
    """``CKPT_TRACE_WRITER_CHECKSUM_KIND`` in a fresh process: the writer records that kind, its values are
    the kind's own (zlib, the crc32c package), and a load, warm and cold, checks them: a flipped byte in
    the middle of an item fails it."""
    import json
    import os
    import subprocess
    import sys
    import zlib

    if kind == "crc32c":
        crc32c = pytest.importorskip("crc32c")
    path = tmp_path / "ckpt"
    script = (
        "import json, sys, torch, torch.distributed.checkpoint as dcp, warnings\n"
        "warnings.filterwarnings('ignore')\n"
        "from ckpt_trace.writer import CheckpointWriter\n"
        "g = torch.Generator().manual_seed(9)\n"
        "state = {'w': torch.randn(3, 300_001, generator=g), 'b': torch.randn(77, generator=g)}\n"
        "dcp.save(state, storage_writer=CheckpointWriter(sys.argv[1]))\n"
        "print(json.dumps({k: v.numpy().tobytes().hex() for k, v in state.items() if k == 'b'}))\n"
    )
    env = dict(os.environ, CKPT_TRACE_WRITER_CHECKSUM_KIND=kind)
    done = subprocess.run([sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    stored = _stored(path)
    assert {item.checksum_kind for item in stored.values()} == {kind}
    small = bytes.fromhex(json.loads(done.stdout)["b"])
    assert stored["b"].checksum == (crc32c.crc32c(small) if kind == "crc32c" else zlib.crc32(small))
    from ckpt_trace.writer import CheckpointReader, WriterOptions

    ways = {  # the warm read (pieces checked as they land) and the O_DIRECT stream (the Verifier's thread)
        "warm": WriterOptions(),
        "o-direct": WriterOptions(load_cache_aware=False),
    }

    def load(way: str) -> dict:
        if way == "warm":
            for file in path.iterdir():
                file.read_bytes()
        target = {"w": torch.zeros(3, 300_001), "b": torch.zeros(77)}
        reader = CheckpointReader(path, ways[way])
        try:
            dcp.load(target, storage_reader=reader)
        finally:
            stats = reader.last_load_stats  # each way read the items
            assert stats["direct_bytes" if way == "warm" else "buffered_bytes"] == 0, stats
        return target

    for way in ways:
        assert load(way)["b"].numpy().tobytes() == small
    _flip(path, stored["w"], stored["w"].size_bytes // 2)
    for way in ways:
        with pytest.raises(dcp.api.CheckpointException, match="corrupt"):
            load(way)
