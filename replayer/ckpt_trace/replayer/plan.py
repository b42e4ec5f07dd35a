"""Replay plans: frozen data built by pure functions from a trace, column by column.

A plan holds one ``WorkerPlan`` per recorded thread (pid, tid) and every
operation in one ``OpTable`` (numpy columns, grouped by worker, in recorded
order), plus what must exist before the clock starts (directories, files the
trace reads but never wrote) and the final size every file must have
afterwards.

Descriptors become *handles*: each successful open or dup creates one;
operations name the handle instead of the recorded fd number, so fd reuse,
dup and descriptors inherited across fork replay correctly. A descriptor a
process uses without having opened it (inherited through fork, which the
trace does not record) aliases a live handle of the same path.

Cross-worker ordering: an operation on a handle another worker created
waits for that open/dup; an operation naming a path (open, rename, unlink,
mkdir) waits for the previous such operation on that path by another
worker, and for the mkdir of its parent directories; a handle used by
several workers keeps its recorded happens-before (a close after every use,
``replayer.ordering``). Within a worker, recorded order is kept.

Open flags are converted here, once, from the recording's architecture (the
trace's ``arch``) to this machine's (``formats.vocabulary.translate_open_flags``),
so every plan and executor works in host ``os.O_*`` values.

How it scales: the rows that change which file a descriptor names (open,
close, dup, rename, mmap...) are few and are walked one by one by
``_Planner``; the reads and writes, nearly every row of a checkpoint trace,
are planned with vectorised numpy: each finds its handle by an as-of join on
(process, descriptor) against the bindings the walk recorded, and file sizes,
the byte ranges ``--verify`` checks and the cross-worker waits come from
sorted group operations. A read or write on a descriptor no binding covers
(inherited) goes through the walk. The walk takes its rows in the order their
descriptor changes took effect, as the tracer orders them: an open or dup at
its return, everything else at its entry (``_effect_order``). Where no open or
dup returns after another row of its process started, that is row order, and
the result is identical to walking every row (``tests/test_plan_equivalence.py``
checks it against a one-row-at-a-time reference on random traces).

A plan is two things: what to execute (``ReplayPlan``) and what must hold
afterwards (``PlanChecks``: final sizes, the byte ranges ``--verify``
compares), plus the planner's file identities (``FileIdentity``) that derived
strategies (``--pack-files``) need.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import int_values, is_any_of, validity
from ckpt_trace.formats import vocabulary as v
from ckpt_trace.iolayer import gpu
from ckpt_trace.iolayer.pattern import file_key
from ckpt_trace.ranges import merge_grouped_ranges, merge_ranges

from . import entries
from .optable import COPY, KCOPIES, KINDS, MAPPING_KINDS, NONE, READ, WRITE, OpTable, PlanOp, interleave_columns
from .ordering import with_cross_worker_order
from .paths import relative_target_path

DATA_KINDS = v.DATA_OPS
PATH_KINDS = v.PATH_OPS
FD_KINDS = v.FD_OPS
METADATA_KINDS = v.METADATA_OPS

__all__ = [
    "DATA_KINDS",
    "FD_KINDS",
    "GLOBAL_ROW",
    "KINDS",
    "MAPPING_KINDS",
    "METADATA_KINDS",
    "PATH_KINDS",
    "FileIdentity",
    "OpTable",
    "PlanChecks",
    "PlanOp",
    "ReplayPlan",
    "WorkerPlan",
    "build_posix_plan",
    "merge_grouped_ranges",
    "merge_ranges",
]


@dataclass(frozen=True)
class WorkerPlan:
    """One recorded thread: rows ``start``..``stop`` of the plan's ``OpTable``. ``ops`` materialises them
    as ``PlanOp``s (for small plans and tests; executors read the columns)."""

    pid: int
    tid: int
    rank: int
    start: int = 0
    stop: int = 0
    table: OpTable = field(default_factory=OpTable.empty, repr=False, compare=False)

    @property
    def ops(self) -> tuple[PlanOp, ...]:
        return self.table.ops(self.start, self.stop)

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class PlanChecks:
    """What must hold after a run of the plan (checked by ``replay``, not by executors).

    ``expected_sizes``: each file's size when the recording ended (bytes).
    ``verify_ranges``: per final file, the byte ranges written data ends in
    (``--verify`` compares them with the pattern); ``unverifiable``: files
    written at offsets the trace did not know. With ``--pack-files``,
    ``pack_verify`` holds (pack, final path, offset in the pack, ranges) and
    each packed file's size is checked through ``ReplayPlan.pack_index``.
    ``ranges_planned`` is False for a plan made without the ranges
    (``build_posix_plan(verify_ranges=False)``: a dry run, a replay without
    ``--verify``), which ``verify_content`` refuses.
    """

    expected_sizes: Mapping[str, int] = field(default_factory=dict)
    verify_ranges: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    unverifiable: tuple[str, ...] = ()
    pack_verify: tuple[tuple[str, str, int, tuple[tuple[int, int], ...]], ...] = ()
    ranges_planned: bool = True


@dataclass(frozen=True)
class FileIdentity:
    """The planner's file identities: ``handle_files`` maps each handle to its file, ``file_paths`` each
    live file to its final path (files are followed through renames)."""

    handle_files: Mapping[int, int] = field(default_factory=dict)
    file_paths: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplayPlan:
    """A complete, immutable replay plan: what an executor runs (see the module docstring).

    ``ops`` holds every operation (``OpTable``); ``workers`` the recorded
    threads, each a range of it. ``precreate_dirs`` and ``precreate_files``
    ((path, bytes)) exist before the clock starts, holding the pattern of
    ``pattern_keys``; ``bytes_to_write`` is what the run will write (free
    space is checked against it); ``awaited`` are the seq numbers other
    workers wait on; ``skipped_ops`` counts trace rows not replayed, by
    reason. With ``--pack-files``, ``pack_index`` maps each packed file's final
    path to its pack, offset and size (the executor writes it as
    ``index.json``) and ``metadata_ops_saved`` counts the operations packing
    removed. ``checks`` is what must hold afterwards; ``files`` the file
    identities; ``queue_depths`` the most requests each recorded queue had
    in flight; ``preallocate`` (open seq -> bytes) the files the executor
    reserves with fallocate(2) when that open creates them (the aggregated
    strategy).
    """

    strategy: str
    workers: tuple[WorkerPlan, ...]
    precreate_dirs: tuple[str, ...]
    precreate_files: tuple[tuple[str, int], ...]
    skipped_ops: Mapping[str, int]
    bytes_to_write: int
    awaited: frozenset[int] = field(default_factory=frozenset)
    pattern_keys: Mapping[str, int] = field(default_factory=dict)
    pack_index: Mapping[str, Mapping] = field(default_factory=dict)
    metadata_ops_saved: int = 0
    checks: PlanChecks = field(default_factory=PlanChecks)
    files: FileIdentity = field(default_factory=FileIdentity)
    queue_depths: Mapping[int, int] = field(default_factory=dict)
    ops: OpTable = field(default_factory=OpTable.empty, repr=False)
    preallocate: Mapping[int, int] = field(default_factory=dict)

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    def counts(self) -> dict[str, int]:
        """Operations per kind."""
        return self.ops.counts()

    def with_ops(self, table: OpTable, **changes) -> ReplayPlan:
        """This plan with ``table`` as its operations (grouped by worker index) and ``changes``."""
        import dataclasses

        return dataclasses.replace(self, ops=table, workers=_workers_of(table, self.workers), **changes)


def _workers_of(table: OpTable, workers: Iterable[WorkerPlan]) -> tuple[WorkerPlan, ...]:
    """``workers`` re-pointed at their rows of ``table`` (grouped by worker index)."""
    workers = list(workers)
    bounds = np.searchsorted(table.worker, np.arange(len(workers) + 1))
    return tuple(
        WorkerPlan(pid=w.pid, tid=w.tid, rank=w.rank, start=int(bounds[i]), stop=int(bounds[i + 1]), table=table)
        for i, w in enumerate(workers)
    )


def plan_from_ops(plan: ReplayPlan, worker_ops: list[tuple[PlanOp, ...]], **changes) -> ReplayPlan:
    """``plan`` with each worker's operations replaced by ``worker_ops[i]`` (``PlanOp``s; slow: for derived
    plans that rewrite few operations one by one, such as ``--pack-files``)."""
    workers = [i for i, ops in enumerate(worker_ops) for _ in ops]
    table = OpTable.from_ops(workers, [op for ops in worker_ops for op in ops], plan.ops.paths)
    return plan.with_ops(table, **changes)


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


# -- the trace, as the planner reads it -------------------------------------------------------------------------

#: An optional int64 column of planner input: each row's index in the whole trace file. A planner fed a
#: share of the rows (``replayer.distributed``) numbers operations by it, so every share's plan names the
#: same operation by the same ``seq``.
GLOBAL_ROW = "row"
PLAN_COLUMNS = _PLAN_COLUMNS = (
    "ts_ns",
    "pid",
    "tid",
    "rank",
    "op",
    "fd",
    "path",
    "new_path",
    "offset",
    "size",
    "ret",
    "flags",
    "interface",
    "queue_id",
    "in_flight",
    "address",
    "prot",
    "memory_kind",
    "dur_ns",  # when an open or dup takes effect (its return): ``_effect_order``
)
_TEXT = ("op", "path", "new_path", "interface", "memory_kind")
_RING = np.array(sorted(v.RING_OPS))


class _Rows:
    """The planner's columns of every trace row, in start-time order: numpy arrays (text as codes into
    ``texts``; integer columns with a validity mask) filled batch by batch. ``capacity`` (the trace's row
    count, when known) lets every column be allocated once and filled in place, rather than joined from the
    batches' copies at the end (half the peak and one copy less); then a batch's all-null column (requests
    and mappings, in a trace of plain calls) is not copied at all: its zeroed column and mask stand."""

    _MASKED = ("fd", "offset", "size", "flags", "queue_id", "in_flight", "address", "prot", "dur_ns")

    def __init__(self, batches: Iterable[pa.RecordBatch | pa.Table], capacity: int | None = None) -> None:
        self.texts: list[str] = []
        self._code_of: dict[str, int] = {}
        self._luts: dict[str, tuple[pa.Array, np.ndarray]] = {}  # per column: its last dictionary and codes
        self._with_values: set[str] = set()  # the masked columns some row has a value in
        parts: dict[str, list[np.ndarray]] = defaultdict(list)
        filled: dict[str, np.ndarray] = {}
        n = placed = 0  # rows seen; rows placed in ``filled`` (a prefix: once one batch overflows, none fit)
        slots = capacity if capacity is not None else 0  # filled's length, used only in place (capacity given)
        for batch in batches:
            rows = batch.num_rows
            in_place = capacity is not None and placed == n and n + rows <= capacity
            for name in _PLAN_COLUMNS + (("row",) if GLOBAL_ROW in batch.schema.names else ()):
                column = batch.column(name)
                if isinstance(column, pa.ChunkedArray):
                    column = column.combine_chunks()
                if in_place and name in self._MASKED and column.null_count == rows:
                    # All null (a trace without requests or mappings): a column no batch filled yet is
                    # zeroed whole (zeroed pages cost nothing until read), and nothing is copied.
                    for key, dtype in ((name, np.dtype(str(column.type))), (name + "?", np.dtype(bool))):
                        if key not in filled:
                            filled[key] = np.zeros(slots, dtype)
                        else:
                            filled[key][n : n + rows] = 0
                    continue
                if in_place and name in _TEXT:  # codes looked up straight into place
                    if name not in filled:
                        filled[name] = np.empty(slots, np.int32)
                    self._codes(name, column, out=filled[name][n : n + rows])
                    continue
                values = {name: self._codes(name, column) if name in _TEXT else int_values(column)}
                if name in self._MASKED and column.null_count < rows:
                    self._with_values.add(name)
                if name in self._MASKED:  # the other columns are never null (the schema says so)
                    values[name + "?"] = validity(column)  # nulls' slots: masked with it
                for key, value in values.items():
                    if in_place:
                        if key not in filled:  # (a later all-null batch zeroes its own rows)
                            filled[key] = np.empty(slots, value.dtype)
                        filled[key][n : n + rows] = value
                    else:
                        parts[key].append(np.array(value))
            n += rows
            placed += rows if in_place else 0
        self.n = n
        empty = {name: np.int32 for name in _TEXT}
        self.cols = {}
        if filled and not parts:
            for key, column in filled.items():
                self.cols[key] = column[:n]
        else:  # no capacity given (or a wrong one): join the batches' copies, one column at a time
            for key in list(filled):
                parts[key].insert(0, filled.pop(key)[:placed])
            for name in list(parts):
                pieces = parts.pop(name)
                self.cols[name] = np.concatenate(pieces) if pieces else np.zeros(0, empty.get(name, np.int64))
                del pieces
        for name in _PLAN_COLUMNS:
            self.cols.setdefault(name, np.zeros(0, empty.get(name, np.int64)))
        ts = self.cols["ts_ns"]
        if self.n and np.any(ts[1:] < ts[:-1]):
            order = np.argsort(ts, kind="stable")
            for name in list(self.cols):
                self.cols[name] = self.cols[name][order]

    def _codes(self, name: str, column: pa.Array, out: np.ndarray | None = None) -> np.ndarray:
        """Codes into ``texts`` (-1: null) of a string or dictionary column, written into ``out`` when given.
        A trace file's batches share one dictionary per column, so its codes are worked out once, not per
        batch."""
        if column.null_count == len(column):  # (a column no row uses: new_path, memory_kind)
            if out is None:
                return np.full(len(column), -1, np.int32)
            out.fill(-1)
            return out
        if not pa.types.is_dictionary(column.type):
            column = column.dictionary_encode()
        dictionary, indices = column.dictionary, column.indices
        last = self._luts.get(name)
        if last is not None and (last[0] is dictionary or last[0].equals(dictionary)):
            lut = last[1]
        else:
            lut = np.empty(len(dictionary) + 1, np.int32)
            for i, value in enumerate(dictionary.to_pylist()):
                code = self._code_of.get(value)
                if code is None:
                    code = self._code_of[value] = len(self.texts)
                    self.texts.append(value)
                lut[i] = code
            lut[-1] = -1
            self._luts[name] = (dictionary, lut)
        raw = int_values(indices)
        if indices.null_count:
            raw = np.where(validity(indices), raw, len(dictionary))
        return np.take(lut, raw, out=out)

    def drop(self, *names: str) -> None:
        """Forget columns ``names`` (and their validity masks): a step that gathered them is done with them."""
        for name in names:
            self.cols.pop(name, None)
            self.cols.pop(name + "?", None)

    def take(self, name: str) -> np.ndarray:
        """Column ``name``, forgotten here (its last reader takes it over)."""
        self.cols.pop(name + "?", None)
        return self.cols.pop(name)

    def code(self, text: str) -> int:
        try:
            return self.texts.index(text)
        except ValueError:
            return -2  # matches nothing

    def any_valid(self, name: str) -> bool:
        """Whether some row has a value in the masked column ``name``."""
        return name in self._with_values

    def valid(self, name: str) -> np.ndarray:
        mask = self.cols.get(name + "?")
        return np.ones(self.n, bool) if mask is None else mask

    def row(self, i: int) -> dict:
        """Row ``i`` as the walk reads it (None for nulls)."""
        out = {}
        for name in _PLAN_COLUMNS:
            value = self.cols[name][i]
            if name in _TEXT:
                out[name] = self.texts[value] if value >= 0 else None
            elif name + "?" in self.cols and not self.cols[name + "?"][i]:
                out[name] = None
            else:
                out[name] = int(value)
        return out


# -- the walk over the rows that change state --------------------------------------------------------------------

Worker = tuple[int, int]  # (pid, tid): a recorded thread


class Origin(NamedTuple):
    """The operation a later one may wait for: its ``seq`` and its ``worker``."""

    seq: int
    worker: Worker


class Binding(NamedTuple):
    """A change of what descriptor ``fd`` of process ``pid`` names, in force for the rows after position
    ``seq`` (row order): ``handle`` (NONE: closed). A close's is its row; an open's or dup's the last row that
    started before it returned (``_effect_order``)."""

    pid: int
    fd: int
    seq: int
    handle: int


class Truncation(NamedTuple):
    """File ``file`` cut to ``length`` bytes at row ``seq`` (O_TRUNC: 0; ftruncate)."""

    file: int
    seq: int
    length: int


class MappedRange(NamedTuple):
    """A file mapping of a process: ``length`` bytes at ``address``, from file offset ``offset`` of the file
    of ``handle``."""

    address: int
    length: int
    offset: int
    handle: int


class MappedAt(NamedTuple):
    """Where an address of a process's mapping is: the mapping's ``handle`` and the file ``offset`` (bytes)."""

    handle: int
    offset: int


class WalkedIO(NamedTuple):
    """A read or write the walk resolved (a descriptor no binding covers, pages through a mapping): its
    ``row``, the ``handle`` it acts on and its cross-worker ``deps``; ``offset`` and ``size`` (bytes) the
    walk's for pages through a mapping (``mapped``), else None: the row's."""

    row: int
    handle: int
    deps: tuple[int, ...]
    offset: int | None
    size: int | None
    mapped: bool


class _Planner:
    """Walks trace rows in order; holds the mutable bookkeeping a plan is built from. Reads and writes it
    gets (``data`` rows) it only resolves to handles; their sizes and ranges are planned in bulk."""

    def __init__(self, strip_prefix: str | None, arch: str) -> None:
        self.strip_prefix = strip_prefix
        self.arch = arch
        self.ops: list[tuple[tuple[int, int], PlanOp]] = []
        self.ranks: dict[tuple[int, int], int] = {}
        self.slots: dict[tuple[int, int], int] = {}
        self.handle_path: dict[int, str] = {}
        self.handle_refs: Counter = Counter()
        self.handle_origin: dict[int, Origin] = {}
        self.next_handle = 0
        self.last_path_op: dict[str, Origin] = {}
        self.mkdir_seq: dict[str, Origin] = {}
        self.dir_paths: set[str] = set()  # paths some path operation named a path below
        self.sizes: dict[str, int | None] = {}
        self.first_touch: dict[str, bool] = {}
        self.read_extent: dict[str, int] = {}
        self.made_dirs: set[str] = set()
        self.opened_dirs: set[str] = set()
        self.named: set[str] = set()
        self.skipped: Counter = Counter()
        self.bytes_to_write = 0
        self.awaited: set[int] = set()
        self.file_of_path: dict[str, int] = {}
        self.handle_file: dict[int, int] = {}
        self.files = 0
        self.truncations: list[Truncation] = []
        self.precreated: dict[str, int] = {}
        self.queue_depths: dict[int, int] = {}
        self.mappings: dict[int, list[MappedRange]] = defaultdict(list)  # per pid
        self.bindings: list[Binding] = []  # descriptor slot changes
        self.returns_at: dict[int, int] = {}  # open/dup row -> its binding's position (``_effect_order``)
        self.data_ops: list[WalkedIO] = []

    def file(self, path: str) -> int:
        """The identity of the file now at ``path`` (a new one if none is known)."""
        fid = self.file_of_path.get(path)
        if fid is None:
            fid = self.files
            self.files += 1
            self.file_of_path[path] = fid
        return fid

    # -- helpers -------------------------------------------------------
    def rel(self, path: str | None) -> str | None:
        return relative_target_path(path, self.strip_prefix) if path else None

    def emit(self, worker: tuple[int, int], op: PlanOp) -> None:
        self.ops.append((worker, op))

    def emit_row(self, seq: int, worker: tuple[int, int], row: dict, kind: str, **fields: Any) -> None:
        """``emit`` the operation of trace row ``row``: its ``seq``, ``kind`` and recorded start; ``fields`` the
        rest of its ``PlanOp``."""
        self.emit(worker, PlanOp(seq=seq, kind=kind, ts_ns=row["ts_ns"], **fields))

    def bind(self, pid: int, fd: int | None, seq: int, handle: int | None) -> None:
        if fd is not None:
            self.bindings.append(Binding(pid, fd, seq, NONE if handle is None else handle))

    def returned_at(self, seq: int) -> int:
        """The position in row order from which the descriptor open or dup row ``seq`` made is in force: the
        last row that started before it returned (``_effect_order``), at least ``seq``."""
        return self.returns_at.get(seq, seq)

    def _dep(self, origin: Origin | None, worker: Worker, deps: list[int]) -> None:
        if origin is not None and origin.worker != worker:
            deps.append(origin.seq)
            self.awaited.add(origin.seq)

    def path_deps(self, seq: int, worker: tuple[int, int], *paths: str) -> tuple[int, ...]:
        deps: list[int] = []
        for path in paths:
            self._dep(self.last_path_op.get(path), worker, deps)
            for parent in _ancestors(path):
                self._dep(self.mkdir_seq.get(parent), worker, deps)
                self.dir_paths.add(parent)
            self.last_path_op[path] = Origin(seq, worker)
        return tuple(sorted(set(deps)))

    def new_handle(self, path: str, seq: int, worker: tuple[int, int], fid: int | None = None) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.handle_path[handle] = path
        self.handle_file[handle] = self.file(path) if fid is None else fid
        self.handle_refs[handle] = 1
        self.handle_origin[handle] = Origin(seq, worker)
        return handle

    def handle_for(self, pid: int, fd: int, path: str | None, seq: int, worker, ts: int) -> int | None:
        """The handle of (pid, fd); a descriptor never opened by pid aliases a live handle of its path."""
        handle = self.slots.get((pid, fd))
        if handle is not None:
            return handle
        if path is None:
            return None
        for candidate, candidate_path in self.handle_path.items():
            if candidate_path == path and self.handle_refs[candidate] > 0:
                self.handle_refs[candidate] += 1
                self.slots[(pid, fd)] = candidate
                self.bind(pid, fd, seq, candidate)
                return candidate
        handle = self.new_handle(path, seq, worker)
        self.slots[(pid, fd)] = handle
        self.bind(pid, fd, seq, handle)
        self.touch(path, creating=False)
        self.emit(
            worker,
            PlanOp(
                seq=seq,
                kind=v.OPEN,
                ts_ns=ts,
                handle=handle,
                path=path,
                flags=os.O_RDWR,
                deps=self.path_deps(seq, worker, path),
            ),
        )
        self.skipped["implicit_opens"] += 1
        return handle

    def current_path(self, handle: int) -> str | None:
        """Where the handle's file is now (renames followed); None once it was unlinked."""
        fid = self.handle_file[handle]
        return next((path for path, f in self.file_of_path.items() if f == fid), None)

    def touch(self, path: str, creating: bool) -> None:
        self.named.add(path)
        if path not in self.first_touch:
            self.first_touch[path] = creating
            if not creating:
                self.sizes.setdefault(path, 0)
                self.precreated[path] = self.file(path)

    # -- rows ----------------------------------------------------------
    def add(self, seq: int, row: dict) -> None:
        worker = (row["pid"], row["tid"])
        self.ranks.setdefault(worker, row["rank"])
        handler = getattr(self, f"_row_{row['op']}", None)
        if handler is None:
            self.skipped[f"unsupported_{row['op']}"] += 1
            return
        handler(seq, worker, row)

    def _row_open(self, seq, worker, row) -> None:
        path = self.rel(row["path"])
        if path is None:
            self.skipped["no_path"] += 1
            return
        flags = v.translate_open_flags(row["flags"] or 0, self.arch, HOST_ARCH)
        if flags & os.O_DIRECTORY:
            self.opened_dirs.add(path)
            self.named.add(path)
        else:
            creating = bool(flags & os.O_CREAT)
            self.touch(path, creating)
            if flags & os.O_TRUNC and flags & os.O_ACCMODE:
                self.sizes[path] = 0
                self.truncations.append(Truncation(self.file(path), seq, 0))
            elif creating:
                self.sizes.setdefault(path, 0)
        handle = self.new_handle(path, seq, worker)
        old = self.slots.get((row["pid"], row["fd"]))
        if old is not None:
            self.handle_refs[old] -= 1
        self.slots[(row["pid"], row["fd"])] = handle
        self.bind(row["pid"], row["fd"], self.returned_at(seq), handle)
        self.emit_row(
            seq, worker, row, v.OPEN, handle=handle, path=path, flags=flags, deps=self.path_deps(seq, worker, path)
        )

    def _fd_op(self, seq, worker, row) -> tuple[int, list[int]] | None:
        path = self.rel(row["path"])
        handle = self.handle_for(row["pid"], row["fd"], path, seq, worker, row["ts_ns"])
        if handle is None:
            self.skipped["unknown_fd"] += 1
            return None
        deps: list[int] = []
        self._dep(self.handle_origin.get(handle), worker, deps)
        return handle, deps

    def _append_fd_op(self, seq, worker, row, kind, **values) -> int | None:
        found = self._fd_op(seq, worker, row)
        if found is None:
            return None
        handle, deps = found
        self.emit_row(seq, worker, row, kind, handle=handle, path=self.handle_path[handle], deps=tuple(deps), **values)
        return handle

    def _row_copy(self, seq, worker, row) -> None:
        """A host<->device copy: replayed before the I/O that followed it (``iolayer.gpu``), or skipped and
        counted where no GPU is."""
        self.emit_row(seq, worker, row, COPY, size=row["size"] or 0, flags=gpu.encode(row["op"], row["memory_kind"]))

    _row_copy_h2d = _row_copy_d2h = _row_copy_d2d = _row_copy_h2h = _row_copy_p2p = _row_copy_other = _row_copy

    def _row_close(self, seq, worker, row) -> None:
        found = self._fd_op(seq, worker, row)
        if found is None:
            return
        handle, deps = found
        self.slots.pop((row["pid"], row["fd"]), None)
        self.bind(row["pid"], row["fd"], seq, None)
        self.handle_refs[handle] -= 1
        path = self.handle_path[handle]  # a later open, rename or unlink of its file by another worker waits
        if self.file_of_path.get(path) == self.handle_file[handle]:  # (and joins the path's chain of waits)
            self._dep(self.last_path_op.get(path), worker, deps)
            self.last_path_op[path] = Origin(seq, worker)
        self.emit_row(
            seq,
            worker,
            row,
            v.CLOSE,
            handle=handle,
            release=self.handle_refs[handle] <= 0,
            deps=tuple(sorted(set(deps))),
        )

    def _request(self, row) -> dict:
        """The queue of a request row (and its recorded depth), as PlanOp fields."""
        queue = row["queue_id"]
        if queue is None or row["interface"] not in (v.IO_URING, v.LIBAIO):
            return {}
        self.queue_depths[queue] = max(self.queue_depths.get(queue, 1), row["in_flight"] or 1)
        return {"queue": queue}

    def _mapped_handle(self, pid: int, address: int | None) -> MappedAt | None:
        """Where ``address`` is in the process's mapping holding it (None: in none)."""
        if address is None:
            return None
        for m in self.mappings.get(pid, ()):
            if m.address <= address < m.address + m.length:
                return MappedAt(m.handle, m.offset + address - m.address)
        return None

    def _row_write(self, seq, worker, row) -> None:
        self._data_row(seq, worker, row, v.WRITE)

    def _row_read(self, seq, worker, row) -> None:
        self._data_row(seq, worker, row, v.READ)

    def _data_row(self, seq, worker, row, kind: str) -> None:
        """A read or write the walk gets (a descriptor no binding covered, a fixed file, pages): its handle."""
        if row["interface"] == v.MMAP:
            found = self._mapped_handle(row["pid"], row["address"])
            if found is None:
                self.skipped["pages_outside_a_mapping"] += 1
                return
            handle, offset = found
            deps: list[int] = []
            self._dep(self.handle_origin.get(handle), worker, deps)
            self.data_ops.append(WalkedIO(seq, handle, tuple(deps), offset, row["size"] or 0, mapped=True))
            return
        self._request(row)
        found = self._fd_op(seq, worker, row)
        if found is None:
            return
        handle, deps = found
        self.data_ops.append(WalkedIO(seq, handle, tuple(deps), row["offset"], None, mapped=False))

    def _row_mmap(self, seq, worker, row) -> None:
        """A file mapping: one ``mmap`` op that opens the file for the mapping (the program may close its
        descriptor meanwhile) and maps it; its handle is the mapping's."""
        path = self.rel(row["path"])
        if path is None or row["address"] is None:
            self.skipped["no_path"] += 1
            return
        handle = self.new_handle(path, seq, worker)
        self.touch(path, creating=False)
        self.emit_row(
            seq,
            worker,
            row,
            v.MMAP_OP,
            handle=handle,
            path=path,
            offset=row["offset"] or 0,
            size=row["size"],
            flags=row["flags"],
            prot=row["prot"],
            deps=self.path_deps(seq, worker, path),
        )
        self.mappings[row["pid"]].append(MappedRange(row["address"], row["size"] or 0, row["offset"] or 0, handle))

    def _row_munmap(self, seq, worker, row) -> None:
        """The end of a mapping: ``munmap`` unmaps it and closes its handle."""
        found = self._mapped_handle(row["pid"], row["address"])
        if found is None:
            self.skipped["unmapped_without_mapping"] += 1
            return
        handle = found.handle
        self.mappings[row["pid"]] = [m for m in self.mappings[row["pid"]] if m.handle != handle]
        self.handle_refs[handle] -= 1
        deps: list[int] = []
        self._dep(self.handle_origin.get(handle), worker, deps)
        self.emit_row(seq, worker, row, v.MUNMAP, handle=handle, release=True, deps=tuple(deps))

    def _row_msync(self, seq, worker, row) -> None:
        found = self._mapped_handle(row["pid"], row["address"])
        if found is None:
            self.skipped["synced_without_mapping"] += 1
            return
        deps: list[int] = []
        self._dep(self.handle_origin.get(found.handle), worker, deps)
        self.emit_row(
            seq,
            worker,
            row,
            v.MSYNC,
            handle=found.handle,
            offset=found.offset,
            size=row["size"],
            flags=row["flags"],
            deps=tuple(deps),
        )

    def _row_lseek(self, seq, worker, row) -> None:
        self._append_fd_op(seq, worker, row, v.LSEEK, offset=row["offset"])

    def _row_fsync(self, seq, worker, row) -> None:
        self._append_fd_op(seq, worker, row, row["op"], **self._request(row))

    _row_fdatasync = _row_fsync

    def _row_sync_file_range(self, seq, worker, row) -> None:
        self._append_fd_op(
            seq, worker, row, v.SYNC_FILE_RANGE, offset=row["offset"], size=row["size"], flags=row["flags"]
        )

    def _row_ftruncate(self, seq, worker, row) -> None:
        handle = self._append_fd_op(seq, worker, row, v.FTRUNCATE, size=row["size"])
        if handle is not None:
            path = self.current_path(handle)
            if path is not None:
                self.sizes[path] = row["size"]
            self.truncations.append(Truncation(self.handle_file[handle], seq, row["size"] or 0))
            self.bytes_to_write += row["size"] or 0

    def _row_fallocate(self, seq, worker, row) -> None:
        mode = row["flags"] or 0
        handle = self._append_fd_op(seq, worker, row, v.FALLOCATE, offset=row["offset"], size=row["size"], flags=mode)
        if handle is not None and not mode & v.FALLOC_FL_KEEP_SIZE:
            path = self.current_path(handle)
            if path is not None and self.sizes.get(path, 0) is not None:
                self.sizes[path] = max(self.sizes.get(path) or 0, row["offset"] + row["size"])
            self.bytes_to_write += row["size"] or 0

    def _row_dup(self, seq, worker, row) -> None:
        found = self._fd_op(seq, worker, row)
        if found is None:
            return
        source, deps = found
        handle = self.new_handle(self.handle_path[source], seq, worker, fid=self.handle_file[source])
        old = self.slots.get((row["pid"], row["ret"]))
        if old is not None:
            self.handle_refs[old] -= 1
        self.slots[(row["pid"], row["ret"])] = handle
        self.bind(row["pid"], row["ret"], self.returned_at(seq), handle)
        self.emit_row(seq, worker, row, v.DUP, handle=handle, source_handle=source, deps=tuple(deps))

    def _row_fcntl(self, seq, worker, row) -> None:
        self._append_fd_op(seq, worker, row, v.FCNTL, flags=row["flags"])

    def _two_names(self, row) -> tuple[str, str] | None:
        """A rename or link row's (old, new) names under the target, both named from now on; None (the row
        skipped, counted as no_path) where either is outside it."""
        old, new = self.rel(row["path"]), self.rel(row["new_path"])
        if old is None or new is None:
            self.skipped["no_path"] += 1
            return None
        self.named.update((old, new))
        return old, new

    def _row_rename(self, seq, worker, row) -> None:
        names = self._two_names(row)
        if names is None:
            return
        old, new = names
        flags = row["flags"] or 0
        entries.move((self.sizes, self.file_of_path), old, new, flags)  # subtrees move (``replayer.entries``)
        deps: list[int] = []
        if old != new:
            for path in entries.arrived(self.first_touch, self.file_of_path, old, new, flags):
                if path in (new, old):  # came into being by the rename: never made before the clock
                    self.made_dirs.add(path)
            # A directory's rename waits for every other worker's last operation on a path below either name
            # (a pool thread's open of a file in step.tmp/); later ones below the new name wait for the rename.
            for origin in entries.take_subtree(self.last_path_op, self.dir_paths, old, new):
                self._dep(origin, worker, deps)
            self.mkdir_seq[new] = Origin(seq, worker)
            if flags & entries.RENAME_EXCHANGE:
                self.mkdir_seq[old] = Origin(seq, worker)
        deps = sorted(set(deps) | set(self.path_deps(seq, worker, old, new)))
        self.emit_row(seq, worker, row, v.RENAME, path=old, new_path=new, flags=row["flags"], deps=tuple(deps))

    def _row_link(self, seq, worker, row) -> None:
        """A second name of a file (link(2)): both names are the one file (sizes, content) from now on."""
        names = self._two_names(row)
        if names is None:
            return
        old, new = names
        self.touch(old, creating=False)
        self.first_touch.setdefault(new, True)
        self.file_of_path[new] = self.file(old)
        if old in self.sizes:
            self.sizes[new] = self.sizes[old]
        self.emit_row(
            seq,
            worker,
            row,
            v.LINK,
            path=old,
            new_path=new,
            flags=row["flags"],
            deps=self.path_deps(seq, worker, old, new),
        )

    def _row_symlink(self, seq, worker, row) -> None:
        """A symbolic link made (symlink(2)): an entry holding the recorded content, which the replay never
        follows; ``path`` is that content, not a path of the target."""
        new = self.rel(row["new_path"])
        if new is None or row["path"] is None:
            self.skipped["no_path"] += 1
            return
        if "\0" in row["path"]:
            raise ReplayError("trace holds a symbolic link with a NUL byte")
        self.named.add(new)
        self.first_touch.setdefault(new, True)
        self.made_dirs.add(new)  # (an entry the trace makes: nothing is made at its name before the clock)
        self.emit_row(
            seq, worker, row, v.SYMLINK, path=row["path"], new_path=new, deps=self.path_deps(seq, worker, new)
        )

    def _row_unlink(self, seq, worker, row) -> None:
        path = self.rel(row["path"])
        if path is None:
            self.skipped["no_path"] += 1
            return
        self.named.add(path)
        # rmdir: a directory, made before the clock if never seen
        if (row["flags"] or 0) & v.AT_REMOVEDIR and path not in self.first_touch and not self._under_made_dir(path):
            self.opened_dirs.add(path)
        self.first_touch.setdefault(path, False)
        self.sizes.pop(path, None)
        self.file_of_path.pop(path, None)
        self.emit_row(seq, worker, row, v.UNLINK, path=path, flags=row["flags"], deps=self.path_deps(seq, worker, path))

    def _row_mkdir(self, seq, worker, row) -> None:
        path = self.rel(row["path"])
        if path is None:
            self.skipped["no_path"] += 1
            return
        deps = self.path_deps(seq, worker, path)
        self.made_dirs.add(path)
        self.mkdir_seq[path] = Origin(seq, worker)
        self.emit_row(seq, worker, row, v.MKDIR, path=path, deps=deps)

    def _under_made_dir(self, path: str) -> bool:
        return any(path == d or path.startswith(d + "/") for d in self.made_dirs)


