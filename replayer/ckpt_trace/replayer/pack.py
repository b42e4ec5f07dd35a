"""``--pack-files``: many small files packed into one file per worker, with an index.

A pure transformation of the aggregated plan, after arXiv 2512.24511's
observation that metadata operations (open, close, fsync per file) dominate
small-file checkpoints. A file is packed when one worker alone creates it,
uses every descriptor of it and names it in renames and unlinks, no other
worker waits on those operations, and every read and write of it has a known
offset. Each worker's packed files get block-aligned regions, in order of
first use, in ``ckpt-trace-packs/pack-PID-TID.bin``; their reads and writes
move to the region, padded to whole blocks so all of them go through
O_DIRECT. A packed write carries the pack's own pattern at its offset in the
pack (``iolayer.pattern``, keyed by the pack's path), so ``--verify`` reads
each file's ranges back from its region, and consecutive writes that are
contiguous in the pack (one file's pieces, or the end of one file and the
start of the next) become one extent cut again into ``buffer_bytes`` writes:
a thousand files of a few hundred KiB go out as a few hundred full buffers,
as the paper's aggregating writer sends them. Their open, close, fsync,
lseek, ftruncate, fallocate, dup, fcntl, rename and unlink become entries of
``ckpt-trace-packs/index.json`` (final path -> pack, offset, size), and the
pack is opened, preallocated at its final size with fallocate(2) (as the
aggregated strategy does for every file whose size it knows), fsynced (when
the trace fsynced any packed file) and closed once. ``metadata_ops_saved``
counts what disappeared, net of the pack's own.
"""

from __future__ import annotations

import dataclasses
import os
from types import MappingProxyType

import numpy as np

from ckpt_trace.formats import is_any_of
from ckpt_trace.iolayer import pattern

from .aggregate import split_extent
from .optable import KIND
from .options import DEFAULT_BUFFER_BYTES
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
    return (
        bool(opens)
        and bool(writes)
        and all((o.flags or 0) & os.O_CREAT and not (o.flags or 0) & os.O_DIRECTORY for o in opens)
        and all(op.offset is not None for _, op in ops if op.kind in DATA_KINDS)
    )


def _named_elsewhere(plan: ReplayPlan, by_file: dict[int, list[tuple[int, PlanOp]]], fids: set[int]) -> set[int]:
    """The files of ``fids`` some rename or unlink names (under any name the file had) that another worker
    runs or waits on: packing removes the renames and unlinks of a packed file, and a removed operation
    can neither run in another worker nor signal one waiting for it."""
    names: dict[str, set[int]] = {}
    for fid in fids:
        for _, op in by_file[fid]:
            if op.kind == "open" and op.path is not None:
                names.setdefault(op.path, set()).add(fid)
    table = plan.ops
    rows = np.flatnonzero(is_any_of(table.kind, (KIND["rename"], KIND["unlink"])))
    rows = rows[np.argsort(table.seq[rows], kind="stable")]  # trace order
    workers = np.searchsorted([w.start for w in plan.workers], rows, side="right") - 1
    path_ops = [(int(index), table.op(int(row))) for row, index in zip(rows, workers)]

    def named(path: str | None) -> set[int]:
        return names.get(path, set()) if path is not None else set()

    for _, op in path_ops:  # follow the names through renames
        if op.kind == "rename" and op.path in names and op.new_path is not None:
            names.setdefault(op.new_path, set()).update(names[op.path])
    out: set[int] = set()
    for index, op in path_ops:
        named_here = named(op.path) | (named(op.new_path) if op.kind == "rename" else set())
        out |= {fid for fid in named_here if op.seq in plan.awaited or by_file[fid][0][0] != index}
    return out


