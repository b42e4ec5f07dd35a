"""``--pack-files``: many small files packed into one file per worker, with an index.

A pure transformation of the aggregated plan, after arXiv 2512.24511's
observation that metadata operations (open, close, fsync per file) dominate
small-file checkpoints. A file is packed when one worker alone creates it,
uses every descriptor of it and names it in renames and unlinks, no other
worker waits on those operations, and every read and write of it has a known
offset. Each worker's packed files get block-aligned regions, in order of
first use, in ``ckpt-trace-packs/pack-PID-TID.bin``; their reads and writes
move to the region, padded to whole blocks so all of them go through
O_DIRECT (the pattern stays that of the original file and offset, so
``--verify`` still applies), and the pieces one aggregated write was cut
into around unaligned ends become one write again; their open, close,
fsync, lseek, ftruncate, fallocate, dup, fcntl, rename and unlink become
entries of ``ckpt-trace-packs/index.json`` (final path -> pack, offset,
size), and the pack is opened, fsynced (when the trace fsynced any packed
file) and closed once. ``metadata_ops_saved`` counts what disappeared, net of the pack's own.
"""

from __future__ import annotations

import dataclasses
import os
from types import MappingProxyType

from .plan import DATA_KINDS, MAPPING_KINDS, PlanChecks, PlanOp, ReplayPlan, WorkerPlan, plan_from_ops

PACK_DIR = "ckpt-trace-packs"
INDEX_PATH = f"{PACK_DIR}/index.json"
PACK_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC  # host values: plans hold host flags
_SYNCS = frozenset({"fsync", "fdatasync", "sync_file_range"})


def _ops_of_file(plan: ReplayPlan) -> dict[int, list[tuple[int, PlanOp]]]:
    """(worker index, op) pairs of every handle-based operation, by file identity."""
    by_file: dict[int, list[tuple[int, PlanOp]]] = {}
    for index, worker in enumerate(plan.workers):
        for op in worker.ops:
            for handle in (op.handle, op.source_handle):
                if handle is not None and handle in plan.files.handle_files:
                    by_file.setdefault(plan.files.handle_files[handle], []).append((index, op))
    return by_file


def _packable(plan: ReplayPlan, ops: list[tuple[int, PlanOp]]) -> bool:
    workers = {index for index, _ in ops}
    if len(workers) != 1 or any(op.seq in plan.awaited for _, op in ops):
        return False
    opens = [op for _, op in ops if op.kind == "open"]
    writes = [op for _, op in ops if op.kind == "write"]
    if any(op.kind in MAPPING_KINDS or op.mapped for _, op in ops):
        return False  # a mapped file stays a file of its own
    return (bool(opens) and bool(writes) and all((o.flags or 0) & os.O_CREAT and not (o.flags or 0) & os.O_DIRECTORY
                                                  for o in opens)
            and all(op.offset is not None for _, op in ops if op.kind in DATA_KINDS))


