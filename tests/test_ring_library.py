"""The ring's C library itself: a stale build is refused at load with one line, byte counts are 64-bit, the
BPF ring buffer reader's ordered loads and stores (which it takes from this library) read committed records
only, and the emitted reader's mapped copy lands every byte with its CRC."""

from __future__ import annotations

import ctypes
import mmap
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_trace.iolayer import ring as rings
from ckpt_trace.tracer import ringbuf

needs_cc = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")


def _compile(output, **defines):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import build_ring
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return build_ring.compile_ring(REPO, output, {name: str(value) for name, value in defines.items()})


@needs_cc
def test_a_library_of_another_abi_version_is_refused_in_one_line(tmp_path):
    """A library compiled from a _ring.c of another ABI version (here: CKR_ABI_VERSION=1 against this
    module's ABI_VERSION) is refused before any function is bound; the same source at the right version loads."""
    stale = _compile(tmp_path / "libckpt_ring.so.1", CKR_ABI_VERSION=rings.ABI_VERSION - 1)
    with pytest.raises(rings.RingUnavailable) as caught:
        rings.load_library(stale)
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert f"ABI version {rings.ABI_VERSION - 1}" in message and f"needs version {rings.ABI_VERSION}" in message
    assert "build_ring.py" in message and "--" not in message  # what to do, in library words, no CLI flag
    (tmp_path / "fresh").mkdir()
    fresh = _compile(tmp_path / "fresh" / "libckpt_ring.so.1")
    assert rings.load_library(fresh).ckr_abi_version() == rings.ABI_VERSION


@needs_cc
def test_a_stale_library_beside_its_source_is_rebuilt(tmp_path, monkeypatch):
    """Where _ring.c sits beside the library (a source tree, an editable install), ``library`` rebuilds a
    stale one in place and loads the new one, even though the stale one was loaded (and refused) first."""
    shutil.copy(REPO / "iolayer" / "ckpt_trace" / "iolayer" / "_ring.c", tmp_path / "_ring.c")
    stale = _compile(tmp_path / "libckpt_ring.so.1", CKR_ABI_VERSION=rings.ABI_VERSION + 7)
    monkeypatch.setattr(rings, "_LIBRARY", stale)
    monkeypatch.setattr(rings, "_lib", None)
    lib = rings.library()
    assert lib.ckr_abi_version() == rings.ABI_VERSION
    assert rings.load_library(stale).ckr_abi_version() == rings.ABI_VERSION  # the file itself was replaced
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


@pytest.mark.slow
@needs_cc
def test_a_library_built_before_the_version_check_is_refused(tmp_path):
    """A library without ckr_abi_version at all (every build before it existed) is refused too."""
    source = tmp_path / "old.c"
    source.write_text("int ckr_setup(void) { return 0; }\n")
    library = tmp_path / "libckpt_ring.so.1"
    subprocess.run(
        [*shlex.split(os.environ.get("CC", "cc")), "-shared", "-fPIC", "-o", str(library), str(source)], check=True
    )
    with pytest.raises(rings.RingUnavailable, match="stale: built for ring ABI version 1 or older"):
        rings.load_library(library)


def test_the_posix_loop_counts_more_than_2_gib_in_one_request():
    """One write of 3 GiB - 1 moves more than INT32_MAX bytes over two write(2) calls (Linux moves at most
    2 GiB - 4 KiB per call); its result is the whole count, not a negative 32-bit wrap. /dev/null never reads
    the buffer, so the 3 GiB mapping is never touched (no memory, no disk)."""
    size = 3 * (1 << 30) - 1  # the largest a request's u32 len allows is 4 GiB - 1
    area = mmap.mmap(-1, size + 1, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0))
    address = ctypes.addressof(ctypes.c_char.from_buffer(area))
    fd = os.open("/dev/null", os.O_WRONLY)
    try:
        requests = rings.batch(2)
        requests["opcode"] = rings.OP_WRITE
        requests["fd"] = fd
        requests["addr"] = address
        requests["len"] = size
        requests["off"] = [0, rings.POSITION]  # pwrite(2), and write(2) at the file position
        results, latencies = rings.pio_run(requests)
    finally:
        os.close(fd)
        del address
        area.close()
    assert results.dtype == np.int64 and results.tolist() == [size, size]
    assert rings.first_failure(requests, results) is None and (latencies > 0).all()


def _memfd_ring(size_bytes: int) -> int:
    """A file laid out like a BPF ring buffer map for RingReader (consumer page, producer page, data twice)."""
    fd = os.memfd_create("ringbuf-test")
    os.ftruncate(fd, 2 * mmap.PAGESIZE + 2 * size_bytes)
    return fd


