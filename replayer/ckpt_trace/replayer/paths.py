"""Containment of replayed paths: nothing outside the target directory is touched.

A recorded path is mapped to a path *relative* to the target: an optional
prefix is stripped, then ``..`` components are folded at the root (POSIX
path resolution folds ``/..`` to ``/``), so a hostile trace cannot climb
out. Symbolic links are defused at execution time by ``TargetRoot``
(``iolayer.beneath``): every operation is relative to a descriptor of the
target and never resolves through a link.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from ckpt_trace.errors import ReplayError
from ckpt_trace.iolayer.beneath import Root


def relative_target_path(recorded: str, strip_prefix: str | None = None) -> str | None:
    """The target-relative path of a recorded path, or None if nothing remains.

    ``"/a/../../etc/passwd"`` -> ``"etc/passwd"``; ``strip_prefix="/data"``
    maps ``"/data/ckpt/x"`` to ``"ckpt/x"``. Raises ReplayError on a NUL byte.
    """
    if "\0" in recorded:
        raise ReplayError("trace holds a path with a NUL byte")
    path = posixpath.normpath("/" + recorded)
    if strip_prefix:
        prefix = posixpath.normpath("/" + strip_prefix)
        if path == prefix:
            path = "/"
        elif path.startswith(prefix.rstrip("/") + "/"):
            path = path[len(prefix.rstrip("/")) :]
    rel = path.lstrip("/")
    return rel or None


class TargetRoot(Root):
    """The replay target directory, held open: every operation of a replay runs beneath it
    (``iolayer.beneath.Root``: openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or a walk with
    O_NOFOLLOW on every component), so neither a planted link nor a rename race moves a write, create or
    unlink outside it. ``root`` is the directory's path (for messages and statvfs-like questions only).
    Raises OSError when the directory cannot be opened.
    """

    @property
    def root(self) -> Path:
        return Path(self.path)
