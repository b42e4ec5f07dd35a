"""Before planning: every row's columns in their range; after planning: what the plan skips, said.

A well-formed trace can still hold values no system call produces (a hand
edit, a bit flip, another tool's export): a negative offset, size, duration
or queue depth, a read or write larger than Linux moves in one call, open
flags of -1, rows out of start-time order. ``checked_batches`` refuses them
as the planner reads each record batch (no extra pass over the file), with
one line naming the row, the column and the value, instead of a kernel error
or a silent change halfway through the replay.

Rows the planner cannot replay (an operation it does not know, a path that
maps to nothing under the target: empty, ``/``, a rename to ``/..``, a
``--strip-prefix`` equal to a recorded file, a descriptor never opened) are
counted in the plan's ``skipped_ops``; ``skip_notes`` turns those counts into
the results' notes, and ``--strict`` makes any of them an error
(``refuse_skips``). Rows skipped by design are not changes and never count:
failed calls (``failed``: replayed as what they did, nothing) and the
submission calls of recorded queues (``queue_calls``: their requests are
rows of their own).

Sources: read(2)/write(2) (at most 0x7ffff000 bytes per call, MAX_RW_COUNT
in include/linux/fs.h), open(2), the trace format's row order
(``formats/README.md``: rows in start-time order).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import is_any_of

from .optable import KIND, NO_FLAGS, READ, WRITE
from .paths import relative_target_path

MAX_RW_BYTES = 0x7FFFF000  # MAX_RW_COUNT: the most one read/write/readv/writev moves on Linux
BY_DESIGN = frozenset({"failed", "queue_calls"})  # rows not replayed on purpose (see the module docstring)
_WHY = {
    "no_path": "their path names nothing under the target (empty, '/', a rename to '/..', or a --strip-prefix "
    "equal to the file)",
    "unknown_fd": "their descriptor was never opened in the trace",
    "implicit_opens": "they use a descriptor opened before the recording began",
    "pages_outside_a_mapping": "their pages lie outside any recorded mapping",
    "unmapped_without_mapping": "they unmap a mapping never recorded",
    "synced_without_mapping": "they sync a mapping never recorded",
}

__all__ = [
    "MAX_RW_BYTES",
    "check_bound_paths",
    "checked_batches",
    "refuse_file_and_directory",
    "refuse_skips",
    "skip_notes",
]


def _refuse(row: int, column: str, value, why: str) -> ReplayError:
    return ReplayError(
        f"trace row {row}: {column} {value} {why}; the trace was edited or damaged (replay refused before any I/O)"
    )


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def _ints(batch: pa.RecordBatch, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, valid) of an integer column of ``batch``, or None when the batch lacks it."""
    if name not in batch.schema.names:
        return None
    column = batch.column(name)
    valid = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False), bool)
    values = np.asarray(column.fill_null(0).to_numpy(zero_copy_only=False))
    return values, valid


def _ops(batch: pa.RecordBatch, names: tuple[str, ...]) -> np.ndarray:
    column = batch.column("op")
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return np.asarray(pc.is_in(column, pa.array(list(names))).fill_null(False).to_numpy(zero_copy_only=False), bool)


