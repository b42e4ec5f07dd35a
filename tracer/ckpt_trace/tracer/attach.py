"""``record --pid`` / ``--cgroup``: trace a job that is already running, for a while or for N checkpoint files,
then detach.

The job is the process ``pid`` and its descendants, those running at the attach and those it starts later
(bcc: their thread group ids in the program's ``traced`` map, which the ``sched:sched_process_fork``
tracepoint extends; strace: ``strace -f -p`` on each running process, strace following their forks); or,
with ``--cgroup PATH``, every process of a cgroup v2 directory and of the cgroups below it, whenever it runs
there (bcc: the kernel compares ``bpf_get_current_ancestor_cgroup_id(level)`` with the directory's cgroup
id, its inode number, held in the program's ``traced_cgroup`` map (before Linux 5.10, which does not let
tracing programs call it, ``bpf_get_current_cgroup_id()``: the directory's own processes only, not those of
the cgroups below it: ``bcc_backend.cgroup_ancestors``), so a process that joins the cgroup later
is traced from its first call and one that leaves it is not; strace: ``strace -f -p`` on the processes the
cgroup's ``cgroup.procs`` files list at the attach, and their forks; see cgroups(7), "Cgroups version 2"). The
job is never started, signalled, stopped for long or waited for: bcc only reads tracepoints, and strace
detaches from every thread on SIGINT (strace(1): "Trace can be stopped by Ctrl-C"; ptrace(2) PTRACE_DETACH),
so the job runs on as if nothing happened, but for the time each traced call takes to be copied out.

What the trace knows of descriptors opened before the attach comes from /proc (proc(5): /proc/PID/fd,
fdinfo's ``pos`` and ``flags``, cwd, environ for the rank): their reads and writes get paths and offsets.

A recording stops at the first of: ``--duration`` seconds, ``--until-checkpoints N`` checkpoint files,
the job's first process ending, or SIGINT/SIGTERM/SIGHUP to the recorder. A **checkpoint file**, an
engine-neutral rule (``CheckpointCounter``): a regular file (not under /proc, /sys or /dev; inside the path
filters when there are any) that a traced process opened for writing after the attach (O_WRONLY or O_RDWR;
creat), wrote at least one byte to through the write family (write, pwrite64, writev, pwritev, pwritev2) on
that descriptor, and closed. Only such a file is whole in the trace: its open, every write, its close. A
rename afterwards does not count it again; a file written through a mapping or io_uring only is not
counted. The trace then ends at that close: events after it (the start of the next save, in the few
milliseconds before the detach) are left out, so ``--until-checkpoints 1`` holds exactly one file's life;
but for a rename of a counted file seen before the detach, which is kept: the commit of a file written
under a temporary name (DCP's ``.metadata.tmp`` -> ``.metadata``, right after its close). At the other
end, a save under way at the attach may leave its tail in the trace (writes, close, rename through a
descriptor opened before): never its open, and it is not counted. But a save made by several processes
(DCP: a file per rank, then ``.metadata`` once every rank is done) under way at the attach may also open
files after it, a slower rank's or its metadata: those are counted, so N files counted after an attach in
the middle of such a save span two saves (the 2-rank DCP test's flake at load 14, before it attached
between saves). No engine-neutral rule tells them apart; ``AttachPlan.on_live`` (the CLI's "attached to
... recording" line on stderr) says when the probes are live, for a job that can be held between saves.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ckpt_trace.errors import TracerError

from . import syscalls as sc
from .children import children
from .spool import RowSpool
from .state import Description, FdTable, Process, rank_from_environ

_SPECIAL = ("/proc/", "/sys/", "/dev/")
_WRITES = ("write", "pwrite64", "writev", "pwritev", "pwritev2")
_OPENS = ("open", "openat", "openat2", "creat")
_RENAMES = ("rename", "renameat", "renameat2")


@dataclass(frozen=True)
class AttachPlan:
    """What to trace and when to stop: ``pid``'s tree, or every process of the cgroup v2 directory ``cgroup``
    (exactly one of the two), for ``duration_s`` or ``until_checkpoints`` files (both None: until the job's
    first process ends, or its cgroup has no process left, or the recorder is interrupted)."""

    pid: int | None
    duration_s: float | None = None
    until_checkpoints: int | None = None
    cgroup: str | None = None
    on_live: Callable[[], None] | None = field(default=None, compare=False)  # called once the probes are live


@dataclass(frozen=True)
class Cgroup:
    """A cgroup v2 directory: ``path`` (absolute, resolved), ``id`` (its inode number, which the kernel's
    ``bpf_get_current_cgroup_id`` returns for a process in it) and ``level`` (its depth below the hierarchy's
    root, which is level 0)."""

    path: str
    id: int
    level: int


CGROUP_CONTROLLERS = "cgroup.controllers"  # only cgroup v2 directories have it (cgroups(7))


def _cgroup2_mounts() -> list[tuple[str, str]]:
    """(mount point, root of the hierarchy it shows) of each cgroup2 mount (proc(5) /proc/self/mountinfo)."""
    mounts = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        fstype = line.split(" - ", 1)[1].split(" ")[0]
        if fstype == "cgroup2":
            mounts.append((fields[4].replace("\\040", " "), fields[3].replace("\\040", " ")))
    return mounts


def resolve_cgroup(path: str) -> Cgroup:
    """The cgroup v2 directory ``path`` names. Raises TracerError (``option`` cgroup) when it does not exist,
    is not a directory of a cgroup2 mount (a cgroup v1 one included), or cannot be read."""
    real = os.path.realpath(path)
    mounts = _cgroup2_mounts()
    where = f" (cgroup2 is mounted at {', '.join(point for point, _ in mounts)})" if mounts else " (no cgroup2 mount)"
    if not os.path.isdir(real):
        raise TracerError(f"{{option}} {path}: no such cgroup directory{where}", option="cgroup")
    if not os.path.exists(os.path.join(real, CGROUP_CONTROLLERS)):
        kind = "a cgroup v1 directory" if os.path.exists(os.path.join(real, "cgroup.procs")) else "not a cgroup"
        raise TracerError(f"{{option}} {path}: {kind}, only cgroup v2 is traced{where}", option="cgroup")
    mount = max(
        (m for m in mounts if real == m[0] or real.startswith(m[0].rstrip("/") + "/")),
        key=lambda m: len(m[0]),
        default=None,
    )
    if mount is None:
        raise TracerError(f"{{option}} {path}: not under a cgroup2 mount{where}", option="cgroup")
    inside = os.path.relpath(real, mount[0])
    parts = [p for p in mount[1].split("/") + ([] if inside == "." else inside.split("/")) if p and p != "."]
    return Cgroup(real, os.stat(real).st_ino, len(parts))


def cgroup_pids(cgroup: str) -> list[int]:
    """The processes in the cgroup directory ``cgroup`` and the cgroups below it (``cgroup.procs``), in order."""
    found: set[int] = set()
    for directory, _, _ in os.walk(cgroup):
        try:
            found.update(int(line) for line in Path(directory, "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue
    return sorted(found)


def job_pids(plan: AttachPlan) -> list[int]:
    """The job's processes running now: ``pid``'s tree, parents first, or its cgroup's processes."""
    if plan.cgroup is not None:
        return cgroup_pids(plan.cgroup)
    return process_tree(plan.pid) if plan.pid is not None else []


