"""Path filters that follow renames: a file whose path matches ``--path-filter`` at any point of its life
is kept whole.

Engines write under a temporary name or directory and rename it into place
(Orbax's ``step.orbax-checkpoint-tmp/`` -> ``step/``, a ``.tmp`` file moved
into the checkpoint directory from elsewhere). A filter judged when a
descriptor is opened drops every write of such a file: at that moment its
path lies outside the prefix. So, with path filters, the recorder holds the
rows of *candidates* instead of dropping them: files a traced process opened
for writing or created, and directories it made, outside the filters. Their
rows wait here, keyed by the candidate's current path; a rename moves the key
with the file (a directory's rename, every key below it); a rename into the
filters releases the rows into the trace unchanged (each with the path it
had then, which the replay follows through the recorded renames); an unlink
of a candidate gives its rows up. Read-only opens of files outside the
filters (the libraries a program loads) are never candidates, so the held
rows stay few.

Bounded: at most ``config.RECORD_RENAME_HELD_ROWS`` rows are held; past it a
candidate's further rows are left out and counted (``dropped``), and the
trace's metadata says so. What is held when the recording ends is left out
(``given_up``). The in-kernel filter (bcc) keeps the same candidates: with
path filters it does not drop opens for writing or creating, mkdirs,
unlinks or renames outside them (``bcc_backend``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ckpt_trace import config

__all__ = ["RenameFollower"]


class RenameFollower:
    """The rows of candidates outside ``filters`` (path prefixes), held until a rename brings their file into
    the filters (see the module docstring). Call order: ``start`` a candidate (before its first row),
    ``hold`` its rows, ``rename``/``unlink`` as the calls happen; ``finish`` at the end.

    Counters: ``followed`` rows released by renames, ``dropped`` rows left out past the bound, ``given_up``
    rows of candidates unlinked or never renamed in."""

    def __init__(self, filters: Iterable[str], max_rows: int | None = None) -> None:
        self.filters = tuple(filters)
        self.max_rows = config.RECORD_RENAME_HELD_ROWS if max_rows is None else max_rows
        self._held: dict[str, list[dict]] = {}
        self.rows_held = 0
        self.followed = 0
        self.dropped = 0
        self.given_up = 0

    def matches(self, path: str | None) -> bool:
        return path is not None and path.startswith(self.filters)

    def start(self, path: str | None) -> None:
        """``path`` (outside the filters) is a candidate from now on: a file opened for writing or created,
        or a directory made, by a traced process."""
        if path is not None and not self.matches(path) and path not in self._held:
            self._held[path] = []

    def is_candidate(self, path: str | None) -> bool:
        return path is not None and path in self._held

    def hold(self, path: str | None, row: dict) -> bool:
        """Hold ``row`` (column -> value) under the candidate ``path``; False if ``path`` is none."""
        rows = self._held.get(path) if path is not None else None
        if rows is None:
            return False
        if self.rows_held >= self.max_rows:
            self.dropped += 1
            return True
        rows.append(row)
        self.rows_held += 1
        return True

    def _below(self, top: str) -> list[str]:
        prefix = top + "/"
        return [p for p in self._held if p == top or p.startswith(prefix)]

    def rename(self, old: str | None, new: str | None) -> list[dict]:
        """After a successful rename of ``old`` to ``new``: the rows it releases (candidates at or below
        ``old`` whose new path lies in the filters), in the order they were held; the other candidates below
        ``old`` now sit below ``new``. Candidates at or below ``new`` before are gone (replaced)."""
        if old is None or new is None or old == new:
            return []
        moving = self._below(old)
        for path in self._below(new):
            if path not in moving:
                self._give_up(path)
        released: list[dict] = []
        rows_of = {path: self._held.pop(path) for path in moving}
        for path, rows in rows_of.items():
            moved = new + path[len(old) :]
            if self.matches(moved):
                released.extend(rows)
                self.rows_held -= len(rows)
                self.followed += len(rows)
            else:
                self._held[moved] = rows
        released.sort(key=lambda row: row["ts_ns"])
        return released

    def unlink(self, path: str | None) -> None:
        """A candidate removed: its rows are given up."""
        if path is not None and path in self._held:
            self._give_up(path)

    def _give_up(self, path: str) -> None:
        rows = self._held.pop(path)
        self.rows_held -= len(rows)
        self.given_up += len(rows)

    def finish(self) -> None:
        """The recording ended: what is still held is left out (``given_up``)."""
        for path in list(self._held):
            self._give_up(path)
