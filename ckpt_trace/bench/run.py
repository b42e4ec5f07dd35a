"""``ckpt-trace bench``: run the matrix on the storage under a target directory.

Call order (the CLI's): ``make_matrix`` (``matrix``), ``check_output``
before anything runs, ``run_bench`` (one row per point), then
``write_outputs`` (``bench.arrow`` and one heat map per dimension pair).

Each point runs in fresh processes forked from this one, one per
``processes``, each writing (reading) its own file in a scratch directory that
``run_bench`` creates inside the target and removes at the end; nothing
else under the target is touched. fork(2) copies only the calling thread,
so call ``run_bench`` from a process with no other threads running (the
CLI's progress bar refreshes without a thread for this reason). The
processes set up untimed, meet at a barrier, and each times its own
stream; the point's elapsed time runs from the first start to the last end
(CLOCK_MONOTONIC is one clock for every process). A process that dies
during setup breaks the barrier, so the others give up at once. Files are
removed after each point, so the target needs room for one point at a time.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import tempfile
import time
from array import array
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_ready
from pathlib import Path

from ckpt_trace import config
from ckpt_trace.errors import BenchError
from ckpt_trace.iolayer.fio import fio_bytes_per_s
from ckpt_trace.iolayer.host import environment
from ckpt_trace.iolayer.ring import probe as probe_ring
from ckpt_trace.stats import median_index, percentiles_ns

from . import worker
from .matrix import BenchPoint, Matrix, describe, stream_bytes
from .results import TABLE_NAME, to_table, write_table

SCRATCH_PREFIX = ".ckpt-trace-bench-"


@dataclass(frozen=True)
class PointOutcome:
    """What one point measured (see ``results`` for each column's meaning); ``error`` set, figures empty,
    when the storage refused the configuration."""

    point: BenchPoint
    volume_bytes: int
    elapsed_s: float | None = None
    runs_elapsed_s: tuple[float, ...] = ()
    io_ops: int = 0
    latency_ns: dict = dataclasses.field(default_factory=dict)
    cpu_s: float | None = None
    error: str | None = None

    def row(self) -> dict:
        elapsed_s = self.elapsed_s
        figures = elapsed_s is not None
        return {
            **dataclasses.asdict(self.point),
            "volume_bytes": self.volume_bytes,
            "elapsed_s": elapsed_s,
            "runs_elapsed_s": list(self.runs_elapsed_s) or None,
            "throughput_bytes_per_s": self.volume_bytes / elapsed_s
            if elapsed_s is not None and elapsed_s > 0
            else None,
            "io_ops": self.io_ops if figures else None,
            "latency_p50_ns": self.latency_ns.get("p50"),
            "latency_p99_ns": self.latency_ns.get("p99"),
            "latency_max_ns": self.latency_ns.get("max"),
            "cpu_s": self.cpu_s,
            "error": self.error,
        }


def check_target(target: Path) -> int:
    """Create ``target`` if missing (its parent must exist: a mistyped path is refused, not built); return its
    block size (statvfs f_bsize). Raises BenchError."""
    if target.exists() and not target.is_dir():
        raise BenchError(f"target {target} exists and is not a directory")
    if not target.exists() and not target.parent.is_dir():
        raise BenchError(f"cannot use target {target}: directory {target.parent} does not exist")
    try:
        target.mkdir(exist_ok=True)
        return os.statvfs(target).f_bsize
    except OSError as err:
        raise BenchError(f"cannot use target {target}: {err.strerror}") from None


def check_output(output: Path, force: bool) -> None:
    """Refuse an output that is a file, or a non-empty directory without ``force``. Raises BenchError."""
    if output.exists() and not output.is_dir():
        raise BenchError(f"output {output} exists and is not a directory")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise BenchError(
            f"output {output} is not empty (pass {{option}} to overwrite its results)", option="force", switch=True
        )


def needed_bytes(matrix: Matrix) -> int:
    """Free space one point can need: its largest stream in every process, staging rounding, a margin."""
    largest = max(
        stream_bytes(p, matrix.volume_bytes) * p.processes + p.processes * matrix.aggregate_bytes
        for p in matrix.points()
    )
    return largest + config.BENCH_FREE_SPACE_MARGIN_BYTES


def run_bench(
    target: str | os.PathLike, matrix: Matrix, *, repeat: int = 1, fio: bool = False, progress=None
) -> tuple[list[dict], dict]:
    """Run every point of ``matrix`` ``repeat`` times on ``target``'s storage; return (rows, metadata).

    ``progress`` (optional) gets ``start(total_bytes, label)`` once and
    ``advance(bytes)`` after each run. ``fio`` also measures fio's
    sequential O_DIRECT write limit (``fio_write_bytes_per_s``) and, when
    reads are swept, its read limit (``fio_read_bytes_per_s``). Raises
    BenchError for a bad target, too little space, too little memory for the
    read points' destinations (the whole volume), a process that fails other
    than by the storage refusing its configuration (ENOSPC, EIO, a read that
    returned wrong bytes), fio missing or failing.
    """
    if repeat < 1:
        raise BenchError("{option} must be at least 1", option="repeat")
    if "uring" in matrix.values["engine"]:
        for depth in matrix.values["queue_depth"]:
            problem = probe_ring(depth)
            if problem:
                raise BenchError(f"{{option}} {depth}: {problem}", option="queue_depths")
    target = Path(target)
    block_bytes = check_target(target)
    if matrix.aggregate_bytes % block_bytes:
        raise BenchError(f"the aggregation buffer must be a multiple of the block size ({block_bytes} bytes)")
    free, needed = shutil.disk_usage(target).free, needed_bytes(matrix)
    if free < needed:
        raise BenchError(
            f"target {target} has {free / 2**20:.0f} MiB free; the bench needs "
            f"{needed / 2**20:.0f} MiB (lower --volume)"
        )
    points = matrix.points()
    reads = "read" in matrix.directions
    if reads:
        check_read_memory(matrix)
    began = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=target))
    try:
        fio_limit = _fio(scratch, matrix.volume_bytes) if fio and "write" in matrix.directions else None
        fio_read = _fio(scratch, matrix.volume_bytes, "read") if fio and reads else None
        context = _context()
        if progress is not None:
            progress.start(sum(stream_bytes(p, matrix.volume_bytes) * p.processes for p in points) * repeat, "bench")
        rows = [_measure(context, point, matrix, scratch, block_bytes, repeat, progress).row() for point in points]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    metadata = {
        "values": {name: list(values) for name, values in matrix.values.items()},
        "baseline": dataclasses.asdict(matrix.baseline),
        "volume_bytes": matrix.volume_bytes,
        "aggregate_bytes": matrix.aggregate_bytes,
        "block_bytes": block_bytes,
        "repeat": repeat,
        "environment": environment(target),
        "elapsed_s": time.monotonic() - began,
        "fio_write_bytes_per_s": fio_limit,
        "fio_read_bytes_per_s": fio_read,
    }
    return rows, metadata


def check_read_memory(matrix: Matrix) -> None:
    """Refuse read points whose destinations (the whole volume, as a restore holds the state dict) and
    staging buffers would not fit in the memory available now (sysconf _SC_AVPHYS_PAGES). Raises BenchError."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    needed = max(
        stream_bytes(p, matrix.volume_bytes) * p.processes + p.processes * (p.queue_depth + 1) * matrix.aggregate_bytes
        for p in matrix.points()
        if p.direction == "read"
    )
    if needed > available * config.BENCH_READ_MEMORY_FRACTION:
        raise BenchError(
            f"read points need {needed / 2**20:.0f} MiB of memory to read into; "
            f"{available / 2**20:.0f} MiB is available (lower --volume)"
        )