def job_root(plan: AttachPlan) -> int:
    """The process the trace is rooted at: ``pid``, or the cgroup's oldest-numbered process (-1: none)."""
    if plan.pid is not None:
        return plan.pid
    return min(job_pids(plan), default=-1)


def job_running(plan: AttachPlan) -> bool:
    """Whether the job is still there: ``pid`` alive, or the cgroup populated (``cgroup.events``)."""
    if plan.cgroup is None:
        return plan.pid is not None and alive(plan.pid)
    try:
        events = Path(plan.cgroup, "cgroup.events").read_text().split("\n")
    except OSError:
        return False  # the cgroup was removed
    return "populated 1" in events


def job_name(plan: AttachPlan) -> str:
    """How messages name the job: ``pid 4242`` or ``cgroup /sys/fs/cgroup/job``."""
    return f"cgroup {plan.cgroup}" if plan.cgroup is not None else f"pid {plan.pid}"


def check_plan(plan: AttachPlan) -> None:
    """Refuse what cannot be attached to, with why, naming the field (``option``: pid, cgroup, duration_s,
    until_checkpoints; the CLI says its flag). Raises TracerError."""
    if (plan.pid is None) == (plan.cgroup is None):
        raise TracerError("attach to a process id or a cgroup, exactly one of the two")
    if plan.duration_s is not None and not plan.duration_s > 0:
        raise TracerError(f"{{option}} {plan.duration_s}: must be a positive number of seconds", option="duration_s")
    if plan.until_checkpoints is not None and plan.until_checkpoints < 1:
        raise TracerError(f"{{option}} {plan.until_checkpoints}: must be at least 1", option="until_checkpoints")
    mine = os.getpid()
    if plan.cgroup is not None:
        cgroup = resolve_cgroup(plan.cgroup)
        members = cgroup_pids(cgroup.path)
        if not members:
            raise TracerError(f"{{option}} {plan.cgroup}: no process in that cgroup", option="cgroup")
        if mine in members:
            raise TracerError(
                f"{{option}} {plan.cgroup}: the recorder runs in that cgroup (run it from another one)",
                option="cgroup",
            )
        return
    assert plan.pid is not None
    if plan.pid <= 0:
        raise TracerError(f"{{option}} {plan.pid}: not a process id", option="pid")
    if not alive(plan.pid):
        raise TracerError(f"{{option}} {plan.pid}: no such running process", option="pid")
    if plan.pid == mine or mine in process_tree(plan.pid):
        raise TracerError(
            f"{{option}} {plan.pid}: the recorder is part of that job (trace another process)", option="pid"
        )


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (proc(5) /proc/PID/stat state)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants running now, parents first."""
    order, stack = [], [pid]
    while stack:
        current = stack.pop()
        if current in order:
            continue
        order.append(current)
        stack += children(current)
    return order


def threads(pid: int) -> list[int]:
    """The thread ids of process ``pid`` ([] when it is gone)."""
    try:
        return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def job_command(pid: int) -> list[str]:
    """The job's command line (/proc/PID/cmdline), for the trace's ``command``."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return [f"pid {pid}"]
    return [part.decode("utf-8", "surrogateescape") for part in raw.split(b"\0") if part] or [f"pid {pid}"]


