"""The bytes a replay writes, made before the clock where memory allows.

Every write carries ``iolayer.pattern``'s replay data: incompressible, unique
per 4 KiB block and per file, a function of the file's key and the offset.
Generating it as each write is issued costs about a memory copy per byte
(``benchmarks/replay_data.py``: up to a third of a page-cache replay's time on
the development VM), a cost the traced program did not have: its data was in
memory before it wrote. So, before the clock, ``Pregenerated`` fills one
buffer per written file, over the span of content offsets the plan's writes
at known offsets cover, when all of them together fit
``REPLAY_PREGENERATE_BYTES`` (default: a quarter of the memory available, at
most 4 GiB); a write then points into its file's buffer, as an application's
write points into its tensors. Otherwise (too large, or a write at an unknown
offset) the executors generate the bytes as each write is issued
(``engine.WorkerContext.issue``), and the result says so in a note.
"""

from __future__ import annotations

import os

import numpy as np

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer import pattern
from ckpt_trace.iolayer.buffers import PAGE_BYTES, AlignedBuffer
from ckpt_trace.tracer import compressibility

from .optable import WRITE, OpTable

#: The bytes ``unique_bytes_for`` compresses to find a ratio: 16 pieces of 64 KiB, as ``record`` samples.
_PROBE_BYTES = 16 * compressibility.SAMPLE_BYTES

#: A request's user_data for a write whose bytes are already in memory (keys are under 2**63: never this).
PREGENERATED = np.uint64((1 << 64) - 1)


