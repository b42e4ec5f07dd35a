"""Record a small workload under the bcc backend and save the raw ring records it copied, poll by poll.

The saved stream (``tests/data/raw_stream.npz``) lets tests feed the same real events through both of the
recorder's decoding paths (``tests/test_stream.py``): one array per ring per poll (``<poll>_<ring>``, the
records as ``ringbuf.RingReader`` copied them, with their exact dtypes) and ``meta``, a JSON string with the
builder's arguments, the root process, the ranks read at exec and the recording's counts. Needs root and bcc.

    python scripts/save_raw_stream.py [tests/data/raw_stream.npz]
    python scripts/save_raw_stream.py --uring [tests/data/raw_stream_uring.npz]

``--uring`` records fio's io_uring engine instead (``URING_JOBS``: reads and writes, registered files and
buffers, a submission-queue polling thread, fsync requests), for ``tests/test_ringcalls.py``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from ckpt_trace.tracer import bcc_backend, state, stream
from ckpt_trace.tracer.backends import BackendChoice

# What the workload does (each call of the builder's main kinds: opens, positioned and plain data calls,
# seeks, dups, fsync, rename, mmap with page touches, threads sharing descriptors; then io_uring requests).
WORKLOAD = r"""
import mmap, os, sys, threading
d = sys.argv[1]
fd = os.open(f"{d}/a.tmp", os.O_CREAT | os.O_RDWR, 0o644)
for i in range(64):
    os.write(fd, bytes([i]) * 1000)
os.pwrite(fd, b"x" * 4096, 1 << 16)
os.lseek(fd, 10, os.SEEK_SET)
os.read(fd, 333)
copy = os.dup(fd)
os.write(copy, b"y" * 77)
os.fsync(fd)
os.close(copy)
def worker(n):
    for i in range(50):
        os.pwrite(fd, b"t" * 512, 200000 + n * 100000 + i * 512)
threads = [threading.Thread(target=worker, args=(n,)) for n in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
os.close(fd)
os.rename(f"{d}/a.tmp", f"{d}/a.bin")
with open(f"{d}/a.bin", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
    total = sum(m[i] for i in range(0, len(m), 4096))
with open(f"{d}/b.bin", "wb") as f:
    f.write(b"z" * 100000)
"""

# fio jobs one after the other (--stonewall): io_uring requests of each kind the recorder sees.
URING_JOBS = (
    "--name=plain --ioengine=io_uring --rw=randrw --bs=4k --size=512k --iodepth=8",
    "--name=fixed --ioengine=io_uring --rw=randwrite --bs=4k --size=256k --iodepth=4 --registerfiles=1 --fixedbufs=1",
    "--name=sqpoll --ioengine=io_uring --rw=write --bs=8k --size=256k --iodepth=4 --sqthread_poll=1",
    "--name=fsync --ioengine=io_uring --rw=write --bs=4k --size=128k --iodepth=2 --fsync=4",
)


def main() -> None:
    uring = "--uring" in sys.argv[1:]
    paths = [arg for arg in sys.argv[1:] if arg != "--uring"]
    output = Path(paths[0] if paths else f"tests/data/raw_stream{'_uring' if uring else ''}.npz")
    record_mod = importlib.import_module("ckpt_trace.tracer.record")
    polls: list[dict] = []
    saved: dict = {}
    put = stream.StreamDecoder.put
    start = bcc_backend._Rings.start_stream
    builder_init = state.TraceBuilder.__init__

    def saving_put(self, group):
        polls.append({name: np.concatenate(chunks) for name, chunks in group.items()})
        put(self, group)

    def saving_start(self, rec):
        saved["ranks"] = self.ranks  # filled as execs are seen
        start(self, rec)

    def saving_init(self, **kwargs):
        saved["builder"] = {k: v for k, v in kwargs.items()}
        builder_init(self, **kwargs)

    stream.StreamDecoder.put = saving_put
    bcc_backend._Rings.start_stream = saving_start
    state.TraceBuilder.__init__ = saving_init
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "out"
        directory.mkdir()
        cmd = [
            "sh",
            "-c",
            f"\"{sys.executable}\" -c '{WORKLOAD}' {directory} && fio --name=u --directory={directory} "
            "--ioengine=io_uring --rw=randwrite --bs=4k --size=64k --iodepth=4 --output=/dev/null",
        ]
        if uring:
            jobs = [f"{job} --stonewall".split() for job in URING_JOBS]
            cmd = ["fio", f"--directory={directory}", "--output=/dev/null", *(arg for job in jobs for arg in job)]
        result = record_mod.record(
            cmd,
            Path(scratch) / "t.arrow",
            choice=BackendChoice("bcc", "save_raw_stream"),
            path_filters=[f"{directory}/"],
        )
    builder = saved["builder"]
    meta = {
        "builder": {
            **builder,
            "path_filters": list(builder["path_filters"]),
            "inherited_fds": builder["inherited_fds"],
        },
        "ranks": {str(pid): rank for pid, rank in saved["ranks"].items()},
        "rows": result.rows,
        "lost_events": result.lost_events,
    }
    arrays = {f"{i:05d}_{name}": records for i, poll in enumerate(polls) for name, records in poll.items()}
    output.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(output, meta=np.array(json.dumps(meta, default=str)), **arrays)  # type: ignore[arg-type]
    events = sum(len(a) for a in arrays.values())
    print(f"{output}: {len(polls)} polls, {events} records, {result.rows} rows, {os.path.getsize(output)} bytes")


if __name__ == "__main__":
    main()