def running_process(pid: int) -> Process | None:
    """The builder's view of a process running before the attach: its descriptors with their paths, status
    flags and positions (proc(5) fdinfo), cwd, rank and command name. None when it is gone."""
    fds = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for name in names:
        try:
            path = os.readlink(f"/proc/{pid}/fd/{name}")
            info = dict(
                line.split(":", 1)
                for line in Path(f"/proc/{pid}/fdinfo/{name}").read_text().splitlines()
                if ":" in line
            )
            flags = int(info.get("flags", "0").strip(), 8)
            pos = int(info.get("pos", "0").strip())
        except (OSError, ValueError):
            continue
        fds[int(name)] = Description(path, flags & ~0o2000000, pos)  # O_CLOEXEC is the descriptor's
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = rank_from_environ(item.decode("utf-8", "replace") for item in environ if item)
    except OSError:
        rank = None
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = None
    return Process(tgid=pid, table=FdTable(fds), cwd=cwd, rank=-1 if rank is None else rank, comm=comm)


def seed_builder(builder, pids: list[int]) -> None:
    """Put the running processes ``pids`` (and their threads) into ``builder`` as they are now."""
    for pid in pids:
        proc = running_process(pid)
        if proc is None:
            continue
        builder.procs[pid] = proc
        for tid in threads(pid):
            builder.procs[tid] = proc


