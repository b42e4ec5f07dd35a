"""A replay deletes or overwrites only what it created in this run.

``plan_paths`` lists every path a plan may create under its directory (pure).
Before any I/O, a ``Claim`` refuses a directory where one of those files
already exists (the replay would overwrite a file it did not create: a user's
file, an earlier replay's output, the trace itself) or where one of them is a
path the command must not write (its own results file). Between ``--repeat``
runs, and when a run fails or is interrupted, ``release`` removes exactly
what this run created: the plan's files, then the directories it made, when
empty, each found beneath the target's descriptor and compared by identity
(device, inode) with what the run created (``iolayer.beneath``), so a
renamed or swapped entry is never removed. Nothing else under the target is ever touched; ``--force`` only allows
a non-empty target.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import is_any_of
from ckpt_trace.iolayer.beneath import Identity

from .optable import KIND, KINDS, NO_FLAGS
from .pack import INDEX_PATH, PACK_DIR
from .paths import TargetRoot
from .plan import ReplayPlan


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def plan_paths(plan: ReplayPlan) -> tuple[frozenset[str], frozenset[str]]:
    """(files, directories) the plan may create, relative to its directory. Pure."""
    files, dirs = {path for path, _ in plan.precreate_files}, set(plan.precreate_dirs)
    ops = plan.ops
    naming = np.flatnonzero(
        is_any_of(ops.kind, [KIND[k] for k in ("open", "rename", "unlink", "mkdir", "mmap", "link", "symlink")])
    )
    for row in naming.tolist():  # the few rows that name paths: opens, renames, unlinks, mkdirs
        kind, path, new_path = KINDS[ops.kind[row]], int(ops.path[row]), int(ops.new_path[row])
        path = ops.paths[path] if path >= 0 else None
        new_path = ops.paths[new_path] if new_path >= 0 else None
        if kind == "open" and path:
            flags = int(ops.flags[row])
            (dirs if flags != NO_FLAGS and flags & os.O_DIRECTORY else files).add(path)
        elif kind in ("rename", "unlink", "link"):
            files.update(p for p in (path, new_path) if p)
        elif kind == "symlink" and new_path:  # (its path is the link's content, not a path of the target)
            files.add(new_path)
        elif kind == "mkdir" and path:
            dirs.add(path)
    if plan.pack_index:
        files.update(entry["pack"] for entry in plan.pack_index.values())
        files.add(INDEX_PATH)
        dirs.add(PACK_DIR)
    files -= dirs
    for path in list(files) + list(dirs):
        dirs.update(_ancestors(path))
    return frozenset(files), frozenset(dirs)


class Claim:
    """The paths one run of ``plan`` owns under ``directory`` (see the module docstring).

    Call order: ``Claim(directory, plan, fresh=...)``, ``refuse_conflicts(protected)``
    before any I/O, ``root()`` for the executor (the directory held open: every
    file operation of the run goes through it, ``iolayer.beneath``), then
    ``release()`` after a run whose files must go (between repeats with
    ``keep_directory=True``; after a failure; by ``ReplayReport.release``).
    ``fresh``: ``directory`` is a strategy's subdirectory of ``--strategy all``,
    which this replay creates and never adopts (an existing entry there, a
    symbolic link or a directory, is refused). ``adopt`` (the processes of
    one distributed replay): another process of the job may have made it.
    What is removed is what this replay created, by identity (device,
    inode), never by path. Called by ``replayer.replay``.
    """

    def __init__(self, directory: Path, plan: ReplayPlan, *, fresh: bool = False, adopt: bool = False) -> None:
        self.directory = Path(directory)
        self.files, self.dirs = plan_paths(plan)
        self.fresh, self.adopt = fresh, adopt
        self.created: set[Identity] = set()
        self._root: TargetRoot | None = None
        self._parent: TargetRoot | None = None

    def refuse_conflicts(self, protected: Iterable[str | os.PathLike[str]] = ()) -> None:
        """Raise ReplayError when a file the plan may create already exists, or is a protected path, or (for
        a fresh directory) the directory exists."""
        if self.fresh and os.path.lexists(self.directory):
            what = "a symbolic link" if os.path.islink(self.directory) else "already there"
            raise ReplayError(
                f"{self.directory} is {what}; {{option}} all creates each strategy's directory "
                "itself and never adopts one: remove it or choose another target",
                option="strategy",
            )
        guarded = {os.path.realpath(p) for p in protected}
        for rel in sorted(self.files):
            full = self.directory / rel
            if os.path.realpath(full) in guarded:
                raise ReplayError(
                    f"the replay would write {full}, which is an input or output of this command; "
                    "choose another target or {option}",
                    option="strip_prefix",
                )
            if os.path.lexists(full):
                raise ReplayError(
                    f"{full} already exists and the replay would overwrite it (it writes only files "
                    "it creates); replay into an empty directory"
                )

    def root(self) -> TargetRoot:
        """The directory held open (made here first when ``fresh``); the same one for every run. Raises
        ReplayError when it cannot be made or opened."""
        if self._root is None:
            try:
                if self.fresh:
                    self._parent = TargetRoot(self.directory.parent, self.created)
                    if self.adopt:
                        self._parent.mkdir(self.directory.name, exist_ok=True)
                        fd = self._parent.open(self.directory.name, os.O_RDONLY | os.O_DIRECTORY)
                        self._root = TargetRoot(self.directory, self.created, fd=fd)
                    else:
                        self._root = self._parent.child(self.directory.name)
                else:
                    self._root = TargetRoot(self.directory, self.created)
            except OSError as err:
                raise ReplayError(
                    f"cannot open the target directory {self.directory}: {err.strerror or err}"
                    + (
                        " (a symbolic link or an existing entry is never adopted)"
                        if err.errno in (errno.EEXIST, errno.ELOOP, errno.ENOTDIR)
                        else ""
                    )
                ) from None
        assert self._root is not None  # opened above, or on an earlier call
        return self._root

    def release(self, keep_directory: bool = False) -> int:
        """Remove what runs of the plan created (by identity); return how many entries were removed. Unless
        ``keep_directory``, a fresh directory goes too and the directory is let go."""
        root = self._root
        if root is None:
            return 0
        removed = 0
        for rel in sorted(self.files, key=lambda p: -p.count("/")):
            removed += root.remove_created(rel)
        for rel in sorted(self.dirs, key=lambda p: -p.count("/")):
            removed += root.remove_created(rel)
        if not keep_directory:
            root.close()
            self._root = None
            if self._parent is not None:
                removed += self._parent.remove_created(self.directory.name)
                self._parent.close()
                self._parent = None
        return removed
