"""Directory entries as first-class: renames of files and directories (renameat2 flags), removal of trees,
and their replay without resolving a path through a symbolic link.

Checkpoint engines commit by naming: Orbax writes a step into
``step.orbax-checkpoint-tmp/`` and renames the directory to ``step/``; others
rename files across directories, take O_CREAT|O_EXCL lock files, remove old
steps with ``shutil.rmtree`` (unlinkat per file, then AT_REMOVEDIR per
directory). The planner follows every entry through these operations:

- ``move``: what the planner knows under a renamed path (sizes, file
  identities, first sightings) moves with it, for a directory its whole
  subtree; RENAME_EXCHANGE swaps the two subtrees; a destination that comes
  into being by the rename (and everything under it) is never made before
  the clock (a pre-made ``step/`` would make the rename fail with ENOTEMPTY).
- ``rename_entry``, ``remove_entry``: the executor's side: renameat2(2) with
  the recorded flags (RENAME_NOREPLACE, RENAME_EXCHANGE; RENAME_WHITEOUT is
  an overlayfs detail and is dropped), unlink or rmdir. Both act on the
  entry itself: the final component is never followed (rename(2) and
  unlink(2) do not follow it either), and every directory on the way is
  reached beneath the target's descriptor, never through a link
  (``TargetRoot``, ``iolayer.beneath``).

- ``link_entry``, ``symlink_entry``: a second name of a file; a symbolic
  link holding its recorded content, made as an entry and never followed.

Sources: rename(2) (renameat2 flags, include/uapi/linux/fs.h), unlink(2),
rmdir(2), link(2), symlink(2).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, MutableMapping
from typing import Any, TypeVar

from ckpt_trace.formats import vocabulary as v

from .paths import TargetRoot

T = TypeVar("T")  # what a table of last operations holds (the planner's Origin)

__all__ = [
    "RENAME_EXCHANGE",
    "RENAME_NOREPLACE",
    "RENAME_WHITEOUT",
    "arrived",
    "link_entry",
    "move",
    "remove_entry",
    "rename_entry",
    "symlink_entry",
    "take_subtree",
    "under",
]

RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1, 2, 4  # include/uapi/linux/fs.h


def under(paths: Iterable[str], top: str) -> list[str]:
    """The paths of ``paths`` that are ``top`` or lie below it."""
    prefix = top + "/"
    return [p for p in paths if p == top or p.startswith(prefix)]


def move(tables: Iterable[MutableMapping[str, Any]], old: str, new: str, flags: int = 0) -> None:
    """Rename ``old`` to ``new`` in each of ``tables`` (path -> what is known of it): entries at or below
    ``old`` move below ``new``; what was at or below ``new`` is gone (replaced), or, with RENAME_EXCHANGE,
    moves below ``old``."""
    if old == new:
        return
    exchange = bool(flags & RENAME_EXCHANGE)
    for table in tables:
        source = {p: table.pop(p) for p in under(list(table), old)}
        replaced = {p: table.pop(p) for p in under(list(table), new)}
        table.update({new + p[len(old) :]: value for p, value in source.items()})
        if exchange:
            table.update({old + p[len(new) :]: value for p, value in replaced.items()})


def arrived(
    first_touch: MutableMapping[str, bool], now: Iterable[str], old: str, new: str, flags: int = 0
) -> list[str]:
    """After renaming ``old`` to ``new``: each path the rename brought into being (``new`` and the paths of
    ``now``, the files known to exist after the rename, below it; with RENAME_EXCHANGE, ``old`` and below it
    too) is first seen as created, unless seen before. Returns the paths first seen now."""
    now = list(now)
    pairs = [new, *under(now, new)]
    if flags & RENAME_EXCHANGE:
        pairs += [old, *under(now, old)]
    fresh = [p for p in dict.fromkeys(pairs) if p not in first_touch]
    for p in fresh:
        first_touch[p] = True
    return fresh


# -- execution --------------------------------------------------------------------------------------------------


def rename_entry(root: TargetRoot, old: str, new: str, flags: int | None = None) -> None:
    """Rename the target's entry ``old`` to ``new`` (target-relative) with the recorded renameat2 ``flags``
    (RENAME_WHITEOUT dropped), beneath the target's descriptor (``iolayer.beneath``: no link on the way is
    followed, nor either final component). Raises OSError as rename(2)."""
    wanted = (flags or 0) & (RENAME_NOREPLACE | RENAME_EXCHANGE)
    if wanted:
        try:
            root.rename(old, new, wanted)
        except OSError as err:
            if err.errno not in (errno.ENOSYS, errno.EINVAL) or wanted & RENAME_EXCHANGE:
                raise
            if root.exists(new):  # a file system without renameat2 flags: NOREPLACE by hand
                raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), new) from None
            root.rename(old, new)
    else:
        root.rename(old, new)


def remove_entry(root: TargetRoot, path: str, flags: int | None = None) -> None:
    """unlink(2) the target's entry ``path``, or rmdir(2) it when ``flags`` hold AT_REMOVEDIR, beneath the
    target's descriptor; a symbolic link is removed itself, never followed. Raises OSError as they do."""
    if (flags or 0) & v.AT_REMOVEDIR:
        root.rmdir(path)
    else:
        root.unlink(path)


def link_entry(root: TargetRoot, old: str, new: str) -> None:
    """link(2) the target's entry ``old`` to the new name ``new`` beneath the target's descriptor (a symbolic
    link at ``old`` is linked itself, not followed). Raises OSError as link(2)."""
    root.link(old, new)


def symlink_entry(root: TargetRoot, content: str, new: str) -> None:
    """symlink(2): the target's entry ``new`` becomes a symbolic link holding ``content`` exactly as recorded
    (absolute or relative), beneath the target's descriptor; the replay never resolves a path through it
    (``iolayer.beneath``: RESOLVE_NO_SYMLINKS). Raises OSError as symlink(2)."""
    root.symlink(content, new)


def take_subtree(last_op: MutableMapping[str, T], dirs: set[str], *tops: str) -> list[T]:
    """The last operations recorded (``last_op``: path -> origin) on paths strictly below each of ``tops``,
    removed from ``last_op`` (a later operation below a renamed directory waits for the rename instead).
    Only a top in ``dirs`` (paths something was named below) is scanned, so a file's rename costs nothing."""
    found = []
    for top in tops:
        if top in dirs:
            found.extend(last_op.pop(path) for path in under(list(last_op), top) if path != top)
    return found
