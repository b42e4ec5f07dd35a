"""Record a small load under the bcc backend and save its page-cache insertions and read rows.

The saved stream (``tests/data/cache_inserts.npz``) lets ``tests/test_cold_bytes.py`` check the interval
method of ``tracer.page_cache`` against a page-by-page count on real kernel input: ``inserts`` (rows: ts_ns on
the trace's clock, file number, first and last page index of the folio), ``reads`` (rows: file number,
offset, ret, ts_ns, dur_ns of every read row) and ``cold_bytes`` (the column the recording wrote) and
``meta`` (JSON: file sizes, page size, kernel). The workload reads two files, partly warm at the start,
sequentially and at random offsets, and drops some of their pages mid-way (``posix_fadvise(DONTNEED)``) to
read them again: pages inserted twice, and pages read warm then inserted after that read ended. Needs root
and bcc.

    python scripts/save_cache_inserts.py [tests/data/cache_inserts.npz]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from ckpt_trace.cli import main as cli_main
from ckpt_trace.formats import read_trace
from ckpt_trace.iolayer.pagecache import evict
from ckpt_trace.tracer import page_cache

SIZES = (8 << 20, 3 << 20 | 1234)  # the second file ends mid-page

WORKLOAD = r"""
import os, random, sys
rng = random.Random(7)
paths = sys.argv[1:]
fds = [os.open(p, os.O_RDONLY) for p in paths]
sizes = [os.fstat(fd).st_size for fd in fds]
for off in range(0, 4 << 20, 256 << 10):
    os.pread(fds[0], 256 << 10, off)
for _ in range(60):
    f = rng.randrange(2)
    os.pread(fds[f], rng.randrange(1, 300_000), rng.randrange(sizes[f]))
os.posix_fadvise(fds[0], 2 << 20, 1 << 20, os.POSIX_FADV_DONTNEED)
os.posix_fadvise(fds[0], 0, 1 << 20, os.POSIX_FADV_DONTNEED)
os.posix_fadvise(fds[1], 0, 0, os.POSIX_FADV_DONTNEED)
for f, off, n in ((0, 2 << 20, 1 << 20), (0, 100, 1 << 20), (1, 5000, 2 << 20)):
    os.pread(fds[f], n, off)
for _ in range(30):
    f = rng.randrange(2)
    os.pread(fds[f], rng.randrange(1, 300_000), rng.randrange(sizes[f]))
"""


def main(out: str) -> None:
    parts: list[np.ndarray] = []
    original = page_cache.Inserts.add

    def add(self, records, start_ns):
        parts.append(
            np.stack(
                [
                    records["ts_ns"].astype(np.int64) - start_ns,
                    records["dev"].astype(np.int64),
                    records["ino"].astype(np.int64),
                    records["index"].astype(np.int64),
                    records["last_index"].astype(np.int64),
                ],
                axis=1,
            )
        )
        original(self, records, start_ns)

    page_cache.Inserts.add = add  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as scratch:
        paths = [Path(scratch) / f"f{i}.bin" for i in range(len(SIZES))]
        rng = np.random.default_rng(3)
        for path, size in zip(paths, SIZES):
            path.write_bytes(rng.bytes(size))
            evict(path)
        with open(paths[0], "rb") as f:  # warm at the start: [2 MiB, 3 MiB) of the first file
            f.seek(2 << 20)
            f.read(1 << 20)
        trace = Path(scratch) / "t.arrow"
        script = Path(scratch) / "load.py"
        script.write_text(WORKLOAD)
        try:
            cli_main(
                ["record", "--backend", "bcc", "-o", str(trace), "--", sys.executable, str(script), *map(str, paths)]
            )
        except SystemExit as done:
            if done.code:
                raise
        keys = [(page_cache.kernel_dev(os.stat(p).st_dev), os.stat(p).st_ino) for p in paths]
        raw = np.concatenate(parts)
        number = np.full(len(raw), -1)
        for i, key in enumerate(keys):
            number[(raw[:, 1] == key[0]) & (raw[:, 2] == key[1])] = i
        raw = raw[number >= 0]
        inserts = np.stack([raw[:, 0], number[number >= 0], raw[:, 3], raw[:, 4]], axis=1)
        table = read_trace(trace).table
        table = table.filter(
            pc.and_(
                pc.equal(table.column("op"), "read"),
                pc.is_in(table.column("path"), pc.cast([str(p) for p in paths], "string")),
            )
        )
        path_list = table.column("path").to_pylist()
        reads = np.stack(
            [np.array([paths.index(Path(p)) for p in path_list])]
            + [
                np.asarray(table.column(c).to_numpy(zero_copy_only=False), np.int64)
                for c in ("offset", "ret", "ts_ns", "dur_ns")
            ],
            axis=1,
        )
        cold = np.asarray(table.column("cold_bytes").to_numpy(zero_copy_only=False), np.int64)
    meta = {"sizes": SIZES, "page_bytes": page_cache.PAGE_BYTES, "kernel": os.uname().release}
    np.savez_compressed(out, inserts=inserts, reads=reads, cold_bytes=cold, meta=json.dumps(meta))
    print(f"{len(inserts)} insertions, {len(reads)} reads, {int(cold.sum()):,} cold bytes -> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/cache_inserts.npz")
