"""The one-operation-at-a-time aggregation ckpt-trace used before the columnar one: the reference
``test_plan_equivalence.py`` checks ``replayer.aggregate`` against. Not used by the package.

The ``aggregated`` strategy: coalesce each descriptor's reads and writes into aligned buffers.

This is the strategy of arXiv 2512.24511 ("Understanding LLM Checkpoint/Restore
I/O Strategies and Patterns", Gossman et al.): file-system-aware aggregation
into 1-4 MiB aligned buffers submitted with O_DIRECT through io_uring.

A pure transformation of the as-recorded plan. Within each worker, the reads
and the writes of a descriptor whose offsets the trace knows are collected
until a barrier (an operation on that descriptor other than lseek, an
operation naming paths, an operation another worker waits on, a read or
write at an unknown offset)
and then replaced, before the barrier, by the merged extents of their byte
ranges (overlapping or adjacent ranges merge). Each extent [a, b) becomes an
unaligned head [a, A), a body [A, B) cut into ``buffer_bytes`` pieces, all
aligned to ``block_bytes``, and an unaligned tail [B, b), where A and B are
a rounded up and b rounded down to the block size. The executor (io_uring,
O_DIRECT) writes the body directly and the head and tail through a buffered
descriptor, so exactly the recorded byte ranges are written and every file
ends with its recorded size.
"""

from __future__ import annotations

import dataclasses

from ckpt_trace.replayer.plan import DATA_KINDS, PATH_KINDS, PlanOp, merge_ranges

MIN_BUFFER_BYTES = 1 << 20
MAX_BUFFER_BYTES = 64 << 20


merge_extents = merge_ranges  # union of half-open byte ranges, sorted; touching ranges merge


def split_extent(start: int, end: int, buffer_bytes: int, block_bytes: int) -> list[tuple[int, int]]:
    """(offset, size) pieces of [start, end): unaligned head, aligned body in buffer_bytes pieces, unaligned tail."""
    body_start = -(-start // block_bytes) * block_bytes
    body_end = end // block_bytes * block_bytes
    if body_start >= body_end:
        return [(start, end - start)]
    pieces = [(start, body_start - start)] if body_start > start else []
    pieces += [(offset, min(buffer_bytes, body_end - offset)) for offset in range(body_start, body_end, buffer_bytes)]
    if end > body_end:
        pieces.append((body_end, end - body_end))
    return pieces


class _WorkerAggregator:
    """Rewrites one worker's operations; holds the pending reads and writes per handle."""

    def __init__(self, buffer_bytes: int, block_bytes: int, awaited: frozenset[int]) -> None:
        self.buffer_bytes, self.block_bytes, self.awaited = buffer_bytes, block_bytes, awaited
        self.pending: dict[int, list[PlanOp]] = {}
        self.out: list[PlanOp] = []

    def add(self, op: PlanOp) -> None:
        if op.kind in DATA_KINDS and op.offset is not None and op.seq not in self.awaited:
            self.pending.setdefault(op.handle, []).append(op)
            return
        if op.kind in PATH_KINDS or op.seq in self.awaited:
            self.flush_all()
        elif op.kind == "lseek":
            pass  # moves only the position, which pending reads and writes (explicit offsets) do not use
        elif op.handle is not None:
            self.flush(op.handle)
            if op.source_handle is not None:
                self.flush(op.source_handle)
        self.out.append(op)

    def flush_all(self) -> None:
        for handle in list(self.pending):
            self.flush(handle)

    def flush(self, handle: int) -> None:
        ops = self.pending.pop(handle, None)
        if not ops:
            return
        for kind in ("write", "read"):
            of_kind = [op for op in ops if op.kind == kind]
            if of_kind:
                self._emit(kind, of_kind)

    def _emit(self, kind: str, ops: list[PlanOp]) -> None:
        first = ops[0]
        deps = tuple(sorted({dep for op in ops for dep in op.deps}))  # e.g. another worker's open of the handle
        for start, end in merge_extents([(op.offset, op.offset + (op.size or 0)) for op in ops]):
            for offset, size in split_extent(start, end, self.buffer_bytes, self.block_bytes):
                # a written piece is ready when the last operation writing into it started; a read one
                # is read ahead, at its group's first operation
                into = [op.ts_ns for op in ops if op.offset < offset + size and op.offset + (op.size or 0) > offset]
                ts = max(into) if kind == "write" else first.ts_ns
                self.out.append(dataclasses.replace(first, offset=offset, size=size, deps=deps, ts_ns=ts))


def aggregate_worker_ops(ops, awaited, *, buffer_bytes: int = 4 << 20, block_bytes: int = 4096) -> list[PlanOp]:
    """One worker's operations (``PlanOp``s), aggregated."""
    aggregator = _WorkerAggregator(buffer_bytes, block_bytes, awaited)
    for op in ops:
        aggregator.add(op)
    aggregator.flush_all()
    return aggregator.out
