"""The replay's data: incompressible, unique per 4 KiB block and per file, the same under every strategy.

A storage system that deduplicates blocks or compresses would otherwise see
few unique bytes and report flattering throughput (issue 34). The generator
(C, ``ckr_fill``) is compared with its numpy reference; replayed files are
compressed with zstd (its command line, at its default level and with a
128 MiB window), zlib and xz, and every full 4 KiB block the replay wrote
is compared with every other.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import DCP

from ckpt_trace.iolayer import pattern
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.iolayer.buffers import AlignedBuffer
from ckpt_trace.replayer import replay

BLOCK = 4096


@pytest.mark.parametrize(
    "offset,size", [(0, 4096), (3, 5000), (4093, 20), (12345, 100_000), (0, 1 << 20), (7, 3), ((1 << 40) + 4090, 9000)]
)
def test_the_c_generator_matches_its_numpy_reference(offset, size):
    key = pattern.file_key("dir/file.bin")
    with AlignedBuffer(size) as buf:
        pattern.fill(buf.ptr, size, key, offset)
        assert bytes(buf.mmap[:size]) == pattern.data_bytes(offset, size, key)
    # a piece is the same bytes as the whole range's slice: content depends on (key, offset) only
    whole = pattern.data_bytes(offset - offset % 8, size + 16, key)
    assert pattern.data_bytes(offset, size, key) == whole[offset % 8 : offset % 8 + size]


def test_keys_differ_per_path_and_are_int64():
    keys = {pattern.file_key(f"ckpt/__{i}_0.distcp") for i in range(1000)}
    assert len(keys) == 1000 and all(0 <= k < 2**63 for k in keys)


def _ring_or_skip():
    problem = rings.probe()
    if problem:
        pytest.skip(f"io_uring unavailable: {problem}")


@pytest.mark.parametrize("engine", ["ring", "pio"])
def test_generated_writes_recycle_their_slots_and_land_where_asked(engine, tmp_path):
    """64 writes of 64 KiB (some at unaligned offsets) through 3 slots at depth 16: every byte as generated."""
    if engine == "ring":
        _ring_or_skip()
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    key = pattern.file_key("f")
    size, count = 64 << 10, 64
    offsets = np.arange(count, dtype=np.int64) * size + 3  # unaligned: generated from mid-word
    order = np.random.default_rng(1).permutation(count)
    requests = rings.batch(count)
    requests["opcode"] = rings.OP_WRITE
    requests["fd"] = fd
    requests["off"] = offsets[order]
    requests["addr"] = offsets[order]  # the content offset: the file offset
    requests["len"] = size
    requests["user_data"] = key
    generate = np.ones(count, bool)
    slots = rings.Slots(size, 1 if engine == "pio" else 3)
    try:
        if engine == "ring":
            with rings.Ring(16) as ring:
                results, _ = ring.run(requests, generate=generate, slots=slots)
        else:
            results, _ = rings.pio_run(requests, generate=generate, slots=slots)
        assert (results == size).all()
        too_big = requests[:1].copy()
        too_big["len"] = slots.slot_bytes + 1
        with pytest.raises(OSError, match="Invalid argument"):  # larger than a slot: refused, nothing written
            if engine == "ring":
                with rings.Ring(4) as ring:
                    ring.run(too_big, generate=np.ones(1, bool), slots=slots)
            else:
                rings.pio_run(too_big, generate=np.ones(1, bool), slots=slots)
    finally:
        slots.close()
        os.close(fd)
    data = path.read_bytes()
    assert data[:3] == b"\0\0\0" and data[3:] == pattern.data_bytes(3, count * size, key)


def _written_blocks(target: Path, plan) -> list[bytes]:
    """Every full 4 KiB block (file-aligned) inside the ranges the plan leaves written, of every file."""
    blocks = []
    for rel, ranges in plan.checks.verify_ranges.items():
        data = (target / rel).read_bytes()
        for start, end in ranges:
            first = -(-start // BLOCK) * BLOCK
            blocks.extend(data[offset : offset + BLOCK] for offset in range(first, end - BLOCK + 1, BLOCK))
    return blocks


def _compressed_share(data: bytes) -> dict[str, float]:
    """Compressed size over original size, per compressor (1.0: nothing gained)."""
    shares = {"zlib-6": len(zlib.compress(data, 6)) / len(data), "xz": len(lzma.compress(data, preset=1)) / len(data)}
    zstd = shutil.which("zstd")
    if zstd:
        for args in (["-3"], ["-3", "--long=27"]):
            out = subprocess.run([zstd, "-q", "-c", *args], input=data, capture_output=True, check=True).stdout
            shares["zstd " + " ".join(args)] = len(out) / len(data)
    return shares


@pytest.mark.slow
@pytest.mark.parametrize("made", ["before the clock", "as issued"])
@pytest.mark.parametrize("strategy", ["posix", "uring-buffered", "uring-direct", "aggregated"])
def test_a_replay_writes_incompressible_blocks_that_never_repeat(strategy, made, tmp_path, monkeypatch):
    if strategy != "posix":
        _ring_or_skip()
    if made == "as issued":  # no memory for the bytes before the clock: the C loops generate them
        monkeypatch.setenv("CKPT_TRACE_REPLAY_PREGENERATE_BYTES", "0")
    target = tmp_path / "t"
    report = replay(DCP, target=target, strategy=strategy, verify=True)
    plan = report.plan
    assert report.results[0].verified_files == len(plan.checks.verify_ranges) == 3
    assert report.options["data"].startswith("generated")
    notes = [n for n in report.results[0].notes if n.startswith("data generated as each write was issued")]
    assert len(notes) == (made == "as issued")
    blocks = _written_blocks(target, plan)
    assert len(blocks) > 500  # the tiny DCP save writes a few MiB in three files
    digests = [hashlib.blake2b(b, digest_size=16).digest() for b in blocks]
    assert len(set(digests)) == len(digests), "two 4 KiB blocks of the replay are equal"
    whole = b"".join((target / rel).read_bytes() for rel in sorted(plan.checks.verify_ranges))
    shares = _compressed_share(whole)
    assert all(share > 0.99 for share in shares.values()), shares  # compresses by less than 1 %


def test_the_table_pattern_would_have_failed_these_checks():
    """The checks above can fail: the old table pattern (the bench's) repeats its blocks and compresses."""
    data = b"".join(pattern.expected(o, BLOCK, 3) for o in range(0, 8 << 20, BLOCK))
    digests = {hashlib.blake2b(data[o : o + BLOCK], digest_size=16).digest() for o in range(0, len(data), BLOCK)}
    assert len(digests) == pattern.PAGES < len(data) // BLOCK
    assert _compressed_share(data)["xz"] < 0.5
