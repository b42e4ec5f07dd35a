"""The one-row-at-a-time planner ckpt-trace used before the columnar one: the reference the columnar
planner (``replayer.plan``) is checked against in ``test_plan_equivalence.py``. Not used by the package.

Replay plans: frozen data built by pure functions from a trace table.

A plan holds one ``WorkerPlan`` per recorded thread (pid, tid), each a
tuple of ``PlanOp`` in recorded order, plus what must exist before the
clock starts (directories, files the trace reads but never wrote) and the
final size every file must have afterwards.

Descriptors become *handles*: each successful open or dup creates one;
operations name the handle instead of the recorded fd number, so fd reuse,
dup and descriptors inherited across fork replay correctly. A descriptor a
process uses without having opened it (inherited through fork, which the
trace does not record) aliases a live handle of the same path.

Cross-worker ordering: an operation on a handle another worker created
waits for that open/dup; an operation naming a path (open, rename, unlink,
mkdir) waits for the previous such operation on that path by another
worker, and for the mkdir of its parent directories. Within a worker,
recorded order is kept.

Open flags are converted here, once, from the recording's architecture (the
trace's ``arch``) to this machine's (``formats.vocabulary.translate_open_flags``),
so every plan and executor works in host ``os.O_*`` values.

A plan is two things: what to execute (``ReplayPlan``) and what must hold
afterwards (``PlanChecks``: final sizes, the byte ranges ``--verify``
compares), plus the planner's file identities (``FileIdentity``) that derived
strategies (``--pack-files``) need.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import pyarrow as pa

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import vocabulary as v
from ckpt_trace.iolayer.pattern import file_key
from ckpt_trace.replayer import entries
from ckpt_trace.replayer.paths import relative_target_path

DATA_KINDS = v.DATA_OPS
MAPPING_KINDS = frozenset({"mmap", "munmap", "msync"})  # plan kinds of the mapping rows (madvise, mremap: skipped)
PATH_KINDS = v.PATH_OPS
FD_KINDS = v.FD_OPS
METADATA_KINDS = v.METADATA_OPS


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
    ``pattern_key`` selects the content a write carries (``replayer.pattern``),
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
    ``size`` bytes from file offset ``offset``.
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


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """The operations of one recorded thread, in recorded order."""

    pid: int
    tid: int
    rank: int
    ops: tuple[PlanOp, ...]


@dataclass(frozen=True)
class PlanChecks:
    """What must hold after a run of the plan (checked by ``replay``, not by executors).

    ``expected_sizes``: each file's size when the recording ended (bytes).
    ``verify_ranges``: per final file, the byte ranges written data ends in
    (``--verify`` compares them with the pattern); ``unverifiable``: files
    written at offsets the trace did not know. With ``--pack-files``,
    ``pack_verify`` holds (pack, final path, offset in the pack, ranges) and
    each packed file's size is checked through ``ReplayPlan.pack_index``.
    """

    expected_sizes: Mapping[str, int] = field(default_factory=dict)
    verify_ranges: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    unverifiable: tuple[str, ...] = ()
    pack_verify: tuple[tuple[str, str, int, tuple[tuple[int, int], ...]], ...] = ()


@dataclass(frozen=True)
class FileIdentity:
    """The planner's file identities: ``handle_files`` maps each handle to its file, ``file_paths`` each
    live file to its final path (files are followed through renames)."""

    handle_files: Mapping[int, int] = field(default_factory=dict)
    file_paths: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplayPlan:
    """A complete, immutable replay plan: what an executor runs (see the module docstring).

    ``precreate_dirs`` and ``precreate_files`` ((path, bytes)) exist before
    the clock starts, holding the pattern of ``pattern_keys``;
    ``bytes_to_write`` is what the run will write (free space is checked
    against it); ``awaited`` are the seq numbers other workers wait on;
    ``skipped_ops`` counts trace rows not replayed, by reason. With
    ``--pack-files``, ``pack_index`` maps each packed file's final path to its
    pack, offset and size (the executor writes it as ``index.json``) and
    ``metadata_ops_saved`` counts the operations packing removed.
    ``checks`` is what must hold afterwards; ``files`` the file identities;
    ``queue_depths`` the most requests each recorded queue had in flight.
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

    @property
    def num_ops(self) -> int:
        return sum(len(w.ops) for w in self.workers)

    def counts(self) -> dict[str, int]:
        """Operations per kind."""
        return dict(Counter(op.kind for w in self.workers for op in w.ops))


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