@dataclass
class CheckpointCounter:
    """Counts checkpoint files (the module's rule) as a recording's events come, in either backend's clock.

    ``files``: (path, close time) of each counted file, in the order their closes were seen; ``cut_ns``:
    the close time of the ``wanted``-th one (None until then)."""

    path_filters: tuple[str, ...] = ()
    wanted: int | None = None
    files: list[tuple[str, int]] = field(default_factory=list)
    cut_ns: int | None = None
    _open: dict[int, list | None] = field(default_factory=dict)  # key -> [path, open end time, written]

    @staticmethod
    def key(tgid: int, fd: int) -> int:
        return (int(tgid) << 32) | (int(fd) & 0xFFFFFFFF)

    def accepts(self, path: str) -> bool:
        if not path.startswith("/") or path.startswith(_SPECIAL):
            return False
        return not self.path_filters or any(path.startswith(prefix) for prefix in self.path_filters)

    @property
    def done(self) -> bool:
        return self.cut_ns is not None

    def counted(self) -> set[str]:
        """The paths of the files counted up to ``wanted`` (all of them when it is None)."""
        return {path for path, _ in self.files[: self.wanted]}

    def kept_after_cut(self, name: str, pid: int, path: str | None) -> bool:
        """Whether an event past ``cut_ns`` stays in the trace: a rename of a counted file (its commit)."""
        return name in _RENAMES and path is not None and _absolute(pid, path) in self.counted()

    def observe(
        self,
        opens: list[tuple[int, int, str]],
        closes: list[tuple[int, int]],
        write_keys: np.ndarray,
        write_ends: np.ndarray,
    ) -> None:
        """One batch: ``opens`` (end time, key, absolute path) of opens for writing that returned a
        descriptor, ``closes`` (end time, key) of successful closes, and the keys and end times of the
        writes that wrote bytes (numpy, any length: matched to open files without a loop per write)."""
        candidates = set(self._open) | {key for _, key, _ in opens}
        closes = [close for close in closes if close[1] in candidates]
        if len(write_keys) and candidates:
            mask = np.isin(write_keys, np.fromiter(candidates, dtype=np.int64, count=len(candidates)))
            write_keys, write_ends = write_keys[mask], write_ends[mask]
        order = np.lexsort((write_ends, write_keys))
        write_keys, write_ends = write_keys[order], write_ends[order]

        def wrote(key: int, after: int, before: int | None) -> bool:
            lo, hi = np.searchsorted(write_keys, key, "left"), np.searchsorted(write_keys, key, "right")
            times = write_ends[lo:hi]
            first = np.searchsorted(times, after, "right")
            last = len(times) if before is None else np.searchsorted(times, before, "left")
            return bool(last > first)

        steps = sorted(
            [(end, 0, key, path) for end, key, path in opens] + [(end, 1, key, None) for end, key in closes],
            key=lambda step: (step[0], step[1]),
        )
        for end, _kind, key, path in steps:  # opens before closes at one time
            if path is not None:  # an open (a close carries no path)
                self._open[key] = [path, end, False] if self.accepts(path) else None
                continue
            entry = self._open.pop(key, None)
            if entry is None:
                continue
            if entry[2] or wrote(key, entry[1], end):
                self.files.append((entry[0], end))
                if self.wanted is not None and len(self.files) == self.wanted:
                    self.cut_ns = end
        for key, entry in self._open.items():
            if entry is not None and not entry[2]:
                entry[2] = wrote(key, entry[1], None)
        self._open = {key: entry for key, entry in self._open.items() if entry is not None}


def _cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def _absolute(pid: int, path: str) -> str:
    if path.startswith("/"):
        return os.path.normpath(path)
    cwd = _cwd(pid)
    return os.path.normpath(os.path.join(cwd, path)) if cwd else path


def _open_flags(name: str, args: dict) -> int:
    return sc.O_WRONLY if name == "creat" else int(args.get("flags") or 0)


def _writes_for(flags: int) -> bool:
    return (flags & sc.O_ACCMODE) in (sc.O_WRONLY, sc.O_RDWR)