def _fio(scratch: Path, volume_bytes: int, rw: str = "write") -> float:
    limit = fio_bytes_per_s(scratch, str(volume_bytes), rw)
    if limit is None:
        raise BenchError("{option} needs fio on PATH (Debian: apt install fio)", option="fio", switch=True)
    return limit


def _context():
    """The fork context: a point's processes start in milliseconds and import nothing (see the module docstring)."""
    return multiprocessing.get_context("fork")


def _measure(
    context, point: BenchPoint, matrix: Matrix, scratch: Path, block_bytes: int, repeat: int, progress
) -> PointOutcome:
    """Run ``point`` ``repeat`` times; the outcome of the run with the median elapsed time."""
    runs = []
    for _ in range(repeat):
        outcome = _run_once(context, point, matrix, scratch, block_bytes)
        if progress is not None:
            progress.advance(outcome.volume_bytes)
        if outcome.error is not None:
            return outcome
        runs.append(outcome)
    median = runs[median_index([o.elapsed_s for o in runs])]
    return dataclasses.replace(median, runs_elapsed_s=tuple(o.elapsed_s for o in runs))


def _run_once(context, point: BenchPoint, matrix: Matrix, scratch: Path, block_bytes: int) -> PointOutcome:
    stream = stream_bytes(point, matrix.volume_bytes)
    barrier = context.Barrier(point.processes, timeout=config.BENCH_SETUP_TIMEOUT_S)
    processes, connections = [], []
    try:
        for index in range(point.processes):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(
                target=worker.child_main,
                daemon=True,
                name=f"ckpt-trace-bench-{index}",
                args=(
                    point,
                    str(scratch / f"writer{index}.data"),
                    stream,
                    matrix.aggregate_bytes,
                    block_bytes,
                    barrier,
                    sender,
                ),
            )
            process.start()
            sender.close()
            processes.append(process)
            connections.append(receiver)
        messages = _collect(connections, processes, barrier)
    except BaseException:  # Ctrl-C or a failure here: the writers stop now, not after their streams
        for process in processes:
            process.kill()
        raise
    finally:
        _reap(processes, connections)
        for path in scratch.glob("writer*.data"):
            path.unlink()
    return _combine(point, stream * point.processes, messages)