def check_batch(batch: pa.RecordBatch, first_row: int, last_ts_ns: int | None) -> int | None:
    """Refuse (ReplayError) a batch of trace rows (``first_row``: the trace row of its first) holding a value out
    of its column's range; return its last ``ts_ns`` (for the next batch's order check)."""
    ts = _ints(batch, "ts_ns")
    if ts is not None and len(ts[0]):
        values, _ = ts
        bad = _first(values < 0)
        if bad is not None:
            raise _refuse(first_row + bad, "ts_ns", int(values[bad]), "is negative")
        back = np.r_[values[:1] < last_ts_ns if last_ts_ns is not None else np.zeros(1, bool), values[1:] < values[:-1]]
        bad = _first(back)
        if bad is not None:
            before = last_ts_ns if bad == 0 else int(values[bad - 1])
            raise _refuse(
                first_row + bad,
                "ts_ns",
                int(values[bad]),
                f"goes back in time (the row before starts at {before}; a trace's rows are in start-time order)",
            )
        last_ts_ns = int(values[-1])
    for name in ("dur_ns", "in_flight", "size", "offset"):
        column = _ints(batch, name)
        if column is None:
            continue
        values, valid = column
        bad = _first(valid & (values < 0))
        if bad is not None:
            raise _refuse(first_row + bad, name, int(values[bad]), "is negative")
    size = _ints(batch, "size")
    if size is not None and "op" in batch.schema.names:
        data = _ops(batch, ("read", "write"))
        bad = _first(data & size[1] & (size[0] > MAX_RW_BYTES))
        if bad is not None:
            raise _refuse(
                first_row + bad,
                "size",
                int(size[0][bad]),
                f"is more than one read or write moves on Linux ({MAX_RW_BYTES:,} B)",
            )
    flags = _ints(batch, "flags")
    if flags is not None and "op" in batch.schema.names:
        bad = _first(_ops(batch, ("open",)) & flags[1] & (flags[0] < 0))
        if bad is not None:
            raise _refuse(first_row + bad, "flags", int(flags[0][bad]), "are not open(2) flags")
    return last_ts_ns


def checked_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches``, each checked (``check_batch``) as it passes. Raises ReplayError on the first bad value."""
    row, last = 0, None
    for batch in batches:
        last = check_batch(batch, row, last)
        row += batch.num_rows
        yield batch


def skip_notes(skipped_ops: Mapping[str, int]) -> list[str]:
    """One note per kind of row a plan does not replay (``BY_DESIGN`` kinds aside): how many, and why."""
    notes = []
    for kind, count in sorted(skipped_ops.items()):
        if kind in BY_DESIGN or not count:
            continue
        if kind.startswith("unsupported_"):
            why = f"the operation {kind[len('unsupported_') :]!r} is not one the replayer knows"
        else:
            why = _WHY.get(kind, kind.replace("_", " "))
        notes.append(f"{count} trace row(s) not replayed ({kind}): {why}")
    return notes


def refuse_skips(skipped_ops: Mapping[str, int]) -> None:
    """``--strict``: raise ReplayError when the plan skips any row not skipped by design."""
    notes = skip_notes(skipped_ops)
    if notes:
        more = f" (and {len(notes) - 1} more kind(s))" if len(notes) > 1 else ""
        raise ReplayError(
            f"{{option}}: {notes[0]}{more}; the replay would differ from the recording", option="strict", switch=True
        )


def refuse_file_and_directory(plan) -> None:
    """Raise ReplayError when ``plan`` opens a path as a file that it must also make, before the clock, as
    a directory (files are named below it) and never renames or removes: the replay would fail with "Is a
    directory" halfway. The usual cause is a ``/`` inside a recorded file name (an edited trace)."""
    dirs = set(plan.precreate_dirs)
    if not dirs:
        return
    t = plan.ops
    opens = t.kind == KIND["open"]
    as_file = opens & ((t.flags == NO_FLAGS) | ((t.flags & os.O_DIRECTORY) == 0))
    moved = is_any_of(t.kind, [KIND["rename"], KIND["unlink"]])
    renamed = {t.paths[i] for i in np.unique(np.r_[t.path[moved], t.new_path[moved]]).tolist() if i >= 0}
    for index in np.unique(t.path[as_file]).tolist():
        path = t.paths[index] if index >= 0 else None
        if path in dirs and path not in renamed:
            raise ReplayError(
                f"the trace opens {path} as a file and names files below it, so it must also be a "
                "directory: a '/' inside a recorded file name, or an edited trace? (replay refused "
                "before any I/O)"
            )


