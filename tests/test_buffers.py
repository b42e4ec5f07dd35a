"""AlignedBuffer: the I/O layer's staging memory is backed by transparent huge pages from 2 MiB up.

Why it matters (iolayer.buffers docstring): an O_DIRECT request is built from the buffer's physical pages, and
scattered 4 KiB pages split one 4 MiB write into several device requests; the emitted writer's later saves in
one process ran at 69-100 % of fio's rate before (benchmarks/emitted_writer.py --repeated). The kernel's own
account of the mapping (/proc/self/smaps, ``AnonHugePages``) is what is checked here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ckpt_trace.iolayer.buffers import HUGE_PAGE_BYTES, AlignedBuffer

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    try:
        found = re.search(r"\[(\w+)\]", THP.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def _smaps_of(address: int) -> dict[str, int]:
    """The /proc/self/smaps fields (kB) of the mapping holding ``address``."""
    fields: dict[str, int] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            inside = int(head.group(1), 16) <= address < int(head.group(2), 16)
            continue
        if inside:
            name, _, value = line.partition(":")
            parts = value.split()
            if parts and parts[0].isdigit():
                fields[name] = int(parts[0])
    return fields


@pytest.mark.skipif(_thp_mode() in (None, "never"), reason="transparent huge pages are off or absent here")
def test_a_staging_buffer_is_backed_by_huge_pages():
    with AlignedBuffer(2 * HUGE_PAGE_BYTES) as buf:
        buf.prefault()
        fields = _smaps_of(buf.ptr)
        assert fields, "the buffer's mapping is not in /proc/self/smaps"
        assert fields.get("AnonHugePages", 0) * 1024 >= HUGE_PAGE_BYTES, fields
        assert fields.get("Shared_Clean", 0) + fields.get("Shared_Dirty", 0) == 0  # private memory


def test_a_private_buffer_still_serves_o_direct_io(tmp_path):
    """Bytes written with O_DIRECT from the buffer read back equal (private, huge-page memory takes DMA alike)."""
    path = tmp_path / "direct.bin"
    block = os.urandom(4096)
    with AlignedBuffer(2 * HUGE_PAGE_BYTES) as out:
        out.fill(block)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
        except OSError as err:
            pytest.skip(f"O_DIRECT refused on {tmp_path}: {err.strerror}")
        try:
            assert os.pwritev(fd, [out.view()], 0) == len(out.mmap)
        finally:
            os.close(fd)
        assert path.read_bytes() == bytes(out.mmap)