class _Planner:
    """Walks trace rows in order; holds the mutable bookkeeping a plan is built from."""

    def __init__(self, strip_prefix: str | None, arch: str) -> None:
        self.strip_prefix = strip_prefix
        self.arch = arch
        self.ops: dict[tuple[int, int], list[PlanOp]] = defaultdict(list)
        self.ranks: dict[tuple[int, int], int] = {}
        self.slots: dict[tuple[int, int], int] = {}
        self.handle_path: dict[int, str] = {}
        self.handle_refs: Counter = Counter()
        self.handle_origin: dict[int, tuple[int, tuple[int, int]]] = {}
        self.next_handle = 0
        self.last_path_op: dict[str, tuple[int, tuple[int, int]]] = {}
        self.mkdir_seq: dict[str, tuple[int, tuple[int, int]]] = {}
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
        self.coverage: dict[int, list[tuple[int, int]]] = {}
        self.unverifiable: set[int] = set()
        self.truncated: set[int] = set()
        self.precreated: dict[str, int] = {}
        self.queue_depths: dict[int, int] = {}
        self.mappings: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)  # pid -> (addr, len, off, handle)

    def file(self, path: str) -> int:
        """The identity of the file now at ``path`` (a new one if none is known)."""
        fid = self.file_of_path.get(path)
        if fid is None:
            fid = len(self.coverage)
            self.file_of_path[path] = fid
            self.coverage[fid] = []
        return fid

    # -- helpers -------------------------------------------------------
    def rel(self, path: str | None) -> str | None:
        return relative_target_path(path, self.strip_prefix) if path else None

    def _dep(self, origin: tuple[int, tuple[int, int]] | None, worker: tuple[int, int], deps: list[int]) -> None:
        if origin is not None and origin[1] != worker:
            deps.append(origin[0])
            self.awaited.add(origin[0])

    def path_deps(self, seq: int, worker: tuple[int, int], *paths: str) -> tuple[int, ...]:
        deps: list[int] = []
        for path in paths:
            self._dep(self.last_path_op.get(path), worker, deps)
            for parent in _ancestors(path):
                self._dep(self.mkdir_seq.get(parent), worker, deps)
                self.dir_paths.add(parent)
            self.last_path_op[path] = (seq, worker)
        return tuple(sorted(set(deps)))

    def new_handle(self, path: str, seq: int, worker: tuple[int, int], fid: int | None = None) -> int:
        handle = self.next_handle
        self.next_handle += 1
        self.handle_path[handle] = path
        self.handle_file[handle] = self.file(path) if fid is None else fid
        self.handle_refs[handle] = 1
        self.handle_origin[handle] = (seq, worker)
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
                return candidate
        handle = self.new_handle(path, seq, worker)
        self.slots[(pid, fd)] = handle
        self.touch(path, creating=False)
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind="open",
                ts_ns=ts,
                handle=handle,
                path=path,
                flags=os.O_RDWR,
                deps=self.path_deps(seq, worker, path),
            )
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
        op, ret = row["op"], row["ret"]
        if op in v.RING_OPS:
            self.skipped["queue_calls"] += 1  # the requests are rows of their own
            return
        if ret < 0:
            self.skipped["failed"] += 1
            return
        handler = getattr(self, f"_row_{op}", None)
        if handler is None:
            self.skipped[f"unsupported_{op}"] += 1
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
                fid = self.file(path)
                self.coverage[fid] = []
                self.truncated.add(fid)
            elif creating:
                self.sizes.setdefault(path, 0)
        handle = self.new_handle(path, seq, worker)
        old = self.slots.get((row["pid"], row["fd"]))
        if old is not None:
            self.handle_refs[old] -= 1
        self.slots[(row["pid"], row["fd"])] = handle
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind="open",
                ts_ns=row["ts_ns"],
                handle=handle,
                path=path,
                flags=flags,
                deps=self.path_deps(seq, worker, path),
            )
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
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind=kind,
                ts_ns=row["ts_ns"],
                handle=handle,
                path=self.handle_path[handle],
                deps=tuple(deps),
                **values,
            )
        )
        return handle

    def _row_close(self, seq, worker, row) -> None:
        found = self._fd_op(seq, worker, row)
        if found is None:
            return
        handle, deps = found
        self.slots.pop((row["pid"], row["fd"]), None)
        self.handle_refs[handle] -= 1
        path = self.handle_path[handle]  # a later open, rename or unlink of its file by another worker waits
        if self.file_of_path.get(path) == self.handle_file[handle]:  # (and joins the path's chain of waits)
            self._dep(self.last_path_op.get(path), worker, deps)
            self.last_path_op[path] = (seq, worker)
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind="close",
                ts_ns=row["ts_ns"],
                handle=handle,
                release=self.handle_refs[handle] <= 0,
                deps=tuple(sorted(set(deps))),
            )
        )

    def _request(self, row) -> dict:
        """The queue of a request row (and its recorded depth), as PlanOp fields."""
        queue = row["queue_id"]
        if queue is None or row["interface"] not in (v.IO_URING, v.LIBAIO):
            return {}
        self.queue_depths[queue] = max(self.queue_depths.get(queue, 1), row["in_flight"] or 1)
        return {"queue": queue}

    def _mapped_handle(self, pid: int, address: int | None) -> tuple[int, int] | None:
        """(handle, file offset of ``address``) of the process's mapping holding ``address``."""
        if address is None:
            return None
        for start, length, offset, handle in self.mappings.get(pid, ()):
            if start <= address < start + length:
                return handle, offset + address - start
        return None

    def _row_write(self, seq, worker, row) -> None:
        if row["interface"] == v.MMAP:
            self._row_mapped(seq, worker, row, "write")
            return
        offset, size = row["offset"], row["ret"]
        handle = self._append_fd_op(seq, worker, row, "write", offset=offset, size=size, **self._request(row))
        if handle is None:
            return
        path = self.current_path(handle)
        self.bytes_to_write += size
        fid = self.handle_file[handle]
        if offset is None:
            self.unverifiable.add(fid)
        elif size > 0:
            self.coverage[fid].append((offset, offset + size))
        if path is None:  # written after its unlink: not the size of whatever is at its old path now
            return
        if offset is None:
            self.sizes[path] = None
        elif self.sizes.get(path, 0) is not None and size > 0:
            self.sizes[path] = max(self.sizes.get(path) or 0, offset + size)

    def _row_read(self, seq, worker, row) -> None:
        if row["interface"] == v.MMAP:
            self._row_mapped(seq, worker, row, "read")
            return
        handle = self._append_fd_op(
            seq, worker, row, "read", offset=row["offset"], size=row["size"] or 0, **self._request(row)
        )
        if handle is None:
            return
        path = self.handle_path[handle]
        if row["offset"] is not None and not self.first_touch.get(path, False):
            self.read_extent[path] = max(self.read_extent.get(path, 0), row["offset"] + max(row["ret"], 0))

    def _row_mapped(self, seq, worker, row, kind: str) -> None:
        """Pages read or written through a mapping: I/O on the mapping's handle at their file offset."""
        found = self._mapped_handle(row["pid"], row["address"])
        if found is None:
            self.skipped["pages_outside_a_mapping"] += 1
            return
        handle, offset = found
        path, size = self.handle_path[handle], row["size"] or 0
        deps: list[int] = []
        self._dep(self.handle_origin.get(handle), worker, deps)
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind=kind,
                ts_ns=row["ts_ns"],
                handle=handle,
                path=path,
                offset=offset,
                size=size,
                mapped=True,
                deps=tuple(deps),
            )
        )
        if kind == "write":
            self.bytes_to_write += size
            self.coverage[self.handle_file[handle]].append((offset, offset + size))
        elif not self.first_touch.get(path, False):
            self.read_extent[path] = max(self.read_extent.get(path, 0), offset + size)

    def _row_mmap(self, seq, worker, row) -> None:
        """A file mapping: one ``mmap`` op that opens the file for the mapping (the program may close its
        descriptor meanwhile) and maps it; its handle is the mapping's."""
        path = self.rel(row["path"])
        if path is None or row["address"] is None:
            self.skipped["no_path"] += 1
            return
        handle = self.new_handle(path, seq, worker)
        self.touch(path, creating=False)
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind="mmap",
                ts_ns=row["ts_ns"],
                handle=handle,
                path=path,
                offset=row["offset"] or 0,
                size=row["size"],
                flags=row["flags"],
                prot=row["prot"],
                deps=self.path_deps(seq, worker, path),
            )
        )
        self.mappings[row["pid"]].append((row["address"], row["size"] or 0, row["offset"] or 0, handle))

    def _row_munmap(self, seq, worker, row) -> None:
        """The end of a mapping: ``munmap`` unmaps it and closes its handle."""
        found = self._mapped_handle(row["pid"], row["address"])
        if found is None:
            self.skipped["unmapped_without_mapping"] += 1
            return
        handle = found[0]
        self.mappings[row["pid"]] = [m for m in self.mappings[row["pid"]] if m[3] != handle]
        self.handle_refs[handle] -= 1
        deps: list[int] = []
        self._dep(self.handle_origin.get(handle), worker, deps)
        self.ops[worker].append(
            PlanOp(seq=seq, kind="munmap", ts_ns=row["ts_ns"], handle=handle, release=True, deps=tuple(deps))
        )

    def _row_msync(self, seq, worker, row) -> None:
        found = self._mapped_handle(row["pid"], row["address"])
        if found is None:
            self.skipped["synced_without_mapping"] += 1
            return
        deps: list[int] = []
        self._dep(self.handle_origin.get(found[0]), worker, deps)
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind="msync",
                ts_ns=row["ts_ns"],
                handle=found[0],
                offset=found[1],
                size=row["size"],
                flags=row["flags"],
                deps=tuple(deps),
            )
        )

    def _row_lseek(self, seq, worker, row) -> None:
        self._append_fd_op(seq, worker, row, "lseek", offset=row["offset"])

    def _row_fsync(self, seq, worker, row) -> None:
        self._append_fd_op(seq, worker, row, row["op"], **self._request(row))

    _row_fdatasync = _row_fsync

    def _row_sync_file_range(self, seq, worker, row) -> None:
        self._append_fd_op(
            seq, worker, row, "sync_file_range", offset=row["offset"], size=row["size"], flags=row["flags"]
        )

    def _row_ftruncate(self, seq, worker, row) -> None:
        handle = self._append_fd_op(seq, worker, row, "ftruncate", size=row["size"])
        if handle is not None:
            if self.current_path(handle) is not None:
                self.sizes[self.current_path(handle)] = row["size"]
            fid, length = self.handle_file[handle], row["size"] or 0
            self.coverage[fid] = [(s, min(e, length)) for s, e in self.coverage[fid] if s < length]
            self.truncated.add(fid)
            self.bytes_to_write += row["size"] or 0

    def _row_fallocate(self, seq, worker, row) -> None:
        mode = row["flags"] or 0
        handle = self._append_fd_op(seq, worker, row, "fallocate", offset=row["offset"], size=row["size"], flags=mode)
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
        self.ops[worker].append(
            PlanOp(seq=seq, kind="dup", ts_ns=row["ts_ns"], handle=handle, source_handle=source, deps=tuple(deps))
        )

    def _row_fcntl(self, seq, worker, row) -> None:
        self._append_fd_op(seq, worker, row, "fcntl", flags=row["flags"])

    def _row_rename(self, seq, worker, row) -> None:
        old, new = self.rel(row["path"]), self.rel(row["new_path"])
        if old is None or new is None:
            self.skipped["no_path"] += 1
            return
        self.named.update((old, new))
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
            self.mkdir_seq[new] = (seq, worker)
            if flags & entries.RENAME_EXCHANGE:
                self.mkdir_seq[old] = (seq, worker)
        deps = sorted(set(deps) | set(self.path_deps(seq, worker, old, new)))
        self.ops[worker].append(
            PlanOp(
                seq=seq, kind="rename", ts_ns=row["ts_ns"], path=old, new_path=new, flags=row["flags"], deps=tuple(deps)
            )
        )

    def _row_link(self, seq, worker, row) -> None:
        """A second name of a file (link(2)): both names are the one file (sizes, content) from now on."""
        old, new = self.rel(row["path"]), self.rel(row["new_path"])
        if old is None or new is None:
            self.skipped["no_path"] += 1
            return
        self.named.update((old, new))
        self.touch(old, creating=False)
        self.first_touch.setdefault(new, True)
        self.file_of_path[new] = self.file(old)
        if old in self.sizes:
            self.sizes[new] = self.sizes[old]
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind="link",
                ts_ns=row["ts_ns"],
                path=old,
                new_path=new,
                flags=row["flags"],
                deps=self.path_deps(seq, worker, old, new),
            )
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
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind="symlink",
                ts_ns=row["ts_ns"],
                path=row["path"],
                new_path=new,
                deps=self.path_deps(seq, worker, new),
            )
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
        self.ops[worker].append(
            PlanOp(
                seq=seq,
                kind="unlink",
                ts_ns=row["ts_ns"],
                path=path,
                flags=row["flags"],
                deps=self.path_deps(seq, worker, path),
            )
        )

    def _row_mkdir(self, seq, worker, row) -> None:
        path = self.rel(row["path"])
        if path is None:
            self.skipped["no_path"] += 1
            return
        deps = self.path_deps(seq, worker, path)
        self.made_dirs.add(path)
        self.mkdir_seq[path] = (seq, worker)
        self.ops[worker].append(PlanOp(seq=seq, kind="mkdir", ts_ns=row["ts_ns"], path=path, deps=deps))

    # -- result --------------------------------------------------------
    def _under_made_dir(self, path: str) -> bool:
        return any(path == d or path.startswith(d + "/") for d in self.made_dirs)

    def finish(self, strategy: str) -> ReplayPlan:
        # Ported fix: a path with files under it is a directory, never a file to create.
        parents = {a for path in self.first_touch for a in _ancestors(path)}
        precreate_files = tuple(
            sorted(
                (path, self.read_extent.get(path, 0))
                for path, creating in self.first_touch.items()
                if not creating and path not in self.made_dirs and path not in self.opened_dirs and path not in parents
            )
        )
        dirs = {d for d in self.opened_dirs if not self._under_made_dir(d)}
        for path in self.named:
            for parent in _ancestors(path):
                if not self._under_made_dir(parent):
                    dirs.add(parent)
        final_path = {fid: path for path, fid in self.file_of_path.items()}
        key_of = {fid: file_key(path) for fid, path in final_path.items()}
        for path, extent in precreate_files:
            fid = self.precreated.get(path)
            if fid is not None and fid not in self.truncated and extent:
                self.coverage[fid].insert(0, (0, extent))
        workers = tuple(
            WorkerPlan(
                pid=pid,
                tid=tid,
                rank=self.ranks[(pid, tid)],
                ops=tuple(
                    dataclasses.replace(op, pattern_key=key_of.get(self.handle_file[op.handle], 0))
                    if op.kind == "write"
                    else op
                    for op in ops
                ),
            )
            for (pid, tid), ops in sorted(self.ops.items())
            if ops
        )
        expected = {path: size for path, size in self.sizes.items() if size is not None and path not in parents}
        for path, extent in precreate_files:
            if path in expected:
                expected[path] = max(expected[path], extent)
        return ReplayPlan(
            strategy=strategy,
            workers=workers,
            precreate_dirs=tuple(sorted(dirs, key=lambda d: (d.count("/"), d))),
            precreate_files=precreate_files,
            skipped_ops=MappingProxyType(dict(self.skipped)),
            bytes_to_write=self.bytes_to_write + sum(size for _, size in precreate_files),
            awaited=frozenset(self.awaited),
            pattern_keys=MappingProxyType(
                {path: key_of.get(self.precreated.get(path), 0) for path, _ in precreate_files}
            ),
            checks=PlanChecks(
                expected_sizes=MappingProxyType(expected),
                verify_ranges=MappingProxyType(
                    {
                        path: _clipped(merge_ranges(self.coverage[fid]), expected[path])
                        for path, fid in sorted(self.file_of_path.items())
                        if fid not in self.unverifiable and path in expected and final_path[fid] == path
                    }
                ),
                unverifiable=tuple(sorted(p for p, fid in self.file_of_path.items() if fid in self.unverifiable)),
            ),
            files=FileIdentity(
                handle_files=MappingProxyType(dict(self.handle_file)), file_paths=MappingProxyType(final_path)
            ),
            queue_depths=MappingProxyType(dict(self.queue_depths)),
        )


