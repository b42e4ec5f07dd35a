"""One io_uring per thread, with batched submission: the ring the replayer, the writer and the bench share.

The kernel interface is ``_ring.c`` (built by the project's install, loaded
here with ctypes; ctypes releases the GIL around each call). Two ways to use
a ``Ring``, both by its owning thread only:

- **request by request** (the checkpoint writer and reader, the bench's
  aggregated streams): ``submit`` stages a request and enters the kernel
  once ``batch_size`` are staged (1, the default: at once), or at the next
  ``flush``, ``wait`` or ``drain``; ``wait`` returns one completed
  ``Request``; ``drain(key)`` waits for every request of one key (a buffer,
  a file handle) or, without a key, for all; ``close``.
- **a whole batch** (the replayer, the bench's plain streams): ``run(batch)``
  issues an array of independent requests with at most ``queue_depth`` in
  flight, entirely in C, and returns each request's result and latency.

Failures are one rule everywhere: a request that fails raises ``OSError``
with its errno; a write that moves fewer bytes than asked raises
``OSError(ENOSPC)`` (a regular file takes a short write only when it cannot
grow: disk full, quota, file size limit; write(2)); a short read is not an
error (end of file). ``drain`` reaps every request in flight before it raises
the first failure, so the caller's buffers are free afterwards.

The latency hook: a ``Ring(latency_sink=array('q'))`` appends, per request,
nanoseconds from its entering the kernel to the reaping of its completion.

References: io_uring(7), io_uring_setup(2), io_uring_enter(2),
io_uring_register(2); include/uapi/linux/io_uring.h for the opcodes.
"""

from __future__ import annotations

import _ctypes
import ctypes
import errno
import os
import struct
import sys
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from . import ring_build

if TYPE_CHECKING:
    from .posix_ring import PosixRing

# include/uapi/linux/io_uring.h, enum io_uring_op (stable ABI).
OP_NOP, OP_READV, OP_WRITEV, OP_FSYNC, OP_READ_FIXED, OP_WRITE_FIXED = 0, 1, 2, 3, 4, 5
OP_READ, OP_WRITE = 22, 23
FSYNC_DATASYNC = 1  # IORING_FSYNC_DATASYNC
REGISTER_BUFFERS, UNREGISTER_BUFFERS, REGISTER_FILES, UNREGISTER_FILES = 0, 1, 2, 3
REGISTER_PROBE = 8
IO_URING_OP_SUPPORTED = 1  # struct io_uring_probe_op.flags
SETUP_BEST = 0xFFFFFFFF  # _ring.c: SINGLE_ISSUER | DEFER_TASKRUN, else COOP_TASKRUN, else none
MAX_ENTRIES = 32768  # IORING_MAX_ENTRIES (io_uring/io_uring.c): io_uring_setup refuses more without CLAMP
POSITION = (1 << 64) - 1  # offset -1: the file position (IORING_FEAT_RW_CUR_POS)

#: One request as _ring.c reads it (``ckr_req``, 40 bytes).
REQUEST_DTYPE = np.dtype(
    [
        ("opcode", "u1"),
        ("sqe_flags", "u1"),
        ("buf_index", "u2"),
        ("fd", "i4"),
        ("addr", "u8"),
        ("len", "u4"),
        ("op_flags", "u4"),
        ("off", "u8"),
        ("user_data", "u8"),
    ]
)
_CQE_DTYPE = np.dtype([("user_data", "u8"), ("res", "i4"), ("flags", "u4")])
#: One piece of ``copy_mapped``: ``ckr_piece`` of _ring.c (32 bytes).
PIECE_DTYPE = np.dtype([("dst", "u8"), ("offset", "u8"), ("size_bytes", "u8"), ("check", "u4"), ("crc", "u4")])
_SQE = struct.Struct("<BBHiQIIQQ")  # REQUEST_DTYPE, packed one by one on the request-by-request path
assert _SQE.size == REQUEST_DTYPE.itemsize
_KINDS = {"read": OP_READ, "write": OP_WRITE, "fsync": OP_FSYNC, "fdatasync": OP_FSYNC}