class BccCheckpoints:
    """``CheckpointCounter`` fed from the bcc rings' raw records (numpy, as ``BccTracer.attach`` copies them):
    the opens from the ``events`` ring, closes and writes from the ``compact`` ring, vectorised.

    The rings are read one after the other, so a file's open and its close may come in different reads:
    what ``__call__`` gathers goes to the counter at ``flush``, and only up to a watermark, the time the
    previous flush ended less a millisecond (bpf_ktime_get_ns is CLOCK_MONOTONIC): every record that ended
    before it was committed before the current reads began, in every ring. Later ones wait for the next flush."""

    def __init__(self, counter: CheckpointCounter) -> None:
        from .bcc_backend import _NAMES

        self.counter = counter
        self._names = _NAMES
        self._open_nrs = np.array([_NAMES.index(n) for n in _OPENS if n in _NAMES])
        self._write_nrs = np.array([_NAMES.index(n) for n in _WRITES if n in _NAMES])
        self._close_nr = _NAMES.index("close")
        self._opens: list = []
        self._closes: list = []
        self._write_keys = np.empty(0, np.int64)
        self._write_ends = np.empty(0, np.int64)
        self._last_flush_ns = time.monotonic_ns()

    def __call__(self, ring: str, records: np.ndarray) -> None:
        if ring == "events":
            hits = records[np.isin(records["nr"], self._open_nrs) & (records["ret"] >= 0)]
            for record in hits:
                name = self._names[int(record["nr"])]
                regs = record["a"]
                spec = sc.SYSCALLS[name].args
                flags = (
                    sc.O_WRONLY
                    if name == "creat"
                    else int(record["extra"])
                    if name == "openat2"
                    else int(regs[spec.index("flags")]) & 0xFFFFFFFF
                )
                if not _writes_for(flags):
                    continue
                path = record["path"].tobytes().split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                pid = int(record["pid"])
                self._opens.append(
                    (
                        int(record["ts_ns"] + record["dur_ns"]),
                        CheckpointCounter.key(pid, int(record["ret"])),
                        _absolute(pid, path),
                    )
                )
            return
        if ring != "compact":
            return
        nrs, rets = records["nr"], records["ret"]
        fds = records["a"][:, 0] & 0xFFFFFFFF
        keys = ((records["pid"].astype(np.int64) << 32) | fds).astype(np.int64)
        ends = (records["ts_ns"] + records["dur_ns"]).astype(np.int64)
        closing = (nrs == self._close_nr) & (rets == 0)
        writing = np.isin(nrs, self._write_nrs) & (rets > 0)
        self._closes += list(zip(ends[closing].tolist(), keys[closing].tolist()))
        self._write_keys = np.concatenate([self._write_keys, keys[writing]])
        self._write_ends = np.concatenate([self._write_ends, ends[writing]])

    def flush(self) -> None:
        """Count what ended before the watermark (see the class); keep the rest."""
        mark = self._last_flush_ns - 1_000_000
        opens = [item for item in self._opens if item[0] <= mark]
        closes = [item for item in self._closes if item[0] <= mark]
        self._opens = [item for item in self._opens if item[0] > mark]
        self._closes = [item for item in self._closes if item[0] > mark]
        now = self._write_ends <= mark
        keys, ends = self._write_keys[now], self._write_ends[now]
        self._write_keys, self._write_ends = self._write_keys[~now], self._write_ends[~now]
        if opens or closes or len(keys):
            self.counter.observe(opens, closes, keys, ends)
        self._last_flush_ns = time.monotonic_ns()


def events_checkpoints(counter: CheckpointCounter, events, tgid_of) -> None:
    """Feed ``counter`` from decoded ``SyscallEvent`` objects (strace's log, parsed as it grows); ``tgid_of``
    maps a thread id to its process (strace names threads only)."""
    opens, closes, write_keys, write_ends = [], [], [], []
    for event in events:
        name = getattr(event, "name", None)
        if name is None or event.ret is None:
            continue
        end = event.ts_ns + event.dur_ns
        if name in _OPENS and event.ret >= 0 and _writes_for(_open_flags(name, event.args)):
            tgid = tgid_of(event.tid)
            opens.append((end, CheckpointCounter.key(tgid, event.ret), _absolute(tgid, str(event.args.get("path")))))
        elif name == "close" and event.ret == 0:
            closes.append((end, CheckpointCounter.key(tgid_of(event.tid), event.args.get("fd", -1))))
        elif name in _WRITES and event.ret > 0:
            write_keys.append(CheckpointCounter.key(tgid_of(event.tid), event.args.get("fd", -1)))
            write_ends.append(end)
    if opens or closes or write_keys:
        counter.observe(opens, closes, np.array(write_keys, np.int64), np.array(write_ends, np.int64))


