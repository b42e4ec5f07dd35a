"""The kernel's writeback thresholds while a command runs: the trace's ``writeback`` metadata.

When buffered writes start reaching the device depends on how much dirty page cache the kernel lets
accumulate: background writeback starts at ``nr_dirty_background_threshold`` dirty pages and writers are
throttled at ``nr_dirty_threshold`` (/proc/vmstat; Documentation/admin-guide/sysctl/vm.rst,
``dirty_background_ratio``/``_bytes`` and ``dirty_ratio``/``_bytes``). With the ratios (the default) both
are shares of the memory that can hold page cache, so they fall while a job holds memory: the same 1.5 GB
of checkpoint written by a 2-rank DCP save was flushed by its fsyncs in 0.75-0.77 s when recorded and in
0.86-1.06 s by a replay or a plain script holding little memory (the kernel's background threshold then
2.4 GB, above what was dirty; 0.68-0.94 s with 12 GiB held, the threshold 1.2 GB; 2026-11-29, 2-core VM).

``WritebackSampler`` reads both every ``SAMPLE_S`` on a thread of its own while the command runs and
says their least and largest values, with the sysctl settings; ``replay --writeback recorded`` sets the
least values for the replay's run (``replayer.writeback``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

VMSTAT = Path("/proc/vmstat")
SYSCTL = Path("/proc/sys/vm")
#: How often the thresholds are read while the command runs (s): one read of /proc/vmstat takes about 50 µs.
SAMPLE_S = 0.25
_KEYS = {"nr_dirty_background_threshold": "dirty_background_bytes", "nr_dirty_threshold": "dirty_bytes"}
SETTINGS = ("dirty_background_ratio", "dirty_background_bytes", "dirty_ratio", "dirty_bytes")


def thresholds() -> dict[str, int] | None:
    """{"dirty_background_bytes", "dirty_bytes"}: the kernel's current thresholds in bytes (/proc/vmstat,
    pages times the page size); None where /proc/vmstat does not give them."""
    try:
        text = VMSTAT.read_text()
    except OSError:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in _KEYS:
            found[_KEYS[name]] = int(value) * page
    return found if len(found) == len(_KEYS) else None


def settings() -> dict[str, int]:
    """The sysctl settings behind the thresholds (/proc/sys/vm), those that can be read."""
    values = {}
    for name in SETTINGS:
        try:
            values[name] = int((SYSCTL / name).read_text())
        except (OSError, ValueError):
            continue
    return values


class WritebackSampler:
    """Samples ``thresholds()`` every ``SAMPLE_S`` from ``start()`` to ``stop()``, on a daemon thread.

    Call order: ``start()`` before the command starts, ``stop()`` after it ended, then ``metadata()``.
    """

    def __init__(self) -> None:
        self._samples: list[dict[str, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._settings: dict[str, int] = {}

    def start(self) -> WritebackSampler:
        self._settings = settings()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="ckpt-trace-writeback", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        found = thresholds()
        if found is not None:
            self._samples.append(found)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    def metadata(self) -> dict | None:
        """The ``writeback`` metadata: {"source", "samples", "interval_s", "dirty_background_bytes": {"min",
        "max"}, "dirty_bytes": {"min", "max"}, "settings": {sysctl name: value}}; None with no sample."""
        if not self._samples:
            return None
        out: dict = {"source": "/proc/vmstat", "samples": len(self._samples), "interval_s": SAMPLE_S}
        for key in _KEYS.values():
            values = [sample[key] for sample in self._samples]
            out[key] = {"min": min(values), "max": max(values)}
        out["settings"] = self._settings
        return out


__all__ = ["SAMPLE_S", "SETTINGS", "WritebackSampler", "settings", "thresholds"]