def _clipped(ranges: list[tuple[int, int]], size: int) -> tuple[tuple[int, int], ...]:
    """``ranges`` cut at ``size`` (pages written back through a mapping may reach past the end of the file)."""
    return tuple((start, min(end, size)) for start, end in ranges if start < size)


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of half-open byte ranges [start, end), sorted; touching ranges merge."""
    merged: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


_PLAN_COLUMNS = (
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
)


HOST_ARCH = v.host_arch()


def build_posix_plan(table: pa.Table, strip_prefix: str | None = None, *, arch: str = v.X86_64) -> ReplayPlan:
    """Plan the replay of ``table`` (a trace recorded on ``arch``) operation for operation, as recorded.

    Pure: reads only the table. Rows are taken in ``ts_ns`` order; open flags
    become this machine's. Raises ReplayError on a path with a NUL byte or a
    trace of an architecture whose open flags are unknown.
    """
    if v.normalize_arch(arch) not in v.OPEN_FLAGS:
        raise ReplayError(
            f"the trace was recorded on {arch}, whose open flags this release does not know "
            f"(known: {', '.join(v.ARCHES)})"
        )
    table = table.select(list(_PLAN_COLUMNS))
    if table.num_rows:
        table = table.sort_by([("ts_ns", "ascending")])
    planner = _Planner(strip_prefix, arch)
    columns = {name: table.column(name).to_pylist() for name in _PLAN_COLUMNS}
    for seq in range(table.num_rows):
        planner.add(seq, {name: columns[name][seq] for name in _PLAN_COLUMNS})
    return _cross_worker_order(planner.finish("posix"))


_ORDERED = {
    "close",
    "munmap",
    "lseek",
    "fcntl",
    "ftruncate",
    "fallocate",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "msync",
}


def _cross_worker_order(plan: ReplayPlan) -> ReplayPlan:
    """Handles used by several workers keep their recorded happens-before, one operation at a time: an
    ordered use (``_ORDERED``, or a read or write at the file position) waits for each other worker's last
    earlier use of the handle; another use, for the last earlier ordered use when another worker's."""
    everything = sorted(((op.seq, i, k) for i, w in enumerate(plan.workers) for k, op in enumerate(w.ops)))
    uses: dict[int, list[tuple[int, int, bool]]] = defaultdict(list)  # handle -> (seq, worker, ordered)
    for seq, i, k in everything:
        op = plan.workers[i].ops[k]
        if op.handle is not None:
            uses[op.handle].append(
                (seq, i, op.kind in _ORDERED or (op.kind in ("read", "write") and op.offset is None and not op.mapped))
            )
        if op.kind == "dup" and op.source_handle is not None:
            uses[op.source_handle].append((seq, i, False))
    workers_of = {h: {w for _, w, _ in u} for h, u in uses.items()}
    kind_of = {(seq, i): plan.workers[i].ops[k].kind for seq, i, k in everything}
    extra: dict[tuple[int, int], set[int]] = defaultdict(set)
    for seq, i, k in everything:
        op = plan.workers[i].ops[k]
        handles = (
            [(op.handle, op.kind in _ORDERED or (op.kind in ("read", "write") and op.offset is None and not op.mapped))]
            if op.handle is not None
            else []
        )
        if op.kind == "dup" and op.source_handle is not None:
            handles.append((op.source_handle, False))
        for handle, ordered in handles:
            if len(workers_of[handle]) < 2:
                continue
            before = [u for u in uses[handle] if u[0] < seq]
            if ordered:  # each other worker's last use from the previous ordered use on (that one included)
                marks = [s for s, w, o in before if o]
                since = marks[-1] if marks else -1
                last: dict[int, int] = {w: s for s, w, _ in before if w != i and s >= since}  # the last one wins
                extra[(i, k)].update(last.values())
            else:
                marks = [(s, w) for s, w, o in before if o]
                if marks and marks[-1][1] != i:
                    extra[(i, k)].add(marks[-1][0])
                if op.kind == "read" and handle == op.handle:  # the last write of each other worker before it
                    last_write = {w: s for s, w, _ in before if w != i and kind_of[(s, w)] == "write"}
                    extra[(i, k)].update(last_write.values())
    if not extra:
        return plan
    workers = tuple(
        dataclasses.replace(
            w,
            ops=tuple(
                dataclasses.replace(op, deps=tuple(sorted(set(op.deps) | extra[(i, k)]))) if extra.get((i, k)) else op
                for k, op in enumerate(w.ops)
            ),
        )
        for i, w in enumerate(plan.workers)
    )
    awaited = set(plan.awaited) | {s for deps in extra.values() for s in deps}
    return dataclasses.replace(plan, workers=workers, awaited=frozenset(awaited))
