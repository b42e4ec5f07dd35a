"""Replay results: what one strategy's run measured, and its JSON form."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ckpt_trace import config
from ckpt_trace.stats import LatencyHistogram
from ckpt_trace.version import __version__


@dataclass
class ReplayResult:
    """Measurements of one replay run.

    Throughputs are bytes per second of wall time (``elapsed_s``, from the
    first to the last operation, pre-creation excluded). ``latency_ns``
    covers data operations (read, write). CPU seconds are the replaying
    process's user and system time over the run (getrusage(2)).
    ``unaligned_ops`` counts reads and writes O_DIRECT could not take
    (uring-direct); ``speedup_vs_posix`` is posix's ``elapsed_s`` divided by
    this run's, when posix ran in the same invocation. ``runs_elapsed_s``
    holds every repeat's elapsed time when the result is the median of several,
    ``runs_p99_latency_ns`` every repeat's p99;
    ``verified_files`` how many files ``--verify`` checked (None without it);
    ``metadata_ops_saved`` the operations ``--pack-files`` removed; ``notes``
    what the run could not do as recorded (O_DIRECT refused by the target...);
    ``preallocated_files`` the files reserved at their final size with
    fallocate(2) when created (the aggregated strategy). ``gpu_copies``, for
    traces with host<->device copy rows: ``mode`` (recorded, pinned, skip),
    ``executed`` and ``skipped`` copies, ``bytes`` copied, ``elapsed_s`` spent
    copying (inside ``elapsed_s``), ``skipped_why``; None without copy rows.
    ``latency_histogram`` (``stats.LatencyHistogram``, not in the JSON form)
    is kept by runs of a distributed replay, whose processes merge their
    latencies through it. ``data_paths``: operations and bytes by the way
    they reached the file (``posix.DATA_PATHS``: system call or io_uring,
    page cache or O_DIRECT by the descriptor's status flags, or a mapping);
    the JSON form adds the shares through io_uring, through O_DIRECT and
    through the path the strategy's name promises (``Strategy.named_path``), and
    ``off_named_path`` when that path carried less than
    ``config.REPLAY_NAMED_PATH_MIN_SHARE`` of the bytes. ``file_bytes``
    (internal): (written, read) bytes per file path, checked after each run.
    ``speedup``: over posix, from paired rounds (``replayer.verdicts``:
    median, low, high, coverage, n, verdict), None without posix;
    ``versus``: the same over every other strategy of the replay, by name.
    ``timing`` (``--timing original``): the per-operation start error's
    median and p99 as a share of the job's recorded I/O window, per rank
    the replayed window against the recorded one, and where the error comes
    from: the share of operations whose thread was still busy past their
    start, and the error of those it waited for (``RunState.timing_figures``).
    ``phases``: ``save`` (the writes) and ``load`` (the reads), each with its
    bytes, its time from the first such operation's start to the last one's
    end, its throughput, and per rank the same with the slowest rank and its
    time (``RunState.phase_figures``): a trace holding a save and a load
    reports each apart, and the slowest rank's save time as MLPerf Storage does.
    """

    strategy: str
    elapsed_s: float
    bytes_written: int
    bytes_read: int
    data_ops: int
    metadata_ops: int
    latency_ns: dict[str, int]
    cpu_user_s: float
    cpu_sys_s: float
    skipped_ops: dict[str, int] = field(default_factory=dict)
    unaligned_ops: int = 0
    speedup_vs_posix: float | None = None
    runs_elapsed_s: list[float] = field(default_factory=list)
    runs_p99_latency_ns: list[int] = field(default_factory=list)
    verified_files: int | None = None
    metadata_ops_saved: int = 0
    notes: list[str] = field(default_factory=list)
    preallocated_files: int = 0
    gpu_copies: dict | None = None
    latency_histogram: LatencyHistogram | None = field(default=None, repr=False, compare=False)
    data_paths: dict[str, dict[str, int]] = field(default_factory=dict)
    speedup: dict | None = None
    timing: dict | None = None
    phases: dict = field(default_factory=dict)
    versus: dict[str, dict] = field(default_factory=dict)
    file_bytes: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False, compare=False)
    timing_samples: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def named_path(self) -> str | None:
        """The data path the strategy's name promises (``Strategy.named_path``), None for posix (as recorded)
        and for a name the strategy table does not know (results of another version)."""
        spec = self._strategy()
        return spec.named_path if spec is not None else None

    def _strategy(self):
        from .strategies import find  # imported here: the strategy modules import the executors, which import us

        return find(self.strategy)

    def path_shares(self) -> dict[str, float | None]:
        """Shares of operations and bytes through io_uring, through O_DIRECT, and through the named path
        (None where nothing moved)."""
        paths = self.data_paths
        ops = sum(p["ops"] for p in paths.values())
        moved = sum(p["bytes"] for p in paths.values())

        def share(names: tuple[str, ...], key: str, total: int) -> float | None:
            return sum(paths.get(n, {}).get(key, 0) for n in names) / total if total else None

        uring, direct = ("io_uring_buffered", "io_uring_direct"), ("syscall_direct", "io_uring_direct")
        spec = self._strategy()
        named = spec.named_path_members if spec is not None else ()
        return {
            "io_uring_ops_share": share(uring, "ops", ops),
            "io_uring_bytes_share": share(uring, "bytes", moved),
            "o_direct_ops_share": share(direct, "ops", ops),
            "o_direct_bytes_share": share(direct, "bytes", moved),
            "named_path_ops_share": share(named, "ops", ops) if named else None,
            "named_path_bytes_share": share(named, "bytes", moved) if named else None,
        }

    @property
    def off_named_path(self) -> bool:
        """Whether the named path carried less than ``config.REPLAY_NAMED_PATH_MIN_SHARE`` of the bytes."""
        share = self.path_shares()["named_path_bytes_share"]
        return share is not None and share < config.REPLAY_NAMED_PATH_MIN_SHARE

    @property
    def write_throughput_bytes_per_s(self) -> float:
        return self.bytes_written / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def read_throughput_bytes_per_s(self) -> float:
        return self.bytes_read / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict:
        data = asdict(dataclasses.replace(self, latency_histogram=None))
        data.pop("latency_histogram")  # internal: how processes of a distributed replay merge latencies
        data.pop("file_bytes")  # internal: checked after each run (``replay.check_file_bytes``)
        data.pop("timing_samples")  # internal: how processes of a distributed replay merge ``timing``
        data["named_path"] = self.named_path
        data.update(self.path_shares())
        data["off_named_path"] = self.off_named_path
        runs = self.runs_elapsed_s or [self.elapsed_s]
        data["elapsed_spread_s"] = {
            "median": float(np.median(runs)),
            "min": min(runs),
            "max": max(runs),
            "runs": len(runs),
        }
        data["write_throughput_bytes_per_s"] = self.write_throughput_bytes_per_s
        data["read_throughput_bytes_per_s"] = self.read_throughput_bytes_per_s
        return data


class Replayed(Protocol):
    """What a replay's results document is made of (``replay.ReplayReport``, ``distributed.DistributedReport``)."""

    @property
    def trace(self) -> Path: ...
    @property
    def trace_sha256(self) -> str | None: ...
    @property
    def target(self) -> Path: ...
    @property
    def environment(self) -> dict: ...
    @property
    def options(self) -> dict: ...
    @property
    def results(self) -> Sequence[ReplayResult]: ...


def results_document(report: Replayed, fio_write_bytes_per_s: float | None = None) -> dict:
    """The results document (``documents.ReplayDoc``) that single-node and distributed replay both write: the
    trace (path and sha256, which ties the results to it), the target, the tool, where it ran, the options and
    one entry per result (``ReplayResult.to_json``); a distributed replay adds its ``distributed`` key."""
    return {
        "trace": str(report.trace),
        "trace_sha256": report.trace_sha256,
        "target": str(report.target),
        "creator": "ckpt-trace",
        "creator_version": __version__,
        "environment": report.environment,
        "options": report.options,
        "fio_write_bytes_per_s": fio_write_bytes_per_s,
        "results": [result.to_json() for result in report.results],
    }
