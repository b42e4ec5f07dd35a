"""Output files written safely beside their final name, on a shared machine too.

Every output of ckpt-trace (traces, results and baseline JSON, HTML reports,
emitted modules, exports) is written to a temporary file in the output's own
directory and renamed over the output when complete (rename(2) is atomic
within a file system and replaces a symlink at the output, never what it
points to). The temporary file is made like mkstemp(3): a random name,
``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, so a name or a symlink another
user planted in a shared directory such as /tmp is never opened, followed or
overwritten (open(2), "O_EXCL": "if pathname already exists, then open()
fails"; symlinks are not followed). The file is then written through its
descriptor (``fd_path``: /proc/self/fd/N reopens that very file), not by its
name, so renaming entries in the directory mid-write cannot redirect a byte.

``same_file`` tells whether an output is one of the inputs (the same device
and inode, through any symlink or hard link), which every command refuses
whatever ``--force`` says: ``--force`` replaces an output, never an input.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .errors import CkptTraceError

TEMPORARY_SUFFIX = ".tmp"


def temporary_prefix(path: str | os.PathLike) -> str:
    """The prefix of ``path``'s temporary names: ``.NAME.PID-`` (``.NAME.PID-XXXXXXXX.tmp`` in all; the
    process id lets a later run tell a killed run's leftovers from a live one's files)."""
    return f".{Path(path).name}.{os.getpid()}-"


def make_temporary(path: str | os.PathLike, mode: int = 0o644) -> tuple[int, Path]:
    """Create a new, empty temporary file beside ``path`` (random name, O_EXCL, O_NOFOLLOW, close-on-exec).

    Returns (descriptor open for reading and writing, its path); the caller closes the descriptor and
    removes or renames the file. ``mode`` is applied with fchmod (mkstemp makes 0600). Raises OSError.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, name = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=TEMPORARY_SUFFIX, dir=directory)
    try:
        os.fchmod(fd, mode & ~_umask())
    except OSError:
        pass
    return fd, Path(name)


def make_temporary_directory(path: str | os.PathLike) -> Path:
    """Create a new, empty temporary directory beside ``path`` (mkdtemp: random name, mode 0700).

    Returns its path; the caller renames it over ``path`` or removes it. Raises OSError.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    name = tempfile.mkdtemp(prefix=temporary_prefix(path), suffix=TEMPORARY_SUFFIX, dir=directory)
    os.chmod(name, 0o755 & ~_umask())
    return Path(name)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fd_path(fd: int, fallback: str | os.PathLike) -> str:
    """A path that opens the file of descriptor ``fd`` itself (/proc/self/fd/N, see proc(5)), for libraries
    that take a path rather than a descriptor; ``fallback`` where /proc is not mounted."""
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.exists(proc) else str(fallback)


def remove_if_same(path: str | os.PathLike, identity: tuple[int, int] | None) -> None:
    """Unlink ``path`` if it is still the file of ``identity`` (st_dev, st_ino) or ``identity`` is None;
    never follows a symlink and never raises for a missing file."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if identity is not None and (info.st_dev, info.st_ino) != identity:
        return
    try:
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def fsync_directory(directory: str | os.PathLike) -> None:
    """fsync(2) a directory, so a rename or a new entry in it survives a crash. Raises OSError."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicFile:
    """A file written beside ``path`` and renamed over it by ``commit``; ``discard`` removes it.

    ``fileobj`` is a binary file object on the temporary file's descriptor; ``sink_path`` names that very
    file for libraries that open by path (``fd_path``). Use as a context manager: the file is committed
    when the block ends normally, discarded when it raises. ``temporary`` adopts a file made earlier by
    ``make_temporary`` (``reserve_temporary``: the output's space checked before a long job).

    Raises CkptTraceError with a one-line reason when the file cannot be made, written or renamed; the
    output is untouched then.
    """

    def __init__(self, path: str | os.PathLike, *, temporary: str | os.PathLike | None = None, what: str = "") -> None:
        self.path = Path(path)
        self.what = what
        try:
            if temporary is None:
                self.fd, self.tmp = make_temporary(self.path)
            else:
                self.tmp = Path(temporary)
                self.fd = os.open(self.tmp, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
                os.ftruncate(self.fd, 0)
        except OSError as err:
            raise CkptTraceError(self._message(err)) from None
        info = os.fstat(self.fd)
        self.identity = (info.st_dev, info.st_ino)
        self.fileobj = os.fdopen(self.fd, "r+b", closefd=False)
        self.sink_path = fd_path(self.fd, self.tmp)
        self.done = False

    def _message(self, err: OSError) -> str:
        return f"cannot write {self.what + ' ' if self.what else ''}{self.path}: {err.strerror or err}"

    def write(self, data: bytes) -> None:
        try:
            self.fileobj.write(data)
        except OSError as err:
            self.discard()
            raise CkptTraceError(self._message(err)) from None

    def commit(self) -> Path:
        """fsync the file, rename it over ``path`` and fsync the directory. Returns ``path``."""
        if self.done:
            return self.path
        try:
            self.fileobj.flush()
            os.fsync(self.fd)
            info = os.lstat(self.tmp)
            if (info.st_dev, info.st_ino) != self.identity:
                raise OSError(17, f"temporary file {self.tmp} was replaced by another")
            os.replace(self.tmp, self.path)
            fsync_directory(self.path.parent if str(self.path.parent) else ".")
        except OSError as err:
            self.discard()
            raise CkptTraceError(self._message(err)) from None
        self._close()
        return self.path

    def discard(self) -> None:
        """Remove the temporary file (only if it is still the one made here); ``path`` is untouched."""
        if self.done:
            return
        self._close()
        remove_if_same(self.tmp, self.identity)

    def _close(self) -> None:
        self.done = True
        try:
            self.fileobj.close()
        except OSError:
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def file_identity(path: str | os.PathLike) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file ``path`` names, following symlinks; None when it does not exist."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` are one existing file (same device and inode, through any link)."""
    first = file_identity(a)
    return first is not None and first == file_identity(b)


def refuse_input(output: str | os.PathLike, inputs: Iterable[str | os.PathLike | None]) -> None:
    """Raise CkptTraceError when ``output`` is one of ``inputs`` (the same file through any link), whatever
    ``--force`` says: an output never replaces what the command reads."""
    for source in inputs:
        if source is not None and same_file(output, source):
            raise CkptTraceError(
                f"{output} is the input {source} (the same file); an output is never written over "
                "an input, overwriting or not: choose another output"
            )
