"""Containment of replayed paths: nothing outside the target directory is touched.

A recorded path is mapped to a path *relative* to the target: an optional
prefix is stripped, then ``..`` components are folded at the root (POSIX
path resolution folds ``/..`` to ``/``), so a hostile trace cannot climb
out. Symbolic links are defused at execution time by ``TargetRoot``:
every directory on the way is checked to resolve inside the target, and
files are opened with O_NOFOLLOW.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from ckpt_trace.errors import ReplayError


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
            path = path[len(prefix.rstrip("/")):]
    rel = path.lstrip("/")
    return rel or None


class TargetRoot:
    """The replay target directory and the safe mapping of relative paths into it.

    Call order: construct (the directory must exist), then ``resolve`` for each
    relative path an operation names; ``resolve`` checks the parent chain once
    per directory and caches it. Raises ReplayError on a path that escapes.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.realpath(root))
        self._safe_dirs: set[str] = {str(self.root)}

    def resolve(self, rel: str) -> str:
        full = os.path.join(self.root, rel)
        self._check_parent(os.path.dirname(full))
        if os.path.islink(full):
            raise ReplayError(f"refusing to follow symbolic link {full} inside the target")
        return full

    def resolve_entry(self, rel: str) -> str:
        """The full path of the entry ``rel`` itself, for calls that act on an entry without following it
        (rename, unlink, rmdir, symlink, link): only the directories on the way are checked; a symbolic link
        at ``rel`` is the entry."""
        full = os.path.join(self.root, rel)
        self._check_parent(os.path.dirname(full))
        return full

    def _check_parent(self, directory: str) -> None:
        if directory in self._safe_dirs:
            return
        real = os.path.realpath(directory)
        root = str(self.root)
        if real != root and not real.startswith(root + os.sep):
            raise ReplayError(f"path {directory} escapes the target {root} (symbolic link)")
        if real != os.path.normpath(directory):  # a symbolic link on the way, even one inside the target
            raise ReplayError(f"refusing to resolve {directory} through a symbolic link inside the target")
        self._safe_dirs.add(directory)

    def forget(self, rel: str) -> None:
        """Drop cached checks under ``rel`` (after a directory rename or unlink)."""
        full = os.path.join(self.root, rel)
        self._safe_dirs = {d for d in self._safe_dirs if d != full and not d.startswith(full + os.sep)}