def budget_bytes() -> int:
    """``CKPT_TRACE_REPLAY_PREGENERATE_BYTES``, else a quarter of MemAvailable (/proc/meminfo), at most 4 GiB."""
    value = os.environ.get("CKPT_TRACE_REPLAY_PREGENERATE_BYTES")
    if value:
        return int(value)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return min(4 << 30, int(line.split()[1]) * 1024 // 4)
    except OSError:
        pass
    return 256 << 20


class Pregenerated:
    """The replay data of every file a plan writes at known offsets, in memory: ``addresses`` maps writes to it.

    ``note`` is None when every such write is covered, else why none is (the
    span exceeded the budget): the executors then generate as they issue.
    """

    def __init__(self, ops: OpTable, budget: int | None = None) -> None:
        budget = budget_bytes() if budget is None else budget
        self.buffer: AlignedBuffer | None = None
        self.keys = np.zeros(0, np.int64)
        self.note: str | None = None
        writes = (ops.kind == WRITE) & (ops.offset >= 0) & (ops.size > 0)
        if not writes.any():
            return
        base = np.where(ops.pattern_offset[writes] >= 0, ops.pattern_offset[writes], ops.offset[writes])
        end = base + ops.size[writes]
        keys, inverse = np.unique(ops.pattern_key[writes], return_inverse=True)
        low = np.full(len(keys), np.iinfo(np.int64).max, np.int64)
        high = np.zeros(len(keys), np.int64)
        np.minimum.at(low, inverse, base)
        np.maximum.at(high, inverse, end)
        spans = -(-(high - low) // PAGE_BYTES) * PAGE_BYTES  # each file's buffer starts on a page
        total = int(spans.sum())
        if total > budget:
            self.note = (
                f"data generated as each write was issued: the {total:,} B of the written files' spans "
                f"exceed the {budget:,} B kept in memory (CKPT_TRACE_REPLAY_PREGENERATE_BYTES)"
            )
            return
        self.buffer = AlignedBuffer(total)
        starts = np.concatenate(([0], np.cumsum(spans)[:-1])).astype(np.int64)
        for key, lo, hi, start in zip(keys.tolist(), low.tolist(), high.tolist(), starts.tolist()):
            pattern.fill(self.buffer.ptr + start, hi - lo, key, lo)
        self.keys, self.low, self.high = keys, low, high
        self.address0 = self.buffer.ptr + starts - low  # int64; + a content offset: the address of its bytes

    def addresses(self, keys: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(address, covered) of writes of ``lengths`` bytes at content ``offsets`` of files with ``keys``:
        where ``covered``, the address of their bytes in memory."""
        if not len(self.keys):
            return np.zeros(len(keys), np.uint64), np.zeros(len(keys), bool)
        i = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        covered = (self.keys[i] == keys) & (offsets >= self.low[i]) & (offsets + lengths <= self.high[i])
        return np.where(covered, self.address0[i] + offsets, 0).astype(np.uint64), covered

    def address(self, key: int, offset: int, length: int) -> int | None:
        """The address of one write's bytes in memory, or None where they are not covered."""
        addresses, covered = self.addresses(
            np.array([key], np.int64), np.array([offset], np.int64), np.array([length], np.int64)
        )
        return int(addresses[0]) if covered[0] else None

    def view(self, key: int, offset: int, length: int) -> memoryview | None:
        """One write's bytes in memory as a memoryview (release it after the call), or None where not covered."""
        address = self.address(key, offset, length)
        if address is None:
            return None
        buffer = self.buffer
        if buffer is None:  # closed: nothing is covered
            return None
        start = address - buffer.ptr
        return memoryview(buffer.mmap)[start : start + length]

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None


def probe_ratio(unique_bytes: int) -> float:
    """The ratio (compressed over raw bytes, ``compressibility.METHOD`` on 64 KiB pieces) of the replay data with
    ``unique_bytes`` generated per 4 KiB block, measured on ``_PROBE_BYTES`` of one file. Raises
    ring.RingUnavailable when the I/O library is not built."""
    with pattern.compressible(unique_bytes):
        data = pattern.generated(0, _PROBE_BYTES, pattern.file_key("ckpt-trace probe"))
    step = compressibility.SAMPLE_BYTES
    view = memoryview(data)
    return sum(compressibility.compressed_bytes(view[i : i + step]) for i in range(0, len(data), step)) / len(data)


def unique_bytes_for(ratio: float) -> tuple[int, float]:
    """(unique bytes per 4 KiB block, the ratio they measure) whose measured ratio (``probe_ratio``) is the
    closest to ``ratio``: a bisection over multiples of 8 in 8..4096 (the ratio grows with them); 4096 where
    fewer measure no less than the wholly unique data does."""
    low, high = 1, pattern.BLOCK // 8  # in words
    while low < high:
        middle = (low + high) // 2
        if probe_ratio(middle * 8) < ratio:
            low = middle + 1
        else:
            high = middle
    candidates = {words * 8: probe_ratio(words * 8) for words in (max(1, low - 1), low)}
    unique = min(candidates, key=lambda u: abs(candidates[u] - ratio))
    whole = probe_ratio(pattern.BLOCK)
    if candidates[unique] >= whole:  # zero runs too short to be found (under ~80 B at level 1): all unique
        return pattern.BLOCK, whole
    return unique, candidates[unique]


def recorded_ratio(metadata: dict) -> dict:
    """What ``--data recorded-ratio`` writes for a trace with ``metadata``: {"recorded_ratio", "method",
    "unique_bytes_per_block", "generated_ratio"} (``unique_bytes_for``). Raises ReplayError when the trace has no
    ``data_compressibility`` (recorded before it existed, or no written file could be read)."""
    measured = metadata.get("data_compressibility")
    if not isinstance(measured, dict) or not isinstance(measured.get("ratio"), int | float):
        raise ReplayError(
            "{option} recorded-ratio: the trace holds no measured compressibility (data_compressibility: "
            "recorded by an older ckpt-trace, or no file the command wrote was left to read); record it again "
            "or replay with {option} unique",
            option="data",
        )
    unique, generated = unique_bytes_for(float(measured["ratio"]))
    return {
        "recorded_ratio": measured["ratio"],
        "method": measured.get("method", compressibility.METHOD),
        "unique_bytes_per_block": unique,
        "generated_ratio": round(generated, 6),
    }