def _padded(offset: int | None, size: int, block_bytes: int) -> tuple[int, int]:
    """The block-aligned extent (start, size) around a packed file's write of ``size`` bytes at ``offset``, which
    ``_packable`` requires known on every data operation of a packed file."""
    assert offset is not None  # _packable: a file with a data operation at an unknown offset is not packed
    start = offset // block_bytes * block_bytes
    end = -(-(offset + size) // block_bytes) * block_bytes
    return start, end - start


class _WorkerPacker:
    """Rewrites one worker's operations onto its pack."""

    def __init__(
        self,
        plan: ReplayPlan,
        worker: WorkerPlan,
        fids: set[int],
        pack_handle: int,
        block_bytes: int,
        buffer_bytes: int,
    ):
        self.plan, self.worker, self.fids, self.pack_handle = plan, worker, fids, pack_handle
        self.block_bytes, self.buffer_bytes = block_bytes, buffer_bytes
        self.pack_path = f"{PACK_DIR}/pack-{worker.pid}-{worker.tid}.bin"
        self.pack_key = pattern.file_key(self.pack_path)
        self.seq = -1 - pack_handle  # the pack's own operations: below zero, see rewrite
        self.bases: dict[int, int] = {}
        self.size_bytes = 0
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
        self.size_bytes = end

    def rewrite(self) -> tuple[PlanOp, ...]:
        # The pack's own operations get seq numbers below zero: no worker waits on them, and they
        # must not signal the completion of a recorded operation another worker waits on.
        first, last = self.worker.ops[0], self.worker.ops[-1]
        out = [
            PlanOp(
                seq=self.seq,
                kind="open",
                ts_ns=first.ts_ns,
                handle=self.pack_handle,
                path=self.pack_path,
                flags=PACK_FLAGS,
            )
        ]
        run: list[PlanOp] = []  # consecutive pack writes, each starting where the one before ended
        for op in self.worker.ops:
            replaced = self._rewrite(op)
            if replaced is None:  # no other worker waits on a removed operation (_packable, _named_elsewhere)
                self.saved += 1
                continue
            if self._pack_write(replaced) and (not run or replaced.offset == self._extent(run[-1])[1]):
                run.append(replaced)
                continue
            out += self._cut(run)
            run = [replaced] if self._pack_write(replaced) else []
            if not run:
                out.append(replaced)
        out += self._cut(run)
        if self.synced:
            out.append(PlanOp(seq=self.seq, kind="fsync", ts_ns=last.ts_ns, handle=self.pack_handle))
        out.append(PlanOp(seq=self.seq, kind="close", ts_ns=last.ts_ns, handle=self.pack_handle, release=True))
        self.saved -= 2 + self.synced
        return tuple(out)

    @staticmethod
    def _extent(op: PlanOp) -> tuple[int, int]:
        """(offset, end) of a pack write, whose offset and size ``_rewrite`` always sets."""
        assert op.offset is not None and op.size is not None  # set by _rewrite on every write it moves to the pack
        return op.offset, op.offset + op.size

    def _pack_write(self, op: PlanOp) -> bool:
        return op.kind == "write" and op.handle == self.pack_handle

    def _cut(self, run: list[PlanOp]) -> list[PlanOp]:
        """A run of contiguous pack writes as one extent cut into ``buffer_bytes`` writes, at the place of the
        run's first write; each waits for every operation of other workers any write of the run waited for
        (only removed operations, which no worker waits on, stood between them, so this adds no cycle).
        Every offset stays block aligned: the run starts at a padded offset and buffers are whole blocks."""
        if len(run) < 2:
            return run
        deps = tuple(sorted({dep for op in run for dep in op.deps}))
        pieces = split_extent(self._extent(run[0])[0], self._extent(run[-1])[1], self.buffer_bytes, self.block_bytes)
        return [
            dataclasses.replace(run[0], offset=offset, size=size, pattern_offset=offset, deps=deps)
            for offset, size in pieces
        ]

    def _rewrite(self, op: PlanOp) -> PlanOp | None:
        fid = self.plan.files.handle_files.get(op.handle) if op.handle is not None else None
        if fid in self.fids:
            if op.kind == "open" and op.path is not None:
                self.paths.add(op.path)
            if op.kind in DATA_KINDS:
                start, size = _padded(op.offset, op.size or 0, self.block_bytes)
                offset = self.bases[fid] + start
                return dataclasses.replace(
                    op,
                    handle=self.pack_handle,
                    offset=offset,
                    size=size,
                    pattern_key=self.pack_key,
                    pattern_offset=offset,
                )
            self.synced |= op.kind in _SYNCS
            return None
        if op.kind in ("rename", "unlink") and op.path in self.paths:
            if op.kind == "rename" and op.new_path is not None:
                self.paths.add(op.new_path)
            return None
        return op


def pack_plan(plan: ReplayPlan, *, block_bytes: int = 4096, buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> ReplayPlan:
    """The plan with each worker's packable files moved into one pack per worker. Pure.

    ``block_bytes`` is the file system's block size (regions and writes are aligned to it);
    ``buffer_bytes`` (a multiple of it) the largest write, as in ``build_aggregated_plan``.
    """
    by_file = _ops_of_file(plan)
    packable = {fid for fid, ops in by_file.items() if _packable(plan, ops)}
    packable -= _named_elsewhere(plan, by_file, packable)
    next_handle = max(plan.files.handle_files, default=-1) + 1
    checks = plan.checks
    workers, index, verify, expected, saved = [], {}, dict(checks.verify_ranges), dict(checks.expected_sizes), 0
    pack_verify = []
    if not packable:
        return plan
    packed_opens = {op.seq for fid in packable for _, op in by_file[fid] if op.kind == "open"}
    preallocate = {seq: size for seq, size in plan.preallocate.items() if seq not in packed_opens}
    for number, worker in enumerate(plan.workers):
        fids = {fid for fid in packable if by_file[fid][0][0] == number}
        if not fids:
            workers.append(worker.ops)
            continue
        packer = _WorkerPacker(plan, worker, fids, next_handle + number, block_bytes, buffer_bytes)
        workers.append(packer.rewrite())
        if packer.size_bytes:
            preallocate[packer.seq] = packer.size_bytes
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
        plan,
        workers,
        pack_index=MappingProxyType(index),
        metadata_ops_saved=saved,
        preallocate=preallocate,
        precreate_dirs=tuple(dict.fromkeys(plan.precreate_dirs + ((PACK_DIR,) if index or saved else ()))),
        checks=PlanChecks(
            expected_sizes=MappingProxyType(expected),
            verify_ranges=MappingProxyType(verify),
            unverifiable=checks.unverifiable,
            pack_verify=tuple(pack_verify),
        ),
    )