# A bench process's one message: ("ok", StreamResult), or ("unsupported" | "error" | "aborted", why).
_Message = tuple[str, worker.StreamResult | str]


def _collect(connections, processes, barrier) -> list[_Message]:
    """Every process's message, in order; one that dies without sending breaks the barrier so the rest stop."""
    messages: dict[int, _Message] = {}
    while len(messages) < len(processes):
        pending = [i for i in range(len(processes)) if i not in messages]
        wait_ready([connections[i] for i in pending] + [processes[i].sentinel for i in pending])
        for i in pending:
            try:
                if connections[i].poll():
                    messages[i] = connections[i].recv()
                    continue
            except EOFError:
                pass
            if not processes[i].is_alive():
                barrier.abort()
                messages[i] = ("error", f"a bench process exited with code {processes[i].exitcode} before reporting")
    return [messages[i] for i in range(len(processes))]


def _reap(processes, connections) -> None:
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
    for connection in connections:
        connection.close()


def _combine(point: BenchPoint, volume_bytes: int, messages: list[_Message]) -> PointOutcome:
    """One outcome from every process's message; BenchError when any failed for a reason other than refusal."""
    for kind, value in messages:
        if kind == "error":
            raise BenchError(f"bench point '{describe(point)}' failed: {value}")
    refused = [str(value) for kind, value in messages if kind == "unsupported"]  # (a str: why)
    if refused or any(kind != "ok" for kind, _ in messages):
        return PointOutcome(point, volume_bytes, error=refused[0] if refused else "a process did not start")
    results = [value for _, value in messages if isinstance(value, worker.StreamResult)]  # all: every kind is ok
    latencies = array("q")
    for result in results:
        latencies.frombytes(result.latencies_ns)
    elapsed_s = (max(r.end_ns for r in results) - min(r.start_ns for r in results)) / 1e9
    return PointOutcome(
        point,
        sum(r.stream_bytes for r in results),
        elapsed_s=elapsed_s,
        io_ops=sum(r.io_ops for r in results),
        latency_ns=percentiles_ns(latencies.tolist()),
        cpu_s=sum(r.cpu_s for r in results),
    )


def write_outputs(rows: list[dict], metadata: dict, matrix: Matrix, output: Path) -> dict[str, list[str] | str]:
    """Write ``output/bench.arrow`` and ``output/heatmap-<row>-<column>.png`` for each dimension pair
    (``heatmap-read-...`` for reads); return their paths. Raises BenchError when the output cannot be written."""
    from .heatmap import write_heatmaps

    try:
        output.mkdir(parents=True, exist_ok=True)
        table = to_table(rows, metadata)
        write_table(table, output / TABLE_NAME)
        heatmaps = write_heatmaps(table, matrix, output)
    except OSError as err:
        raise BenchError(f"cannot write the results to {output}: {err.strerror or err}") from None
    return {"table": str(output / TABLE_NAME), "heatmaps": [str(path) for path in heatmaps]}
