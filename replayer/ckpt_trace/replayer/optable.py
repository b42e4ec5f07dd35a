"""The operations of a replay plan, column by column (``OpTable``), and their one-at-a-time view (``PlanOp``).

A plan of ten million operations is ten million rows of small integers here
(about 60 bytes each), not ten million Python objects: planners build the
columns with numpy, executors read them directly and hand runs of reads and
writes to the I/O layer's C loops. ``PlanOp`` remains the readable view of
one operation (tests, error messages, the rare per-operation paths).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ckpt_trace.formats import vocabulary as v

#: The format's mapping operations a plan replays (madvise and mremap rows are skipped).
MAPPING_KINDS = frozenset({v.MMAP_OP, v.MUNMAP, v.MSYNC})
#: The one plan kind the format does not name: a host<->device copy of any direction (the format's
#: ``COPY_OPS``; the direction and host memory kind are in the operation's ``flags``, ``iolayer.gpu.encode``).
COPY = "copy"
#: Plan operation kinds; ``OpTable.kind`` holds indexes into this tuple. The names are the format's
#: (``formats.vocabulary``: every metadata and data operation, and ``MAPPING_KINDS``), sorted, then ``COPY``:
#: the codes follow from the format's vocabulary and are a table's own (never stored, never compared
#: across versions).
KINDS = (*sorted(v.METADATA_OPS | v.DATA_OPS | MAPPING_KINDS), COPY)
KIND = {name: code for code, name in enumerate(KINDS)}
READ, WRITE = KIND[v.READ], KIND[v.WRITE]
#: In-kernel copies (``OpTable.kcopy``): the system call a read or write row was half of (0: none).
KCOPIES = ("", v.SENDFILE, v.COPY_FILE_RANGE, v.SPLICE)
NONE = -1  # "no value" in the integer columns (handles, paths, offsets, sizes, queues, prot, pattern offsets)
NO_FLAGS = np.iinfo(np.int64).min  # "no value" in ``flags`` (any other int64 is a flag word)


@dataclass(frozen=True, slots=True)
class PlanOp:
    """One operation to replay.

    ``handle`` is the handle acted on (created, for open and dup);
    ``source_handle`` the handle a dup copies. ``path``/``new_path`` are
    target-relative. ``offset`` (bytes) is None where the trace did not
    know it: the executor then uses the file position. ``size`` is bytes
    to transfer (writes: what the recorded call transferred; reads: what
    it requested). ``release`` marks the close of a handle's last
    reference. ``deps`` are ``seq`` numbers of other workers' operations
    that must complete first. ``ts_ns`` is the recorded start time.
    ``pattern_key`` selects the content a write carries (``iolayer.pattern``),
    derived from the final path of the file written; ``pattern_offset``, when
    set, is the offset in that file the bytes belong to (packed files live at
    another offset of their pack). ``queue`` is the recorded io_uring ring or
    libaio context of a request (None for a system call): executors that replay
    as recorded submit requests asynchronously, at most the queue's recorded
    depth (``ReplayPlan.queue_depths``) in flight. ``mapped``: a read or write
    of pages through the mapping on ``handle``, which the POSIX executor
    replays through a mapping and the others as plain I/O. Kind ``mmap`` opens
    ``path`` and maps ``size`` bytes from ``offset`` with ``prot`` (PROT_*)
    and ``flags`` (MAP_*); ``munmap`` unmaps and closes it; ``msync`` syncs
    ``size`` bytes from file offset ``offset``. Kind ``copy`` is a host<->device
    copy of ``size`` bytes, its direction and host memory kind in ``flags``
    (``iolayer.gpu.encode``). Kind ``link`` makes ``new_path`` a second name of ``path``; ``symlink`` makes
    ``new_path`` a symbolic link holding ``path`` exactly as recorded (never resolved: ``replayer.entries``).
    ``kcopy`` (an index of ``KCOPIES``, 0 for none) marks a read or write that was one side of an in-kernel
    copy (sendfile(2), copy_file_range(2), splice(2)): the source's read row comes right before the
    destination's write row of the same call, and splice's two calls through a pipe are each one row. The
    engine makes the same call where its data path leaves copies to it (``DataPath.kernel_copies``: posix,
    mmap); the others read and write. ``op_size`` (bytes; None: ``size``) is the size of the recorded
    operation whose bytes a read or write moves, where a strategy re-planned them: a piece of ``aggregated``
    reads carries the largest recorded read it holds bytes of. ``replay --read-memory malloc`` decides by it
    where a read lands, so a re-planned read lands where the recorded one did.
    """

    seq: int
    kind: str
    ts_ns: int
    handle: int | None = None
    source_handle: int | None = None
    path: str | None = None
    new_path: str | None = None
    offset: int | None = None
    size: int | None = None
    flags: int | None = None
    release: bool = False
    deps: tuple[int, ...] = ()
    pattern_key: int = 0
    pattern_offset: int | None = None
    queue: int | None = None
    mapped: bool = False
    prot: int | None = None
    kcopy: int = 0
    op_size: int | None = None


_INT_COLUMNS = {  # name: (dtype, value standing for None)
    "seq": (np.int64, None),
    "ts_ns": (np.int64, None),
    "worker": (np.int32, None),
    "handle": (np.int32, NONE),
    "source_handle": (np.int32, NONE),
    "path": (np.int32, NONE),
    "new_path": (np.int32, NONE),
    "offset": (np.int64, NONE),
    "size": (np.int64, NONE),
    "flags": (np.int64, NO_FLAGS),
    "pattern_key": (np.int64, None),
    "pattern_offset": (np.int64, NONE),
    "queue": (np.int64, NONE),
    "prot": (np.int32, NONE),
    "kcopy": (np.int8, None),
    "op_size": (np.int64, NONE),
}


@dataclass(frozen=True, eq=False)
class OpTable:
    """Every operation of a plan: one row per operation, grouped by ``worker`` (the index of its
    ``WorkerPlan``) and in recorded order within it. Columns are numpy arrays of equal length; NONE
    (-1) and NO_FLAGS stand for "no value" as the column docs say. ``path``/``new_path`` index
    ``paths``; ``deps`` of row i are ``dep_seq[dep_ptr[i]:dep_ptr[i + 1]]``. Immutable by convention:
    arrays are marked read-only.
    """

    kind: np.ndarray  # int8, KINDS
    seq: np.ndarray  # int64: the trace row the operation comes from (deps name these)
    ts_ns: np.ndarray  # int64
    worker: np.ndarray  # int32
    handle: np.ndarray  # int32
    source_handle: np.ndarray  # int32
    path: np.ndarray  # int32 into paths
    new_path: np.ndarray  # int32 into paths
    offset: np.ndarray  # int64 bytes
    size: np.ndarray  # int64 bytes
    flags: np.ndarray  # int64
    release: np.ndarray  # bool
    pattern_key: np.ndarray  # int64 (iolayer.pattern.file_key)
    pattern_offset: np.ndarray  # int64
    queue: np.ndarray  # int64
    mapped: np.ndarray  # bool
    prot: np.ndarray  # int32
    kcopy: np.ndarray  # int8, KCOPIES
    op_size: np.ndarray  # int64 bytes: the recorded operation's (NONE: ``size``; ``PlanOp.op_size``)
    dep_ptr: np.ndarray  # int64, len + 1
    dep_seq: np.ndarray  # int64
    paths: tuple[str, ...]

    def __post_init__(self) -> None:
        for name in _INT_COLUMNS.keys() | {"kind", "release", "mapped", "dep_ptr", "dep_seq"}:
            getattr(self, name).flags.writeable = False

    def __len__(self) -> int:
        return len(self.kind)

    @classmethod
    def empty(cls) -> OpTable:
        return cls.from_ops([], [], ())

    @classmethod
    def from_columns(
        cls, columns: dict[str, np.ndarray], dep_ptr: np.ndarray, dep_seq: np.ndarray, paths: Sequence[str]
    ) -> OpTable:
        """From numpy columns (missing optional ones take their "no value"), cast to the table's dtypes."""
        n = len(columns["kind"])
        full = {
            "kind": np.asarray(columns["kind"], np.int8),
            "release": np.asarray(columns.get("release", np.zeros(n, bool)), bool),
            "mapped": np.asarray(columns.get("mapped", np.zeros(n, bool)), bool),
        }
        for name, (dtype, missing) in _INT_COLUMNS.items():
            if name in columns:
                full[name] = np.asarray(columns[name], dtype)
            else:
                full[name] = np.full(n, 0 if missing is None else missing, dtype)
        return cls(
            **full, dep_ptr=np.asarray(dep_ptr, np.int64), dep_seq=np.asarray(dep_seq, np.int64), paths=tuple(paths)
        )

    @classmethod
    def from_ops(cls, workers: Sequence[int], ops: Sequence[PlanOp], paths: Iterable[str] = ()) -> OpTable:
        """From ``PlanOp``s and the worker index of each, in table order (slow: small plans and tests)."""
        path_list = list(dict.fromkeys([*paths, *(p for op in ops for p in (op.path, op.new_path) if p)]))
        index = {p: i for i, p in enumerate(path_list)}

        def number(value, missing=NONE):
            return missing if value is None else value

        columns = {
            "kind": [KIND[op.kind] for op in ops],
            "seq": [op.seq for op in ops],
            "ts_ns": [op.ts_ns for op in ops],
            "worker": list(workers),
            "handle": [number(op.handle) for op in ops],
            "source_handle": [number(op.source_handle) for op in ops],
            "path": [index[op.path] if op.path else NONE for op in ops],
            "new_path": [index[op.new_path] if op.new_path else NONE for op in ops],
            "offset": [number(op.offset) for op in ops],
            "size": [number(op.size) for op in ops],
            "flags": [number(op.flags, NO_FLAGS) for op in ops],
            "release": [op.release for op in ops],
            "pattern_key": [op.pattern_key for op in ops],
            "pattern_offset": [number(op.pattern_offset) for op in ops],
            "queue": [number(op.queue) for op in ops],
            "mapped": [op.mapped for op in ops],
            "prot": [number(op.prot) for op in ops],
            "kcopy": [op.kcopy for op in ops],
            "op_size": [number(op.op_size) for op in ops],
        }
        arrays = {
            name: np.array(values, dtype=_INT_COLUMNS[name][0] if name in _INT_COLUMNS else None)
            for name, values in columns.items()
        }
        arrays["kind"] = np.array(columns["kind"], np.int8)
        arrays["release"] = np.array(columns["release"], bool)
        arrays["mapped"] = np.array(columns["mapped"], bool)
        lengths = np.array([len(op.deps) for op in ops], np.int64)
        dep_ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        dep_seq = np.array([d for op in ops for d in op.deps], np.int64)
        return cls.from_columns(arrays, dep_ptr, dep_seq, path_list)

    def deps_of(self, i: int) -> tuple[int, ...]:
        return tuple(self.dep_seq[self.dep_ptr[i] : self.dep_ptr[i + 1]].tolist())

    def op(self, i: int) -> PlanOp:
        """Row ``i`` as a ``PlanOp``."""

        def value(column: np.ndarray, missing=NONE):
            v = int(column[i])
            return None if v == missing else v

        path, new_path = int(self.path[i]), int(self.new_path[i])
        return PlanOp(
            seq=int(self.seq[i]),
            kind=KINDS[self.kind[i]],
            ts_ns=int(self.ts_ns[i]),
            handle=value(self.handle),
            source_handle=value(self.source_handle),
            path=self.paths[path] if path >= 0 else None,
            new_path=self.paths[new_path] if new_path >= 0 else None,
            offset=value(self.offset),
            size=value(self.size),
            flags=value(self.flags, NO_FLAGS),
            release=bool(self.release[i]),
            deps=self.deps_of(i),
            pattern_key=int(self.pattern_key[i]),
            pattern_offset=value(self.pattern_offset),
            queue=value(self.queue),
            mapped=bool(self.mapped[i]),
            prot=value(self.prot),
            kcopy=int(self.kcopy[i]),
            op_size=value(self.op_size),
        )

    def ops(self, start: int = 0, stop: int | None = None) -> tuple[PlanOp, ...]:
        return tuple(self.op(i) for i in range(start, len(self) if stop is None else stop))

    def op_sizes(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """The recorded operation's size (bytes, int64) of each row of ``rows``: ``op_size`` where a strategy
        set it, else ``size``."""
        op_size = self.op_size[rows]
        return np.where(op_size >= 0, op_size, self.size[rows])

    def counts(self) -> dict[str, int]:
        """Operations per kind."""
        codes, counts = np.unique(self.kind, return_counts=True)
        return {KINDS[c]: int(n) for c, n in zip(codes, counts)}

    def take(self, rows: np.ndarray, dep_rows: np.ndarray | None = None, **replace: np.ndarray) -> OpTable:
        """The rows ``rows`` (indices, in the order given), with columns in ``replace`` substituted
        (arrays of the new length). Deps follow their rows unless ``dep_rows`` names, for each new row,
        the old row whose deps it takes (-1: none)."""
        source = rows if dep_rows is None else dep_rows
        has = source >= 0
        starts = np.where(has, self.dep_ptr[np.maximum(source, 0)], 0)
        ends = np.where(has, self.dep_ptr[np.maximum(source, 0) + 1], 0)
        lengths = ends - starts
        dep_ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        dep_seq = self.dep_seq[run_indices(starts, lengths)]
        columns = {name: getattr(self, name)[rows] for name in (*_INT_COLUMNS, "kind", "release", "mapped")}
        columns.update(replace)
        return OpTable.from_columns(columns, dep_ptr, dep_seq, self.paths)


_FEW_INSERTS = 64  # up to this many inserted rows, the others are placed by slices rather than through a mask


def interleave_columns(
    inserted: OpTable, columns: dict[str, np.ndarray], dep_ptr: np.ndarray, dep_seq: np.ndarray, at: np.ndarray
) -> OpTable:
    """A table of the rows given as numpy ``columns`` (missing ones take their "no value"; each is popped
    from the dict once placed, so its memory goes as the table fills) and their deps (``dep_ptr``,
    ``dep_seq``), with the rows of ``inserted`` placed so that row i of ``inserted`` ends at position
    ``at[i]`` (``at`` strictly increasing), the other rows keeping their order in between: one scatter
    per column, the table built once, in place (same ``paths``)."""
    n = len(columns["kind"])
    total = len(inserted) + n
    at = np.asarray(at, np.int64)
    if len(at) <= _FEW_INSERTS:  # the rest lie in len(at) + 1 stretches: slice copies, no mask
        ends = np.r_[at, total]
        starts = np.r_[0, at + 1]
        stretches = [(int(a), int(b), int(a - i)) for i, (a, b) in enumerate(zip(starts, ends)) if b > a]

        def place_rest(dest: np.ndarray, values: np.ndarray | int) -> None:
            for begin, end, source in stretches:
                dest[begin:end] = values if isinstance(values, int) else values[source : source + end - begin]
    else:
        rest = np.ones(total, bool)  # a mask, not indices: a byte per row rather than eight
        rest[at] = False

        def place_rest(dest: np.ndarray, values: np.ndarray | int) -> None:
            dest[rest] = values

    out = {}
    dtypes = {"kind": (np.int8, None), "release": (bool, None), "mapped": (bool, None), **_INT_COLUMNS}
    for name, (dtype, missing) in dtypes.items():
        column = np.empty(total, dtype)
        column[at] = getattr(inserted, name)
        values = columns.pop(name, None)
        place_rest(column, (0 if missing is None else missing) if values is None else values)
        del values
        out[name] = column
    counts = np.diff(dep_ptr)
    ptr = np.zeros(total + 1, np.int64)
    ptr[1:][at] = np.diff(inserted.dep_ptr)
    place_rest(ptr[1:], counts)
    np.cumsum(ptr, out=ptr)
    seq = np.empty(int(ptr[-1]), np.int64)
    with_deps = np.flatnonzero(counts)  # the rest's rows that have deps (few)
    _copy_runs(seq, ptr[at], inserted.dep_seq, inserted.dep_ptr[:-1], np.diff(inserted.dep_ptr))
    # The position of the rest's row j: j plus the inserted rows before it (row i has at[i] - i rest rows before it).
    rest_rows = with_deps + np.searchsorted(at - np.arange(len(at)), with_deps, side="right")
    _copy_runs(seq, ptr[rest_rows], dep_seq, dep_ptr[with_deps], counts[with_deps])
    return OpTable(**out, dep_ptr=ptr, dep_seq=seq, paths=inserted.paths)


def run_indices(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices of the runs [starts[i], starts[i] + lengths[i]), one after another (int64), vectorised:
    how the deps of several rows (``dep_ptr`` runs of ``dep_seq``) are gathered at once."""
    total = int(np.sum(lengths))
    if not total:
        return np.zeros(0, np.int64)
    lengths = np.asarray(lengths, np.int64)
    return np.repeat(np.asarray(starts, np.int64) - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)


def _copy_runs(
    dest: np.ndarray, dest_starts: np.ndarray, source: np.ndarray, source_starts: np.ndarray, lengths: np.ndarray
) -> None:
    """``dest[dest_starts[i]:dest_starts[i] + lengths[i]] = source[source_starts[i]:...]`` for every i, vectorised."""
    dest[run_indices(dest_starts, lengths)] = source[run_indices(source_starts, lengths)]


def count_kinds(table: OpTable, mask: np.ndarray | None = None) -> Counter:
    kinds = table.kind if mask is None else table.kind[mask]
    codes, counts = np.unique(kinds, return_counts=True)
    return Counter({KINDS[c]: int(n) for c, n in zip(codes, counts)})