def tgid_of(tid: int, cache: dict[int, int]) -> int:
    """The process (thread group) of thread ``tid`` (/proc/TID/status ``Tgid``), remembered in ``cache``."""
    if tid not in cache:
        tgid = tid
        try:
            for line in Path(f"/proc/{tid}/status").read_text().splitlines():
                if line.startswith("Tgid:"):
                    tgid = int(line.split()[1])
                    break
        except (OSError, ValueError):
            pass
        cache[tid] = tgid
    return cache[tid]


class Stopper:
    """When an attached recording ends: the plan's duration, its checkpoint count, the job's first process
    gone, or a signal to the recorder (SIGINT, SIGTERM, SIGHUP: the job is not sent it). ``reason`` says which."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, plan: AttachPlan, counter: CheckpointCounter) -> None:
        self.plan, self.counter = plan, counter
        self.reason: str | None = None
        self.signal: int | None = None
        self.started = time.monotonic()
        self._previous: dict = {}

    def __enter__(self) -> Stopper:
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.SIGNALS}
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum, frame) -> None:
        self.signal = signum

    def should_stop(self) -> bool:
        if self.reason is None:
            if self.counter.done:
                self.reason = "checkpoints"
            elif self.signal is not None:
                self.reason = signal.Signals(self.signal).name
            elif self.plan.duration_s is not None and time.monotonic() - self.started >= self.plan.duration_s:
                self.reason = "duration"
            elif not job_running(self.plan):
                self.reason = "job ended"
        return self.reason is not None


def strace_attach_command(pids: list[int], log_path) -> list[str]:
    """strace(1) attached to ``pids`` (-p each; -f: all their threads and later children), writing
    ``log_path``: ``strace_command``'s options less --seccomp-bpf, which only a command strace starts can
    install (seccomp(2) filters are set by the tracee itself)."""
    from .strace_backend import strace_command

    argv = strace_command([], log_path)
    argv = [arg for arg in argv[:-1] if arg != "--seccomp-bpf"]  # [-1] is the "--" before a command
    for pid in pids:
        argv += ["-p", str(pid)]
    return argv


def _traced_by(pid: int) -> int:
    """TracerPid of ``pid`` (proc(5) status), 0 when none or gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class _LogTail:
    """The complete lines a growing strace log has gained since the last call, parsed into events."""

    def __init__(self, path) -> None:
        self.path, self.offset, self.rest, self.pending = path, 0, b"", {}

    def events(self) -> list:
        from .strace_backend import _events_from_lines

        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.rest + data
        cut = data.rfind(b"\n") + 1
        self.rest = data[cut:]
        lines = data[:cut].decode("utf-8", "surrogateescape").splitlines()
        return list(_events_from_lines(iter(lines), self.pending))


def strace_attach(plan: AttachPlan, scratch, counter: CheckpointCounter, stopper: Stopper) -> dict:
    """Attach strace to the job, follow its log until ``stopper`` says stop, detach (SIGINT to strace).
    Returns {"logs": [paths], "released_s", "exited_s", "attached": [pids]}. Raises TracerError when strace
    cannot attach (ptrace refused: Yama's ptrace_scope, another tracer)."""
    import subprocess
    from pathlib import Path

    from .children import set_parent_death_signal

    procs, tails, logs, attached = [], [], [], set()
    tids: dict[int, int] = {}
    try:
        for attempt in range(5):  # a process forked before its parent was attached: another strace for it
            # not yet attached, and not followed by a strace already (a fork after its parent was attached)
            missing = [
                pid for pid in job_pids(plan) if pid not in attached and alive(pid) and not (procs and _traced_by(pid))
            ]
            if not missing:
                break
            log = Path(scratch) / f"strace-{attempt}.log"
            argv = strace_attach_command(missing, log)
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=set_parent_death_signal
            )
            procs.append(proc)
            logs.append(log)
            tails.append(_LogTail(log))
            while not all(_traced_by(tid) == proc.pid for pid in missing if alive(pid) for tid in threads(pid)):
                if proc.poll() is not None:
                    raise TracerError(
                        f"strace could not attach to {missing[0]}: "
                        f"{(proc.stderr.read() if proc.stderr else b'').decode(errors='replace').strip()[:300]}"
                    )
                time.sleep(0.01)
            attached.update(missing)
        released_s = time.monotonic()
        if plan.on_live is not None:
            plan.on_live()
        while not stopper.should_stop():
            for tail in tails:
                events_checkpoints(counter, tail.events(), lambda tid: tgid_of(tid, tids))
            if counter.done:
                continue
            if all(proc.poll() is not None for proc in procs):  # every tracee gone: strace has ended
                stopper.reason = stopper.reason or "job ended"
                break
            time.sleep(0.05)
        exited_s = time.monotonic()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # strace detaches from every tracee and exits
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stderr.close()
    return {"logs": logs, "released_s": released_s, "exited_s": exited_s, "attached": sorted(attached)}


