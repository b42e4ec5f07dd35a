"""File operations confined beneath one directory held open: no path is ever resolved through a link.

A ``Root`` holds a descriptor of a directory (the replay target) and runs
every operation on a path *relative* to it through that descriptor, so that
no rename race and no planted symbolic link can move a write, a create or an
unlink outside it:

- where the kernel has openat2(2) (Linux 5.6+, system call 437), each path is
  opened with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS``
  (the kernel refuses any ``..`` that climbs out and any symbolic link on the
  way, the last component included; see openat2(2));
- elsewhere each component is opened in turn with ``O_PATH | O_DIRECTORY |
  O_NOFOLLOW`` relative to the one before (``fstat`` confirms a directory),
  and the last one with ``O_NOFOLLOW``.

Entries are made and removed with the ``*at`` calls (mkdirat, unlinkat,
renameat2, linkat, symlinkat) relative to a descriptor of their parent
directory opened the same way, so only the final name is looked up by the
call, and those calls never follow a link in the final name. A symbolic link
the caller creates (``symlink``) is an entry: nothing here ever resolves
through one.

What a Root creates is remembered by identity (``Identity``: device, inode),
not by path: ``created`` is what a cleanup may remove (``remove_created``),
whatever was renamed or swapped in the meantime.

Raises OSError as the system calls do; ELOOP (a symbolic link on the way),
EXDEV (a path that would leave the root) and ENOTDIR are the refusals.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

__all__ = ["Identity", "Root", "openat2_available", "split_relative"]

SYS_OPENAT2 = 437  # x86_64, aarch64 and every architecture with the generic table (asm-generic/unistd.h)
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RENAME_NOREPLACE = 0x1
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_renameat2 = getattr(_libc, "renameat2", None)  # glibc 2.28+
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int:
    tmpfile = getattr(os, "O_TMPFILE", 0)  # __O_TMPFILE | O_DIRECTORY: all of it, not O_DIRECTORY alone
    creates = flags & os.O_CREAT or (tmpfile and flags & tmpfile == tmpfile)
    how = _OpenHow(flags & 0xFFFFFFFF, mode if creates else 0, _RESOLVE)  # openat2: a mode without them is EINVAL
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def _probe_openat2() -> bool:
    if os.environ.get("CKPT_TRACE_NO_OPENAT2"):  # tests: exercise the component walk
        return False
    base = os.open("/", _DIR_FLAGS)
    try:
        os.close(_openat2(base, ".", _DIR_FLAGS, 0))
    except OSError as err:
        return err.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL)
    finally:
        os.close(base)
    return True


_HAVE_OPENAT2: bool | None = None


def openat2_available() -> bool:
    """Whether this kernel (and its seccomp policy) lets us use openat2(2); probed once."""
    global _HAVE_OPENAT2
    if _HAVE_OPENAT2 is None:
        _HAVE_OPENAT2 = _probe_openat2()
    return _HAVE_OPENAT2


def split_relative(rel: str) -> list[str]:
    """The components of a relative path. Raises OSError(EINVAL) for an absolute or empty path, a NUL byte,
    or a ``.``/``..`` component (the caller folds those before: ``replayer.paths``)."""
    parts = [p for p in rel.split("/") if p]
    if not parts or rel.startswith("/") or "\0" in rel or any(p in (".", "..") for p in parts):
        raise OSError(errno.EINVAL, "not a plain relative path", rel)
    return parts


@dataclass(frozen=True)
class Identity:
    """A file by (device, inode): what a cleanup compares before it removes anything."""

    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino)


class Root:
    """A directory held open, and every operation on a path relative to it (see the module docstring).

    Call order: ``Root(path)`` (or ``child`` of another Root), then any
    of ``open``, ``mkdir``, ``unlink``, ``rmdir``, ``rename``, ``link``,
    ``symlink``, ``lstat``; ``remove_created`` to clean up; ``close``.
    Thread-safe (descriptors are per call; ``created`` under a lock).
    """

    fd = -1

    def __init__(self, path: str | os.PathLike, created: set[Identity] | None = None, *, fd: int | None = None) -> None:
        """Hold the directory ``path`` open (named by the user: resolved as any path), or adopt ``fd``, a
        descriptor of it. Raises OSError."""
        # opened as "path/": a tracer's path filter "path/" then sees this open, and the descriptor every
        # later call is relative to, inside it (ckpt-trace's own bcc filter compares the raw string)
        self.fd = os.open(os.path.join(path, ""), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if fd is None else fd
        self.path = os.fspath(path)
        self.created: set[Identity] = created if created is not None else set()
        self.identity = Identity.of(os.fstat(self.fd))
        self._lock = threading.Lock()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _remember(self, st: os.stat_result) -> None:
        with self._lock:
            self.created.add(Identity.of(st))

    # -- resolution -------------------------------------------------------
    def _open_beneath(self, rel: str, flags: int, mode: int = 0) -> int:
        parts = split_relative(rel)
        if openat2_available():
            return _openat2(self.fd, "/".join(parts), flags | os.O_CLOEXEC, mode)
        parent = self._walk(parts[:-1])
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
        finally:
            if parent != self.fd:
                os.close(parent)

    def _walk(self, parts: list[str]) -> int:
        """A descriptor (O_PATH) of the directory ``parts`` below the root, no component a link (self.fd when
        ``parts`` is empty: not to be closed)."""
        fd = self.fd
        for part in parts:
            try:
                nxt = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except NotADirectoryError:
                if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), "/".join(parts)) from None
                raise
            finally:
                if fd != self.fd:
                    os.close(fd)
            fd = nxt
            if not stat.S_ISDIR(os.fstat(fd).st_mode):  # O_PATH|O_NOFOLLOW opens a link itself
                os.close(fd)
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), "/".join(parts))
        return fd

    def _parent(self, rel: str) -> tuple[int, str]:
        """(descriptor of ``rel``'s parent directory, its last component); the caller closes the descriptor
        when it is not ``self.fd``."""
        parts = split_relative(rel)
        if len(parts) == 1:
            return self.fd, parts[0]
        if openat2_available():
            return _openat2(self.fd, "/".join(parts[:-1]), _DIR_FLAGS, 0), parts[-1]
        return self._walk(parts[:-1]), parts[-1]

    def _release(self, fd: int) -> None:
        if fd != self.fd:
            os.close(fd)

    # -- operations -------------------------------------------------------
    def open(self, rel: str, flags: int, mode: int = 0o644) -> int:
        """open(2) ``rel`` beneath the root (never through a link). A file this call creates is remembered
        (an O_CREAT open that finds the file existing is not: it is tried with O_EXCL first). Raises OSError."""
        if flags & os.O_CREAT and not flags & os.O_EXCL:
            try:
                fd = self._open_beneath(rel, flags | os.O_EXCL, mode)
            except FileExistsError:
                return self._open_beneath(rel, flags & ~os.O_CREAT, mode)
        else:
            fd = self._open_beneath(rel, flags, mode)
        if flags & os.O_CREAT:
            try:
                self._remember(os.fstat(fd))
            except OSError:
                os.close(fd)
                raise
        return fd

    def open_dir(self, rel: str) -> int:
        """An O_PATH descriptor of the directory ``rel`` (``""``: a new descriptor of the root)."""
        if not rel.strip("/"):
            return os.open(".", _DIR_FLAGS, dir_fd=self.fd)
        return self._open_beneath(rel, _DIR_FLAGS)

    def lstat(self, rel: str) -> os.stat_result:
        """The entry ``rel`` itself (a link is not followed, nor any on the way). Raises OSError."""
        parent, name = self._parent(rel)
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        finally:
            self._release(parent)

    def remember(self, fd: int) -> None:
        """Count the open file ``fd`` as created by this Root (a caller that knows it made it)."""
        self._remember(os.fstat(fd))

    def exists(self, rel: str) -> bool:
        try:
            self.lstat(rel)
        except OSError:
            return False
        return True

    def mkdir(self, rel: str, mode: int = 0o755, *, exist_ok: bool = False) -> bool:
        """mkdirat(2); the new directory is remembered. True when created, False when it existed as a
        directory (with ``exist_ok``). Raises OSError."""
        parent, name = self._parent(rel)
        try:
            try:
                os.mkdir(name, mode, dir_fd=parent)
            except FileExistsError:
                mode_found = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
                if exist_ok and stat.S_ISDIR(mode_found):
                    return False
                if exist_ok and stat.S_ISLNK(mode_found):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel) from None
                raise
            self._remember(os.stat(name, dir_fd=parent, follow_symlinks=False))
            return True
        finally:
            self._release(parent)

    def child(self, rel: str) -> Self:
        """A new Root for the directory ``rel``, which this call creates (never adopts an existing entry:
        FileExistsError), sharing ``created``. Raises OSError."""
        parent, name = self._parent(rel)
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        finally:
            self._release(parent)
        root = type(self)(os.path.join(self.path, rel), self.created, fd=fd)
        with self._lock:
            self.created.add(root.identity)
        return root

    def unlink(self, rel: str) -> None:
        self._in_parent(os.unlink, rel)

    def rmdir(self, rel: str) -> None:
        self._in_parent(os.rmdir, rel)

    def _in_parent(self, call: Callable[..., None], rel: str) -> None:
        """``call(name, dir_fd=parent)`` on ``rel``'s last name in its parent directory (opened beneath the
        root, released after)."""
        parent, name = self._parent(rel)
        try:
            call(name, dir_fd=parent)
        finally:
            self._release(parent)

    def rename(self, old: str, new: str, flags: int = 0) -> None:
        """renameat2(2) within the root (``flags``: RENAME_NOREPLACE...). Raises OSError."""
        old_parent, old_name = self._parent(old)
        try:
            new_parent, new_name = self._parent(new)
            try:
                if flags:
                    if _renameat2 is None:
                        raise OSError(errno.ENOSYS, "renameat2 is not in this libc", old)
                    if _renameat2(old_parent, os.fsencode(old_name), new_parent, os.fsencode(new_name), flags) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, os.strerror(err), old)
                else:
                    os.rename(old_name, new_name, src_dir_fd=old_parent, dst_dir_fd=new_parent)
            finally:
                self._release(new_parent)
        finally:
            self._release(old_parent)

    def link(self, old: str, new: str) -> None:
        """linkat(2) of the entry ``old`` (a link itself, never its target) as ``new``; remembered."""
        old_parent, old_name = self._parent(old)
        try:
            new_parent, new_name = self._parent(new)
            try:
                os.link(old_name, new_name, src_dir_fd=old_parent, dst_dir_fd=new_parent, follow_symlinks=False)
            finally:
                self._release(new_parent)
        finally:
            self._release(old_parent)

    def symlink(self, text: str, rel: str) -> None:
        """symlinkat(2): the entry ``rel`` holding ``text`` (an entry only: nothing here resolves it);
        remembered."""
        parent, name = self._parent(rel)
        try:
            os.symlink(text, name, dir_fd=parent)
            self._remember(os.stat(name, dir_fd=parent, follow_symlinks=False))
        finally:
            self._release(parent)

    # -- cleanup ----------------------------------------------------------
    def remove_created(self, rel: str) -> int:
        """Remove the entry ``rel`` when it is one this Root (or a Root sharing ``created``) made, by
        identity: a file is unlinked, a directory emptied of what is ours (recursively) and removed when
        empty. Anything else (not ours, a link on the way, gone) is left. Returns the entries removed."""
        try:
            parent, name = self._parent(rel)
        except OSError:
            return 0
        try:
            return self._remove_at(parent, name)
        finally:
            self._release(parent)

    def _remove_at(self, parent: int, name: str) -> int:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return 0
        if Identity.of(st) not in self.created:
            return 0
        removed = 0
        if stat.S_ISDIR(st.st_mode):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            except OSError:
                return 0
            try:
                if Identity.of(os.fstat(fd)) != Identity.of(st):
                    return 0  # swapped between the stat and the open
                for entry in os.listdir(fd):
                    removed += self._remove_at(fd, entry)
            finally:
                os.close(fd)
            try:
                os.rmdir(name, dir_fd=parent)
                removed += 1
            except OSError:
                pass  # something not ours is in it
            return removed
        try:
            if Identity.of(os.stat(name, dir_fd=parent, follow_symlinks=False)) == Identity.of(st):
                os.unlink(name, dir_fd=parent)
                removed += 1
        except OSError:
            pass
        return removed
