"""Per-process file-description state: syscall events in, trace rows out.

Both backends decode their raw events into ``SyscallEvent`` and feed them,
in the order their effects became visible (``effect_ns``), to ``TraceBuilder``. The builder keeps what the
kernel keeps (open(2), dup(2), fork(2), execve(2)):

- a process (thread group) owns a descriptor table, shared by its threads
  and, after ``clone(CLONE_FILES)``, by other processes too;
- a descriptor points to an open file description holding the path, the
  status flags and the file position; dup and fork share descriptions, so
  positions are shared exactly as the kernel shares them;
- execve closes close-on-exec descriptors; chdir/fchdir move the cwd that
  relative paths are resolved against.

Offsets of plain read/write/readv/writev come from the tracked position
(``offset_source='position'``), O_APPEND writes from the tracked file size
(``'append'``), positional calls from their argument (``'explicit'``); a
backend that reads the kernel's ``struct file`` supplies ``kernel_offset``
(``'kernel'``). Where none of these is known the offset is null with
``offset_source='unknown'`` rather than a guess.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field
from typing import Any, Iterable

from ckpt_trace.formats import COLUMNS
from ckpt_trace.formats import vocabulary as v
from ckpt_trace.formats.vocabulary import IO_URING_PATH, SPECIAL_PATHS, SPECIAL_PREFIXES

from . import syscalls as sc


@dataclass(slots=True)
class SyscallEvent:
    """One completed system call as a backend decoded it.

    ``ts_ns`` is the entry time on the backend's clock, ``dur_ns`` the time
    to exit. ``args`` maps the names of ``syscalls.SYSCALLS[name].args`` to
    ints or path strings. ``pid`` is the thread group id when the backend
    knows it. ``size`` is the summed iov_len of vectored calls.
    ``kernel_offset`` is the file offset read from the kernel, when read.
    ``rank`` is the rank found in a new image's environment (execve only).
    """

    ts_ns: int
    dur_ns: int
    tid: int
    name: str
    args: dict[str, Any]
    ret: int
    pid: int | None = None
    comm: str | None = None
    size: int | None = None
    kernel_offset: int | None = None
    rank: int | None = None


@dataclass(slots=True)
class Description:
    """An open file description (struct file): path, status flags, position."""

    path: str | None
    flags: int
    pos: int | None = 0


@dataclass(slots=True)
class FdTable:
    """A descriptor table (struct files_struct)."""

    fds: dict[int, Description] = field(default_factory=dict)
    cloexec: set[int] = field(default_factory=set)

    def copy(self) -> "FdTable":
        return FdTable(dict(self.fds), set(self.cloexec))

    def install(self, fd: int, desc: Description, cloexec: bool) -> None:
        self.fds[fd] = desc
        if cloexec:
            self.cloexec.add(fd)
        else:
            self.cloexec.discard(fd)

    def remove(self, fd: int) -> Description | None:
        self.cloexec.discard(fd)
        return self.fds.pop(fd, None)


@dataclass(slots=True)
class Process:
    """A thread group: its descriptor table, cwd, rank and command name."""

    tgid: int
    table: FdTable
    cwd: str | None
    rank: int = -1
    comm: str | None = None


def rank_from_environ(env: Iterable[str]) -> int | None:
    """Return the distributed rank named in ``KEY=VALUE`` strings, or None.

    Keys, first match wins: RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI),
    SLURM_PROCID (Slurm), PMI_RANK (MPICH).
    """
    values = {}
    for item in env:
        key, sep, value = item.partition("=")
        if sep:
            values[key] = value
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"):
        if key in values:
            try:
                return int(values[key])
            except ValueError:
                continue
    return None


_AT_ENTRY = frozenset({"clone", "clone3", "fork", "vfork", "close", "close_range"})


def effect_ns(ev: SyscallEvent) -> int:
    """When a call's effect on descriptor state became visible to other threads.

    A descriptor exists from the moment open/dup *returns*, so calls take
    effect at their exit; but close frees the number at the start of the
    call (another thread's open may return it before close returns), and a
    child exists from inside its parent's clone, before any of its own calls,
    so those take effect at their entry.
    """
    return ev.ts_ns if ev.name in _AT_ENTRY else ev.ts_ns + max(ev.dur_ns, 0)


def normalize_path(path: str) -> str:
    """Absolute path with '.', '..' and repeated slashes folded (no symlink lookup)."""
    norm = posixpath.normpath(path)
    return "/" + norm.lstrip("/") if norm.startswith("/") else norm


class TraceBuilder:
    """Turns time-ordered ``SyscallEvent`` objects into trace rows.

    Call order: construct with the root process's state, ``feed`` every
    event in ``effect_ns`` order (``feed_all`` sorts for you), then read
    ``columns()`` and the counters. Called by both tracer backends.
    """

    def __init__(
        self,
        *,
        start_ns: int,
        root_pid: int | None = None,
        cwd: str | None = None,
        inherited_fds: dict[int, str] | None = None,
        root_rank: int = -1,
        path_filters: Iterable[str] = (),
        keep_special: bool = False,
    ) -> None:
        self.start_ns = start_ns
        self.path_filters = tuple(path_filters)
        self.keep_special = keep_special
        self.procs: dict[int, Process] = {}
        self.sizes: dict[str, int] = {}
        self.untracked_fd_ops = 0
        self.filtered_ops = 0
        self._root_template = Process(
            tgid=-1,
            table=FdTable({fd: Description(path, 0, None) for fd, path in (inherited_fds or {}).items()}),
            cwd=cwd,
            rank=root_rank,
        )
        if root_pid is not None:
            self._adopt_root(root_pid)
        self._cols: dict[str, list] = {name: [] for name in _COLUMN_NAMES}

    def _adopt_root(self, pid: int) -> Process:
        proc = self._root_template
        proc.tgid = pid
        self.procs[pid] = proc
        return proc

    # -- public --------------------------------------------------------
    def feed_all(self, events: Iterable[SyscallEvent]) -> None:
        """Feed events in the order their effects became visible (see ``effect_ns``)."""
        for event in sorted(events, key=effect_ns):
            self.feed(event)

    def feed(self, ev: SyscallEvent) -> None:
        proc = self._process_of(ev)
        handler = _HANDLERS.get(ev.name)
        if handler is not None:
            handler(self, proc, ev)

    def columns(self) -> dict[str, list]:
        return self._cols

    @property
    def num_rows(self) -> int:
        return len(self._cols["ts_ns"])

    # -- processes -----------------------------------------------------
    def _process_of(self, ev: SyscallEvent) -> Process:
        proc = self.procs.get(ev.tid)
        if proc is not None:
            return proc
        if self._root_template.tgid == -1:
            proc = self._adopt_root(ev.pid if ev.pid is not None else ev.tid)
            self.procs[ev.tid] = proc
            return proc
        if ev.pid is not None and ev.pid in self.procs:
            proc = self.procs[ev.pid]
        else:
            proc = Process(tgid=ev.pid if ev.pid is not None else ev.tid, table=FdTable(), cwd=None)
            self.procs[proc.tgid] = proc
        self.procs[ev.tid] = proc
        return proc

    def _resolve(self, proc: Process, dirfd: int | None, path: str | None) -> str | None:
        if path is None:
            return None
        if path.startswith("/"):
            return normalize_path(path)
        if dirfd is None or dirfd == sc.AT_FDCWD:
            base = proc.cwd
        else:
            desc = proc.table.fds.get(dirfd)
            base = desc.path if desc else None
        if base is None or not base.startswith("/"):
            return None
        return normalize_path(posixpath.join(base, path)) if path else normalize_path(base)

    def _keep(self, path: str | None, op: str) -> bool:
        """Path filters, when given, decide alone (so ``--path-filter /dev/shm/ckpt/`` keeps an in-memory
        checkpoint); without them, pseudo files and non-files are left out. io_uring instance rows stay."""
        ring = op.startswith("io_uring")
        if path is None:
            return ring
        if self.path_filters:
            return path.startswith(self.path_filters) or (ring and path == IO_URING_PATH)
        if not self.keep_special and (path in SPECIAL_PATHS or path.startswith(SPECIAL_PREFIXES)):
            return ring and path == IO_URING_PATH
        return True

    def _emit(self, proc: Process, ev: SyscallEvent, op: str, **values: Any) -> None:
        path, new_path = values.get("path"), values.get("new_path")
        if not (self._keep(path, op) or (new_path is not None and self._keep(new_path, op))):
            self.filtered_ops += 1
            return
        cols = self._cols
        cols["ts_ns"].append(max(0, ev.ts_ns - self.start_ns))
        cols["dur_ns"].append(max(0, ev.dur_ns))
        cols["pid"].append(proc.tgid)
        cols["tid"].append(ev.tid)
        cols["comm"].append(ev.comm or proc.comm)
        cols["rank"].append(proc.rank)
        cols["syscall"].append(ev.name)
        cols["op"].append(op)
        cols["ret"].append(ev.ret)
        for name in _OPTIONAL_COLUMNS:
            cols[name].append(values.get(name))

    def _desc(self, proc: Process, fd: int) -> Description | None:
        desc = proc.table.fds.get(fd)
        if desc is None:
            self.untracked_fd_ops += 1
        return desc

    def _grow(self, path: str | None, end: int) -> None:
        if path is not None and path in self.sizes:
            self.sizes[path] = max(self.sizes[path], end)

    # -- handlers ------------------------------------------------------
    def _on_open(self, proc: Process, ev: SyscallEvent) -> None:
        flags = sc.O_CREAT | sc.O_WRONLY | sc.O_TRUNC if ev.name == "creat" else int(ev.args.get("flags", 0))
        path = self._resolve(proc, ev.args.get("dirfd"), ev.args.get("path"))
        if ev.ret >= 0:
            proc.table.install(ev.ret, Description(path, flags, 0), bool(flags & sc.O_CLOEXEC))
            writable = flags & sc.O_ACCMODE != 0
            if path is not None and ((flags & sc.O_TRUNC and writable) or flags & sc.O_EXCL and flags & sc.O_CREAT):
                self.sizes[path] = 0
        self._emit(proc, ev, "open", fd=ev.ret if ev.ret >= 0 else None, path=path, flags=flags)

    def _on_close(self, proc: Process, ev: SyscallEvent) -> None:
        fd = int(ev.args["fd"])
        desc = proc.table.fds.get(fd) if ev.ret < 0 else proc.table.remove(fd)
        if desc is None:
            self.untracked_fd_ops += 1
            return
        self._emit(proc, ev, "close", fd=fd, path=desc.path)

    def _on_close_range(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.ret != 0:
            return
        first, last, flags = int(ev.args["fd"]), int(ev.args["max_fd"]) & 0xFFFFFFFF, int(ev.args.get("flags", 0))
        for fd in [fd for fd in proc.table.fds if first <= fd <= last]:
            if flags & sc.CLOSE_RANGE_CLOEXEC:
                proc.table.cloexec.add(fd)
            else:
                proc.table.remove(fd)

    def _data_offset(self, desc: Description, ev: SyscallEvent, is_write: bool) -> tuple[int | None, str, bool]:
        """Return (offset, offset_source, uses_file_position) of a read or write."""
        explicit = ev.args.get("offset") if ev.name in sc.POSITIONAL else None
        if explicit is not None and int(explicit) == -1 and ev.name in ("preadv2", "pwritev2"):
            explicit = None
        appends = is_write and (desc.flags & sc.O_APPEND or int(ev.args.get("rwflags", 0)) & sc.RWF_APPEND)
        if ev.kernel_offset is not None and explicit is None:
            return ev.kernel_offset, v.OFFSET_KERNEL, True
        if appends:
            size = self.sizes.get(desc.path) if desc.path is not None else None
            return size, (v.OFFSET_APPEND if size is not None else v.OFFSET_UNKNOWN), explicit is None
        if explicit is not None:
            return int(explicit), v.OFFSET_EXPLICIT, False
        return desc.pos, (v.OFFSET_POSITION if desc.pos is not None else v.OFFSET_UNKNOWN), True

    def _on_data(self, proc: Process, ev: SyscallEvent) -> None:
        fd = int(ev.args["fd"])
        desc = self._desc(proc, fd)
        if desc is None:
            return
        is_write = sc.SYSCALLS[ev.name].op == "write"
        offset, source, uses_pos = self._data_offset(desc, ev, is_write)
        moved = max(ev.ret, 0)
        if uses_pos and ev.ret >= 0:
            desc.pos = offset + moved if offset is not None else None
        if is_write and offset is not None and moved:
            self._grow(desc.path, offset + moved)
        vectored = ev.name in sc.VECTORED
        size = ev.size if vectored else int(ev.args.get("count", 0))
        self._emit(
            proc, ev, sc.SYSCALLS[ev.name].op, fd=fd, path=desc.path, offset=offset, offset_source=source,
            size=size, iov_count=int(ev.args["iov_count"]) if vectored else None,
        )

    def _on_lseek(self, proc: Process, ev: SyscallEvent) -> None:
        fd = int(ev.args["fd"])
        desc = self._desc(proc, fd)
        if desc is None:
            return
        if ev.ret >= 0:
            desc.pos = ev.ret
            if int(ev.args.get("whence", 0)) == sc.SEEK_END and desc.path is not None:
                self.sizes[desc.path] = ev.ret - int(ev.args.get("offset", 0))
        self._emit(proc, ev, "lseek", fd=fd, path=desc.path, offset=ev.ret if ev.ret >= 0 else None,
                   offset_source=v.OFFSET_POSITION if ev.ret >= 0 else None)

    def _on_fd_only(self, proc: Process, ev: SyscallEvent) -> None:
        fd = int(ev.args["fd"])
        desc = self._desc(proc, fd)
        if desc is None:
            return
        op = sc.SYSCALLS[ev.name].op
        values: dict[str, Any] = {"fd": fd, "path": desc.path}
        if ev.name == "sync_file_range":
            values.update(offset=int(ev.args["offset"]), offset_source=v.OFFSET_EXPLICIT, size=int(ev.args["count"]),
                          flags=int(ev.args.get("flags", 0)))
        elif ev.name == "ftruncate":
            values["size"] = int(ev.args["length"])
            if ev.ret == 0 and desc.path is not None:
                self.sizes[desc.path] = int(ev.args["length"])
        elif ev.name == "fallocate":
            offset, length, mode = int(ev.args["offset"]), int(ev.args["count"]), int(ev.args.get("mode", 0))
            values.update(offset=offset, offset_source=v.OFFSET_EXPLICIT, size=length, flags=mode)
            if ev.ret == 0 and not mode & sc.FALLOC_FL_KEEP_SIZE:
                self._grow(desc.path, offset + length)
        self._emit(proc, ev, op, **values)

    def _rename_open_files(self, old: str, new: str) -> None:
        prefix = old + "/"
        seen: set[int] = set()
        for proc in self.procs.values():
            for desc in proc.table.fds.values():
                if id(desc) in seen or desc.path is None:
                    continue
                seen.add(id(desc))
                if desc.path == old:
                    desc.path = new
                elif desc.path.startswith(prefix):
                    desc.path = new + desc.path[len(old):]
        if old in self.sizes:
            self.sizes[new] = self.sizes.pop(old)

    def _on_rename(self, proc: Process, ev: SyscallEvent) -> None:
        old = self._resolve(proc, ev.args.get("dirfd"), ev.args.get("path"))
        new = self._resolve(proc, ev.args.get("dirfd2"), ev.args.get("path2"))
        if ev.ret == 0 and old is not None and new is not None:
            self._rename_open_files(old, new)
        flags = ev.args.get("flags")
        self._emit(proc, ev, "rename", path=old, new_path=new, flags=int(flags) if flags is not None else None)

    def _on_path_only(self, proc: Process, ev: SyscallEvent) -> None:
        path = self._resolve(proc, ev.args.get("dirfd"), ev.args.get("path"))
        op = sc.SYSCALLS[ev.name].op
        if op == "unlink" and ev.ret == 0 and path is not None:
            self.sizes.pop(path, None)
        if op == "mkdir":
            self._emit(proc, ev, op, path=path)
        else:
            self._emit(proc, ev, op, path=path, flags=int(ev.args.get("flags", 0)) or None)

    def _dup(self, proc: Process, ev: SyscallEvent, cloexec: bool, syscall_flags: int | None) -> None:
        fd = int(ev.args["fd"])
        desc = self._desc(proc, fd)
        if desc is None:
            return
        if ev.ret >= 0:
            proc.table.install(ev.ret, desc, cloexec)
        self._emit(proc, ev, "dup", fd=fd, path=desc.path, flags=syscall_flags)

    def _on_dup(self, proc: Process, ev: SyscallEvent) -> None:
        flags = int(ev.args.get("flags", 0)) if ev.name == "dup3" else None
        self._dup(proc, ev, bool(flags and flags & sc.O_CLOEXEC), flags)

    def _on_fcntl(self, proc: Process, ev: SyscallEvent) -> None:
        cmd, fd, arg = int(ev.args["cmd"]), int(ev.args["fd"]), int(ev.args.get("arg", 0))
        if cmd in (sc.F_DUPFD, sc.F_DUPFD_CLOEXEC):
            self._dup(proc, ev, cmd == sc.F_DUPFD_CLOEXEC, None)
        elif cmd == sc.F_SETFD and ev.ret == 0 and fd in proc.table.fds:
            if arg & sc.FD_CLOEXEC:
                proc.table.cloexec.add(fd)
            else:
                proc.table.cloexec.discard(fd)
        elif cmd == sc.F_SETFL:
            desc = self._desc(proc, fd)
            if desc is None:
                return
            if ev.ret == 0:
                desc.flags = (desc.flags & ~sc.SETFL_MASK) | (arg & sc.SETFL_MASK)
            self._emit(proc, ev, "fcntl", fd=fd, path=desc.path, flags=arg)

    def _on_ioctl(self, proc: Process, ev: SyscallEvent) -> None:
        cmd, fd = int(ev.args["cmd"]) & 0xFFFFFFFF, int(ev.args["fd"])
        if ev.ret != 0 or fd not in proc.table.fds:
            return
        if cmd == sc.FIOCLEX:
            proc.table.cloexec.add(fd)
        elif cmd == sc.FIONCLEX:
            proc.table.cloexec.discard(fd)

    def _on_io_uring(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.name == "io_uring_setup":
            if ev.ret >= 0:
                proc.table.install(ev.ret, Description(IO_URING_PATH, sc.O_CLOEXEC, None), True)
            self._emit(proc, ev, "io_uring_setup", fd=ev.ret if ev.ret >= 0 else None, path=IO_URING_PATH)
            return
        fd = int(ev.args["fd"])
        desc = proc.table.fds.get(fd)
        self._emit(proc, ev, "io_uring_enter", fd=fd, path=desc.path if desc else None,
                   flags=int(ev.args.get("flags", 0)))

    def _on_clone(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.ret <= 0:
            return
        child = ev.ret
        flags = int(ev.args.get("clone_flags", 0)) if ev.name in ("clone", "clone3") else 0
        if flags & sc.CLONE_THREAD:
            self.procs[child] = proc
            return
        table = proc.table if flags & sc.CLONE_FILES else proc.table.copy()
        self.procs[child] = Process(tgid=child, table=table, cwd=proc.cwd, rank=proc.rank, comm=proc.comm)

    def _on_execve(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.ret != 0:
            return
        table = proc.table.copy()
        for fd in list(table.cloexec):
            table.remove(fd)
        proc.table = table
        path = ev.args.get("path")
        proc.comm = ev.comm or (os.path.basename(path)[:15] if path else proc.comm)
        if ev.rank is not None:
            proc.rank = ev.rank

    def _on_chdir(self, proc: Process, ev: SyscallEvent) -> None:
        if ev.ret != 0:
            return
        if ev.name == "chdir":
            proc.cwd = self._resolve(proc, None, ev.args.get("path"))
        else:
            desc = proc.table.fds.get(int(ev.args["fd"]))
            proc.cwd = desc.path if desc else None


_COLUMN_NAMES = COLUMNS
_OPTIONAL_COLUMNS = ("fd", "path", "new_path", "offset", "offset_source", "size", "flags", "iov_count")


def _handlers() -> dict:
    table = {}
    by_op = {
        "open": TraceBuilder._on_open, "close": TraceBuilder._on_close, "read": TraceBuilder._on_data,
        "write": TraceBuilder._on_data, "lseek": TraceBuilder._on_lseek, "fsync": TraceBuilder._on_fd_only,
        "fdatasync": TraceBuilder._on_fd_only, "sync_file_range": TraceBuilder._on_fd_only,
        "ftruncate": TraceBuilder._on_fd_only, "fallocate": TraceBuilder._on_fd_only,
        "rename": TraceBuilder._on_rename, "unlink": TraceBuilder._on_path_only,
        "mkdir": TraceBuilder._on_path_only, "dup": TraceBuilder._on_dup, "fcntl": TraceBuilder._on_fcntl,
        "io_uring_setup": TraceBuilder._on_io_uring, "io_uring_enter": TraceBuilder._on_io_uring,
    }
    for name, call in sc.SYSCALLS.items():
        if call.op is not None:
            table[name] = by_op[call.op]
    table.update(
        close_range=TraceBuilder._on_close_range, ioctl=TraceBuilder._on_ioctl, clone=TraceBuilder._on_clone, clone3=TraceBuilder._on_clone,
        fork=TraceBuilder._on_clone, vfork=TraceBuilder._on_clone, execve=TraceBuilder._on_execve,
        execveat=TraceBuilder._on_execve, chdir=TraceBuilder._on_chdir, fchdir=TraceBuilder._on_chdir,
    )
    return table


_HANDLERS = _handlers()
