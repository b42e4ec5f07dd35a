"""Data like a checkpoint's (issue 34): ``record`` measures how far the written files compress
(``tracer.compressibility``, the trace's ``data_compressibility``) and ``replay --data recorded-ratio``
writes blocks, still unique, that compress as far (``replayer.data``, ``pattern.compressible``).

The replayed files are compressed by the zstd command line (another implementation and level than the
recording's Arrow zstd level 1) and by zlib, and every 4 KiB block is compared with every other.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zlib

import pytest
from conftest import DCP, cli, record

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import read_metadata
from ckpt_trace.iolayer import pattern
from ckpt_trace.iolayer.buffers import AlignedBuffer
from ckpt_trace.replayer import replay
from ckpt_trace.replayer.data import probe_ratio, unique_bytes_for
from ckpt_trace.tracer import compressibility

BLOCK = 4096
HALF_ZEROS = """
import os, sys
with open(sys.argv[1], "wb") as f:
    for _ in range(96):  # 6 MiB: 32 KiB of random bytes, then 32 KiB of zeros
        f.write(os.urandom(32 << 10) + bytes(32 << 10))
"""


@pytest.mark.parametrize("unique", [8, 1000, 2048, 4088])
@pytest.mark.parametrize("offset,size", [(0, 3 * BLOCK), (3, 9000), (4093, 20), (2045, 6000), (12345, 100_000)])
def test_the_compressible_generator_matches_its_reference_and_keeps_blocks_unique(unique, offset, size):
    key = pattern.file_key("ck/half.bin")
    with pattern.compressible(unique) as used, AlignedBuffer(size) as buf:
        assert used == unique and pattern.unique_bytes() == unique
        pattern.fill(buf.ptr, size, key, offset)
        got = bytes(buf.mmap[:size])
        assert got == pattern.data_bytes(offset, size, key)
        whole = pattern.data_bytes(0, 32 * BLOCK, key)
    assert pattern.unique_bytes() == BLOCK  # restored
    for position in range(offset, offset + size):  # zeros exactly from byte `unique` of each block on
        if position % BLOCK >= unique:
            assert got[position - offset] == 0, position
    unzeroed = pattern.data_bytes(0, 32 * BLOCK, key)  # outside the block: the default data again
    blocks = [whole[i : i + BLOCK] for i in range(0, len(whole), BLOCK)]
    assert len(set(blocks)) == len(blocks)
    assert all(b[:unique] == unzeroed[i * BLOCK : i * BLOCK + unique] for i, b in enumerate(blocks))


def test_unique_bytes_are_chosen_so_the_recorded_method_measures_the_ratio():
    for ratio in (0.1, 0.5, 0.9):
        unique, measured = unique_bytes_for(ratio)
        assert abs(measured - ratio) < 0.01 and measured == probe_ratio(unique)
    assert unique_bytes_for(1.0)[0] == BLOCK and unique_bytes_for(0.0)[0] == 8


def test_measure_samples_the_written_files_that_remain_and_follows_renames(tmp_path):
    random_bytes, zeros, small = tmp_path / "r.bin", tmp_path / "z.bin", tmp_path / "s.bin"
    random_bytes.write_bytes(os.urandom(8 << 20))  # 128 pieces: 64 sampled
    zeros.write_bytes(bytes(1 << 20))
    small.write_bytes(b"x")
    written = compressibility.written_paths(
        [str(tmp_path / "r.tmp"), str(zeros), str(small), str(tmp_path / "gone"), "/dev/null"],
        [(str(tmp_path / "r.tmp"), str(random_bytes))],
    )
    measured = compressibility.measure(written)
    assert measured is not None and measured["method"] == compressibility.METHOD
    files = measured["files"]
    assert set(files) == {str(random_bytes), str(zeros), str(small)} and measured["files_not_sampled"] == 0
    assert files[str(random_bytes)]["sampled_bytes"] == 64 * compressibility.SAMPLE_BYTES
    assert files[str(zeros)]["sampled_bytes"] == 1 << 20 and files[str(small)]["sampled_bytes"] == 1
    assert files[str(zeros)]["compressed_bytes"] < (1 << 20) // 1000
    random_ratio = files[str(random_bytes)]["compressed_bytes"] / files[str(random_bytes)]["sampled_bytes"]
    assert 0.999 < random_ratio < 1.01
    size = (8 << 20) + (1 << 20) + 1
    assert measured["size_bytes"] == size
    expected = sum(e["size_bytes"] * e["compressed_bytes"] / e["sampled_bytes"] for e in files.values()) / size
    assert measured["ratio"] == pytest.approx(expected, abs=1e-6)
    assert compressibility.measure([str(tmp_path / "gone"), "/dev/null"]) is None


@pytest.mark.slow  # replay(): tests/test_markers.py counts it as starting processes
def test_recorded_ratio_refuses_a_trace_without_a_measured_ratio(tmp_path):
    assert "data_compressibility" not in read_metadata(DCP)
    with pytest.raises(ReplayError, match="no measured compressibility") as err:
        replay(DCP, target=tmp_path / "t", data="recorded-ratio")
    assert "--data recorded-ratio" in err.value.render(lambda option: "--" + option)
    assert not (tmp_path / "t").exists()


def _compressed_shares(data: bytes) -> dict[str, float]:
    shares = {"zlib-1": len(zlib.compress(data, 1)) / len(data)}
    zstd = shutil.which("zstd")
    if zstd:
        out = subprocess.run([zstd, "-q", "-c", "-3"], input=data, capture_output=True, check=True).stdout
        shares["zstd -3"] = len(out) / len(data)
    return shares


@pytest.mark.slow
def test_a_recorded_ratio_replay_compresses_as_the_recording_did(strace_backend, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    script = tmp_path / "half_zeros.py"
    script.write_text(HALF_ZEROS)
    trace = tmp_path / "t.arrow"
    record(strace_backend, trace, work, "python3", str(script), str(work / "half.bin"))
    measured = read_metadata(trace)["data_compressibility"]
    assert list(measured["files"]) == [str(work / "half.bin")]
    recorded = measured["ratio"]
    assert 0.49 < recorded < 0.52  # half the bytes are zeros
    shares = {}
    for data in ("recorded-ratio", "unique"):
        target = tmp_path / data
        result = cli(
            "replay", str(trace), "--target", str(target), "--data", data, "--repeat", "1", "--verify", "--json"
        )
        assert f'"data_mode": "{data}"' in result.stdout
        replayed = (target / work.relative_to("/") / "half.bin").read_bytes()
        assert len(replayed) == 6 << 20
        blocks = [hashlib.blake2b(replayed[i : i + BLOCK], digest_size=16).digest() for i in range(0, 6 << 20, BLOCK)]
        assert len(set(blocks)) == len(blocks), "two 4 KiB blocks of the replay are equal"
        shares[data] = _compressed_shares(replayed)
    for name, share in shares["recorded-ratio"].items():
        assert abs(share - recorded) < 0.03 * recorded, (name, share, recorded)
    for name, share in shares["unique"].items():
        assert share > 0.99, (name, share)
