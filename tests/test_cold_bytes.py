"""The page cache as recorded: ``cold_bytes`` (format version 6), the bytes of each read that came from storage,
from the page-cache insertions the bcc backend records (``tracer.page_cache``)."""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import cli

from ckpt_trace.formats import read_trace, table_from_columns
from ckpt_trace.tracer import page_cache

SIZE = 16 << 20
PAGE = page_cache.PAGE_BYTES


def _reads(path, offsets, sizes, ends):
    count = len(offsets)
    return table_from_columns(
        {
            "ts_ns": [0] * count,
            "dur_ns": list(ends),
            "pid": [1] * count,
            "tid": [1] * count,
            "comm": ["t"] * count,
            "rank": [0] * count,
            "syscall": ["pread64"] * count,
            "op": ["read"] * count,
            "fd": [3] * count,
            "path": [str(path)] * count,
            "new_path": [None] * count,
            "offset": list(offsets),
            "offset_source": ["explicit"] * count,
            "size": list(sizes),
            "ret": list(sizes),
            "flags": [None] * count,
            "iov_count": [None] * count,
        }
    )


def test_a_page_is_cold_when_inserted_before_the_read_ended(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * (10 * PAGE))
    st = os.stat(path)
    inserts = page_cache.Inserts()
    # pages 0-3 inserted at 10 ns (one folio, as readahead inserts them), page 5 at 1000 ns
    inserts.add_arrays([10, 1000], [page_cache.kernel_dev(st.st_dev)] * 2, [st.st_ino] * 2, [0, 5], [3, 5])
    table = _reads(path, [100, 2 * PAGE, 0, 6 * PAGE], [PAGE, 4 * PAGE, 10 * PAGE, PAGE], [100, 100, 2000, 100])
    cold = inserts.cold_bytes(table).to_pylist()
    # [100, 100 + PAGE): pages 0 and 1, both cold; pages 2-5 read by 100 ns: page 5 came in later, so was warm;
    # the whole file read by 2000 ns: pages 0-3 and 5; page 6 never inserted: warm
    assert cold == [PAGE, 2 * PAGE, 5 * PAGE, 0]
    assert inserts.pages() == 5


def test_rows_that_are_no_data_read_or_whose_file_is_gone_are_unknown(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * PAGE)
    table = _reads(path, [0], [PAGE], [10])
    gone = _reads(tmp_path / "gone", [0], [PAGE], [10])
    inserts = page_cache.Inserts()
    assert inserts.cold_bytes(table).to_pylist() == [0]  # no insertion: warm
    assert inserts.cold_bytes(gone).to_pylist() == [None]
    write = table.set_column(table.column_names.index("op"), "op", pa.array(["write"]).dictionary_encode())
    assert inserts.cold_bytes(write).to_pylist() == [None]


def _drop(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _record_load(tmp_path, data, name):
    trace = tmp_path / f"{name}.arrow"
    reader = f"f = open({str(data)!r}, 'rb', buffering=0)\nwhile f.read(1 << 20): pass"
    cli("record", "--backend", "bcc", "--path-filter", str(data), "-o", str(trace), "--", sys.executable, "-c", reader)
    loaded = read_trace(trace)
    reads = loaded.table.filter(pc.equal(loaded.table.column("op"), "read"))
    return trace, loaded, reads


@pytest.mark.slow
def test_a_load_read_cold_then_warm_records_its_cold_bytes(bcc_backend, tmp_path):
    data = tmp_path / "model.bin"
    data.write_bytes(np.random.default_rng(0).bytes(SIZE))
    _drop(data)
    _, cold, reads = _record_load(tmp_path, data, "cold")
    assert cold.metadata["format_version"] == 6
    assert cold.metadata["page_cache"]["insert_events"] > 0
    assert sum(reads.column("size").to_pylist()) >= SIZE
    # every byte of the file came from storage: the file's pages were dropped, each read by one row
    assert sum(reads.column("cold_bytes").to_pylist()) == SIZE
    # Warm: the file's pages held mapped by this process while the command reads it (a page cache dropped
    # by another process of the machine, echo 3 > drop_caches, keeps mapped pages)
    with open(data, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as held:
        assert sum(held[i] for i in range(0, SIZE, PAGE)) >= 0  # every page faulted in
        _, _, warm = _record_load(tmp_path, data, "warm")
    assert warm.column("cold_bytes").null_count == 0 and sum(warm.column("cold_bytes").to_pylist()) == 0

