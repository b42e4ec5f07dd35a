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

Sources: open(2) (O_EXCL), kill(2) (signal 0 probes a pid).
"""

from __future__ import annotations

import errno
import json
import os
import platform
import time
from pathlib import Path

from ckpt_trace.errors import ReplayError

LOCK_NAME = ".ckpt-trace.lock"

__all__ = ["LOCK_NAME", "TargetLock", "job_id", "refuse_held"]


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


def _read(dir_fd: int) -> dict | None:
    try:
        fd = os.open(LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        holder = json.loads(data)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


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
    return (f"target {target} is in use by {_describe(holder)} ({target / LOCK_NAME}); wait for it to end, or "
            "remove that file if that replay is gone")


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
                try:
                    fd = os.open(LOCK_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o644, dir_fd=dir_fd)
                except FileExistsError:
                    holder = _read(dir_fd)
                    if _mine(holder, job):
                        return cls(target, dir_fd, None)
                    if _gone(holder):
                        try:
                            os.unlink(LOCK_NAME, dir_fd=dir_fd)
                        except FileNotFoundError:
                            pass
                        continue
                    raise ReplayError(_held_message(target, holder)) from None
                try:
                    os.write(fd, json.dumps({"pid": os.getpid(), "host": platform.node(), "job": job,
                                             "started": time.time(), "command": "replay"}).encode())
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
                return cls(target, dir_fd, (st.st_dev, st.st_ino))
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
