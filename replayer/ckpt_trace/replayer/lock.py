"""One replay job per target: ``.ckpt-trace.lock``, created with O_EXCL in the target.

Two ``replay --force`` runs on one target used to both pass the ownership
check, and interrupting one deleted the other's files. A replay now creates
``TARGET/.ckpt-trace.lock`` exclusively (O_CREAT | O_EXCL | O_NOFOLLOW,
relative to a descriptor of the target) before it plans any I/O there and
writes its holder into it (JSON: pid, host, job, started); a second replay
finds it and refuses with one line naming the holder. The processes of one
torchrun replay are one job: the same ``TORCHELASTIC_RUN_ID`` (or, without
it, the same ``MASTER_ADDR:MASTER_PORT``) shares the lock, and the process
that created it removes it. A lock whose holder was on this host and is gone
(its pid no longer runs: SIGKILL) is taken over.

The lock appears whole: its holder is written under a private name
(``.ckpt-trace.lock.PID.RANDOM``) and then hard-linked to the lock's name,
which fails with EEXIST when the lock exists, so no process ever reads an empty
lock (the processes of one job start together and each one reads the lock
to see whether it is its job's). Where the file system has no hard links the
lock is created with O_EXCL and written, and a reader that finds it empty
reads again for up to a second.

Sources: open(2) (O_EXCL), link(2) (EEXIST), kill(2) (signal 0 probes a pid).
"""

from __future__ import annotations

import errno
import json
import os
import platform
import secrets
import time
from pathlib import Path

from ckpt_trace.errors import ReplayError

LOCK_NAME = ".ckpt-trace.lock"

__all__ = ["LOCK_NAME", "TargetLock", "is_lock_file", "job_id", "refuse_held"]


def job_id() -> str | None:
    """The launcher's id of this job: the processes of one torchrun share it (None outside a launcher)."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run:
        return f"torchelastic:{run}"
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return f"master:{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return None


def _describe(holder: dict | None) -> str:
    if not holder:
        return "another replay (its lock is being written)"
    when = time.strftime("%H:%M:%S", time.localtime(holder.get("started", 0)))
    job = f", job {holder['job']}" if holder.get("job") else ""
    return f"replay pid {holder.get('pid')} on {holder.get('host')}{job} since {when}"


_EMPTY_LOCK_WAIT_S = 1.0  # how long a reader waits for a lock created without link(2) to be written


def is_lock_file(name: str) -> bool:
    """Whether ``name`` (in a target) is the lock or a lock being made (``LOCK_NAME.PID.RANDOM``)."""
    return name == LOCK_NAME or name.startswith(LOCK_NAME + ".")


def _read_once(dir_fd: int) -> tuple[bool, dict | None]:
    """(whether the lock exists, its holder or None when unreadable)."""
    try:
        fd = os.open(LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False, None
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        holder = json.loads(data)
    except ValueError:
        return True, None
    return True, holder if isinstance(holder, dict) else None


def _read(dir_fd: int) -> dict | None:
    deadline = time.monotonic() + _EMPTY_LOCK_WAIT_S
    while True:
        exists, holder = _read_once(dir_fd)
        if holder is not None or not exists or time.monotonic() >= deadline:
            return holder
        time.sleep(0.01)  # made with O_EXCL, not yet written (a file system without hard links)


def _create(dir_fd: int, job: str | None) -> tuple[int, int] | None:
    """Create the lock whole, holding this process; its (st_dev, st_ino), or None when a lock exists."""
    holder = json.dumps(
        {"pid": os.getpid(), "host": platform.node(), "job": job, "started": time.time(), "command": "replay"}
    ).encode()
    private = f"{LOCK_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(private, flags, 0o644, dir_fd=dir_fd)
    try:
        try:
            os.write(fd, holder)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        try:
            os.link(private, LOCK_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            return st.st_dev, st.st_ino
        except FileExistsError:
            return None
        except OSError as err:
            if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
                raise
    finally:
        os.unlink(private, dir_fd=dir_fd)
    try:  # no hard links here: O_EXCL, then the holder (readers wait for it, _read)
        fd = os.open(LOCK_NAME, flags, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        return None
    try:
        os.write(fd, holder)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino


def _gone(holder: dict | None) -> bool:
    """Whether the holder was a process of this host that no longer runs."""
    if not holder or holder.get("host") != platform.node() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _mine(holder: dict | None, job: str | None) -> bool:
    return bool(holder) and job is not None and holder.get("job") == job


def refuse_held(target: Path, job: str | None = None) -> None:
    """Raise ReplayError when another job holds ``target`` (a check before the target's other checks, so the
    message names the holder; ``TargetLock.acquire`` is what excludes)."""
    try:
        dir_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        try:
            os.stat(LOCK_NAME, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return
        holder = _read(dir_fd)
        if not _mine(holder, job) and not _gone(holder):
            raise ReplayError(_held_message(target, holder))
    finally:
        os.close(dir_fd)


def _held_message(target: Path, holder: dict | None) -> str:
    return (
        f"target {target} is in use by {_describe(holder)} ({target / LOCK_NAME}); wait for it to end, or "
        "remove that file if that replay is gone"
    )


class TargetLock:
    """The lock of one replay job on its target (see the module docstring).

    Call order: ``TargetLock.acquire(target, job)`` after the target exists and
    before anything is written there; ``release()`` when the replay is done
    (after its cleanup, before the target itself may be removed). Raises
    ReplayError when another job holds it.
    """

    def __init__(self, target: Path, dir_fd: int, identity: tuple[int, int] | None) -> None:
        self.target, self._dir_fd, self._identity = target, dir_fd, identity

    @property
    def owner(self) -> bool:
        """Whether this process created the lock (and removes it)."""
        return self._identity is not None

    @classmethod
    def acquire(cls, target: Path, job: str | None = None) -> TargetLock:
        dir_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for _ in range(2):
                identity = _create(dir_fd, job)
                if identity is None:
                    holder = _read(dir_fd)
                    if _mine(holder, job):
                        return cls(target, dir_fd, None)
                    if _gone(holder):
                        try:
                            os.unlink(LOCK_NAME, dir_fd=dir_fd)
                        except FileNotFoundError:
                            pass
                        continue
                    raise ReplayError(_held_message(target, holder))
                return cls(target, dir_fd, identity)
            raise ReplayError(_held_message(target, _read(dir_fd)))
        except BaseException:
            os.close(dir_fd)
            raise

    def release(self) -> None:
        """Remove the lock if this process made it (and it is still the one it made). Idempotent."""
        if self._dir_fd < 0:
            return
        try:
            if self._identity is not None:
                try:
                    st = os.stat(LOCK_NAME, dir_fd=self._dir_fd, follow_symlinks=False)
                    if (st.st_dev, st.st_ino) == self._identity:
                        os.unlink(LOCK_NAME, dir_fd=self._dir_fd)
                except OSError as err:
                    if err.errno != errno.ENOENT:
                        raise
        finally:
            os.close(self._dir_fd)
            self._dir_fd = -1