_LIBRARY = Path(__file__).with_name(ring_build.LIBRARY_NAME)  # built from _ring.c by ring_build
#: The interface version this module binds: ``CKR_ABI_VERSION`` of ``_ring.c``; bumped with it whenever a
#: signature or ``ckr_req`` changes. A library reporting another version (or none: built before the
#: check existed) is rebuilt from the source beside it, or refused (``library``).
ABI_VERSION = 6
_REBUILD = (
    "reinstall ckpt-trace-runtime, or in a source tree: 'python scripts/build_ring.py' (needs cc, linux-libc-dev)"
)
_lib: ctypes.CDLL | None = None


class RingUnavailable(OSError):
    """The ring cannot be used here: the library is not built or is stale, or the kernel refuses io_uring."""


def library() -> ctypes.CDLL:
    """The compiled ``_ring.c`` (``libckpt_ring.so.1``), bound once per process.

    A library that is missing, or was built from another version of
    ``_ring.c`` than this module's ``ABI_VERSION`` (stale: calling it could
    corrupt memory), is rebuilt from the ``_ring.c`` beside it
    (``ring_build``). Raises RingUnavailable (one line) when that cannot be
    done: no source, no compiler, a read-only install.
    """
    global _lib
    if _lib is None:
        try:
            _lib = load_library(_LIBRARY)
        except RingUnavailable as err:
            source = _LIBRARY.with_name(ring_build.SOURCE_NAME)
            if not source.exists():
                raise
            try:
                ring_build.compile_library(source, _LIBRARY)
            except (ring_build.BuildFailed, OSError) as build:
                raise RingUnavailable(err.errno, f"{err.strerror}; rebuilding it failed: {build}") from None
            _lib = load_library(_LIBRARY)
    return _lib


