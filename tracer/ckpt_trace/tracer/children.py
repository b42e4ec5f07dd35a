"""The recorder's children end with it: signals forwarded to the traced command, a parent-death signal.

``record`` runs as root on shared machines; a traced command left running after the recorder is gone
writes untraced, and an orphaned strace holds its tracees. So:

- ``set_parent_death_signal`` (prctl(2) ``PR_SET_PDEATHSIG``, in the child before it execs) makes the
  kernel send SIGKILL to the child when the recorder dies, even by SIGKILL. The setting is kept across
  execve(2) of a non-set-user-ID program and cleared in the children of a fork(2): it covers bcc's traced
  command and the strace process, not the processes strace starts; strace's command is started through
  ``setpriv --pdeathsig KILL`` (strace_backend.pdeathsig_wrapper) so it dies with strace. Processes the
  command itself forks are not covered (a command that does not end its children leaves them).
- ``forwarding`` turns SIGTERM, SIGHUP and SIGINT sent to the recorder into the same signal sent to every
  process of the traced command (the recorder's descendants, found through /proc/PID/task/TID/children,
  proc(5)); strace itself is left to see its tracees exit and finish its log. A second signal sends
  SIGKILL. The recording then ends as any other does, and the trace says it was cut (``interrupted``).
  A SIGINT while the recorder is its terminal's foreground process group is a Ctrl-C, which the terminal
  sent to the whole group, the command included: it is not sent again, and the recording goes on until the
  command ends (``sigint_handler``).
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
FORWARDED = (signal.SIGTERM, signal.SIGHUP)
_ACTIVE: list = []  # the handler of the ``forwarding`` now in force (at most one)
try:  # looked up now: a forked child of a threaded process must not dlopen
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not glibc/musl
    _PRCTL = None


def in_terminal_foreground() -> bool:
    """Whether this process's group is the foreground group of its controlling terminal (tcgetpgrp(3)):
    then a SIGINT is most likely a Ctrl-C that the terminal sent to the whole group. False without one."""
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(tty) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(tty)


def sigint_handler():
    """The SIGINT handler a backend installs while it waits for the command: inside ``forwarding``, its
    handler (a SIGINT sent to the recorder alone goes to the command, as SIGTERM does; a Ctrl-C is left to
    the terminal), else SIG_IGN (the command got the Ctrl-C; the recording goes on until it ends)."""
    return _ACTIVE[-1] if _ACTIVE else signal.SIG_IGN


def set_parent_death_signal(signum: int = signal.SIGKILL) -> None:
    """prctl(PR_SET_PDEATHSIG, signum) for the calling process (a ``preexec_fn`` or a forked child);
    a no-op where the C library has no prctl."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (every thread's ``children`` file); [] when it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as handle:
                found += [int(word) for word in handle.read().split()]
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int, skip_children: bool = False) -> list[int]:
    """Every descendant of ``pid``, parents before children; ``skip_children`` leaves out ``pid``'s own
    children (strace) but not theirs."""
    order: list[int] = []
    stack = [(child, 1) for child in children(pid)]
    while stack:
        current, depth = stack.pop()
        if not (skip_children and depth == 1):
            order.append(current)
        stack += [(child, depth + 1) for child in children(current)]
    return order


@contextmanager
def forwarding(skip_children: bool = False) -> Iterator[list[int]]:
    """While inside: SIGTERM and SIGHUP to this process (SIGINT too, through ``sigint_handler``) go to every descendant (but this process's own
    children when ``skip_children``: strace); a second one sends SIGKILL. Yields the list of signals
    received, for the trace's ``interrupted``. Only in the main thread (elsewhere: nothing forwarded)."""
    import threading

    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def forward(signum, frame) -> None:
        if signum == signal.SIGINT and in_terminal_foreground():
            return  # Ctrl-C: the terminal sent it to the command already
        received.append(signum)
        send = signum if len(received) == 1 else signal.SIGKILL
        for pid in descendants(os.getpid(), skip_children):
            try:
                os.kill(pid, send)
            except OSError:
                pass

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    _ACTIVE.append(forward)
    try:
        yield received
    finally:
        _ACTIVE.remove(forward)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
