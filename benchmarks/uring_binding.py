"""Which io_uring binding issues requests fastest from Python: the choice behind ``ckpt_trace.iolayer.ring``.

Every contender writes the same sequential file of ``--volume`` bytes in
requests of 4 KiB and of 1 MiB at queue depth 32, in one run, on the same
directory (default ``/dev/shm``: a tmpfs, so the issuing loop is measured, not
a disk; pass ``--target DIR --direct`` for a real device), each into a fresh
file:

- ``fio``: fio io_uring, iodepth 32 (fio(1), ``--output-format=json``): the reference.
- ``pyuring``: pyuring 0.3.0 request by request (``write_async_ptr``, one SQE per
  io_uring_enter, ``peek_completion``/``wait_completion``).
- ``liburing``: the ``liburing`` PyPI package (Python + Zig over liburing 2.15),
  request by request: ``io_uring_get_sqe``, ``io_uring_prep_write``, one
  ``io_uring_submit_and_wait`` per batch, ``io_uring_peek_cqe``/``cqe_seen``.
- ``ring.submit``: ckpt-trace's ``Ring`` request by request from Python
  (``submit`` in batches of 32, ``wait``): what the checkpoint writer does.
- ``ring.run``: ckpt-trace's ``Ring.run``: the whole array of requests issued
  by the C loop, at most 32 in flight: what the replayer and the bench do.

Also the synchronous reference: ``fio psync`` and ckpt-trace's ``pio_run``.
Prints requests per second and the ratio to fio, writes
``benchmarks/results/uring_binding.json``.

    python benchmarks/uring_binding.py [--target /dev/shm] [--volume 512MiB] [--direct]

Needs ``pip install 'ckpt-trace[bindings]'`` for pyuring and liburing (a
missing one is reported, not measured; liburing needs Linux 6.14+).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from ckpt_trace.iolayer import ring as rings
from ckpt_trace.iolayer.buffers import AlignedBuffer
from ckpt_trace.units import parse_size

RESULTS = Path(__file__).resolve().parent / "results"
DEPTH = 32


def fio_iops(directory: Path, size_bytes: int, volume: int, engine: str, direct: bool) -> float | None:
    if shutil.which("fio") is None:
        return None
    cmd = [
        "fio",
        "--name=binding",
        f"--directory={directory}",
        "--rw=write",
        f"--bs={size_bytes}",
        f"--size={volume}",
        f"--ioengine={engine}",
        f"--direct={int(direct)}",
        "--output-format=json",
    ]
    if engine == "io_uring":
        cmd.append(f"--iodepth={DEPTH}")
    try:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return float(json.loads(done.stdout)["jobs"][0]["write"]["iops"])
    finally:
        for path in directory.glob("binding.*"):
            path.unlink()


def _open(path: Path, direct: bool, size_bytes: int) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o644)
    os.posix_fallocate(fd, 0, size_bytes)
    return fd


def pyuring_loop(fd: int, buf: AlignedBuffer, size_bytes: int, count: int) -> None:
    import pyuring

    ctx = pyuring.UringCtx(entries=DEPTH)
    in_flight = issued = 0
    try:
        while issued < count or in_flight:
            while issued < count and in_flight < DEPTH:
                ctx.write_async_ptr(fd, buf.ptr, size_bytes, issued * size_bytes, user_data=issued + 1)
                issued += 1
                in_flight += 1
            _, res = ctx.wait_completion()
            in_flight -= 1
            if res < 0:
                raise OSError(-res, os.strerror(-res))
            while in_flight and ctx.peek_completion() is not None:
                in_flight -= 1
    finally:
        ctx.close()


def liburing_loop(fd: int, data: bytes, size_bytes: int, count: int) -> None:
    import liburing as L

    ring, cqe = L.Ring(), L.Cqe()
    L.io_uring_queue_init(DEPTH * 2, ring)
    in_flight = issued = 0
    try:
        while issued < count or in_flight:
            while issued < count and in_flight < DEPTH:
                sqe = L.io_uring_get_sqe(ring)
                L.io_uring_prep_write(sqe, fd, data, issued * size_bytes)
                sqe.user_data = issued
                issued += 1
                in_flight += 1
            L.io_uring_submit_and_wait(ring, 1)
            while in_flight:
                try:
                    L.io_uring_peek_cqe(ring, cqe)
                except BlockingIOError:
                    break
                entry = cqe[0]
                _ = entry.res  # raises the request's error, if any
                L.io_uring_cqe_seen(ring, entry)
                in_flight -= 1
    finally:
        L.io_uring_queue_exit(ring)


def ring_submit_loop(fd: int, buf: AlignedBuffer, size_bytes: int, count: int) -> None:
    with rings.Ring(DEPTH, batch_size=DEPTH) as ring:
        for index in range(count):
            ring.submit("write", fd, buf.ptr, size_bytes, index * size_bytes)
        ring.drain()


def _requests(fd: int, buf: AlignedBuffer, size_bytes: int, count: int) -> np.ndarray:
    requests = rings.batch(count)
    requests["opcode"] = rings.OP_WRITE
    requests["fd"] = fd
    requests["addr"] = buf.ptr
    requests["len"] = size_bytes
    requests["off"] = np.arange(count, dtype=np.uint64) * size_bytes
    return requests


def ring_run(fd: int, buf: AlignedBuffer, size_bytes: int, count: int) -> None:
    requests = _requests(fd, buf, size_bytes, count)
    with rings.Ring(DEPTH) as ring:
        results, _ = ring.run(requests)
    if rings.first_failure(requests, results):
        raise rings.first_failure(requests, results)[1]


def pio(fd: int, buf: AlignedBuffer, size_bytes: int, count: int) -> None:
    requests = _requests(fd, buf, size_bytes, count)
    results, _ = rings.pio_run(requests)
    if rings.first_failure(requests, results):
        raise rings.first_failure(requests, results)[1]


def measure(name: str, directory: Path, size_bytes: int, volume: int, direct: bool) -> float | str:
    """Requests per second of contender ``name``, or why it could not run."""
    if name.startswith("fio"):
        value = fio_iops(directory, size_bytes, volume, "io_uring" if name == "fio" else "psync", direct)
        return value if value is not None else "fio not installed"
    count = volume // size_bytes
    buf = AlignedBuffer(size_bytes).fill(bytes(range(256)))
    path = directory / f"binding-{name}.data"
    fd = _open(path, direct, count * size_bytes)
    try:
        started = time.perf_counter()
        if name == "pyuring":
            pyuring_loop(fd, buf, size_bytes, count)
        elif name == "liburing":
            liburing_loop(fd, bytes(buf.mmap[:size_bytes]), size_bytes, count)
        elif name == "ring.submit":
            ring_submit_loop(fd, buf, size_bytes, count)
        elif name == "ring.run":
            ring_run(fd, buf, size_bytes, count)
        else:
            pio(fd, buf, size_bytes, count)
        elapsed = time.perf_counter() - started
        if os.fstat(fd).st_size != count * size_bytes:
            return f"wrote {os.fstat(fd).st_size} of {count * size_bytes} bytes"
        return count / elapsed
    except ImportError as err:
        return f"not installed ({err.name})"
    except (OSError, RuntimeError) as err:
        return f"failed: {err}"
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
        buf.close()


CONTENDERS = ("fio", "pyuring", "liburing", "ring.submit", "ring.run", "fio psync", "pio_run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="/dev/shm", help="directory to write in (default: a tmpfs)")
    parser.add_argument("--volume", default="512MiB", help="bytes per contender and request size")
    parser.add_argument("--direct", action="store_true", help="O_DIRECT (for a real device)")
    args = parser.parse_args()
    volume = parse_size(args.volume)
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-trace-binding-", dir=args.target))
    rows = []
    try:
        for size_bytes in (4096, 1 << 20):
            figures = {name: measure(name, scratch, size_bytes, volume, args.direct) for name in CONTENDERS}
            for name, value in figures.items():
                reference = figures[
                    "fio" if name in ("fio", "pyuring", "liburing", "ring.submit", "ring.run") else "fio psync"
                ]
                ratio = value / reference if isinstance(value, float) and isinstance(reference, float) else None
                rows.append(
                    {
                        "size_bytes": size_bytes,
                        "contender": name,
                        "requests_per_s": value if isinstance(value, float) else None,
                        "vs_fio": ratio,
                        "note": None if isinstance(value, float) else value,
                    }
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table = Table(
        title=f"io_uring bindings, queue depth {DEPTH}, {args.volume} per point, {args.target}"
        + (" O_DIRECT" if args.direct else "")
    )
    for column in ("request", "contender", "requests/s", "vs fio (same engine)", "note"):
        table.add_column(column, justify="right" if column in ("requests/s", "vs fio (same engine)") else "left")
    for row in rows:
        table.add_row(
            f"{row['size_bytes'] // 1024} KiB",
            row["contender"],
            f"{row['requests_per_s']:,.0f}" if row["requests_per_s"] else "-",
            f"{row['vs_fio']:.2f}x" if row["vs_fio"] else "-",
            row["note"] or "",
        )
    Console(width=120).print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "uring_binding.json"
    out.write_text(
        json.dumps(
            {
                "target": args.target,
                "direct": args.direct,
                "volume_bytes": volume,
                "queue_depth": DEPTH,
                "kernel": os.uname().release,
                "rows": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