def _end_ns(event) -> int:
    return event.ts_ns + (getattr(event, "dur_ns", 0) or 0)


def run_attached(choice, plan: AttachPlan, builder_args: dict, spool):
    """``record``'s body for ``--pid``: (builder, extra metadata, backend choice), as ``record._run_traced``
    returns them, from the chosen backend's ``attach`` (``tracer.backends``). Raises TracerError for a
    backend that cannot attach to a running process."""
    from ckpt_trace import config

    from . import backends
    from .state import EffectOrderFeeder, TraceBuilder

    filters = tuple(builder_args["path_filters"])
    counter = CheckpointCounter(filters, plan.until_checkpoints)
    root_pid = job_root(plan)
    root = running_process(root_pid)
    args = {
        **builder_args,
        "cwd": root.cwd if root else None,
        "inherited_fds": {},
        "root_rank": root.rank if root else -1,
    }

    def spill(builder: TraceBuilder) -> None:
        if builder.num_rows >= config.RECORD_RUN_ROWS:
            spool.add(builder.take_rows())

    def make_feeder(root_pid: int | None, start_ns: int) -> EffectOrderFeeder:
        builder = TraceBuilder(start_ns=start_ns, root_pid=root_pid, **args)
        seed_builder(builder, job_pids(plan))  # as they are now that the probes are live
        return EffectOrderFeeder(
            builder, slack_ns=config.RECORD_REORDER_SLACK_NS, on_rows=spill, release_every=config.RECORD_RELEASE_EVERY
        )

    def attached_summary(stopper: Stopper, processes: list[int]) -> dict:
        return {
            "pid": root_pid,
            **({"cgroup": plan.cgroup} if plan.cgroup is not None else {}),
            "processes": processes,
            "stopped_by": stopper.reason,
            "duration_s": plan.duration_s,
            "until_checkpoints": plan.until_checkpoints,
            "checkpoint_files": [path for path, _ in counter.files[: plan.until_checkpoints]],
            "window_end_ns": counter.cut_ns,
        }

    backend = backends.get(choice.name)
    if backend.attach is None:
        raise TracerError(f"the {backend.name} backend cannot attach to a running process")
    return backend.attach(choice, Attaching(plan, filters, counter, make_feeder, attached_summary, spool))


@dataclass(frozen=True)
class Attaching:
    """What a backend's ``attach`` needs (``run_attached`` makes it): the plan, the path filters, the
    checkpoint counter, the feeder factory, the ``attached`` summary and the row spool."""

    plan: AttachPlan
    filters: tuple[str, ...]
    counter: CheckpointCounter
    make_feeder: Callable
    attached_summary: Callable
    spool: RowSpool


