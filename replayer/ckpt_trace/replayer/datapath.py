"""How a strategy moves data: the ``DataPath`` protocol, and the ``WorkerIO`` the engine hands it.

The engine (``replayer.engine.Executor``) replays a plan: worker threads,
descriptors by handle, dependencies, pacing, metadata operations, recorded
mappings, in-kernel copies and host<->device copies, counting everything.
It never branches on a strategy. What differs between strategies is how
the bytes of reads and writes reach the file, and that is one object given
to the engine: a ``DataPath`` (posix's in ``replayer.posix``, io_uring's in
``replayer.uring``, cuFile's in ``replayer.gds``, mappings' in
``replayer.strategies.mmap``), built from the I/O layer (``iolayer.ring.Ring``,
``iolayer.buffers.AlignedBuffer``, ``iolayer.mapping.FileMapping``).
The shape follows torch DCP's ``StorageWriter`` and fio's ``ioengine_ops``:
one documented call order, no private hooks. ``DataPathDefaults`` holds the
methods of a data path that changes nothing at that step (a data path
inherits it and overrides the rest).

Call order, per executor (one ``prepare``, one run):

1. ``batchable(plan, rows)``, while the engine cuts each worker's rows into
   runs before the clock (pure: reads only the plan);
2. ``prepare(plan)``, once, before the clock (after the target is made);
3. during the run, from the worker threads (several at once: a data path
   that keeps state guards it):
   - ``open_flags(flags)`` before each open of a file (not a directory) and
     ``opened(handle, path, flags)`` after it succeeded; ``setfl_flags(flags)``
     before each fcntl(F_SETFL); ``released(handle)`` after a recorded close
     or munmap released a descriptor;
   - ``submit(io, requests, rows, queue)`` for each run of batchable rows
     (the request array ``io.requests`` built);
   - ``transfer(io, op, row)`` for each read or write run one at a time;
4. ``finish()``, once after the run, whether it succeeded or not: release
   what the run made; the notes it returns go into the result.

Errors: ``submit`` and ``transfer`` raise OSError for a failed call (the
engine names the operation in one line: a full disk, a refused symbolic
link, ...), KeyError for a descriptor never opened (``io.fd``) and
ReplayError otherwise; ``prepare`` raises ReplayError. Errors inside a
run's results (``Submitted.results`` < 0) are the engine's to report.

``DATA_PATHS`` names the ways a read or write reaches the file; a data path
says which one its one-at-a-time transfers take (``path_code``), and the
engine counts a run's requests by its descriptors (O_DIRECT or not) and
whether a ring ran them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from ckpt_trace.errors import ReplayError

if TYPE_CHECKING:
    from ckpt_trace.iolayer.buffers import AlignedBuffer
    from ckpt_trace.iolayer.mapping import FileMapping
    from ckpt_trace.iolayer.ring import Ring

    from .data import Pregenerated
    from .optable import PlanOp
    from .plan import ReplayPlan

#: The ways a read or write reaches the file, as the results count them (``ReplayResult.data_paths``): a
#: system call or an io_uring request, each through the page cache or with O_DIRECT (the descriptor's flags,
#: fcntl(2) F_GETFL); pages touched through a mapping; cuFile; an in-kernel copy made by its call.
DATA_PATHS = (
    "syscall_buffered",
    "syscall_direct",
    "io_uring_buffered",
    "io_uring_direct",
    "mapped",
    "cufile",
    "in_kernel_copy",
)


class Submitted(NamedTuple):
    """What ``DataPath.submit`` returns: per request the result (bytes moved, or -errno) and the latency
    (ns), and whether an io_uring ring ran them (else system calls: the counts' data path)."""

    results: np.ndarray
    latencies: np.ndarray
    via_uring: bool


class WorkerIO(Protocol):
    """What the engine gives a data path of one worker thread during a run: its buffers, descriptors, rings
    and counters. Every method may be called only from that worker's thread.

    ``plan``: the plan being run; ``buffer_bytes``: the worker's buffer size (a larger request is cut into
    pieces of it); ``write_buf``/``read_buf`` (and their ``write_view``/``read_view``): page-aligned buffers
    of at least ``buffer_bytes``, the first for a write's generated data, the second scratch for reads
    (``read_target`` says where each read goes); ``data``: the
    replay data made before the clock (``replayer.data``; None: generate it, ``iolayer.pattern.fill``).
    """

    plan: ReplayPlan
    buffer_bytes: int
    write_buf: AlignedBuffer
    read_buf: AlignedBuffer
    write_view: memoryview
    read_view: memoryview
    data: Pregenerated | None

    def fd(self, handle: int | None) -> int:
        """The descriptor open for a plan handle. Raises KeyError when it was never opened (or is None)."""
        ...

    def requests(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The request array (``iolayer.ring.REQUEST_DTYPE``) of the read and write ``rows`` at known offsets,
        each cut at ``buffer_bytes`` (a write's addr is its content offset and user_data its pattern key:
        its bytes are generated as ``issue`` issues it; or where ``data`` holds them, their address and
        ``replayer.data.PREGENERATED``; a read's addr is ``read_buf``'s and user_data its operation's size, by
        which ``issue`` places it), and for each request the index into ``rows`` it came from."""
        ...

    def read_target(self, size: int, op_bytes: int) -> memoryview:
        """Where a read of ``size`` bytes (at most ``buffer_bytes``) of an operation of ``op_bytes`` lands:
        ``read_view``'s start, or where that operation's reads go fresh (``replay --read-memory``,
        ``replayer.engine``) pages no read filled since they were released."""
        ...

    def issue(self, requests: np.ndarray, ring: Ring | None = None, queue: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """(results, latencies) of ``requests`` through ``ring`` (None: the I/O layer's C loop of system
        calls, ``ring.pio_run``), generating writes' bytes into slots as each is issued; ``queue`` keys the
        slots of a ring."""
        ...

    def ring(self, key: int, queue_depth: int) -> Ring:
        """This worker's ring ``key``, made at first use ``queue_depth`` deep and closed when the worker ends.
        Raises what ``Ring`` raises (``RingUnavailable``, OSError)."""
        ...

    def queue_ring(self, queue: int) -> Ring | None:
        """This worker's ring of a recorded io_uring/libaio queue, as deep as recorded; None where io_uring is
        unavailable (noted once: the requests then run as system calls)."""
        ...

    def through_mapping(self, op: PlanOp, mapping: FileMapping) -> int:
        """Bytes of ``op`` (a read or write at ``op.offset``) copied out of or into ``mapping`` (a write: the
        file's replay data), piece by piece through this worker's buffers; fewer at the mapping's end."""
        ...

    def complete(
        self,
        requests: np.ndarray,
        results: np.ndarray,
        latencies: np.ndarray,
        rows: np.ndarray,
        *,
        via_uring: bool,
        data_ops: int,
        metadata_ops: int = 0,
    ) -> int:
        """Count completed ``requests`` (``rows``: the plan row of each; consecutive requests of one row are
        one operation): bytes, latencies, data paths by descriptor, progress. Returns the bytes moved."""
        ...

    def count_unaligned(self) -> None:
        """Count one operation that could not go the data path's aligned way (``ReplayResult.unaligned_ops``)."""
        ...

    def note(self, text: str) -> None:
        """A note for the result (each text once)."""
        ...


class DataPath(Protocol):
    """How one strategy moves the bytes of reads and writes; see the module docstring for the call order.

    ``name``: the strategy (its results' name). What the engine replays as recorded and what it leaves to
    the data path: ``maps_files`` (recorded mmap/msync/munmap through mappings; else a mapping's pages are
    reads and writes of this path and msync an fdatasync), ``queues_as_recorded`` (a recorded io_uring or
    libaio queue's requests through a ring of its recorded depth), ``kernel_copies`` (sendfile,
    copy_file_range, splice by their call; else a read and a write of this path).
    ``separates_reads_and_writes``: a run never mixes reads and writes (its requests run concurrently).
    ``path_code``: the ``DATA_PATHS`` index of every ``transfer`` (None: by the descriptor's O_DIRECT flag).
    """

    name: str
    maps_files: bool
    queues_as_recorded: bool
    kernel_copies: bool
    separates_reads_and_writes: bool
    path_code: int | None

    def batchable(self, plan: ReplayPlan, rows: slice) -> np.ndarray:
        """Which of ``rows`` (of ``plan.ops``) may be part of a run handed to ``submit`` (bool per row). Pure."""
        ...

    def prepare(self, plan: ReplayPlan, data: Pregenerated | None = None) -> None:
        """Set up before the clock (device buffers, ...); ``data``: the replay data the engine made for the run
        (``replayer.data``; None: none). Raises ReplayError."""
        ...

    def open_flags(self, flags: int) -> int:
        """The flags to open a file (not a directory) with, from the recorded ones (host ``os.O_*``)."""
        ...

    def setfl_flags(self, flags: int) -> int:
        """The status flags for a recorded fcntl(F_SETFL), from the recorded ones."""
        ...

    def opened(self, handle: int, path: str, flags: int) -> None:
        """A file (not a directory) was opened for ``handle`` at target-relative ``path`` with ``flags``."""
        ...

    def released(self, handle: int) -> None:
        """A recorded close or munmap released ``handle``'s descriptor."""
        ...

    def submit(self, io: WorkerIO, requests: np.ndarray, rows: np.ndarray, queue: int) -> Submitted:
        """Run ``requests`` (``rows``: the plan row of each; ``queue``: the run's recorded queue, or
        ``optable.NONE``) to completion. Raises OSError, KeyError, ReplayError."""
        ...

    def transfer(self, io: WorkerIO, op: PlanOp, row: int) -> int | None:
        """Move one read or write (``op``, at ``row`` of the plan; ``op.offset`` None: at the descriptor's
        position, which it then advances). Returns the bytes moved, which the engine counts as one operation
        on ``path_code``, or None when the data path submitted requests and counted them (``io.complete``).
        Raises OSError, KeyError, ReplayError."""
        ...

    def finish(self) -> list[str]:
        """Release what the run made (called after every run, failed or not); the notes for the result."""
        ...


class DataPathDefaults:
    """What a ``DataPath`` does where it changes nothing (a data path takes these and overrides the rest):
    nothing is batchable, nothing to prepare or finish, the recorded flags as they are, no bookkeeping per
    descriptor. ``submit`` raises ReplayError, since with nothing batchable the engine never calls it."""

    name: str

    def batchable(self, plan: ReplayPlan, rows: slice) -> np.ndarray:
        del plan  # every data path's signature
        return np.zeros(rows.stop - rows.start, dtype=bool)

    def prepare(self, plan: ReplayPlan, data: Pregenerated | None = None) -> None:
        del plan, data

    def open_flags(self, flags: int) -> int:
        return flags

    def setfl_flags(self, flags: int) -> int:
        return flags

    def opened(self, handle: int, path: str, flags: int) -> None:
        del handle, path, flags

    def released(self, handle: int) -> None:
        del handle

    def submit(self, io: WorkerIO, requests: np.ndarray, rows: np.ndarray, queue: int) -> Submitted:
        del io, requests, rows, queue
        raise ReplayError(f"the {self.name} data path runs no runs of requests (nothing is batchable)")

    def finish(self) -> list[str]:
        return []


__all__ = ["DATA_PATHS", "DataPath", "DataPathDefaults", "Submitted", "WorkerIO"]
