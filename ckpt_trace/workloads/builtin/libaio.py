"""``libaio``: the flat tensors written and read the way DeepSpeed's FastPersist does, through native AIO
with O_DIRECT (``iolayer.aio``), without DeepSpeed's JIT build. Reference: io_submit(2), DeepSpeed's
"aio" configuration (``io_block_size``, ``queue_depth``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ckpt_trace.errors import WorkloadError

from ..engines import (
    Workload,
    check_same,
    flat_layout,
    flat_tensors,
    local_state,
    model_config,
    require_torch,
)

AIO_CHUNK_BYTES = 1 << 20  # FastPersist's default io_block_size (DeepSpeed docs, "aio" config): 1 MiB
AIO_QUEUE_DEPTH = 8  # and its queue_depth


def run_libaio(out: Path, model: str, with_optimizer: bool, load: bool = False) -> float:
    """Write the flat tensors to ``out/model.aio.bin`` through native AIO with O_DIRECT, as DeepSpeed's
    FastPersist does: tensors copied into one page-aligned buffer (each at a 4 KiB-aligned offset), written
    in 1 MiB requests with 8 in flight, the file then cut to its exact size; ``model.aio.json`` indexes
    the tensors. ``load`` reads the file back the same way and checks every tensor."""
    torch = require_torch()
    from ckpt_trace.iolayer import files
    from ckpt_trace.iolayer.aio import AioContext
    from ckpt_trace.iolayer.buffers import AlignedBuffer

    flat = flat_tensors(local_state(model_config(model), 0, 1, with_optimizer))
    path, index_path = out / "model.aio.bin", out / "model.aio.json"
    layout, end = flat_layout(flat, align_bytes=4096)
    padded = max(4096, end)
    if load and not (path.exists() and index_path.exists()):
        raise WorkloadError(f"nothing to load: {path} or {index_path.name} is missing (run the save first)")
    buf = AlignedBuffer(padded)
    view = buf.view()
    try:
        if not load:
            for name, (offset, nbytes, _) in layout.items():
                view[offset : offset + nbytes] = flat[name].contiguous().view(torch.uint8).numpy().tobytes()
        started = time.perf_counter()
        opened = files.open_file(path, os.O_RDONLY if load else os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct=True)
        try:
            with AioContext(AIO_QUEUE_DEPTH) as ctx:
                sizes = {}
                for tag, offset in enumerate(range(0, padded, AIO_CHUNK_BYTES)):
                    if ctx.in_flight == AIO_QUEUE_DEPTH:
                        _aio_check(ctx.reap(1), sizes, load)
                    sizes[tag] = min(AIO_CHUNK_BYTES, padded - offset)
                    ctx.submit("read" if load else "write", opened.fd, buf.ptr + offset, sizes[tag], offset, tag)
                while ctx.in_flight:
                    _aio_check(ctx.reap(ctx.in_flight), sizes, load)
                if not load:
                    os.ftruncate(opened.fd, end)
                    os.fsync(opened.fd)
        finally:
            os.close(opened.fd)
        if not load:
            index_path.write_text(json.dumps({name: list(entry) for name, entry in layout.items()}))
        io_s = time.perf_counter() - started
        if load:
            loaded = {
                name: torch.frombuffer(bytearray(view[offset : offset + nbytes]), dtype=flat[name].dtype).reshape(shape)
                for name, (offset, nbytes, shape) in layout.items()
            }
            check_same(torch, loaded, flat)
    finally:
        view.release()
        buf.close()
    return io_s


def _aio_check(done, sizes: dict, load: bool) -> None:
    """Raise WorkloadError for a failed request or a short write (a read may end at the end of the file)."""
    for completion in done:
        if completion.res < 0 or (not load and completion.res != sizes[completion.tag]):
            detail = os.strerror(-completion.res) if completion.res < 0 else f"{completion.res} B written"
            raise WorkloadError(f"a native AIO {'read' if load else 'write'} failed: {detail}")


WORKLOAD = Workload(
    "libaio",
    lambda a: run_libaio(a.out, a.model, a.with_optimizer, a.load),
    summary="native AIO with O_DIRECT, as DeepSpeed's FastPersist",
    order=50,
)
