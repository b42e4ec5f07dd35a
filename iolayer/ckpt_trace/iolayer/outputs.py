"""Outputs are checked before the work starts: exists? a directory? writable? (docs/ARCHITECTURE.md, "Nothing is ever lost").

Every command that writes a file or a directory calls one of these before it
runs anything, so a read-only directory or an existing file is one line and
a non-zero exit, not a lost recording after an hour. Writability is tested
by creating and removing a temporary file where the output will go: that
catches read-only mounts, permissions and full inode tables alike, for root
too (access(2) does not).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats.atomic import refuse_input


def probe_writable(directory: str | os.PathLike) -> None:
    """Raise CkptTraceError unless a file can be created (and is removed again) in ``directory``."""
    try:
        fd, name = tempfile.mkstemp(prefix=".ckpt-trace-probe-", dir=directory)
    except FileNotFoundError:
        raise CkptTraceError(f"directory {directory} does not exist") from None
    except OSError as err:
        raise CkptTraceError(f"cannot write in {directory}: {err.strerror}") from None
    os.close(fd)
    os.unlink(name)


def check_output_file(path: str | os.PathLike, force: bool, inputs: Iterable[str | os.PathLike | None] = ()) -> Path:
    """An output file about to be written: refused when it is one of ``inputs`` (the same file through any
    link, whatever ``force`` says), when it exists (unless ``force``) or is a directory, when its directory
    is missing, or when that directory is not writable. Returns it as a Path."""
    path = Path(path)
    refuse_input(path, inputs)
    if path.is_dir():
        raise CkptTraceError(f"{path} is a directory; name a file")
    if path.exists() and not force:
        raise CkptTraceError(f"{path} already exists (use {{option}} to overwrite it)", option="force", switch=True)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise CkptTraceError(f"directory {parent} does not exist")
    probe_writable(parent)
    return path


def check_output_dir(path: str | os.PathLike, force: bool, *, create: bool = True) -> Path:
    """An output directory: refused when it is a file, when it is not empty (unless ``force``, which
    allows a non-empty directory; nothing in it is removed), or not writable. ``create`` makes it
    (and its parents) when missing. Returns it as a Path."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CkptTraceError(f"{path} exists and is not a directory")
    if path.is_dir() and not force and any(path.iterdir()):
        raise CkptTraceError(
            f"{path} is not empty (use {{option}} to write into it; nothing in it is removed)",
            option="force",
            switch=True,
        )
    if not path.exists():
        if not create:
            raise CkptTraceError(f"directory {path} does not exist")
        try:  # exist_ok: the ranks of a job make it side by side (two saw it missing, one made it first)
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CkptTraceError(f"cannot create {path}: {err.strerror}") from None
    probe_writable(path)
    return path
