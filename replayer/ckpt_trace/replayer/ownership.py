"""A replay deletes or overwrites only what it created in this run.

``plan_paths`` lists every path a plan may create under its directory (pure).
Before any I/O, a ``Claim`` refuses a directory where one of those files
already exists (the replay would overwrite a file it did not create: a user's
file, an earlier replay's output, the trace itself) or where one of them is a
path the command must not write (its own results file). Between ``--repeat``
runs, and when a run fails or is interrupted, ``release`` removes exactly
what this run created: the plan's files, then the directories it made, when
empty. Nothing else under the target is ever touched; ``--force`` only allows
a non-empty target.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import is_any_of

from .optable import KIND, KINDS, NO_FLAGS
from .pack import INDEX_PATH, PACK_DIR
from .plan import ReplayPlan


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def plan_paths(plan: ReplayPlan) -> tuple[frozenset[str], frozenset[str]]:
    """(files, directories) the plan may create, relative to its directory. Pure."""
    files, dirs = {path for path, _ in plan.precreate_files}, set(plan.precreate_dirs)
    ops = plan.ops
    naming = np.flatnonzero(is_any_of(ops.kind, [KIND[k] for k in ("open", "rename", "unlink", "mkdir", "mmap", "link",
                                                                "symlink")]))
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

    Call order: ``Claim(directory, plan)``, ``refuse_conflicts(protected)``
    before any I/O, then ``release()`` after a run whose files must go (between
    repeats, after a failure). Called by ``replayer.replay``.
    """

    def __init__(self, directory: Path, plan: ReplayPlan) -> None:
        self.directory = Path(directory)
        self.files, self.dirs = plan_paths(plan)
        self.made_directory = not self.directory.exists()
        self.existing_dirs = {d for d in self.dirs if (self.directory / d).is_dir()}

    def refuse_conflicts(self, protected: Iterable[Path] = ()) -> None:
        """Raise ReplayError when a file the plan may create already exists, or is a protected path."""
        guarded = {os.path.realpath(p) for p in protected}
        for rel in sorted(self.files):
            full = self.directory / rel
            if os.path.realpath(full) in guarded:
                raise ReplayError(f"the replay would write {full}, which is an input or output of this command; "
                                  "choose another target or --strip-prefix")
            if os.path.lexists(full):
                raise ReplayError(f"{full} already exists and the replay would overwrite it (it writes only files "
                                  "it creates); replay into an empty directory")

    def release(self) -> int:
        """Remove what a run of the plan created; return how many paths were removed."""
        removed = 0
        for rel in sorted(self.files, key=lambda p: -p.count("/")):
            full = self.directory / rel
            if full.is_dir() and not full.is_symlink():
                shutil.rmtree(full, ignore_errors=True)  # a directory the plan renamed into one of its paths
                removed += 1
            elif os.path.lexists(full):
                full.unlink()
                removed += 1
        for rel in sorted(self.dirs - self.existing_dirs, key=lambda p: -p.count("/")):
            try:
                (self.directory / rel).rmdir()
                removed += 1
            except OSError:
                pass  # not empty: something not ours is in it, or it is gone already
        if self.made_directory:
            try:
                self.directory.rmdir()
            except OSError:
                pass
        return removed
