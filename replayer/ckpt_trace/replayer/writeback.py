"""``replay --writeback recorded``: the kernel's writeback thresholds of the recording, set for the replay.

A trace recorded by ``record`` says what the kernel's dirty-page thresholds were while the command ran (its
``writeback`` metadata, ``tracer.writeback``): background writeback starts above
``dirty_background_bytes`` and writers are throttled above ``dirty_bytes``. They follow the memory the job
held, so a replay that holds less lets more dirty pages wait for its fsyncs. A 2-rank DCP save of GPT-2-small
(1.5 GB) recorded while 10 GiB were held elsewhere (least background threshold 0.99 GB; fsyncs of 630 and 820
ms), replayed with ``--timing original``, 4 alternated pairs: each rank's window was 3.1-8.6 % long under the
machine's own thresholds (2.3 GB) and 0.0-2.8 % with ``--writeback recorded`` (2026-11-29, 2-core VM;
docs/verdicts.md).

``writeback_choice`` returns the context the runs go in: with ``recorded`` it writes the least recorded
thresholds to /proc/sys/vm/dirty_bytes and dirty_background_bytes (sysctl(8); root; system-wide, as
``--drop-caches`` is) and puts back the settings it found when the replay ends, failed, interrupted or not
(a replay killed with SIGKILL leaves them set: ``settings`` in the results say what they were).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from ckpt_trace.errors import ReplayError
from ckpt_trace.tracer import writeback as sampled

#: ``--writeback``: ``system`` (the machine's settings, untouched; the default) or ``recorded``.
WRITEBACK_MODES = ("system", "recorded")
SYSCTL = sampled.SYSCTL


def recorded_thresholds(metadata: dict) -> dict[str, int]:
    """{"dirty_background_bytes", "dirty_bytes"}: the least values the trace's ``writeback`` metadata
    recorded. Raises ReplayError for a trace without them."""
    found = metadata.get("writeback") or {}
    try:
        return {
            "dirty_background_bytes": int(found["dirty_background_bytes"]["min"]),
            "dirty_bytes": int(found["dirty_bytes"]["min"]),
        }
    except (TypeError, KeyError, ValueError):
        raise ReplayError(
            "{option} recorded: the trace does not say its writeback thresholds (recorded before "
            "ckpt-trace wrote the writeback metadata, or by another tool)",
            option="writeback",
        ) from None


def _write(name: str, value: int) -> None:
    (SYSCTL / name).write_text(f"{value}\n")


@contextlib.contextmanager
def thresholds_set(values: dict[str, int]) -> Iterator[dict[str, int]]:
    """Within the block, the kernel's thresholds are ``values`` (bytes); yields the settings found before,
    which are put back after (a ratio where the bytes setting was 0, else the bytes). Raises ReplayError
    when /proc/sys/vm cannot be written."""
    before = sampled.settings()
    try:
        _write("dirty_bytes", max(values["dirty_bytes"], 2 * os.sysconf("SC_PAGE_SIZE")))
        _write("dirty_background_bytes", max(values["dirty_background_bytes"], 1))
    except OSError as err:
        _restore(before)
        raise ReplayError(
            f"{{option}} recorded: cannot set {SYSCTL}: {err.strerror or err}", option="writeback"
        ) from None
    try:
        yield before
    finally:
        _restore(before)


def _restore(before: dict[str, int]) -> None:
    """Put back what ``sampled.settings`` read: each pair by its bytes setting where it was set, else its
    ratio (writing one of a pair zeroes the other, sysctl/vm.rst)."""
    for ratio, size in (("dirty_ratio", "dirty_bytes"), ("dirty_background_ratio", "dirty_background_bytes")):
        with contextlib.suppress(OSError):
            if before.get(size):
                _write(size, before[size])
            elif ratio in before:
                _write(ratio, before[ratio])


def writeback_choice(mode: str, metadata: dict) -> tuple[contextlib.AbstractContextManager, dict, str | None]:
    """(the context the runs go in, the results' options about writeback, a note for each result or None)
    for ``--writeback mode`` (checked by ``ReplayOptions.check``). Raises ReplayError for ``recorded`` on a
    trace without the thresholds."""
    if mode != "recorded":
        return contextlib.nullcontext(), {"writeback": mode}, None
    values = recorded_thresholds(metadata)
    machine = sampled.thresholds() or {}
    note = (
        f"writeback as recorded: background writeback from {values['dirty_background_bytes'] / 1e6:,.0f} MB of "
        f"dirty pages, writers throttled from {values['dirty_bytes'] / 1e6:,.0f} MB (this machine's own: "
        f"{machine.get('dirty_background_bytes', 0) / 1e6:,.0f} and {machine.get('dirty_bytes', 0) / 1e6:,.0f} "
        "MB), set for the runs and put back after"
    )
    return thresholds_set(values), {"writeback": mode, "writeback_bytes": values}, note


__all__ = ["WRITEBACK_MODES", "recorded_thresholds", "thresholds_set", "writeback_choice"]
