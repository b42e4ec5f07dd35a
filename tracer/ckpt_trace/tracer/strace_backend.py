"""strace backend: ptrace-based tracing for machines without eBPF or root.

strace(1) runs the command with ``-f`` (every thread and child),
``--seccomp-bpf`` (only the traced calls stop the tracee), ``-X raw``
(numeric constants), ``-xx`` (every string byte hex-escaped, so parsing is
unambiguous), nanosecond timestamps and durations, and ``-e raw=`` for the
plain read/write family so data buffers are never printed. Its log is then
parsed into ``SyscallEvent`` objects for ``TraceBuilder``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ckpt_trace import config
from ckpt_trace.errors import TracerError

from . import syscalls as sc
from .children import set_parent_death_signal, sigint_handler
from .state import AUX_AIO_EVENT, AUX_AIO_SUBMIT, AuxEvent, SyscallEvent, rank_from_environ

# strace folds the 64-bit position of the p*v calls into one argument.
_STRACE_ARGS = {
    "preadv": ("fd", "iov", "iov_count", "offset"),
    "pwritev": ("fd", "iov", "iov_count", "offset"),
    "preadv2": ("fd", "iov", "iov_count", "offset", "rwflags"),
    "pwritev2": ("fd", "iov", "iov_count", "offset", "rwflags"),
}
_RAW_CALLS = ("read", "write", "pread64", "pwrite64")
_AIO_CALLS = frozenset({"io_submit", "io_getevents", "io_pgetevents"})

_LINE = re.compile(r"^(\d+)\s+(\d+)\.(\d+)\s+(.*)$")
_CALL = re.compile(r"^([a-z_0-9]+)\((.*)$")
_RESUMED = re.compile(r"^<\.\.\. ([a-z_0-9]+) resumed>(.*)$")
_RESULT = re.compile(r"^(?P<args>.*)\)\s+=\s+(?P<ret>-?\w+|\?)(?P<rest>.*?)(?:\s+<(?P<dur>\d+\.\d+)>)?\s*$")
_KEY = re.compile(r"([a-z_][a-z_0-9]*)=")
_UNFINISHED = " <unfinished ...>"
_ERRNO = {name: getattr(errno, name) for name in dir(errno) if name.startswith("E")}  # aliases too (EOPNOTSUPP)


def available() -> str | None:
    """Return the strace executable's path, or None when strace is not installed."""
    return shutil.which(config.STRACE_BIN)


def strace_command(cmd: list[str], log_path: Path) -> list[str]:
    """The strace(1) command line that traces ``cmd`` into ``log_path``."""
    exe = available()
    if exe is None:
        raise TracerError("strace is not installed (apt-get install strace)")
    names = ",".join(f"?{name}" for name in sc.traced_names())
    return [
        exe,
        "-f",
        "-qq",
        "--seccomp-bpf",
        "-X",
        "raw",
        "-xx",
        "-s",
        str(config.STRACE_STRING_BYTES),
        "--timestamps=unix,ns",
        "--syscall-times=ns",
        "-e",
        "abbrev=!execve,execveat",
        "-e",
        "raw=" + ",".join(_RAW_CALLS),
        "-e",
        "trace=" + names,
        "-o",
        str(log_path),
        "--",
        *cmd,
    ]


def pdeathsig_wrapper() -> list[str]:
    """The words that start a command with a parent-death signal of its own (util-linux setpriv(1)
    ``--pdeathsig KILL``, prctl(2) PR_SET_PDEATHSIG set in the command's process before it execs); [] when
    setpriv is not installed. strace forks the command, and a fork clears the setting strace got from us, so
    without this a SIGKILLed recorder takes strace with it but leaves the command running, untraced.
    ``iter_log(skip_wrapper=True)`` drops what the wrapper did before its exec of the command."""
    exe = shutil.which("setpriv")
    return [exe, "--pdeathsig", "KILL", "--"] if exe else []