def _padded(offset: int, size: int, block_bytes: int) -> tuple[int, int]:
    start = offset // block_bytes * block_bytes
    end = -(-(offset + size) // block_bytes) * block_bytes
    return start, end - start


class _WorkerPacker:
    """Rewrites one worker's operations onto its pack."""

    def __init__(self, plan: ReplayPlan, worker: WorkerPlan, fids: set[int], pack_handle: int, block_bytes: int):
        self.plan, self.worker, self.fids, self.pack_handle = plan, worker, fids, pack_handle
        self.block_bytes = block_bytes
        self.pack_path = f"{PACK_DIR}/pack-{worker.pid}-{worker.tid}.bin"
        self.bases: dict[int, int] = {}
        self.paths: set[str] = set()
        self.saved = 0
        self.synced = False
        self._allocate()

    def _allocate(self) -> None:
        """Block-aligned regions, one per packed file, in order of first write."""
        extents: dict[int, int] = {}
        for op in self.worker.ops:
            fid = self.plan.files.handle_files.get(op.handle) if op.handle is not None else None
            if fid in self.fids and op.kind == "write":
                start, size = _padded(op.offset, op.size or 0, self.block_bytes)
                extents[fid] = max(extents.get(fid, 0), start + size)
        end = 0
        for fid, extent in extents.items():
            self.bases[fid] = end
            end += max(self.block_bytes, extent)

    def rewrite(self) -> tuple[PlanOp, ...]:
        # The pack's own operations get seq numbers below zero: no worker waits on them, and they
        # must not signal the completion of a recorded operation another worker waits on.
        seq = -1 - self.pack_handle
        first = self.worker.ops[0]
        out = [PlanOp(seq=seq, kind="open", ts_ns=first.ts_ns, handle=self.pack_handle, path=self.pack_path,
                      flags=PACK_FLAGS)]
        last_padded = False  # whether out[-1] is a write padding made aligned
        for op in self.worker.ops:
            replaced = self._rewrite(op)
            padded = replaced is not None and replaced.size != op.size
            if replaced is None:
                self.saved += 1
            elif (last_padded or padded) and self._continues(out[-1], replaced):
                out[-1] = dataclasses.replace(out[-1], size=out[-1].size + replaced.size)
                padded = False
            else:
                out.append(replaced)
            last_padded = padded
        last = self.worker.ops[-1]
        if self.synced:
            out.append(PlanOp(seq=seq, kind="fsync", ts_ns=last.ts_ns, handle=self.pack_handle))
        out.append(PlanOp(seq=seq, kind="close", ts_ns=last.ts_ns, handle=self.pack_handle, release=True))
        self.saved -= 2 + self.synced
        return tuple(out)

    def _continues(self, last: PlanOp, op: PlanOp) -> bool:
        """Whether ``op`` continues the pack write ``last``: a piece of the same aggregated write (its seq),
        next in the pack and in the file's pattern. Called where one of the two is a head or tail
        ``split_extent`` cut off unaligned and padding made aligned, so one request writes both (a
        body is not joined to the next body: each stays within the buffer size)."""
        return (op.kind == last.kind == "write" and op.handle == last.handle == self.pack_handle
                and op.seq == last.seq and op.deps == last.deps and op.pattern_key == last.pattern_key
                and op.offset == last.offset + last.size and op.pattern_offset == last.pattern_offset + last.size)

    def _rewrite(self, op: PlanOp) -> PlanOp | None:
        fid = self.plan.files.handle_files.get(op.handle) if op.handle is not None else None
        if fid in self.fids:
            if op.kind == "open":
                self.paths.add(op.path)
            if op.kind in DATA_KINDS:
                start, size = _padded(op.offset, op.size or 0, self.block_bytes)
                return dataclasses.replace(op, handle=self.pack_handle, offset=self.bases[fid] + start, size=size,
                                           pattern_offset=start)
            self.synced |= op.kind in _SYNCS
            return None
        if op.kind in ("rename", "unlink") and op.path in self.paths:
            if op.kind == "rename":
                self.paths.add(op.new_path)
            return None
        return op


def pack_plan(plan: ReplayPlan, *, block_bytes: int = 4096) -> ReplayPlan:
    """The plan with each worker's packable files moved into one pack per worker. Pure."""
    by_file = _ops_of_file(plan)
    packable = {fid for fid, ops in by_file.items() if _packable(plan, ops)}
    next_handle = max(plan.files.handle_files, default=-1) + 1
    checks = plan.checks
    workers, index, verify, expected, saved = [], {}, dict(checks.verify_ranges), dict(checks.expected_sizes), 0
    pack_verify = []
    if not packable:
        return plan
    for number, worker in enumerate(plan.workers):
        fids = {fid for fid in packable if by_file[fid][0][0] == number}
        if not fids:
            workers.append(worker.ops)
            continue
        packer = _WorkerPacker(plan, worker, fids, next_handle + number, block_bytes)
        workers.append(packer.rewrite())
        saved += packer.saved
        for fid, base in packer.bases.items():
            final = plan.files.file_paths.get(fid)
            if final is None:
                continue
            index[final] = {"pack": packer.pack_path, "offset": base, "size_bytes": expected.pop(final, 0)}
            ranges = verify.pop(final, None)
            if ranges is not None:
                pack_verify.append((packer.pack_path, final, base, ranges))
    return plan_from_ops(
        plan, workers, pack_index=MappingProxyType(index), metadata_ops_saved=saved,
        precreate_dirs=tuple(dict.fromkeys(plan.precreate_dirs + ((PACK_DIR,) if index or saved else ()))),
        checks=PlanChecks(expected_sizes=MappingProxyType(expected), verify_ranges=MappingProxyType(verify),
                          unverifiable=checks.unverifiable, pack_verify=tuple(pack_verify)),
    )
