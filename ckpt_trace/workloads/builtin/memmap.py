"""``memmap``: the flat tensors written through a shared file mapping (``numpy.memmap``, then msync), the
way memory-mapped checkpoint writers do, and read back mapped. Reference: mmap(2), msync(2)."""

from __future__ import annotations

import json
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


def run_memmap(out: Path, model: str, with_optimizer: bool, load: bool = False) -> float:
    """Write the flat tensors into ``out/model.mmap.bin`` through a shared mapping (``numpy.memmap`` mode
    ``w+``: the file is sized, mapped, filled, msynced by ``flush``, unmapped) and index them in
    ``model.mmap.json``; ``load`` maps the file read-only, copies every tensor out and checks it."""
    torch = require_torch()
    import numpy as np

    flat = flat_tensors(local_state(model_config(model), 0, 1, with_optimizer))
    path, index_path = out / "model.mmap.bin", out / "model.mmap.json"
    layout, end = flat_layout(flat, align_bytes=1)
    if load and not (path.exists() and index_path.exists()):
        raise WorkloadError(f"nothing to load: {path} or {index_path.name} is missing (run the save first)")
    started = time.perf_counter()
    mapped = np.memmap(path, dtype=np.uint8, mode="r" if load else "w+", shape=(max(1, end),))
    try:
        if load:
            loaded = {
                name: torch.from_numpy(np.array(mapped[offset : offset + nbytes])).view(flat[name].dtype).reshape(shape)
                for name, (offset, nbytes, shape) in layout.items()
            }
        else:
            for name, (offset, nbytes, _) in layout.items():
                mapped[offset : offset + nbytes] = flat[name].contiguous().view(torch.uint8).reshape(-1).numpy()
            mapped.flush()
    finally:
        # munmap now, not at garbage collection; numpy's stubs do not declare memmap's _mmap (the mmap.mmap)
        mapped._mmap.close()  # pyright: ignore[reportAttributeAccessIssue]
        del mapped
    if not load:
        index_path.write_text(json.dumps({name: list(entry) for name, entry in layout.items()}))
    io_s = time.perf_counter() - started
    if load:
        check_same(torch, loaded, flat)
    return io_s


WORKLOAD = Workload(
    "memmap",
    lambda a: run_memmap(a.out, a.model, a.with_optimizer, a.load),
    summary="a shared file mapping (numpy.memmap, msync)",
    order=60,
)