def test_the_bpf_ring_reader_takes_committed_records_and_publishes_its_position():
    """Three records written as the kernel does (8-byte header, sample), the third still BUSY: a read
    returns the first two (a discarded one among them is dropped) and moves consumer_pos past them only;
    once the third commits, the next read returns it. The positions go through the library's acquire load
    and release store (ckr_load_acquire_u64, ckr_store_release_u64)."""
    dtype = np.dtype([("value", "<u8"), ("tag", "<u4")])
    size_bytes = 4 * mmap.PAGESIZE
    fd = _memfd_ring(size_bytes)
    page = mmap.PAGESIZE
    try:
        reader = ringbuf.RingReader(fd, size_bytes, dtype)
        assert reader._ordering.plain is False  # the library is built in this tree
        stride = reader.stride
        assert stride == 8 + 16
        raw = mmap.mmap(fd, 2 * page + 2 * size_bytes)
        header = np.frombuffer(raw, dtype="<u4")
        for index, flags in enumerate((0, ringbuf.DISCARD_BIT, ringbuf.BUSY_BIT, 0)):
            at = 2 * page + index * stride
            header[at // 4] = dtype.itemsize | flags
            raw[at + 8 : at + 8 + dtype.itemsize] = np.array([(100 + index, index)], dtype=dtype).tobytes()
        positions = np.frombuffer(raw, dtype="<u8")
        positions[page // 8] = 4 * stride  # producer_pos: four reserved
        first = reader.read()
        assert first["value"].tolist() == [100]  # the discarded one dropped, the busy one waits
        assert int(positions[0]) == 2 * stride  # consumer_pos: past the two committed ones only
        header[(2 * page + 2 * stride) // 4] = dtype.itemsize  # the third commits
        second = reader.read()
        assert second["value"].tolist() == [102, 103] and int(positions[0]) == 4 * stride
        assert len(reader.read()) == 0
        reader.close()
        del header, positions
        raw.close()
    finally:
        os.close(fd)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cuts=st.lists(st.tuples(st.integers(0, 300_000), st.integers(0, 70_000), st.booleans()), min_size=1, max_size=12),
    window_pages=st.integers(1, 40),
    chunk_bytes=st.sampled_from([1, 4096, 65536, 1 << 20]),
    shift=st.integers(0, 127),
    fused=st.booleans(),
)
def test_copy_mapped_copies_each_piece_and_extends_its_crc(tmp_path, cuts, window_pages, chunk_bytes, shift, fused):
    """``copy_mapped`` (the emitted reader's warm copy): pieces at odd offsets and sizes, overlapping or not,
    in any order, through windows as small as one page and chunks from 1 byte up, to destinations at any
    alignment, land byte for byte as Python's file object reads them; a checked piece's CRC, extended from a
    running value, equals zlib's over the same bytes, an unchecked one is left as given, whether checksum
    and copy run in one pass (``fused``, where ``fused_crc_copy()``) or one after the other; the mmap(2)
    calls counted cover the pieces' windows (at least one per window-sized stretch touched)."""
    import zlib

    from ckpt_trace.writer.checksum import crc32_function

    function = crc32_function()
    path = tmp_path / "data"
    if not path.exists():
        path.write_bytes(np.random.default_rng(5).integers(0, 256, 400_000, dtype=np.uint8).tobytes())
    content = path.read_bytes()
    cuts = [(offset, min(size, len(content) - offset), check and function is not None) for offset, size, check in cuts]
    outputs = [np.zeros(max(size, 1) + shift, dtype=np.uint8)[shift:] for _, size, _ in cuts]
    pieces = np.array(
        [(out.ctypes.data, offset, size, int(check), 7) for out, (offset, size, check) in zip(outputs, cuts)],
        dtype=rings.PIECE_DTYPE,
    )
    window_bytes = window_pages * mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        copied, maps = rings.copy_mapped(
            fd, pieces, function, window_bytes=window_bytes, chunk_bytes=chunk_bytes, fused=fused
        )
    finally:
        os.close(fd)
    assert copied == sum(size for _, size, _ in cuts)
    for out, row, (offset, size, check) in zip(outputs, pieces, cuts):
        assert out[:size].tobytes() == content[offset : offset + size]
        assert int(row["crc"]) == (zlib.crc32(content[offset : offset + size], 7) if check else 7)
    touched = sum(-(-size // window_bytes) for _, size, _ in cuts if size)
    assert (maps >= 1) == (copied > 0) and maps <= touched + sum(1 for _, size, _ in cuts if size)


def test_copy_mapped_one_pass_crc_equals_zlib_at_every_block_count_and_alignment(tmp_path):
    """The one-pass checksum and copy (AVX-512 VPCLMULQDQ folding) against zlib's CRC-32: pieces of 256 B to
    8 KiB in 64-byte steps plus 1 MiB and 1 MiB + 1, each to a destination 0-63 bytes past a 64-byte
    boundary, each from a different running value, land byte for byte with zlib's CRC; the same with the
    one pass off."""
    import zlib

    from ckpt_trace.writer.checksum import crc32_function

    function = crc32_function()
    if not rings.fused_crc_copy() or function is None:
        pytest.skip("this CPU or build has no one-pass checksum and copy (needs AVX-512 and VPCLMULQDQ), or no ISA-L")
    content = np.random.default_rng(11).integers(0, 256, (1 << 20) + 8192, dtype=np.uint8).tobytes()
    path = tmp_path / "data"
    path.write_bytes(content)
    sizes = [*range(256, 8193, 64), 1 << 20, (1 << 20) + 1]
    cuts = [(k * 7 % 4096, size, k % 64) for k, size in enumerate(sizes)]  # (offset, size, shift)
    base = [np.zeros(size + 128, dtype=np.uint8) for _, size, _ in cuts]
    outputs = [out[(-out.ctypes.data) % 64 + shift :][:size] for out, (_, size, shift) in zip(base, cuts)]
    assert [out.ctypes.data % 64 for out in outputs] == [shift for _, _, shift in cuts]
    seeds = [(k * 2654435761) & 0xFFFFFFFF for k in range(len(cuts))]
    fd = os.open(path, os.O_RDONLY)
    try:
        for fused in (True, False):
            for out in outputs:
                out[:] = 0
            pieces = np.array(
                [
                    (out.ctypes.data, offset, size, 1, seed)
                    for out, (offset, size, _), seed in zip(outputs, cuts, seeds)
                ],
                dtype=rings.PIECE_DTYPE,
            )
            rings.copy_mapped(fd, pieces, function, fused=fused)
            for out, row, (offset, size, _), seed in zip(outputs, pieces, cuts, seeds):
                assert out.tobytes() == content[offset : offset + size], (fused, size)
                assert int(row["crc"]) == zlib.crc32(content[offset : offset + size], seed), (fused, size)
    finally:
        os.close(fd)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 300_000),
    src_shift=st.integers(0, 127),
    dst_shift=st.integers(0, 127),
    seed=st.integers(0, 0xFFFFFFFF),
    fused=st.booleans(),
)
def test_copy_crc32_copies_and_extends_the_crc_as_zlib(size, src_shift, dst_shift, seed, fused):
    """``copy_crc32`` (the writer's staging copies): any size, source and destination at any alignment,
    from any running value: the destination holds the source's bytes, the bytes around it are untouched,
    and the CRC equals zlib's, in one pass or not."""
    import zlib

    from ckpt_trace.writer.checksum import crc32_function

    function = crc32_function()
    if function is None:
        pytest.skip("isal is not installed (no CRC-32 function to pass)")
    source = np.random.default_rng(size).integers(0, 256, size + src_shift, dtype=np.uint8)
    target = np.full(size + dst_shift + 64, 0xA5, dtype=np.uint8)
    crc = rings.copy_crc32(
        target.ctypes.data + dst_shift, source.ctypes.data + src_shift, size, seed, function, fused=fused
    )
    assert target[dst_shift : dst_shift + size].tobytes() == source[src_shift:].tobytes()
    assert not (target[:dst_shift] != 0xA5).any() and not (target[dst_shift + size :] != 0xA5).any()
    assert crc == zlib.crc32(source[src_shift:].tobytes(), seed)
    with pytest.raises(ValueError, match="CRC-32 function"):
        rings.copy_crc32(target.ctypes.data, source.ctypes.data, size, seed, 0)


def test_copy_mapped_refuses_a_wrong_array_and_says_which_mmap_failed(tmp_path):
    """A pieces array of another dtype is refused before any C call; mmap(2) on a descriptor open for writing
    only fails with EACCES, raised as OSError naming mmap."""
    with pytest.raises(ValueError, match="PIECE_DTYPE"):
        rings.copy_mapped(0, np.zeros(2, dtype=np.uint64))
    path = tmp_path / "data"
    path.write_bytes(b"x" * 8192)
    out = np.zeros(10, dtype=np.uint8)
    fd = os.open(path, os.O_WRONLY)
    try:
        pieces = np.array([(out.ctypes.data, 0, 10, 0, 0)], dtype=rings.PIECE_DTYPE)
        with pytest.raises(OSError, match="mmap") as caught:
            rings.copy_mapped(fd, pieces)
        assert caught.value.errno == 13
    finally:
        os.close(fd)