def attach_bcc(choice, ctx: Attaching):
    """``record --pid``/``--cgroup`` under bcc: the BPF program attached to the job until the plan stops it;
    where the program does not load and ``auto`` may fall back, the next backend's attach."""
    from . import backends
    from .backends.bcc import load

    plan, counter, spool = ctx.plan, ctx.counter, ctx.spool
    tracer, choice = load(choice, list(ctx.filters))
    if tracer is None:
        fallback = backends.get(choice.name).attach
        if fallback is None:
            raise TracerError(f"backend {choice.name} cannot attach to a running job")
        return fallback(choice, ctx)
    from .bcc_backend import _NAMES

    rename_nrs = np.array([_NAMES.index(name) for name in _RENAMES if name in _NAMES])

    def keep(records: np.ndarray) -> np.ndarray:
        if counter.cut_ns is None:
            return np.ones(len(records), bool)
        mask = (records["ts_ns"] + records["dur_ns"]) <= np.uint64(counter.cut_ns)
        if "path" in (records.dtype.names or ()):
            for i in np.flatnonzero(~mask & np.isin(records["nr"], rename_nrs)).tolist():
                path = records["path"][i].tobytes().split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                mask[i] = counter.kept_after_cut(_NAMES[int(records["nr"][i])], int(records["pid"][i]), path)
        return mask

    seen: list[int] = []
    cgroup = resolve_cgroup(plan.cgroup) if plan.cgroup is not None else None

    def pids() -> list[int]:
        found = job_pids(plan)
        seen.extend(pid for pid in found if pid not in seen)
        return [] if cgroup is not None else found  # a cgroup's processes are told by the kernel, not by pid

    with Stopper(plan, counter) as stopper:
        checkpoints = BccCheckpoints(counter)

        def finished(rec) -> bool:
            checkpoints.flush()
            return stopper.should_stop()

        rec = tracer.attach(
            pids,
            ctx.make_feeder,
            spool.output.parent,
            finished,
            on_records=checkpoints,
            keep=keep,
            cgroup=(cgroup.id, cgroup.level) if cgroup is not None else None,
            on_live=plan.on_live,
        )
    if cgroup is not None:
        pids()  # those that joined while it was traced, and are still there
    builder, extra = rec.finish(spool)
    extra.update(exit_code=0, exit_signal=None, attached=ctx.attached_summary(stopper, seen))  # the job runs on
    return builder, extra, choice


def attach_strace(choice, ctx: Attaching):
    """``record --pid``/``--cgroup`` under strace: ``strace -p`` on every process of the job until the plan stops it,
    the logs merged by time and cut at the checkpoint window."""
    import heapq
    import itertools
    import tempfile

    from ckpt_trace import config

    from . import leftovers, strace_backend
    from .backends.strace import UNSEEN

    plan, counter, spool = ctx.plan, ctx.counter, ctx.spool
    tids: dict[int, int] = {}
    with (
        tempfile.TemporaryDirectory(prefix=leftovers.scratch_prefix("strace")) as scratch,
        Stopper(plan, counter) as stopper,
    ):
        start_ns = time.time_ns()
        feeder = ctx.make_feeder(job_root(plan), start_ns)
        got = strace_attach(plan, scratch, counter, stopper)
        command_elapsed_ns = time.time_ns() - start_ns
        logs = [strace_backend.iter_log(log) for log in got["logs"] if log.exists()]
        events = heapq.merge(*logs, key=lambda event: event.ts_ns)
        if counter.cut_ns is not None:
            events = (
                event
                for event in events
                if _end_ns(event) <= counter.cut_ns
                or counter.kept_after_cut(
                    getattr(event, "name", ""),
                    tgid_of(event.tid, tids),
                    (getattr(event, "args", None) or {}).get("path"),
                )
            )
        while chunk := list(itertools.islice(events, max(1, config.RECORD_DECODE_EVENTS))):
            feeder.add(chunk)
    feeder.finish()
    spool.add(feeder.builder.take_rows())
    unseen = dict(UNSEEN)
    return (
        feeder.builder,
        {
            "lost_events": 0,
            "truncated_paths": 0,
            "exit_code": 0,
            "exit_signal": None,
            "command_elapsed_ns": command_elapsed_ns,
            "unseen": unseen,
            "late_events": feeder.late_events,
            "released_s": got["released_s"],
            "exited_s": got["exited_s"],
            "attached": ctx.attached_summary(stopper, got["attached"]),
        },
        choice,
    )
