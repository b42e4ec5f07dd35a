"""How far the data a recorded command wrote compresses, measured once it has exited.

``record`` calls ``measure`` with the regular files the trace's write rows
name (followed through the trace's renames) that still exist: each is read in
up to ``SAMPLES_PER_FILE`` pieces of ``SAMPLE_BYTES``, spread evenly over the
file, the largest files first, until ``BUDGET_S`` of sampling is spent; each
piece is compressed alone by ``compressed_bytes`` (zstd level 1, Arrow's
codec: pyarrow is a runtime dependency, the zstandard module is not). A
file's ratio is its pieces' compressed bytes over their bytes; the trace's
is the files' ratios weighted by their sizes. The result is the trace's
optional metadata key ``data_compressibility`` (formats/README.md), which
``replay --data recorded-ratio`` reproduces (``replayer.data``).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable

import pyarrow as pa

#: The method, named in the metadata: what ``compressed_bytes`` does.
METHOD = "zstd level 1 (Arrow's codec) of each sampled piece alone"
SAMPLE_BYTES = 64 << 10
SAMPLES_PER_FILE = 64
BUDGET_S = 1.0
MAX_FILES = 256  # the largest written files sampled (and listed in the metadata); the rest are counted

_CODEC = pa.Codec("zstd", compression_level=1)


def compressed_bytes(data: bytes | bytearray | memoryview) -> int:
    """The size in bytes of ``data`` compressed with zstd level 1 (``METHOD``)."""
    return _CODEC.compress(data, asbytes=False).size


def written_paths(written: Iterable[str], renames: Iterable[tuple[str, str]]) -> set[str]:
    """The paths ``written``, each moved through ``renames`` ((old, new) in the order they happened) to the
    name it ended under. Pure."""
    paths = set(written)
    for old, new in renames:
        if old in paths:
            paths.discard(old)
            paths.add(new)
    return paths


def _offsets(size_bytes: int) -> list[int]:
    """Where a file of ``size_bytes`` is sampled: whole when it holds at most ``SAMPLES_PER_FILE`` pieces,
    else ``SAMPLES_PER_FILE`` pieces spread evenly, each starting on a 4 KiB boundary."""
    pieces = -(-size_bytes // SAMPLE_BYTES)
    if pieces <= SAMPLES_PER_FILE:
        return [i * SAMPLE_BYTES for i in range(pieces)]
    last = size_bytes - SAMPLE_BYTES
    return [(i * last // (SAMPLES_PER_FILE - 1)) & ~4095 for i in range(SAMPLES_PER_FILE)]


def _sample(path: str, size_bytes: int, deadline: float) -> tuple[int, int] | None:
    """(sampled bytes, their compressed bytes) of the file at ``path``, or None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    sampled = compressed = 0
    try:
        for offset in _offsets(size_bytes):
            piece = os.pread(fd, SAMPLE_BYTES, offset)
            sampled += len(piece)
            compressed += compressed_bytes(piece) if piece else 0
            if time.monotonic() > deadline:
                break
    except OSError:
        return None
    finally:
        os.close(fd)
    return (sampled, compressed) if sampled else None


def measure(paths: Iterable[str], budget_s: float = BUDGET_S) -> dict | None:
    """The compressibility of the regular, non-empty files among ``paths`` (absolute), as the
    ``data_compressibility`` metadata key holds it: {"method", "ratio" (compressed over sampled bytes, the
    size-weighted mean of the files'), "sampled_bytes", "size_bytes" (of the files sampled),
    "files_sampled", "files_not_sampled" (past ``MAX_FILES`` or the time budget, or unreadable),
    "budget_s", "elapsed_s", "files": {path: {"size_bytes", "sampled_bytes", "compressed_bytes"}}}; None
    when no file could be sampled. Reads files, never raises for one that vanished or cannot be read."""
    started = time.monotonic()
    deadline = started + budget_s
    sizes: list[tuple[int, str]] = []
    for path in paths:
        try:
            st = os.stat(path, follow_symlinks=False)
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size > 0:
            sizes.append((st.st_size, path))
    sizes.sort(key=lambda item: (-item[0], item[1]))
    files: dict[str, dict] = {}
    for size_bytes, path in sizes[:MAX_FILES]:
        if time.monotonic() > deadline:
            break
        got = _sample(path, size_bytes, deadline)
        if got is not None:
            files[path] = {"size_bytes": size_bytes, "sampled_bytes": got[0], "compressed_bytes": got[1]}
    if not files:
        return None
    total = sum(entry["size_bytes"] for entry in files.values())
    ratio = sum(entry["size_bytes"] * entry["compressed_bytes"] / entry["sampled_bytes"] for entry in files.values())
    return {
        "method": METHOD,
        "ratio": round(ratio / total, 6),
        "sampled_bytes": sum(entry["sampled_bytes"] for entry in files.values()),
        "size_bytes": total,
        "files_sampled": len(files),
        "files_not_sampled": len(sizes) - len(files),
        "budget_s": budget_s,
        "elapsed_s": round(time.monotonic() - started, 3),
        "files": files,
    }