# -- reads and writes in bulk ----------------------------------------------------------------------------------


def _asof_handles(bindings: list[Binding], pid: np.ndarray, fd: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The handle bound to (pid, fd) just before each ``seq`` (-1 where none): an as-of join on the slot
    changes the walk recorded (a change at the row's own seq counts only for rows after it). ``seq``
    ascending. Where consecutive rows on one (pid, fd) with no change between them are few runs (a
    writer's calls on one file), each run is looked up at its first row only."""
    if not bindings or not len(seq):
        return np.full(len(seq), NONE, np.int64)
    b = np.array(bindings, np.int64)
    b_key = (b[:, 0] << 32) | (b[:, 1] & 0xFFFFFFFF)
    key = (pid.astype(np.int64) << 32) | (fd.astype(np.int64) & 0xFFFFFFFF)
    keys = _distinct(b_key)  # the (pid, fd) pairs the walk bound: few, whatever the trace's length
    b_id = np.searchsorted(keys, b_key)
    span = int(max(b[:, 2].max(), seq.max())) + 2
    b_pos = b_id * span + b[:, 2]
    order = np.argsort(b_pos, kind="stable")
    b_pos, b_handle = b_pos[order], b[order, 3]
    first_change = np.searchsorted(b_pos, np.arange(len(keys), dtype=np.int64) * span)  # per slot

    def change_in_force(k: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Per row, the index (into ``b_pos``) of its slot's last change strictly before it; -1 where none."""
        slot = np.minimum(np.searchsorted(keys, k), len(keys) - 1)
        known = keys[slot] == k
        id_ = np.where(known, slot, 0)
        at = np.searchsorted(b_pos, id_ * span + s, side="left") - 1
        return np.where(known & (at >= first_change[id_]), at, -1)  # (no division per row)

    n = len(seq)
    # Runs: consecutive rows on one (pid, fd) with no change of any slot between them (a run also starts
    # at the first row after each change), so a run's rows share the change in force at its first row.
    after_change = np.minimum(np.searchsorted(seq, b[:, 2], side="right"), n - 1)
    starts = _few_run_starts(key, after_change)
    if starts is not None:  # few runs (a writer's calls on one file): looked up at their first rows
        at = np.repeat(change_in_force(key[starts], seq[starts]), np.diff(np.r_[starts, n]))
    else:
        at = change_in_force(key, seq)
    return np.where(at >= 0, b_handle[np.maximum(at, 0)], NONE)


def _few_run_starts(keys: np.ndarray, also: np.ndarray | None = None) -> np.ndarray | None:
    """The first index of each run of equal consecutive ``keys`` (a run also starts at each index in
    ``also``) where the runs are at most a quarter of the elements; else None, having held no more than a
    byte per element (the rows of many interleaved ranks are many short runs)."""
    starts = np.empty(len(keys), bool)
    if len(keys):
        starts[0] = True
        np.not_equal(keys[1:], keys[:-1], out=starts[1:])
    if also is not None:
        starts[also] = True
    if np.count_nonzero(starts) * 4 > len(keys):
        return None
    return np.flatnonzero(starts)


def _distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values (``np.unique`` without options imports numpy.ma: 35 ms of a replay's start)."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


def _group_max(keys: np.ndarray, values: np.ndarray, size: int, initial: int = 0) -> np.ndarray:
    """Per key (0 to ``size`` - 1), the largest of its ``values`` (``initial`` where none). Runs of equal
    consecutive keys (a writer's calls on one file) fold first where they are few."""
    out = np.full(size, initial, np.int64)
    if len(keys):
        starts = _few_run_starts(keys)
        if starts is not None:
            keys, values = keys[starts], np.maximum.reduceat(values, starts)
        np.maximum.at(out, keys, values)
    return out


def _merge_grouped(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> dict[int, list[tuple[int, int]]]:
    """``merge_grouped_ranges`` as a dict: group -> its merged ranges."""
    out: dict[int, list[tuple[int, int]]] = {}
    for group, start, end in zip(*(part.tolist() for part in merge_grouped_ranges(groups, starts, ends))):
        out.setdefault(group, []).append((start, end))
    return out


def _clip_by_truncations(
    fids: np.ndarray, seqs: np.ndarray, ends: np.ndarray, truncations: Sequence[Truncation]
) -> np.ndarray:
    """Each range end cut at the smallest length its file was truncated to after it (O_TRUNC: 0)."""
    if not truncations or not len(fids):
        return ends
    t = np.array(truncations, np.int64)
    t = t[np.lexsort((t[:, 1], t[:, 0]))]  # by file, then seq
    suffix_min = t[:, 2].copy()  # per truncation, the smallest length from it on (within its file)
    for lo, hi in zip(*_runs(t[:, 0])):  # few: one per truncated file
        suffix_min[lo:hi] = np.minimum.accumulate(t[lo:hi, 2][::-1])[::-1]
    span = int(max(t[:, 1].max(), seqs.max())) + 2
    keys = t[:, 0] * span + t[:, 1]
    after = np.searchsorted(keys, fids * span + seqs, side="right")  # the file's first truncation after the write
    hit = after < len(t)
    hit[hit] = t[after[hit], 0] == fids[hit]
    return np.where(hit, np.minimum(ends, suffix_min[np.minimum(after, len(t) - 1)]), ends)


def _runs(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, stops) of the runs of equal values of ``sorted_keys``."""
    bounds = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    return np.r_[0, bounds], np.r_[bounds, len(sorted_keys)]


HOST_ARCH = v.host_arch()


# -- the pipeline ------------------------------------------------------------------------------------------------
#
# ``build_posix_plan`` is a pipeline of named steps, each a function of the records the earlier ones made:
#
#   load (``_Rows``) -> classify -> walk (``_Planner``) -> bind (the as-of join; rows no binding covers are
#   walked) -> merge (every read and write in row order) -> index workers -> gather (``IoRows``) -> handles ->
#   read extents, waits, queue depths, file ends -> precreate, expected sizes, verify ranges (``PlanChecks``)
#   -> walk table, worker order, deps, positions, columns -> interleave (``OpTable``) -> workers, dirs ->
#   the plan -> cross-worker order (``replayer.ordering``) -> renumber (``GLOBAL_ROW``).
#
# The steps that read trace columns take them (``_Rows.take``, ``_Rows.drop``): a column is freed once
# gathered into the plan's order, so a 10 M-row trace is never held twice.


class RowClasses(NamedTuple):
    """``_classify``'s answer: ``data`` the reads and writes planned in bulk and ``control`` the rows the
    walk takes (row indices, ascending); ``skipped`` the rows not replayed, by reason."""

    data: np.ndarray
    control: np.ndarray
    skipped: Counter


class Bound(NamedTuple):
    """``_bind``'s answer: the walk, and the reads and writes its bindings cover (``data_rows``, ascending
    row indices) with the handle each acts on (``handles``)."""

    planner: _Planner
    data_rows: np.ndarray
    handles: np.ndarray


class Merged(NamedTuple):
    """Every read and write in row order: ``row`` (ascending trace rows) and ``source``, each one's index
    into the bulk rows followed by the walk's ``WalkedIO``s (``n_bulk`` bulk rows)."""

    row: np.ndarray
    source: np.ndarray
    n_bulk: int

    @property
    def bulk(self) -> np.ndarray:
        """Mask: the rows planned in bulk (not by the walk)."""
        return self.source < self.n_bulk

    def in_row_order(self, bulk_values: np.ndarray, walk_values: np.ndarray) -> np.ndarray:
        """One value per row from the bulk rows' ``bulk_values`` and the walked rows' ``walk_values``."""
        if len(self.source) == self.n_bulk:  # every read and write is a bulk one: already in row order
            return bulk_values
        return np.concatenate([bulk_values, walk_values])[self.source]


class WorkerIndex(NamedTuple):
    """``keys``: the sorted distinct workers (pid << 32 | tid) of the reads and writes and of the walk's
    operations; ``of_row``: each read's and write's index into ``keys``; ``row_key``: its worker key."""

    keys: np.ndarray
    of_row: np.ndarray
    row_key: np.ndarray


class IoRows(NamedTuple):
    """Every read and write, in row order (``Merged``), as a plan needs it: the ``handle`` acted on,
    ``mapped`` (pages through a mapping), ``is_write``, ``offset_known``, ``offset`` (bytes; NONE where
    unknown), ``size`` (bytes: what a write transferred, what a read asked for, the pages'), ``queue``
    (the recorded ring or context of a request; NONE for a call), ``kcopy`` (the in-kernel copy a read or
    write was a side of, ``optable.KCOPIES``; 0 for none)."""

    handle: np.ndarray
    mapped: np.ndarray
    is_write: np.ndarray
    offset_known: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    queue: np.ndarray
    kcopy: np.ndarray


class Handles(NamedTuple):
    """Per handle (index): its ``file``, the seq of the open or dup that made it (``origin_seq``) and that
    operation's worker key (``origin_worker``); NONE for numbers no handle has."""

    file: np.ndarray
    origin_seq: np.ndarray
    origin_worker: np.ndarray


class FileEnds(NamedTuple):
    """Per file (index), from the writes after its last truncation, not through a mapping: ``end`` the
    largest end of those at known offsets (bytes), ``written`` whether there is one, ``unknown_after``
    whether one is at an unknown offset (its size is then unknown)."""

    end: np.ndarray
    written: np.ndarray
    unknown_after: np.ndarray


class WorkerOrder(NamedTuple):
    """The plan's order of the reads and writes (by worker, row order within): ``order`` (a slice where
    they are in it already), ``walked_at`` the positions in it of the rows the walk resolved and
    ``walked_source`` their indices into the walk's ``WalkedIO``s."""

    order: slice | np.ndarray
    walked_at: np.ndarray
    walked_source: np.ndarray


class Layout(NamedTuple):
    """What the plan knows of its files: ``final_path`` (file -> its path when the recording ended),
    ``pattern_key`` (file -> ``iolayer.pattern.file_key`` of that path), ``precreate_files`` ((path, bytes)
    made before the clock) and ``parents`` (paths some file lies under: directories)."""

    final_path: dict[int, str]
    pattern_key: np.ndarray
    precreate_files: tuple[tuple[str, int], ...]
    parents: set[str]


def build_posix_plan(
    trace: pa.Table | Iterable[pa.RecordBatch],
    strip_prefix: str | None = None,
    *,
    arch: str = v.X86_64,
    verify_ranges: bool = True,
    num_rows: int | None = None,
) -> ReplayPlan:
    """Plan the replay of a trace (a table, or record batches of at least the planner's columns) recorded
    on ``arch``, operation for operation, as recorded.

    Pure: reads only the rows. Rows are taken in ``ts_ns`` order; open flags
    become this machine's. ``verify_ranges`` False leaves out the byte ranges
    ``--verify`` checks (``PlanChecks.ranges_planned``): a tenth of the
    planning time of a big trace, which a dry run or a replay without
    ``--verify`` does not need. ``num_rows``, the batches' row count when
    known (``formats.count_rows``), lets the columns be filled in place.
    Raises ReplayError on a path with a NUL byte or a trace of an
    architecture whose open flags are unknown.
    """
    if v.normalize_arch(arch) not in v.OPEN_FLAGS:
        raise ReplayError(
            f"the trace was recorded on {arch}, whose open flags this release does not know "
            f"(known: {', '.join(v.ARCHES)})"
        )
    if isinstance(trace, pa.Table):
        table: Any = trace  # typings/pyarrow leaves pa.Table untyped (Any), so isinstance cannot narrow the union
        num_rows = table.num_rows
        trace = [table.select(list(_PLAN_COLUMNS))]
    rows = _Rows(trace, num_rows)
    classes = _classify(rows)
    bound = _bind(rows, classes, strip_prefix, arch)
    skipped = classes.skipped + bound.planner.skipped
    del classes
    plan = _plan_rows(rows, bound, skipped, verify_ranges)
    table, awaited = with_cross_worker_order(plan.ops, plan.awaited)  # descriptors that cross threads
    if table is not plan.ops:
        plan = plan.with_ops(table, awaited=awaited)
    return _renumbered(plan, rows.cols[GLOBAL_ROW]) if GLOBAL_ROW in rows.cols else plan


def _classify(rows: _Rows) -> RowClasses:
    """Which rows are planned in bulk (successful reads and writes on a descriptor), which the walk takes
    (the other successful rows), which are skipped (ring and context calls: their requests are rows of their
    own; failed calls)."""
    c = rows.cols
    op, ret, interface = c["op"], c["ret"], c["interface"]
    ring = is_any_of(op, [rows.code(name) for name in _RING])
    failed = ~ring & (ret < 0)
    data = (
        ~ring
        & ~failed
        & is_any_of(op, [rows.code(v.READ), rows.code(v.WRITE)])
        & (interface != rows.code(v.MMAP))
        & rows.valid("fd")
    )
    control = ~ring & ~failed & ~data
    skipped = Counter()
    if ring.any():
        skipped["queue_calls"] = int(ring.sum())  # the requests are rows of their own
    if failed.any():
        skipped["failed"] = int(failed.sum())
    return RowClasses(data=np.flatnonzero(data), control=np.flatnonzero(control), skipped=skipped)


def _bind(rows: _Rows, classes: RowClasses, strip_prefix: str | None, arch: str) -> Bound:
    """The walk over the control rows, then the as-of join of the reads and writes on its bindings; reads
    and writes no binding covers (inherited descriptors) join the walk, which then runs again."""
    c = rows.cols
    walked, data_rows = classes.control, classes.data
    planner = _walk(rows, walked, strip_prefix, arch)
    handles = _asof_handles(planner.bindings, c["pid"][data_rows], c["fd"][data_rows], data_rows)
    unbound = handles < 0
    if unbound.any():
        walked = np.union1d(walked, data_rows[unbound])
        planner = _walk(rows, walked, strip_prefix, arch)
        data_rows = data_rows[~unbound]
        handles = _asof_handles(planner.bindings, c["pid"][data_rows], c["fd"][data_rows], data_rows)
    return Bound(planner=planner, data_rows=data_rows, handles=handles)


def _renumbered(plan: ReplayPlan, global_row: np.ndarray) -> ReplayPlan:
    """``plan`` with every ``seq`` (its operations', their deps', ``awaited``) the row's index in the whole
    trace (``GLOBAL_ROW``) rather than in the rows the planner was given."""
    import dataclasses

    t = plan.ops
    table = dataclasses.replace(t, seq=global_row[t.seq], dep_seq=global_row[t.dep_seq])
    awaited = np.fromiter(plan.awaited, np.int64, len(plan.awaited))
    return dataclasses.replace(
        plan, ops=table, workers=_workers_of(table, plan.workers), awaited=frozenset(global_row[awaited].tolist())
    )


def _walk(rows: _Rows, walked: np.ndarray, strip_prefix: str | None, arch: str) -> _Planner:
    """The walk over rows ``walked`` (ascending) in the order their descriptor changes took effect."""
    planner = _Planner(strip_prefix, arch)
    order, planner.returns_at = _effect_order(rows, walked)
    for i in walked[order].tolist():
        planner.add(i, rows.row(i))
    return planner


def _effect_order(rows: _Rows, walked: np.ndarray) -> tuple[slice | np.ndarray, dict[int, int]]:
    """(the order of rows ``walked`` by the time each changed the descriptor table, and each open's and
    dup's position in row order from which its new descriptor is in force).

    An open or dup makes its descriptor at its exit (``ts_ns + dur_ns``; a null ``dur_ns``: 0), every
    other call acts at its entry (``ts_ns``; a close frees its slot there, a read or write looks its
    descriptor up there: fdget), as the tracer orders them (``tracer.state``'s ``effect_ns``); ties keep
    row order. So another thread's open that returned the same number later binds it only for the rows
    that started after it returned: position ``p`` (the last row that started before that return, and at
    least the open's own row) means rows after ``p`` (``_asof_handles``). Rows are in ``ts_ns`` order."""
    c = rows.cols
    makes = is_any_of(c["op"][walked], [rows.code(v.OPEN), rows.code(v.DUP)])
    makes &= c["interface"][walked] == rows.code(v.SYSCALL)  # (a request acts at its submission, as traced)
    if not makes.any() or "dur_ns" not in c:
        return slice(None), {}
    made = walked[makes]
    dur = np.where(rows.valid("dur_ns")[made], c["dur_ns"][made], 0)
    effect_ns = c["ts_ns"][walked]  # (a copy: a gather)
    effect_ns[makes] += np.maximum(dur, 0)
    ts = c["ts_ns"]
    at = np.maximum(made, np.searchsorted(ts, effect_ns[makes], side="left") - 1)
    moved = at != made  # the rows whose change lands later than their own row: few
    order = np.argsort(effect_ns, kind="stable") if moved.any() else slice(None)
    return order, dict(zip(made[moved].tolist(), at[moved].tolist()))


def _plan_rows(rows: _Rows, bound: Bound, skipped: Counter, verify_ranges: bool) -> ReplayPlan:
    """The plan from the walk and the bulk reads and writes (``bound``): the pipeline's steps after the
    walk, in order. Memory: each trace column is dropped once gathered into the plan's order."""
    p = bound.planner
    rows.drop("fd", "path", "new_path", "flags", "address", "prot", "memory_kind", "dur_ns")  # the walk's alone: done
    walk_workers = np.array([(pid << 32) | (tid & 0xFFFFFFFF) for (pid, tid), _ in p.ops], np.int64)
    merged = _merge_io(bound.data_rows, p.data_ops)
    keys, widx, row_key = _index_workers(rows, merged.row, walk_workers)
    io, ret = _gather_io(rows, merged, bound.handles, p.data_ops)
    del bound
    read_extent = _read_extents(p, io, ret)
    del ret
    handles = _handle_arrays(p)
    fid = handles.file[io.handle] if len(io.handle) else np.zeros(0, np.int64)
    needs, awaited = _bulk_waits(merged.bulk, io.handle, row_key, handles, p.awaited)
    del row_key
    depths = _queue_depths(p.queue_depths, rows, merged.row, merged.bulk, io.queue)
    rows.drop("in_flight")
    layout = _layout(p, read_extent)
    checks = _plan_checks(p, io, fid, merged.row, layout, verify_ranges)
    bytes_to_write = p.bytes_to_write + int(io.size[io.is_write].sum())
    del fid
    order = _worker_order(widx, merged)
    row, widx = merged.row[order.order], widx[order.order]
    walk_table, handle_path = _walk_table(p, keys, walk_workers)
    handle = io.handle[order.order]
    dep_ptr, dep_seq = _io_deps(needs[order.order], handle, handles.origin_seq, order, p.data_ops)
    del needs
    at = _walk_positions(widx, row, walk_table)
    columns = _io_columns(
        io, order.order, row, widx, handle, rows.take("ts_ns"), handle_path, layout.pattern_key[handles.file]
    )
    del io, order, merged, handle  # the table takes the columns over
    table = interleave_columns(walk_table, columns, dep_ptr, dep_seq, at)
    plan_workers = _worker_plans(table, keys, p.ranks, rows.cols["rank"], row, widx)
    return ReplayPlan(
        strategy="posix",
        workers=plan_workers,
        precreate_dirs=_precreate_dirs(p),
        precreate_files=layout.precreate_files,
        skipped_ops=MappingProxyType(dict(skipped)),
        bytes_to_write=bytes_to_write + sum(size for _, size in layout.precreate_files),
        awaited=frozenset(awaited),
        pattern_keys=MappingProxyType(
            {
                path: int(layout.pattern_key[p.precreated[path]]) if path in p.precreated else 0
                for path, _ in layout.precreate_files
            }
        ),
        checks=checks,
        files=FileIdentity(
            handle_files=MappingProxyType(dict(p.handle_file)), file_paths=MappingProxyType(layout.final_path)
        ),
        queue_depths=MappingProxyType(depths),
        ops=table,
    )


def _merge_io(data_rows: np.ndarray, walked: list[WalkedIO]) -> Merged:
    """Every read and write in row order: the bulk ones (``data_rows``) and those the walk resolved."""
    if not walked:
        return Merged(row=data_rows, source=np.arange(len(data_rows)), n_bulk=len(data_rows))
    row = np.concatenate([data_rows, np.array([w.row for w in walked], np.int64)])
    source = np.argsort(row, kind="stable")  # two ascending runs: linear
    return Merged(row=row[source], source=source, n_bulk=len(data_rows))


def _index_workers(rows: _Rows, row: np.ndarray, walk_workers: np.ndarray) -> WorkerIndex:
    """Each read's and write's (trace ``row``) worker among those of the rows and of the walk
    (``walk_workers``). Takes the trace's pid and tid columns."""
    row_pid, row_tid = rows.cols["pid"][row], rows.cols["tid"][row]
    rows.drop("pid", "tid")
    row_key = (row_pid.astype(np.int64) << 32) | (row_tid.astype(np.int64) & 0xFFFFFFFF)
    keys, index = _worker_index(row_key, walk_workers, row_pid, row_tid)
    return WorkerIndex(keys=keys, of_row=index, row_key=row_key)


def _gather_io(rows: _Rows, merged: Merged, handles: np.ndarray, walked: list[WalkedIO]) -> tuple[IoRows, np.ndarray]:
    """The reads and writes as ``IoRows``, and each one's recorded return value: from the trace's columns
    (which it takes: op, offset, ret, size, interface, queue_id) and the walk's ``WalkedIO``s."""
    c, row, n_bulk = rows.cols, merged.row, merged.n_bulk
    w_mapped = np.array([w.mapped for w in walked], bool)
    handle = merged.in_row_order(handles.astype(np.int64, copy=False), np.array([w.handle for w in walked], np.int64))
    mapped = merged.in_row_order(np.zeros(n_bulk, bool), w_mapped)
    is_write = c["op"][row] == rows.code(v.WRITE)
    rows.drop("op")
    offset_known = rows.valid("offset")[row]
    offset = np.where(offset_known, c["offset"][row], NONE)
    if w_mapped.any():  # pages written through a mapping: their offsets are the walk's
        offset_known = mapped | offset_known
        w_offset = np.array([NONE if w.offset is None else w.offset for w in walked], np.int64)
        offset = np.where(mapped, merged.in_row_order(np.zeros(n_bulk, np.int64), w_offset), offset)
    rows.drop("offset")
    ret = c["ret"][row]
    rows.drop("ret")
    size = np.where(rows.valid("size")[row], c["size"][row], 0)  # what a read asked for
    rows.drop("size")
    np.copyto(size, ret, where=is_write)  # what a write transferred
    if walked:
        w_size = np.array([w.size or 0 for w in walked], np.int64)
        np.copyto(size, merged.in_row_order(np.zeros(n_bulk, np.int64), w_size), where=mapped)
    queue = (
        np.where(
            ~mapped
            & rows.valid("queue_id")[row]
            & is_any_of(c["interface"][row], [rows.code(v.IO_URING), rows.code(v.LIBAIO)]),
            c["queue_id"][row],
            NONE,
        )
        if rows.any_valid("queue_id")
        else np.full(len(row), NONE, np.int64)
    )  # (a trace of plain calls: no request rows)
    kcopy = np.zeros(len(row), np.int8)
    for code, name in enumerate(KCOPIES):
        if code:
            kcopy[~mapped & (c["interface"][row] == rows.code(name))] = code
    rows.drop("interface", "queue_id")
    return IoRows(
        handle=handle,
        mapped=mapped,
        is_write=is_write,
        offset_known=offset_known,
        offset=offset,
        size=size,
        queue=queue,
        kcopy=kcopy,
    ), ret


def _read_extents(p: _Planner, io: IoRows, ret: np.ndarray) -> dict[str, int]:
    """Per file the trace did not create, the furthest byte read from it (bytes): its content is made before
    the clock. ``ret``: each read's and write's recorded return value."""
    reads = ~io.is_write & io.offset_known
    read_end = io.offset[reads] + np.where(io.mapped[reads], io.size[reads], np.maximum(ret[reads], 0))
    handle_read_end = _group_max(io.handle[reads], read_end, max(p.next_handle, 1))
    del reads, read_end
    read_extent = dict(p.read_extent)
    for h in np.flatnonzero(handle_read_end).tolist():
        path = p.handle_path[h]
        if not p.first_touch.get(path, False):
            read_extent[path] = max(read_extent.get(path, 0), int(handle_read_end[h]))
    return read_extent


def _handle_arrays(p: _Planner) -> Handles:
    """The walk's handles as arrays (``Handles``)."""
    n = max(p.next_handle, 1)
    handle_file = np.full(n, NONE, np.int64)
    origin_seq = np.full(n, NONE, np.int64)
    origin_worker = np.full(n, NONE, np.int64)
    for h, fid in p.handle_file.items():
        handle_file[h] = fid
        origin = p.handle_origin[h]
        pid, tid = origin.worker
        origin_seq[h], origin_worker[h] = origin.seq, (pid << 32) | (tid & 0xFFFFFFFF)
    return Handles(file=handle_file, origin_seq=origin_seq, origin_worker=origin_worker)


def _bulk_waits(
    bulk: np.ndarray, handle: np.ndarray, row_key: np.ndarray, handles: Handles, walk_awaited: Iterable[int]
) -> tuple[np.ndarray, set[int]]:
    """(mask: the bulk reads and writes on a handle another worker made, which wait for its open or dup;
    every seq some operation waits for: the walk's ``walk_awaited`` and those opens)."""
    needs = bulk & (handles.origin_worker[handle] != row_key) if len(handle) else np.zeros(0, bool)
    return needs, set(walk_awaited) | set(handles.origin_seq[handle[needs]].tolist())


def _queue_depths(
    walk_depths: Mapping[int, int], rows: _Rows, row: np.ndarray, bulk: np.ndarray, queue: np.ndarray
) -> dict[int, int]:
    """Per recorded queue, the most requests it had in flight: the walk's and the bulk requests' (their
    ``in_flight`` column)."""
    depths = dict(walk_depths)
    has_queue = bulk & (queue >= 0)
    if has_queue.any():
        c = rows.cols
        qs, depth = (
            queue[has_queue],
            np.maximum(np.where(rows.valid("in_flight")[row[has_queue]], c["in_flight"][row[has_queue]], 1), 1),
        )
        order = np.lexsort((depth, qs))  # per queue, its deepest request last
        last = np.r_[np.flatnonzero(np.diff(qs[order])), len(order) - 1]
        for q, d in zip(qs[order][last].tolist(), depth[order][last].tolist()):
            depths[q] = max(depths.get(q, 1), d)
    return depths


def _file_ends(p: _Planner, fid: np.ndarray, row: np.ndarray, io: IoRows) -> FileEnds:
    """Per file, what its writes after its last truncation say of its size (``FileEnds``). (Pages written
    back through a mapping never grow a file: only the calls that sized it do.)"""
    n_files = max(p.files, 1)
    last_trunc = np.full(n_files, -1, np.int64)
    for t in p.truncations:
        last_trunc[t.file] = max(last_trunc[t.file], t.seq)
    past_truncation = row > last_trunc[fid]
    writes = io.is_write & ~io.mapped & past_truncation
    known_after = writes & (io.size > 0) & io.offset_known
    written_fid = fid[known_after]
    end = _group_max(written_fid, io.offset[known_after] + io.size[known_after], n_files)
    del known_after
    unknown_after = np.zeros(n_files, bool)
    unknown_after[fid[writes & ~io.offset_known]] = True
    written = np.zeros(n_files, bool)
    written[written_fid] = True
    return FileEnds(end=end, written=written, unknown_after=unknown_after)


def _layout(p: _Planner, read_extent: Mapping[str, int]) -> Layout:
    """The files' final paths and pattern keys, and the files made before the clock: the paths the trace
    uses without creating them, holding what it reads of them (``read_extent``)."""
    final_path = {f: path for path, f in p.file_of_path.items()}
    key_of = np.zeros(max(p.files, 1), np.int64)
    for f, path in final_path.items():
        key_of[f] = file_key(path)
    parents = {a for path in p.first_touch for a in _ancestors(path)}  # a path with files under it is a directory
    precreate_files = tuple(
        sorted(
            (path, read_extent.get(path, 0))
            for path, creating in p.first_touch.items()
            if not creating and path not in p.made_dirs and path not in p.opened_dirs and path not in parents
        )
    )
    return Layout(final_path=final_path, pattern_key=key_of, precreate_files=precreate_files, parents=parents)


def _expected_sizes(p: _Planner, ends: FileEnds, layout: Layout) -> dict[str, int]:
    """Each file's size when the recording ended (bytes), where the trace knows it: what the walk sized
    it to, grown by the writes after its last truncation, and by what is made of it before the clock."""
    expected = {}
    for path, walk_size in p.sizes.items():
        f = p.file_of_path.get(path)
        if walk_size is None or (f is not None and ends.unknown_after[f]) or path in layout.parents:
            continue
        expected[path] = max(walk_size, int(ends.end[f])) if f is not None else walk_size
    for path, f in p.file_of_path.items():  # files the walk never sized, written at known offsets
        if path not in p.sizes and ends.written[f] and not ends.unknown_after[f]:
            expected[path] = int(ends.end[f])
    for path, extent in layout.precreate_files:
        if path in expected:
            expected[path] = max(expected[path], extent)
    return expected


def _plan_checks(
    p: _Planner, io: IoRows, fid: np.ndarray, row: np.ndarray, layout: Layout, verify_ranges: bool
) -> PlanChecks:
    """What must hold after a run (``PlanChecks``): the final sizes, and the byte ranges ``--verify``
    checks (left out unless ``verify_ranges``) of each file whose every write has a known offset."""
    expected = _expected_sizes(p, _file_ends(p, fid, row, io), layout)
    covered = _verify_ranges(p, fid, row, io, layout.precreate_files) if verify_ranges else {}
    unverifiable = set(_distinct(fid[io.is_write & ~io.offset_known]).tolist()) if len(fid) else set()
    final_path = layout.final_path
    return PlanChecks(
        expected_sizes=MappingProxyType(expected),
        verify_ranges=MappingProxyType(
            {
                path: _clipped(covered.get(f, []), expected[path])
                for path, f in sorted(p.file_of_path.items())
                if f not in unverifiable and path in expected and final_path[f] == path
            }  # (one name of a linked file)
            if verify_ranges
            else {}
        ),
        unverifiable=tuple(sorted(path for path, f in p.file_of_path.items() if f in unverifiable)),
        ranges_planned=verify_ranges,
    )


def _walk_table(p: _Planner, worker_keys: np.ndarray, walk_workers: np.ndarray) -> tuple[OpTable, np.ndarray]:
    """(the walk's operations as a table ordered by worker and seq, each handle's path's index in its
    ``paths``); ``walk_workers`` the worker key of each of the walk's operations."""
    walk_ops = [op for _, op in p.ops]
    path_list = list(
        dict.fromkeys([*p.handle_path.values(), *(x for op in walk_ops for x in (op.path, op.new_path) if x)])
    )
    path_index = {path: i for i, path in enumerate(path_list)}
    handle_path = np.full(max(p.next_handle, 1), NONE, np.int32)
    for h, path in p.handle_path.items():
        handle_path[h] = path_index[path]
    walk_widx = np.searchsorted(worker_keys, walk_workers)
    walk_order = np.lexsort((np.arange(len(walk_ops)), np.array([op.seq for op in walk_ops], np.int64), walk_widx))
    table = OpTable.from_ops(walk_widx[walk_order].tolist(), [walk_ops[i] for i in walk_order], path_list)
    return table, handle_path


def _worker_order(widx: np.ndarray, merged: Merged) -> WorkerOrder:
    """The plan's order of the reads and writes: by worker (a radix sort on small integers), row order kept
    within each (``WorkerOrder``)."""
    bulk = merged.bulk
    if len(widx) < 2 or not np.any(widx[1:] < widx[:-1]):  # one worker's rows, or already in order: no gathers
        walked_at = np.flatnonzero(~bulk)
        return WorkerOrder(
            order=slice(None), walked_at=walked_at, walked_source=merged.source[walked_at] - merged.n_bulk
        )
    by_worker = np.argsort(widx, kind="stable")
    walked_at = np.flatnonzero(~bulk[by_worker])
    return WorkerOrder(
        order=by_worker, walked_at=walked_at, walked_source=merged.source[by_worker[walked_at]] - merged.n_bulk
    )


def _io_deps(
    needs: np.ndarray, handle: np.ndarray, origin_seq: np.ndarray, order: WorkerOrder, walked: list[WalkedIO]
) -> tuple[np.ndarray, np.ndarray]:
    """(dep_ptr, dep_seq) of the reads and writes in plan order: a bulk one waits at most for its handle's
    open (where ``needs``); one the walk resolved carries its own list."""
    dep_lengths = needs.astype(np.int64)
    if len(order.walked_at):
        dep_lengths[order.walked_at] = [len(walked[i].deps) for i in order.walked_source.tolist()]
    dep_ptr = np.zeros(len(dep_lengths) + 1, np.int64)
    np.cumsum(dep_lengths, out=dep_ptr[1:])
    del dep_lengths
    dep_seq = np.empty(int(dep_ptr[-1]), np.int64)
    dep_seq[dep_ptr[:-1][needs]] = origin_seq[handle[needs]]
    for at, i in zip(order.walked_at.tolist(), order.walked_source.tolist()):
        dep_seq[dep_ptr[at] : dep_ptr[at + 1]] = walked[i].deps
    return dep_ptr, dep_seq


def _walk_positions(widx: np.ndarray, row: np.ndarray, walk_table: OpTable) -> np.ndarray:
    """Where each of the walk's operations lands among the reads and writes (plan order): same worker and
    row, the walk's first (an implicit open precedes the read it is for)."""
    data_keys = (widx.astype(np.int64) << 40) | row
    walk_keys = (walk_table.worker.astype(np.int64) << 40) | walk_table.seq
    return np.searchsorted(data_keys, walk_keys, side="left") + np.arange(len(walk_table))


def _io_columns(
    io: IoRows,
    order: slice | np.ndarray,
    row: np.ndarray,
    widx: np.ndarray,
    handle: np.ndarray,
    ts_ns: np.ndarray,
    handle_path: np.ndarray,
    handle_key: np.ndarray,
) -> dict[str, np.ndarray]:
    """The reads' and writes' table columns in plan order (``order``; ``row``, ``widx``, ``handle`` already
    in it): ``ts_ns`` the trace's column, ``handle_path`` each handle's path index, ``handle_key`` each
    handle's file's pattern key."""
    is_write = io.is_write[order]
    return {
        "kind": np.where(is_write, WRITE, READ),
        "seq": row,
        "ts_ns": ts_ns[row],
        "worker": widx,
        "handle": handle,
        "offset": io.offset[order],
        "size": io.size[order],
        "path": handle_path[handle] if len(handle) else np.zeros(0, np.int32),
        "pattern_key": np.where(is_write, handle_key[handle] if len(handle) else 0, 0),
        "queue": io.queue[order],
        "mapped": io.mapped[order],
        "kcopy": io.kcopy[order],
    }


def _worker_plans(
    table: OpTable,
    keys: np.ndarray,
    ranks: Mapping[tuple[int, int], int],
    rank: np.ndarray,
    row: np.ndarray,
    widx: np.ndarray,
) -> tuple[WorkerPlan, ...]:
    """One ``WorkerPlan`` per worker key: its rank the walk's, else that of its first read or write (``row``
    and ``widx`` in plan order; ``rank`` the trace's column)."""
    first_rows = (
        row[np.minimum(np.searchsorted(widx, np.arange(len(keys))), max(len(row) - 1, 0))]
        if len(row)
        else np.zeros(len(keys), np.int64)
    )
    workers = tuple(
        WorkerPlan(
            pid=int(k >> 32),
            tid=int(k & 0xFFFFFFFF),
            rank=ranks.get((k >> 32, k & 0xFFFFFFFF), int(rank[first_rows[i]])),
        )
        for i, k in enumerate(keys.tolist())
    )
    return _workers_of(table, workers)


def _precreate_dirs(p: _Planner) -> tuple[str, ...]:
    """The directories made before the clock, parents first: those the trace opens or names files under,
    unless it makes them (or one above them) itself."""
    dirs = {d for d in p.opened_dirs if not p._under_made_dir(d)}
    for path in p.named:
        for parent in _ancestors(path):
            if not p._under_made_dir(parent):
                dirs.add(parent)
    return tuple(sorted(dirs, key=lambda d: (d.count("/"), d)))


def _verify_ranges(
    p: _Planner, fid: np.ndarray, row: np.ndarray, io: IoRows, precreate_files: Iterable[tuple[str, int]]
) -> dict[int, list[tuple[int, int]]]:
    """Per file, the merged byte ranges ``--verify`` checks: the writes at known offsets clipped by later
    truncations, and precreated content never truncated."""
    known = io.is_write & (io.size > 0) & io.offset_known
    begins = io.offset[known]
    ends = _clip_by_truncations(fid[known], row[known], begins + io.size[known], p.truncations)
    groups, starts, range_ends = [fid[known]], [begins], [ends]
    truncated = {t.file for t in p.truncations}
    for path, extent in precreate_files:
        f = p.precreated.get(path)
        if f is not None and f not in truncated and extent:
            groups.append(np.array([f]))
            starts.append(np.array([0]))
            range_ends.append(np.array([extent]))
    return _merge_grouped(np.concatenate(groups), np.concatenate(starts), np.concatenate(range_ends))


_TID_TABLE_MAX = 1 << 24  # thread ids below this are looked up in a table (pid_max is at most 2**22)


def _worker_index(
    row_workers: np.ndarray, walk_workers: np.ndarray, pid: np.ndarray | None = None, tid: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(the sorted distinct worker keys of the rows and the walk, each row's index into them). Where each
    thread id belongs to one process (``pid``, ``tid`` given, as a kernel hands them out), by a table
    indexed by thread id; else by a hash (Arrow's dictionary encoding). Never by a sort of the rows. Where
    the rows are few runs of one worker's (a single writer's trace), by the first row of each run."""
    n = len(row_workers)
    if n:
        starts = _few_run_starts(row_workers)
        if starts is not None:
            keys, index = _worker_index(
                row_workers[starts],
                walk_workers,
                None if pid is None else pid[starts],
                None if tid is None else tid[starts],
            )
            return keys, np.repeat(index, np.diff(np.r_[starts, n]))
    dtype = np.int16
    if (
        pid is not None
        and tid is not None
        and len(tid)
        and int(tid.min()) >= 0
        and int(tid.max()) < _TID_TABLE_MAX
        and int(pid.min()) >= 0
    ):
        pid_of = np.full(int(tid.max()) + 1, -1, np.int64)
        pid_of[tid] = pid
        if np.array_equal(pid_of[tid], pid):  # no thread id shared by two processes
            present = np.flatnonzero(pid_of >= 0)
            seen = (pid_of[present] << 32) | present
            keys = _distinct(np.concatenate([seen, walk_workers]))
            lut = np.zeros(len(pid_of), np.int64)
            lut[present] = np.searchsorted(keys, seen)
            dtype = np.int16 if len(keys) < 2**15 else np.int32  # int16: numpy's stable sort is then a radix sort
            return keys, lut[tid].astype(dtype)
    encoded = pa.array(row_workers, pa.int64()).dictionary_encode()
    seen = int_values(encoded.dictionary)
    keys = _distinct(np.concatenate([seen, walk_workers]))
    lut = np.searchsorted(keys, seen)
    index = lut[int_values(encoded.indices)] if len(row_workers) else np.zeros(0, np.int64)
    dtype = np.int16 if len(keys) < 2**15 else np.int32
    return keys, index.astype(dtype)


def _clipped(ranges: list[tuple[int, int]], size: int) -> tuple[tuple[int, int], ...]:
    """``ranges`` cut at ``size`` (pages written back through a mapping may reach past the end of the file)."""
    return tuple((start, min(end, size)) for start, end in ranges if start < size)