def run(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` under strace, writing the log to ``log_path``; return the command's exit code.
    The command is started through ``pdeathsig_wrapper()``: read the log with ``iter_log(skip_wrapper=True)``."""
    argv = strace_command([*pdeathsig_wrapper(), *cmd], log_path)
    try:
        proc = subprocess.Popen(argv, env=env, preexec_fn=set_parent_death_signal)  # strace dies with us
    except OSError as err:
        raise TracerError(f"cannot start strace: {err.strerror}") from None
    # Ctrl-C reaches strace and the command through the terminal; keep recording what they did.
    previous = signal.signal(signal.SIGINT, sigint_handler())
    try:
        return proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def first_event_monotonic_s(log_path: Path) -> float | None:
    """``time.monotonic()`` at the first event of a strace log (its first line's CLOCK_REALTIME stamp, moved
    to the monotonic clock through their present offset): when strace's probes were live. None: no event."""
    import time

    try:
        with open(log_path, encoding="utf-8", errors="surrogateescape") as log:
            for line in log:
                match = _LINE.match(line)
                if match:
                    wall_s = int(match.group(2)) + int((match.group(3) + "000000000")[:9]) / 1e9
                    return time.monotonic() - (time.time() - wall_s)
    except OSError:
        return None
    return None


# -- argument parsing -------------------------------------------------------
class _ArgParser:
    """Recursive-descent parser of strace's argument text (strings, numbers, arrays, structs)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def parse_list(self, closer: str | None) -> tuple[list[Any], dict[str, Any]]:
        values: list[Any] = []
        named: dict[str, Any] = {}
        while True:
            self._skip_space()
            if self.i >= len(self.text) or (closer and self.text[self.i] == closer):
                self.i += 1
                return values, named
            start = self.i
            key = self._key()
            value = self._value()
            self._skip_space()
            if self.text.startswith("=>", self.i):  # "{in} => {out}": keep what was passed in
                self.i += 2
                self._value()
                self._skip_space()
            values.append(value)
            if key is not None:
                named[key] = value
            if self.i < len(self.text) and self.text[self.i] == "," or self.i == start:
                self.i += 1

    def _skip_space(self) -> None:
        text = self.text
        while self.i < len(text):
            if text[self.i] == " ":
                self.i += 1
            elif text.startswith("/*", self.i):
                end = text.find("*/", self.i)
                self.i = len(text) if end < 0 else end + 2
            else:
                return

    def _key(self) -> str | None:
        match = _KEY.match(self.text, self.i)
        if match:
            self.i = match.end()
            return match.group(1)
        return None

    def _value(self) -> Any:
        self._skip_space()
        char = self.text[self.i] if self.i < len(self.text) else ""
        if char == '"':
            return self._string()
        if char == "[":
            self.i += 1
            values, _ = self.parse_list("]")
            return values
        if char == "{":
            self.i += 1
            values, named = self.parse_list("}")
            return named if named else values
        return self._scalar()

    def _string(self) -> str:
        text = self.text
        self.i += 1
        out = bytearray()
        while self.i < len(text) and text[self.i] != '"':
            if text[self.i] == "\\" and text.startswith("x", self.i + 1):
                out.append(int(text[self.i + 2 : self.i + 4], 16))
                self.i += 4
            elif text[self.i] == "\\":
                out.extend(_C_ESCAPES.get(text[self.i + 1], text[self.i + 1]).encode())
                self.i += 2
            else:
                out.extend(text[self.i].encode())
                self.i += 1
        self.i += 1
        if text.startswith("...", self.i):
            self.i += 3
        return out.decode("utf-8", "surrogateescape")

    def _scalar(self) -> Any:
        start = self.i
        depth = 0
        while self.i < len(self.text):
            char = self.text[self.i]
            if char == "(":
                depth += 1
            elif char == ")":
                if depth == 0:
                    break
                depth -= 1
            elif char in ",]}" and depth == 0:
                break
            self.i += 1
        return _number(re.sub(r"/\*.*?\*/", "", self.text[start : self.i]).strip())


_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "v": "\v", "f": "\f", "0": "\0", "\\": "\\", '"': '"'}
_SIGNALS = {"SIGCHLD": 17}


def _number(token: str) -> Any:
    if token in ("NULL", ""):
        return 0 if token == "NULL" else None
    if token == "...":
        return None
    total = 0
    for part in token.split("|"):
        part = part.strip()
        try:
            if re.fullmatch(r"0[0-7]+", part):
                total |= int(part, 8)
            else:
                total |= int(part, 0)
        except ValueError:
            if part in _SIGNALS:
                total |= _SIGNALS[part]
            else:
                return token
    return total


def parse_args(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Parse strace's argument text into positional values and ``key=value`` pairs."""
    return _ArgParser(text).parse_list(None)


# -- log parsing ------------------------------------------------------------
def _ret_value(ret: str, rest: str) -> int | None:
    if ret == "?":
        return None
    value = int(ret, 0)
    if value == -1:
        match = re.match(r"\s+(E[A-Z0-9]+)", rest)
        if match and match.group(1) in _ERRNO:
            return -_ERRNO[match.group(1)]
    return value


def _duration_ns(text: str | None) -> int:
    if not text:
        return 0
    whole, _, frac = text.partition(".")
    return int(whole) * 1_000_000_000 + int((frac + "000000000")[:9])


def _aux_events(name: str, values: list[Any], tid: int, ts_ns: int, dur_ns: int, ret: int) -> list[AuxEvent]:
    """The libaio requests strace decodes: each iocb io_submit accepted, each io_event io_getevents returned
    (strace prints iocbs without their addresses: events are matched by aio_data, in submission order)."""
    if ret <= 0 or len(values) < 3:
        return []
    ctx = _as_int(values[0])
    if name == "io_submit":
        found = []
        for iocb in (values[2] if isinstance(values[2], list) else [])[:ret]:
            if not isinstance(iocb, dict):
                continue
            opcode = _as_int(iocb.get("aio_lio_opcode"))
            buffer = iocb.get("aio_buf")
            vectored = isinstance(buffer, list)
            length = (
                sum(_as_int(item.get("iov_len")) for item in buffer if isinstance(item, dict))
                if vectored
                else _as_int(iocb.get("aio_nbytes"))
            )
            found.append(
                AuxEvent(
                    AUX_AIO_SUBMIT,
                    ts_ns,
                    tid=tid,
                    ctx=ctx,
                    user_data=_as_int(iocb.get("aio_data")),
                    opcode=opcode,
                    fd=_as_int(iocb.get("aio_fildes")),
                    offset=_as_int(iocb.get("aio_offset")),
                    length=length,
                    addr=0 if vectored or isinstance(buffer, str) else _as_int(buffer),
                )
            )
        return found
    events = values[3] if len(values) > 3 and isinstance(values[3], list) else []
    return [
        AuxEvent(
            AUX_AIO_EVENT,
            ts_ns + dur_ns,
            tid=tid,
            ctx=ctx,
            user_data=_as_int(event.get("data")),
            obj=_as_int(event.get("obj")),
            res=_as_int(event.get("res")),
        )
        for event in events[:ret]
        if isinstance(event, dict)
    ]


def _as_int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _decode(name: str, values: list[Any], named: dict[str, Any]) -> tuple[dict[str, Any], int | None, int | None]:
    """Map strace's printed arguments to the table's names; return (args, iov size, rank)."""
    arg_names = _STRACE_ARGS.get(name, sc.SYSCALLS[name].args)
    args: dict[str, Any] = {}
    size = rank = None
    if name == "clone":
        args["clone_flags"] = named.get("flags", 0)
    elif name == "clone3":
        args["clone_flags"] = values[0].get("flags", 0) if values and isinstance(values[0], dict) else 0
    else:
        args = {key: value for key, value in zip(arg_names, values)}
    if name == "openat2" and isinstance(args.get("how"), dict):
        args["flags"] = args["how"].get("flags", 0)
    if "iov" in args:
        iov = args.pop("iov")
        lengths = [item.get("iov_len") for item in iov if isinstance(item, dict)] if isinstance(iov, list) else []
        counts = [n for n in lengths if isinstance(n, int)]
        if isinstance(iov, list) and len(lengths) == int(args.get("iov_count") or 0) and len(counts) == len(lengths):
            size = sum(counts)
    if name in ("execve", "execveat") and isinstance(args.get("envp"), list):
        rank = rank_from_environ(str(item) for item in args["envp"])
    if name == "io_setup" and isinstance(args.get("ctxp"), list) and args["ctxp"]:
        args["ctx_id"] = _as_int(args["ctxp"][0])
    if name == "io_uring_register":
        argument = args.get("arg")
        if isinstance(argument, list):
            args["fds"] = [fd for fd in argument if isinstance(fd, int)]
        elif isinstance(argument, dict):
            args["files_offset"] = _as_int(argument.get("offset"))
            fds = argument.get("fds", argument.get("data"))
            args["fds"] = [fd for fd in fds if isinstance(fd, int)] if isinstance(fds, list) else []
    if name in sc.COPY_CALLS:  # "[0] => [1048576]" parses as [0], what was passed in; NULL as 0
        for pointer, key in (("offset_ptr", "in_offset"), ("off_in_ptr", "in_offset"), ("off_out_ptr", "out_offset")):
            if pointer in args:
                value = args.pop(pointer)
                args[key] = _as_int(value[0]) if isinstance(value, list) and value else None
    if name == "ioctl" and isinstance(args.get("arg"), dict):  # FICLONERANGE's struct file_clone_range
        args.update(
            {key: _as_int(args["arg"].get(key)) for key in ("src_fd", "src_offset", "src_length", "dest_offset")}
        )
    for key in ("argv", "envp", "buf", "how", "params", "sig", "ctxp", "arg", "iocbpp", "events", "timeout", "usig"):
        if key == "arg" and name == "ioctl" and isinstance(args.get(key), int):
            continue  # FICLONE's source descriptor, FIOCLEX's nothing
        args.pop(key, None)
    return args, size, rank


def _events_from_lines(lines: Iterator[str], pending: dict | None = None) -> Iterator[SyscallEvent | AuxEvent]:
    """Events of strace log lines; ``pending`` (calls unfinished at the last line) may be kept by the caller
    to parse a growing log batch by batch (``tracer.attach``)."""
    pending = {} if pending is None else pending
    for line in lines:
        match = _LINE.match(line.rstrip("\n"))
        if not match:
            continue
        tid = int(match.group(1))
        ts_ns = int(match.group(2)) * 1_000_000_000 + int((match.group(3) + "000000000")[:9])
        body = match.group(4)
        if body.startswith(("---", "+++")):
            continue
        resumed = _RESUMED.match(body)
        if resumed:
            name = resumed.group(1)
            start = pending.pop((tid, name), None)
            if start is None:
                continue
            ts_ns, head = start
            body = f"{name}({head}{resumed.group(2)}"
        call = _CALL.match(body)
        if not call or call.group(1) not in sc.SYSCALLS:
            continue
        name = call.group(1)
        if body.endswith(_UNFINISHED):
            pending[(tid, name)] = (ts_ns, call.group(2)[: -len(_UNFINISHED)])
            continue
        result = _RESULT.match(call.group(2))
        if not result:
            continue
        ret = _ret_value(result.group("ret"), result.group("rest"))
        if ret is None:
            continue
        values, named = parse_args(result.group("args"))
        args, size, rank = _decode(name, values, named)
        dur_ns = _duration_ns(result.group("dur"))
        if name in _AIO_CALLS:
            yield from _aux_events(name, values, tid, ts_ns, dur_ns, ret)
        yield SyscallEvent(
            ts_ns=ts_ns,
            dur_ns=dur_ns,
            tid=tid,
            name=name,
            args=args,
            ret=ret,
            size=size,
            rank=rank,
        )


def parse_log(log_path: Path) -> list[SyscallEvent | AuxEvent]:
    """Parse a strace log written by ``run`` into events (in log order), libaio requests included.

    Lines strace could not finish (the tracee was killed mid-call) are skipped.
    """
    return list(iter_log(log_path))


def iter_log(log_path: Path, skip_wrapper: bool = False) -> Iterator[SyscallEvent | AuxEvent]:
    """``parse_log`` one event at a time (a long recording's events are never all in memory).
    ``skip_wrapper``: the log's first process started as ``pdeathsig_wrapper()`` (when setpriv is installed);
    its events up to its second successful execve (the command's) are dropped, that execve kept, so the
    trace holds the command's calls only."""
    with open(log_path, encoding="utf-8", errors="surrogateescape") as log:
        events = _events_from_lines(iter(log))
        if skip_wrapper and pdeathsig_wrapper():
            events = _after_wrapper(events)
        yield from events


def _after_wrapper(events: Iterator[SyscallEvent | AuxEvent]) -> Iterator[SyscallEvent | AuxEvent]:
    """``events`` without the first process's events before its second successful execve (the wrapper's
    own exec is the first). The wrapper does not fork, so no other process appears before that."""
    first: int | None = None
    execs = 0
    for event in events:
        if execs >= 2:
            yield event
            continue
        tid = getattr(event, "tid", None)
        if first is None:
            first = tid
        if tid != first:  # not expected (setpriv does not fork): keep it
            yield event
            continue
        if isinstance(event, SyscallEvent) and event.name in ("execve", "execveat") and event.ret == 0:
            execs += 1
            if execs == 2:
                yield event


def inherited_fds() -> dict[int, str]:
    """Paths of the standard descriptors a command launched from here inherits."""
    fds = {}
    for fd in (0, 1, 2):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return fds
