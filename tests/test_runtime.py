"""The slim runtime (issue 36): the emitted writer and reader import without pyarrow, typer, rich or
matplotlib, and fall back to os.preadv/os.pwritev with one line when the io_uring ring cannot be used."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest
from writer_state import objects_equal_bitwise, plain_state, zeros_like_state

import ckpt_trace.formats as formats
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.iolayer.buffers import AlignedBuffer
from ckpt_trace.iolayer.posix_ring import PosixRing

#: What the emitted module must not need (issue 36): the analysis and CLI dependencies of the full package.
HEAVY = ("pyarrow", "typer", "rich", "matplotlib")


def test_formats_imports_no_pyarrow_and_resolves_every_name_on_first_use():
    eager = {"CkptTraceError", "TraceFormatError", "fsync_directory", "OFFSET_SOURCES", "vocabulary"}
    assert set(formats._LAZY) | eager == set(formats.__all__)
    for name in formats._LAZY:
        assert getattr(formats, name) is getattr(__import__(f"ckpt_trace.formats.{formats._LAZY[name]}").formats, name)
    with pytest.raises(AttributeError):
        formats.no_such_name  # noqa: B018


@pytest.mark.slow
def test_the_writer_and_reader_import_with_the_heavy_dependencies_blocked():
    """A finder that refuses pyarrow, typer, rich and matplotlib: importing the writer and reader must not
    ask for any of them (an import of one would raise ImportError here)."""
    code = textwrap.dedent(
        f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {HEAVY!r}:
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        from ckpt_trace.writer import CheckpointReader, CheckpointWriter, WriterOptions
        print(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_posix_ring_writes_and_reads_back_with_the_rings_failure_rule(tmp_path):
    path = tmp_path / "data"
    out, back = AlignedBuffer(8192), AlignedBuffer(8192)
    out.mmap[:] = bytes(range(256)) * 32
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        ring = PosixRing(2)
        ring.submit("write", fd, out.ptr, 4096, 4096, key="w", tag=1)
        ring.submit("write", fd, out.ptr + 4096, 4096, 0, key="w", tag=2)
        ring.submit("fdatasync", fd, 0, 0, 0, key="w")
        assert ring.pending == 3
        ring.drain("w")
        assert ring.pending == 0
        ring.submit("read", fd, back.ptr, 8192, 0, tag="all")
        ring.submit("read", fd, back.ptr, 4096, 6144, tag="tail")  # 2048 bytes left: a short read, no error
        assert ring.wait_result()[1] == 8192
        request, moved = ring.wait_result()
        assert (request.tag, moved) == ("tail", 2048)
        ring.close()
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(out.mmap[4096:]) + bytes(out.mmap[:4096])
    assert bytes(back.mmap[:2048]) == bytes(out.mmap[2048:4096])
    ring = PosixRing(1)
    ring.submit("write", fd, out.ptr, 4096, 0)  # fd is closed now: EBADF, raised by wait
    with pytest.raises(OSError) as caught:
        ring.wait()
    assert caught.value.errno == errno.EBADF
    with pytest.raises(RuntimeError):
        ring.wait()


@pytest.mark.torch
@pytest.mark.parametrize("direct", [True, False], ids=["o-direct", "buffered"])
def test_the_writer_and_reader_fall_back_with_one_line_when_the_ring_cannot_load(
    tmp_path, torch_installed, monkeypatch, capfd, direct
):
    import torch.distributed.checkpoint as dcp

    from ckpt_trace.writer import CheckpointReader, CheckpointWriter, WriterOptions

    def refuse():
        raise rings.RingUnavailable(errno.ELIBBAD, "libckpt_ring.so.1 is stale (forced by the test)")

    monkeypatch.setattr(rings, "library", refuse)
    monkeypatch.setattr(rings, "_notice_given", False)
    options = WriterOptions(direct_io=direct, load_direct_io=direct, buffer_bytes=8192, queue_depth=2)
    state = plain_state()
    dcp.save(state, storage_writer=CheckpointWriter(tmp_path / "ckpt", options))
    target = zeros_like_state(state)
    dcp.load(target, storage_reader=CheckpointReader(tmp_path / "ckpt", options))
    assert objects_equal_bitwise(state, target)
    notices = [line for line in capfd.readouterr().err.splitlines() if "io_uring" in line]
    assert notices == [
        "ckpt-trace: io_uring ring unavailable (libckpt_ring.so.1 is stale (forced by the test)); "
        "using os.preadv/os.pwritev"
    ]