def _row_path_codes(batches: Iterable[pa.RecordBatch], names: dict[str, int]) -> np.ndarray:
    """One int32 code per trace row of the ``path`` column's record ``batches``: the index in ``names`` (a
    dict filled as new paths appear) of the recorded path, -1 where the row has none. Vectorised per batch:
    only each batch's dictionary is walked in Python."""
    parts = []
    for batch in batches:
        column = batch.column(batch.schema.get_field_index("path"))
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        dictionary = column.dictionary.to_pylist()
        to_code = np.array([names.setdefault(p, len(names)) if p else -1 for p in dictionary] + [-1], np.int32)
        indices = column.indices.fill_null(len(dictionary)).to_numpy(zero_copy_only=False)
        parts.append(to_code[indices])
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def _names_over_time(path: str, renames: list[tuple[str, str]]) -> set[str]:
    """Every name ``path`` takes through ``renames`` ((old, new) target-relative, in trace order), a renamed
    directory renaming what lies below it."""
    names, current = {path}, path
    for old, new in renames:
        if current == old or current.startswith(old + "/"):
            current = new + current[len(old) :]
            names.add(current)
    return names


def check_bound_paths(plan, batches: Iterable[pa.RecordBatch], strip_prefix: str | None) -> None:
    """Refuse a plan whose reads and writes land on another file than the one their trace rows name.

    The planner binds each read and write to a file through its own walk of
    the descriptors (opens, dups, closes, in the order they take effect);
    the tracer names each row's file from its own descriptor table. The two
    are independent, so a disagreement is a bug in one of them: a write
    bound to the wrong file would leave the strategies comparing a replay
    that is not the recording (the size checks after a run compare with the
    plan, so they cannot see it). ``plan`` is the posix plan (each
    operation's ``seq`` its trace row), ``batches`` the trace's ``path``
    column in row order. A row naming a file that the plan's file took
    through a rename (of itself or a directory above it) after opening it
    agrees. Rows without a recorded path (descriptors opened before the
    recording) are not checked. Cost: one int32 per trace row, then a
    vectorised comparison; names are compared in Python only for the
    distinct (recorded, planned) pairs that differ. Raises ReplayError
    naming the first row that disagrees.
    """
    t = plan.ops
    data = np.flatnonzero(((t.kind == READ) | (t.kind == WRITE)) & (t.path >= 0) & (t.seq >= 0))
    if not len(data):
        return
    recorded: dict[str, int] = {}
    codes = _row_path_codes(batches, recorded)
    seq = t.seq[data]
    seq_known = seq < len(codes)
    data, seq = data[seq_known], seq[seq_known]
    names = list(recorded)
    target = np.array([-1] * len(names) + [-1], np.int64)
    planned = {p: i for i, p in enumerate(t.paths)}
    for i, name in enumerate(names):
        rel = relative_target_path(name, strip_prefix)
        target[i] = planned.get(rel, -2) if rel else -1
    row_target = target[codes[seq]]
    wrong = np.flatnonzero((row_target != -1) & (row_target != t.path[data]))
    if not len(wrong):
        return
    moved = np.flatnonzero(t.kind == KIND["rename"])
    renames = [(t.paths[t.path[i]], t.paths[t.new_path[i]]) for i in moved if t.path[i] >= 0 and t.new_path[i] >= 0]
    pairs = np.unique(np.c_[codes[seq[wrong]], t.path[data[wrong]]], axis=0)
    for code, path_index in pairs.tolist():
        name = relative_target_path(names[code], strip_prefix)
        if name not in _names_over_time(t.paths[path_index], renames):
            first = int(seq[wrong][(codes[seq[wrong]] == code) & (t.path[data[wrong]] == path_index)][0])
            raise ReplayError(
                f"trace row {first} reads or writes {names[code]}, but the plan binds it to "
                f"{t.paths[path_index]}: the planner's descriptor walk disagrees with the trace (a bug; "
                "please report it with the trace; replay refused before any I/O)"
            )
