"""``ReplayOptions``: every option of a replay, with its default, in one place.

Single-node ``replay.replay`` and ``distributed.replay_distributed`` take
the same object (or the same keywords, which override its fields), the CLI
builds one from its flags, and the results document's ``options`` is its
JSON form. ``DEFAULT_QUEUE_DEPTH`` and ``DEFAULT_BUFFER_BYTES`` are the one
definition of those defaults (the CLI's ``--queue-depth`` and
``--buffer-size``, ``check``'s baselines, the io_uring executor).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ckpt_trace.errors import ReplayError

from . import strategies
from .writeback import WRITEBACK_MODES

#: io_uring requests in flight per worker (``--queue-depth``).
DEFAULT_QUEUE_DEPTH = 32
#: The aggregated strategy's aligned buffer (``--buffer-size``): inside the 1-4 MiB range arXiv 2512.24511
#: measured fastest.
DEFAULT_BUFFER_BYTES = 4 << 20
TIMINGS = ("asap", "original")
CACHE_STATES = ("recorded", "cold", "warm")
GPU_COPY_MODES = ("recorded", "pinned", "skip")
#: What ``--data`` accepts: ``unique`` (incompressible, the default) or ``recorded-ratio`` (``replayer.data``).
DATA_MODES = ("unique", "recorded-ratio")
#: Where reads land (``--read-memory``, ``replayer.engine``): as glibc's ``malloc`` would serve the recorded
#: operation's buffer (fresh from 32 MiB, reused below; the default), one ``reused`` resident buffer per
#: worker, or ``fresh`` pages each read faults in, as a read into newly mapped memory does.
READ_MEMORY_MODES = ("malloc", "reused", "fresh")


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay (everything but the trace, the target and the strategy); see ``replay.replay``'s
    docstring for each option's meaning. Frozen: ``dataclasses.replace`` makes a changed copy."""

    strip_prefix: str | None = None
    timing: str = "asap"
    force: bool = False
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    repeat: int | None = 1
    min_seconds: float = 0.0
    max_runs: int | None = None
    drop_caches: bool = False
    durable: bool = False
    verify: bool = False
    pack_files: bool = False
    fio: bool = False
    gpu_copies: str = "recorded"
    cache: str = "recorded"
    strict: bool = False
    data: str = "unique"
    read_memory: str = "malloc"
    writeback: str = "system"

    @classmethod
    def of(cls, options: ReplayOptions | None = None, **values) -> ReplayOptions:
        """``options`` (default: every default) with ``values`` replacing its fields. Raises ReplayError for a
        keyword that is no option."""
        unknown = sorted(set(values) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise ReplayError(f"unknown replay option {unknown[0]!r}")
        return dataclasses.replace(options or cls(), **values)

    def check(self, strategy: str) -> None:
        """Refuse, before anything is read, options a replay cannot take. Raises ReplayError."""
        if self.timing not in TIMINGS:
            raise ReplayError(f"unknown timing {self.timing!r} (choose from {', '.join(TIMINGS)})")
        if self.gpu_copies not in GPU_COPY_MODES:
            raise ReplayError(
                f"unknown {{option}} {self.gpu_copies!r} (choose from {', '.join(GPU_COPY_MODES)})", option="gpu_copies"
            )
        strategies.expand(strategy)  # ReplayError for an unknown name
        if self.repeat is not None and self.repeat < 1:
            raise ReplayError("{option} must be at least 1", option="repeat")
        if self.min_seconds < 0:
            raise ReplayError("{option} cannot be negative", option="min_seconds")
        if self.drop_caches and os.geteuid() != 0:
            raise ReplayError(
                "{option} needs root (it writes /proc/sys/vm/drop_caches)", option="drop_caches", switch=True
            )
        if self.data not in DATA_MODES:
            raise ReplayError(f"unknown {{option}} {self.data!r} (choose from {', '.join(DATA_MODES)})", option="data")
        if self.writeback not in WRITEBACK_MODES:
            raise ReplayError(
                f"unknown {{option}} {self.writeback!r} (choose from {', '.join(WRITEBACK_MODES)})", option="writeback"
            )
        if self.writeback == "recorded" and os.geteuid() != 0:
            raise ReplayError("{option} recorded needs root (it writes /proc/sys/vm)", option="writeback")
        if self.read_memory not in READ_MEMORY_MODES:
            raise ReplayError(
                f"unknown {{option}} {self.read_memory!r} (choose from {', '.join(READ_MEMORY_MODES)})",
                option="read_memory",
            )
        if self.cache not in CACHE_STATES:
            raise ReplayError(
                f"unknown {{option}} {self.cache!r} (choose from {', '.join(CACHE_STATES)})", option="cache"
            )
