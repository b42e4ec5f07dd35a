"""bcc backend: eBPF programs on the ``syscalls:sys_{enter,exit}_*`` tracepoints.

Needs root, the ``bcc`` Python module (Debian: python3-bpfcc), kernel
headers for bcc's compiler, tracefs at /sys/kernel/tracing and BPF ring
buffers (Linux >= 5.8). ``probe()`` checks each up front and says which is
missing, so ``auto`` can name the fallback it takes.

One program on ``raw_syscalls:sys_enter`` dispatches on the syscall number
(``__NR_*`` from the kernel headers) into code generated per traced call;
``raw_syscalls:sys_exit`` completes the event. Two tracepoints rather than a
pair per syscall: each detach waits for an RCU grace period, which for ninety
tracepoints cost seconds at exit. Calls the builder would not record are
dropped in the kernel (see bcc_program.c). Descendants are followed through the
``sched:sched_process_fork`` tracepoint, which fires in the parent before
the child first runs. File positions are reconstructed in user space by
``TraceBuilder`` (kprobes and fentry are unavailable on the target kernels).

Reference: bcc reference guide (TRACEPOINT_PROBE, BPF_RINGBUF_OUTPUT,
ring_buffer_poll); Documentation/trace/events.rst.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ckpt_trace import config
from ckpt_trace.errors import TracerError

from . import syscalls as sc
from .state import SyscallEvent, rank_from_environ

TRACEFS = Path("/sys/kernel/tracing")
_EVENTS = TRACEFS / "events" / "raw_syscalls"
_NAMES = list(sc.SYSCALLS)
_POINTER_ARGS = {"path", "path2", "iov", "how", "uargs", "argv", "envp", "buf", "params", "sig", "stack", "ptid", "ctid", "tls"}


def _mount_tracefs() -> None:
    if (_EVENTS).is_dir():
        return
    if os.geteuid() == 0 and TRACEFS.is_dir():
        os.system(f"mount -t tracefs tracefs {TRACEFS} >/dev/null 2>&1")


def probe() -> str | None:
    """Return None when the bcc backend can be tried here, else why it cannot."""
    if os.geteuid() != 0:
        return "not root (eBPF needs CAP_BPF and CAP_PERFMON)"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "the bcc Python module is not importable (Debian: apt-get install python3-bpfcc)"
    _mount_tracefs()
    if not _EVENTS.is_dir():
        return f"tracefs raw_syscalls events not found under {TRACEFS} (mount -t tracefs tracefs {TRACEFS})"
    build = Path("/lib/modules") / os.uname().release / "build"
    if not build.exists():
        return f"no kernel headers at {build} (see scripts/setup-system.sh)"
    return None


_OPENS = frozenset({"open", "openat", "openat2", "creat"})
_DUPS = frozenset({"dup", "dup2", "dup3"})
_PATH_ONLY = frozenset({"unlink", "unlinkat", "mkdir", "mkdirat"})
_RENAMES = frozenset({"rename", "renameat", "renameat2"})
# Calls with an fd argument that must reach the builder even on an ignored descriptor
# (or that _early_checks handles itself).
_KEEP_ON_MARKED_FD = frozenset({"fchdir", "close_range", "io_uring_enter", "fcntl", "close"}) | _DUPS
_CREATES_FD = _OPENS | _DUPS | {"io_uring_setup"}
_SPECIAL_PREFIXES = ("/proc/", "/sys/", "/dev/")


def _literal_test(prefix: str) -> str:
    """C expression: path starts with ``prefix`` (compared byte by byte, no loops)."""
    data = prefix.encode()
    return " && ".join(f"path[{i}] == {byte}" for i, byte in enumerate(data)) or "1"


def excluded_body(path_filters: list[str]) -> str:
    """Body of the BPF ``excluded(path)`` test, as ``TraceBuilder._keep`` decides: with path filters, a path
    is kept when one matches (pseudo files included); without, pseudo files are excluded.

    Filters longer than the BPF path copy cannot be judged in the kernel; then
    nothing is excluded there and user space decides alone.
    """
    if path_filters:
        if not all(len(p.encode()) < config.BPF_PATH_BYTES - 1 for p in path_filters):
            return "    return 0;"
        lines = [f"    if ({_literal_test(p)}) return 0;" for p in path_filters]
        return "\n".join(lines + ["    return 1;"])
    return "\n".join([f"    if ({_literal_test(p)}) return 1;" for p in _SPECIAL_PREFIXES] + ["    return 0;"])


_SIGNED32 = frozenset({"fd", "dirfd", "dirfd2", "newfd"})
_UNSIGNED32 = frozenset({"flags", "rwflags", "mode", "cmd", "whence", "iov_count"})


def _arg_expressions(name: str) -> dict[str, str]:
    """C expressions of each argument of ``name`` from the raw register array ``a``."""
    exprs = {}
    for i, arg in enumerate(sc.SYSCALLS[name].args):
        exprs[arg] = f"(s32)a[{i}]" if arg in _SIGNED32 else f"(u32)a[{i}]" if arg == "cmd" else f"a[{i}]"
    return exprs


def _early_checks(name: str, arg: dict[str, str]) -> list[str]:
    """C statements run before an event is started: drop calls the builder would not record."""
    lines = []
    if name == "ioctl":
        lines.append(f"if ({arg['cmd']} != {sc.FIOCLEX} && {arg['cmd']} != {sc.FIONCLEX}) return 0;")
    if name == "fcntl":
        wanted = (sc.F_DUPFD, sc.F_DUPFD_CLOEXEC, sc.F_SETFD, sc.F_SETFL)
        lines.append("if (" + " && ".join(f"{arg['cmd']} != {c}" for c in wanted) + ") return 0;")
        lines.append(f"if (({arg['cmd']} == {sc.F_SETFD} || {arg['cmd']} == {sc.F_SETFL}) && fd_marked(tgid, {arg['fd']})) return 0;")
    if name == "close":
        lines.append(f"if (fd_marked(tgid, {arg['fd']})) {{ set_mark(tgid, {arg['fd']}, 0); return 0; }}")
    elif "fd" in arg and name not in _KEEP_ON_MARKED_FD:
        lines.append(f"if (fd_marked(tgid, {arg['fd']})) return 0;")
    return lines


_PATH_CHECK = {**dict.fromkeys(_OPENS, 1), **dict.fromkeys(_PATH_ONLY, 2), **dict.fromkeys(_RENAMES, 3)}


def _late_checks(name: str, arg: dict[str, str]) -> list[str]:
    """C statements run once arguments are copied: mark dups of ignored descriptors, choose the path check.

    ``check`` selects the one shared path test after the switch (bcc_program.c):
    1 marks an open of an excluded path, 2 drops an unlink/mkdir of one, 3 drops
    a rename between two.
    """
    lines = []
    if name in _DUPS:
        lines.append(f"e->ignore = fd_marked(tgid, {arg['fd']});")
    if name == "fcntl":
        cmd = arg["cmd"]
        lines.append(f"e->ignore = ({cmd} == {sc.F_DUPFD} || {cmd} == {sc.F_DUPFD_CLOEXEC}) && fd_marked(tgid, {arg['fd']});")
    if name in _PATH_CHECK:
        lines.append(f"check = {_PATH_CHECK[name]};")
    return lines


def _enter_case(nr: int, name: str) -> str:
    """The ``case __NR_name:`` block of the raw sys_enter program for one syscall."""
    call = sc.SYSCALLS[name]
    arg = _arg_expressions(name)
    body = _early_checks(name, arg) + [f"e = enter_begin({nr});", "if (!e) return 0;"]
    for i, name_i in enumerate(call.args):
        body.append(f"e->a[{i}] = (s64)a[{i}];")
        if name_i in ("path", "path2"):
            dest = "e->path" if name_i == "path" else "e->path2"
            body.append(f"read_path({dest}, (const char *)a[{i}], &e->truncated);")
        elif name_i in ("how", "uargs"):
            body.append(f"bpf_probe_read_user(&e->extra, sizeof(e->extra), (const void *)a[{i}]);")
    if "iov" in call.args:
        body.append(f"iov = (const void *){arg['iov']};")
        body.append(f"iov_count = {arg['iov_count']};")
    body += _late_checks(name, arg)
    creates = 2 if name == "fcntl" else int(name in _CREATES_FD)
    body += [f"e->creates = {creates};", "break;"]
    inner = "\n".join(f"        {line}" for line in body)
    return f"#ifdef __NR_{name}\n    case __NR_{name}: {{\n{inner}\n    }}\n#endif"


def program_text(path_filters: list[str] | None = None) -> str:
    """The full BPF C program for ``path_filters``."""
    base = resources.files("ckpt_trace.tracer").joinpath("bcc_program.c").read_text()
    cases = "\n".join(_enter_case(nr, name) for nr, name in enumerate(_NAMES))
    return (base.replace("__PATH_BYTES__", str(config.BPF_PATH_BYTES))
                .replace("__MAX_IOVECS__", str(config.BPF_MAX_IOVECS))
                .replace("__RINGBUF_PAGES__", str(config.BPF_RINGBUF_PAGES))
                .replace("__INFLIGHT__", str(config.BPF_INFLIGHT_ENTRIES))
                .replace("__IGNORED_ENTRIES__", str(config.BPF_IGNORED_FDS))
                .replace("__EXCLUDED_BODY__", excluded_body(list(path_filters or [])))
                .replace("__ENTER_CASES__", cases))


def _cstr(raw: bytes) -> str:
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _environ_rank(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return rank_from_environ(item.decode("utf-8", "replace") for item in raw.split(b"\0") if item)


def _decode(e) -> SyscallEvent:
    name = _NAMES[e.nr]
    call = sc.SYSCALLS[name]
    args: dict = {}
    for i, arg in enumerate(call.args):
        if arg == "path":
            args["path"] = _cstr(e.path)
        elif arg == "path2":
            args["path2"] = _cstr(e.path2)
        elif arg not in _POINTER_ARGS:
            args[arg] = int(e.a[i])
    for key in _SIGNED32 & args.keys():
        args[key] = ctypes.c_int32(args[key]).value
    for key in _UNSIGNED32 & args.keys():
        args[key] &= 0xFFFFFFFF
    if name == "openat2":
        args["flags"] = int(e.extra)
    elif name == "clone3":
        args["clone_flags"] = int(e.extra)
    event = SyscallEvent(
        ts_ns=int(e.ts_ns), dur_ns=int(e.dur_ns), tid=int(e.tid), pid=int(e.pid), name=name, args=args,
        ret=int(e.ret), comm=_cstr(e.comm), size=int(e.size) if e.size >= 0 else None,
    )
    if name in ("execve", "execveat") and event.ret == 0:
        event.rank = _environ_rank(event.pid)
    return event


@dataclass
class BccRecording:
    """What a bcc recording produced: events, counts, and the root process."""

    events: list[SyscallEvent] = field(default_factory=list)
    lost_events: int = 0
    truncated_paths: int = 0
    root_pid: int = -1
    exit_code: int = 0
    exit_signal: int | None = None
    start_ns: int = 0
    command_elapsed_ns: int = 0


class BccTracer:
    """Loads the BPF program, runs a command under it, collects events.

    Call order: ``load()`` (raises TracerError when the kernel refuses the
    program), then ``run(cmd, env)`` once. Called by ``tracer.record``.
    """

    def __init__(self, path_filters: list[str] | None = None) -> None:
        self._bpf = None
        self._path_filters = list(path_filters or [])

    def load(self) -> None:
        from bcc import BPF

        text = program_text(self._path_filters)
        devnull = os.open(os.devnull, os.O_WRONLY)
        saved = os.dup(2)
        try:
            os.dup2(devnull, 2)
            self._bpf = BPF(text=text)
        except Exception as err:  # bcc raises bare Exception on compile/load failure
            raise TracerError(f"the kernel refused the BPF program ({str(err).splitlines()[0]})") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)

    def _spawn(self, cmd: list[str], env: dict[str, str]) -> tuple[int, int]:
        gate_r, gate_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(gate_w)
            os.read(gate_r, 1)
            try:
                os.execvpe(cmd[0], cmd, env)
            except OSError as err:
                os.write(2, f"ckpt-trace: cannot run {cmd[0]}: {err.strerror}\n".encode())
            os._exit(127)
        os.close(gate_r)
        return pid, gate_w

    def run(self, cmd: list[str], env: dict[str, str]) -> BccRecording:
        """Run ``cmd`` with ``env`` traced, with its descendants; return when it exits and events drained."""
        bpf = self._bpf
        rec = BccRecording()

        def on_event(_ctx, data, _size):
            e = bpf["events"].event(data)
            rec.truncated_paths += int(e.truncated)
            rec.events.append(_decode(e))

        bpf["events"].open_ring_buffer(on_event)
        pid, gate = self._spawn(cmd, env)
        rec.root_pid = pid
        bpf["traced"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
        rec.start_ns = time.monotonic_ns()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            os.write(gate, b"x")
            os.close(gate)
            status = None
            while status is None:
                bpf.ring_buffer_poll(config.BPF_POLL_MS)
                done, raw = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = raw
            rec.command_elapsed_ns = time.monotonic_ns() - rec.start_ns
            self._drain(bpf)
        finally:
            signal.signal(signal.SIGINT, previous)
        rec.exit_code = os.waitstatus_to_exitcode(status)
        if rec.exit_code < 0:
            rec.exit_signal = -rec.exit_code
            rec.exit_code = 128 + rec.exit_signal
        rec.lost_events = int(bpf["lost"][ctypes.c_int(0)].value)
        return rec

    @staticmethod
    def _drain(bpf) -> None:
        """Consume what the ring buffer still holds: events are written at syscall exit, so all are there."""
        bpf.ring_buffer_consume()