def load_library(path: Path) -> ctypes.CDLL:
    """Load and bind the ring library at ``path`` after checking its ABI version. Raises RingUnavailable
    when the file is missing or reports another ABI version than ``ABI_VERSION`` (it is unloaded again)."""
    if not path.exists():
        raise RingUnavailable(errno.ENOENT, f"{path.name} is not built ({_REBUILD})")
    try:
        lib = ctypes.CDLL(str(path), use_errno=True)
    except OSError as err:  # dlopen(3) refused it: another architecture, a missing dependency, a bad file
        raise RingUnavailable(errno.ELIBBAD, f"{path} cannot be loaded: {err}") from None
    try:
        version_of = lib.ckr_abi_version
    except AttributeError:
        version = None
    else:
        version_of.argtypes, version_of.restype = [], ctypes.c_int
        version = version_of()
    if version != ABI_VERSION:
        _ctypes.dlclose(lib._handle)  # so that a rebuilt library of the same name loads afresh
        raise RingUnavailable(
            errno.ELIBBAD,
            f"{path} is stale: built for ring ABI version "
            f"{'1 or older' if version is None else version}, this ckpt-trace "
            f"needs version {ABI_VERSION} ({_REBUILD})",
        )
    vp, u, i, sz, p = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
    lib.ckr_setup.argtypes, lib.ckr_setup.restype = [u, u, ctypes.POINTER(vp)], i
    lib.ckr_exit.argtypes, lib.ckr_exit.restype = [vp], None
    for name in ("ckr_sq_entries", "ckr_cq_entries", "ckr_features", "ckr_setup_flags"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [vp], u
    lib.ckr_fd.argtypes, lib.ckr_fd.restype = [vp], i
    lib.ckr_register.argtypes, lib.ckr_register.restype = [vp, u, p, u], i
    lib.ckr_submit.argtypes, lib.ckr_submit.restype = [vp, p, u, u], i
    lib.ckr_reap.argtypes, lib.ckr_reap.restype = [vp, p, u, u], i
    lib.ckr_run.argtypes, lib.ckr_run.restype = [vp, p, sz, u, p, p, i], ctypes.c_long
    lib.ckr_pio_run.argtypes, lib.ckr_pio_run.restype = [p, sz, p, p, i], ctypes.c_long
    lib.ckr_run_gen.argtypes, lib.ckr_run_gen.restype = [vp, p, sz, u, p, p, i, p], ctypes.c_long
    lib.ckr_pio_run_gen.argtypes, lib.ckr_pio_run_gen.restype = [p, sz, p, p, i, p], ctypes.c_long
    u64 = ctypes.c_uint64
    lib.ckr_fill.argtypes, lib.ckr_fill.restype = [p, u64, u64, u64], None
    lib.ckr_set_unique_bytes.argtypes, lib.ckr_set_unique_bytes.restype = [u64], u64
    lib.ckr_load_acquire_u64.argtypes, lib.ckr_load_acquire_u64.restype = [p], ctypes.c_uint64
    lib.ckr_store_release_u64.argtypes, lib.ckr_store_release_u64.restype = [p, ctypes.c_uint64], None
    lib.ckr_fence_acquire.argtypes, lib.ckr_fence_acquire.restype = [], None
    lib.ckr_copy_mapped.argtypes, lib.ckr_copy_mapped.restype = [i, p, sz, p, u64, u64, i, p], ctypes.c_long
    lib.ckr_fused_crc_copy.argtypes, lib.ckr_fused_crc_copy.restype = [], i
    lib.ckr_copy_crc32.argtypes = [p, p, u64, ctypes.c_uint32, p, i]
    lib.ckr_copy_crc32.restype = ctypes.c_uint32
    return lib


class _Gen(ctypes.Structure):
    """``ckr_gen`` of _ring.c."""

    _fields_ = [
        ("flags", ctypes.c_void_p),
        ("slots", ctypes.c_void_p),
        ("slot_bytes", ctypes.c_uint64),
        ("nslots", ctypes.c_uint32),
    ]


class Slots:
    """Buffers that generated writes are filled into just before they are issued (``run``/``pio_run`` with
    ``generate``): ``count`` page-aligned buffers of ``slot_bytes`` each (rounded up to whole pages), every page
    touched at creation with ``prefault`` (else at its first use). A write occupies a slot while it is in
    flight, so at most ``count`` generated writes are; a freed slot is the next one taken (last in, first
    out: the few slots a shallow queue uses stay in the CPU's cache). ``close`` when no run uses them."""

    def __init__(self, slot_bytes: int, count: int, *, prefault: bool = True) -> None:
        from .buffers import PAGE_BYTES, AlignedBuffer

        if not 1 <= count < 0xFFFF:
            raise ValueError(f"slot count {count} outside 1-65534")
        self.slot_bytes = max(PAGE_BYTES, -(-slot_bytes // PAGE_BYTES) * PAGE_BYTES)
        self.count = count
        self.buffer = AlignedBuffer(self.slot_bytes * count)
        if prefault:
            self.buffer.prefault()

    def spec(self, generate: np.ndarray) -> tuple[_Gen, np.ndarray]:
        """The C description of these slots for requests flagged in ``generate`` (keep the returned flag
        array alive while the call runs)."""
        flags = np.ascontiguousarray(generate, dtype=np.uint8)
        return _Gen(flags.ctypes.data, self.buffer.ptr, self.slot_bytes, self.count), flags

    def close(self) -> None:
        self.buffer.close()


def _check(ret: int, what: str) -> int:
    if ret < 0:
        raise OSError(-ret, f"{what}: {os.strerror(-ret)}")
    return ret


class Request(NamedTuple):
    """One staged or submitted request: ``kind`` (read, write, fsync, fdatasync), ``fd``, ``offset``,
    ``size_bytes`` and the caller's ``key`` (what ``drain(key)`` waits for) and ``tag``."""

    kind: str
    fd: int
    offset: int
    size_bytes: int
    key: object = None
    tag: object = None


def batch(count: int) -> np.ndarray:
    """An empty (zeroed) array of ``count`` requests to fill, column by column, for ``Ring.run``/``pio_run``."""
    return np.zeros(count, dtype=REQUEST_DTYPE)


def opcode(kind: str, fixed: bool = False) -> int:
    """The io_uring opcode of ``kind`` (read, write, fsync, fdatasync); ``fixed``: a registered buffer."""
    if fixed and kind in ("read", "write"):
        return OP_READ_FIXED if kind == "read" else OP_WRITE_FIXED
    return _KINDS[kind]


class Ring:
    """One thread's io_uring with at most ``queue_depth`` requests in flight (see the module docstring).

    Only the thread that created a ring may submit to it or wait on it (the
    ring is set up IORING_SETUP_SINGLE_ISSUER where the kernel has it).

    Raises RingUnavailable when the library is missing and OSError from
    io_uring_setup(2) (EINVAL above ``MAX_ENTRIES``, ENOMEM past the locked
    memory limit, EPERM where io_uring is disabled).
    """

    def __init__(self, queue_depth: int, *, latency_sink: array | None = None, batch_size: int = 1) -> None:
        if queue_depth < 1:
            raise ValueError("queue depth must be at least 1")
        self.batch_size = max(1, min(batch_size, queue_depth))
        lib = library()
        handle = ctypes.c_void_p()
        _check(lib.ckr_setup(max(2, queue_depth), SETUP_BEST, ctypes.byref(handle)), "io_uring_setup")
        self._lib, self._ring = lib, handle
        self.queue_depth = queue_depth
        self.latency_sink = latency_sink
        self.entries = lib.ckr_sq_entries(handle)
        self.setup_flags = lib.ckr_setup_flags(handle)
        self.in_flight: dict[int, tuple[Request, int]] = {}  # user_data -> (request, entered ns)
        self.by_key: Counter = Counter()
        self._staged: list[tuple[int, Request, int, int, int]] = []  # (user_data, request, opcode, addr, buf_index)
        self._next = 1
        self._sqes = bytearray(_SQE.size * self.entries)
        self._sqes_address = ctypes.addressof(ctypes.c_char.from_buffer(self._sqes))
        self._cqes = np.zeros(self.entries * 2, dtype=_CQE_DTYPE)
        self._buffers: list = []
        self._done: list[tuple[Request, int]] = []  # completed, not yet returned: (request, result)

    # -- request by request ------------------------------------------------
    @property
    def pending(self) -> int:
        """Requests ``wait`` has yet to return: staged, in flight, or completed and not yet returned."""
        return len(self.in_flight) + len(self._staged) + len(self._done)

    @property
    def has_room(self) -> bool:
        """Whether another request can be submitted without waiting (staged and in flight < queue depth)."""
        return len(self.in_flight) + len(self._staged) < self.queue_depth

    def submit(
        self,
        kind: str,
        fd: int,
        addr: int,
        size_bytes: int,
        offset: int,
        key: object = None,
        tag: object = None,
        *,
        buf_index: int | None = None,
    ) -> None:
        """Stage one request (waiting for a completion first when ``queue_depth`` are pending).

        ``addr`` is the buffer address (``AlignedBuffer.ptr`` + an offset);
        ``buf_index`` a registered buffer's index (``register_buffers``).
        Completions of earlier requests may raise here, as from ``wait``.
        """
        while not self.has_room:
            self._done.extend(self._reap(1))
        user_data = self._next
        self._next += 1
        request = Request(kind, fd, offset, size_bytes, key, tag)
        code = opcode(kind, fixed=buf_index is not None)
        self._staged.append((user_data, request, code, addr, buf_index or 0))
        self.by_key[key] += 1
        if len(self._staged) >= self.batch_size or not self.has_room:
            self._enter(0)

    def flush(self) -> None:
        """Enter every staged request into the kernel now."""
        if self._staged:
            self._enter(0)

    def _enter(self, wait_nr: int) -> None:
        staged, self._staged = self._staged, []
        pack, sqes, size = _SQE.pack_into, self._sqes, _SQE.size
        in_flight = self.in_flight
        entered = time.perf_counter_ns()
        for i, (user_data, request, code, addr, buf_index) in enumerate(staged):
            offset = request.offset
            pack(
                sqes,
                i * size,
                code,
                0,
                buf_index,
                request.fd,
                addr,
                request.size_bytes,
                FSYNC_DATASYNC if request.kind == "fdatasync" else 0,
                POSITION if offset is None or offset < 0 else offset,
                user_data,
            )
            in_flight[user_data] = (request, entered)
        done = _check(self._lib.ckr_submit(self._ring, self._sqes_address, len(staged), wait_nr), "io_uring_enter")
        if done < len(staged):  # never: at most queue_depth <= entries are pending
            raise OSError(errno.EAGAIN, "io_uring submission queue full")

    def _reap(self, wait_nr: int) -> list[tuple[Request, int]]:
        """Enter staged requests and reap completions (at least ``wait_nr``); raise the first failure."""
        if self._staged:
            self._enter(0)
        wait_nr = min(wait_nr, len(self.in_flight))
        got = _check(self._lib.ckr_reap(self._ring, self._cqes.ctypes.data, len(self._cqes), wait_nr), "io_uring_enter")
        now = time.perf_counter_ns()
        done, failure = [], None
        for user_data, res, _ in self._cqes[:got].tolist():
            request, entered = self.in_flight.pop(user_data)
            self.by_key[request.key] -= 1
            if self.latency_sink is not None:
                self.latency_sink.append(now - entered)
            done.append((request, res))
            failure = failure or failure_of(request, res)
        if failure is not None:
            raise failure
        return done

    def wait(self) -> Request:
        """Return one completed request, waiting for a completion when none is at hand. Raises OSError for a
        failed or short write, and RuntimeError when nothing is pending."""
        return self.wait_result()[0]

    def wait_result(self) -> tuple[Request, int]:
        """``wait``, with the request's result: bytes moved (a read may return fewer than it asked for at
        the end of the file; the caller judges)."""
        while not self._done:
            if not (self.in_flight or self._staged):
                raise RuntimeError("Ring.wait() with no request pending")
            self._done.extend(self._reap(1))
        return self._done.pop(0)

    def drain(self, key: object = ...) -> None:
        """Wait for every pending request (of ``key`` only, when given); the first failure is raised
        after all of them have completed. Completions of other keys stay for ``wait``."""
        first: OSError | None = None
        while (self.in_flight or self._staged) and (key is ... or self.by_key[key] > 0):
            try:
                self._done.extend(self._reap(1))
            except OSError as err:
                first = first or err
        self._done = [] if key is ... else [(request, res) for request, res in self._done if request.key != key]
        if first is not None:
            raise first

    # -- a whole batch -------------------------------------------------------
    def run(
        self,
        requests: np.ndarray,
        *,
        stop_on_error: bool = True,
        generate: np.ndarray | None = None,
        slots: Slots | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Issue ``requests`` (an array of ``REQUEST_DTYPE``, e.g. from ``batch``) with at most
        ``queue_depth`` in flight; return (result per request, latency ns per request).

        ``generate`` (bool per request, with ``slots``) marks writes whose bytes are generated as they are
        queued (``pattern.fill``): such a request's ``addr`` is its content offset, ``user_data`` its content
        key, and it is written from a slot (no more than ``slots.count`` in flight; each ``len`` at most
        ``slots.slot_bytes``, else OSError EINVAL).

        Results (int64) are bytes moved or ``-errno``; with ``stop_on_error`` the first
        failure or short write stops submission and the requests never issued
        keep result ``NOT_ISSUED``. Nothing is raised for failed requests: see
        ``first_failure``. Raises OSError when the ring itself fails.
        """
        self.drain()
        count = len(requests)
        requests = np.ascontiguousarray(requests, dtype=REQUEST_DTYPE)
        results = np.full(count, NOT_ISSUED, dtype=np.int64)
        latencies = np.zeros(count, dtype=np.int64)
        args = (
            self._ring,
            requests.ctypes.data,
            count,
            self.queue_depth,
            results.ctypes.data,
            latencies.ctypes.data,
            int(stop_on_error),
        )
        if generate is None:
            done = self._lib.ckr_run(*args)
        else:
            if slots is None:
                raise ValueError("generate needs slots (the buffers the data is made in)")
            spec, flags = slots.spec(generate)
            done = self._lib.ckr_run_gen(*args, ctypes.byref(spec))  # flags: kept alive through the call
        _check(done, "io_uring_enter")
        if self.latency_sink is not None:
            self.latency_sink.extend(latencies[results != NOT_ISSUED].tolist())
        return results, latencies

    # -- registration --------------------------------------------------------
    def register_buffers(self, buffers: Sequence) -> None:
        """Register ``buffers`` (objects with ``ptr`` and ``size_bytes``, e.g. AlignedBuffer) as fixed
        buffers: requests naming ``buf_index=i`` use ``buffers[i]`` without pinning it per request."""
        iovecs = (ctypes.c_uint64 * (2 * len(buffers)))()
        for i, buf in enumerate(buffers):
            iovecs[2 * i], iovecs[2 * i + 1] = buf.ptr, buf.size_bytes
        _check(self._lib.ckr_register(self._ring, REGISTER_BUFFERS, iovecs, len(buffers)), "io_uring_register")
        self._buffers = list(buffers)

    def supported_ops(self) -> set[int]:
        """Opcodes this kernel supports (IORING_REGISTER_PROBE)."""
        size = 16 + 256 * 8
        raw = (ctypes.c_uint8 * size)()
        _check(self._lib.ckr_register(self._ring, REGISTER_PROBE, raw, 256), "io_uring_register")
        ops_len = raw[1]
        return {raw[16 + 8 * i] for i in range(ops_len) if raw[16 + 8 * i + 2] & IO_URING_OP_SUPPORTED}

    def close(self) -> None:
        """Reap what is still in flight (the kernel may still use its buffers), then tear the ring down."""
        if self._ring is None:
            return
        try:
            self.drain()
        except OSError:
            pass
        self._lib.ckr_exit(self._ring)
        self._ring = None

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


NOT_ISSUED = np.iinfo(np.int32).min  # result of a request ``run`` never issued (after a failure)


def failure_of(request: Request, res: int) -> OSError | None:
    """The OSError a completion of ``request`` with result ``res`` stands for (a negative errno; a write
    short of its size: ENOSPC), or None when it succeeded."""
    if res < 0:
        return OSError(
            -res, f"{request.kind} of {request.size_bytes} bytes at offset {request.offset}: {os.strerror(-res)}"
        )
    if request.kind == "write" and res < request.size_bytes:
        return OSError(
            errno.ENOSPC,
            f"short write: {res} of {request.size_bytes} bytes at offset {request.offset} (no space left on device?)",
        )
    return None


def first_failure(requests: np.ndarray, results: np.ndarray) -> tuple[int, OSError] | None:
    """(index, OSError) of the first failed request or short write of a ``run``/``pio_run``, or None."""
    opcode = requests["opcode"]
    writes = (opcode == OP_WRITE) | (opcode == OP_WRITE_FIXED)  # (np.isin: a sort, many times slower)
    bad = (results < 0) & (results != NOT_ISSUED) | (writes & (results >= 0) & (results < requests["len"]))
    where = np.flatnonzero(bad)
    if not len(where):
        return None
    i = int(where[0])
    kind = "write" if writes[i] else "fsync" if requests["opcode"][i] == OP_FSYNC else "read"
    failure = failure_of(
        Request(kind, int(requests["fd"][i]), int(requests["off"][i]), int(requests["len"][i])), int(results[i])
    )
    assert failure is not None  # ``bad`` holds exactly the results failure_of names
    return i, failure


def pio_run(
    requests: np.ndarray, *, stop_on_error: bool = True, generate: np.ndarray | None = None, slots: Slots | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``requests`` one by one through pread(2)/pwrite(2)/fsync(2) in C (the POSIX engine);
    returns (result per request, latency ns per request) as ``Ring.run`` does. Results are int64: one
    request of up to 4 GiB - 1 bytes can move more than 2 GiB (over several calls). ``generate`` and
    ``slots`` as for ``Ring.run`` (each generated write filled into the first slot just before its call)."""
    lib = library()
    count = len(requests)
    requests = np.ascontiguousarray(requests, dtype=REQUEST_DTYPE)
    results = np.full(count, NOT_ISSUED, dtype=np.int64)
    latencies = np.zeros(count, dtype=np.int64)
    if generate is None:
        lib.ckr_pio_run(requests.ctypes.data, count, results.ctypes.data, latencies.ctypes.data, int(stop_on_error))
    else:
        if slots is None:
            raise ValueError("generate needs slots (the buffers the data is made in)")
        spec, flags = slots.spec(generate)  # flags: kept alive through the call
        _check(
            lib.ckr_pio_run_gen(
                requests.ctypes.data,
                count,
                results.ctypes.data,
                latencies.ctypes.data,
                int(stop_on_error),
                ctypes.byref(spec),
            ),
            "pio_run",
        )
    return results, latencies


def probe(queue_depth: int = 2) -> str | None:
    """None when a ring of ``queue_depth`` can be created here, else why not (one line).

    Used before any clock starts: ``--queue-depth 65536`` is refused here, by
    the kernel's own limit, instead of failing inside a worker.
    """
    if queue_depth > MAX_ENTRIES:
        return f"queue depth {queue_depth} exceeds io_uring's limit of {MAX_ENTRIES} entries per ring"
    try:
        Ring(queue_depth).close()
    except RingUnavailable as err:
        return err.strerror
    except OSError as err:
        return f"io_uring_setup({queue_depth}) failed: {os.strerror(err.errno) if err.errno else err}"
    return None


#: Why io_uring_setup(2) may refuse where plain system calls still work: disabled by sysctl or a seccomp
#: profile (EPERM, EACCES), a kernel without io_uring (ENOSYS).
_SETUP_REFUSED = (errno.EPERM, errno.EACCES, errno.ENOSYS)
_notice_given = False


def open_ring(queue_depth: int, *, latency_sink: array | None = None, batch_size: int = 1) -> Ring | PosixRing:
    """A ``Ring`` of ``queue_depth``, or, where the ring library cannot be loaded (``RingUnavailable``) or
    the kernel refuses io_uring (``_SETUP_REFUSED``), a ``posix_ring.PosixRing`` with the same
    request-by-request interface on os.preadv/os.pwritev; the first fallback in a process prints one line
    on stderr saying why. Raises OSError from io_uring_setup(2) otherwise (ENOMEM past the locked memory
    limit, EINVAL above ``MAX_ENTRIES``)."""
    global _notice_given
    try:
        return Ring(queue_depth, latency_sink=latency_sink, batch_size=batch_size)
    except OSError as err:
        if not isinstance(err, RingUnavailable) and err.errno not in _SETUP_REFUSED:
            raise
        reason = err.strerror or str(err)
    from .posix_ring import PosixRing

    if not _notice_given:
        _notice_given = True
        print(f"ckpt-trace: io_uring ring unavailable ({reason}); using os.preadv/os.pwritev", file=sys.stderr)
    return PosixRing(queue_depth, latency_sink=latency_sink, batch_size=batch_size)


def copy_mapped(
    fd: int,
    pieces: np.ndarray,
    crc_function: int | None = None,
    *,
    window_bytes: int = 64 << 20,
    chunk_bytes: int = 64 << 10,
    fused: bool = True,
) -> tuple[int, int]:
    """Copy pieces of file ``fd`` into memory out of a read-only shared mapping of it (``ckr_copy_mapped``,
    GIL released): ``pieces`` is a ``PIECE_DTYPE`` array, each row ``size_bytes`` at file ``offset`` copied
    to address ``dst`` (memory the caller keeps alive for the call) with non-temporal stores, in array
    order; for rows with ``check`` set, ``crc`` (a running CRC-32, zlib's value; 0 to start) is extended
    over those bytes by ``crc_function`` (the address of a C function ``uint32_t f(uint32_t crc, const
    unsigned char *buf, uint64_t len)``: ISA-L's ``crc32_gzip_refl``), ``chunk_bytes`` at a time. Where
    ``fused_crc_copy()`` and ``fused``, each chunk is checksummed while it is copied, in one pass
    (AVX-512 VPCLMULQDQ folding, the function only for the few bytes before the destination's first
    64-byte boundary and after the chunk's last 256-byte block); else each chunk is checksummed by the
    function just before its copy, while the core's cache holds it. The file is mapped
    ``window_bytes`` at a time. Meant for pages the page cache holds (others are read in by page faults,
    one fault-around window at a time). Every piece must lie within the file: a page past its end raises
    SIGBUS (mmap(2)), so check the size first. Returns (bytes copied, mmap(2) calls made); raises OSError
    when mmap(2) fails, RingUnavailable when the library is not built, ValueError for a wrong array."""
    if pieces.dtype != PIECE_DTYPE or not pieces.flags.c_contiguous:
        raise ValueError("pieces must be a C-contiguous PIECE_DTYPE array")
    if len(pieces) == 0:
        return 0, 0
    maps = ctypes.c_uint64(0)
    copied = library().ckr_copy_mapped(
        fd,
        pieces.ctypes.data,
        len(pieces),
        crc_function,
        window_bytes,
        chunk_bytes,
        0 if fused else 1,
        ctypes.byref(maps),
    )
    if copied < 0:
        raise OSError(-copied, f"mmap: {os.strerror(-copied)}")
    return copied, maps.value


def fused_crc_copy() -> bool:
    """Whether ``copy_mapped`` checksums and copies in one pass here: the library was built with a compiler
    that knows AVX-512 and VPCLMULQDQ, and this CPU has them (AVX-512F, BW, VL; the kernel saves their
    registers). Raises RingUnavailable when the library is not built."""
    return bool(library().ckr_fused_crc_copy())


def copy_crc32(dst: int, src: int, size_bytes: int, crc: int, crc_function: int, *, fused: bool = True) -> int:
    """Copy ``size_bytes`` from address ``src`` to address ``dst`` (memory the caller keeps alive; not
    overlapping) and return ``crc`` (a running CRC-32, zlib's value; 0 to start) extended over those bytes:
    in one pass where ``fused_crc_copy()`` and ``fused`` (the destination's lines are written with
    non-temporal stores), else by ``crc_function`` (as in ``copy_mapped``) 64 KiB at a time, each just
    before its copy (``ckr_copy_crc32``, GIL released). Raises ValueError without a ``crc_function`` (the
    one pass leaves it the bytes before ``dst``'s first 64-byte boundary and after its last 256-byte
    block), RingUnavailable when the library is not built."""
    if not crc_function:
        raise ValueError("copy_crc32 needs the address of a CRC-32 function (checksum.crc32_function())")
    if size_bytes <= 0:
        return crc
    return int(library().ckr_copy_crc32(dst, src, size_bytes, crc, crc_function, 0 if fused else 1))
