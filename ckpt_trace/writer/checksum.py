"""Per-item checksums of the emitted writer's checkpoints. The kind new checkpoints record (``KIND``): CRC-32
(zlib's polynomial and value) computed by ISA-L where the ``isal`` package is installed, else CRC32C where
the ``crc32c`` package is, else CRC-32 by zlib; ``CKPT_TRACE_WRITER_CHECKSUM_KIND`` (crc32, crc32c) sets it.
The kind is stored beside each value, so a reader computes the same one, by the fastest package it has: a
CRC-32 checkpoint loads where neither package is installed (zlib).
Rates on the project's 2-core EPYC (AVX-512 with VPCLMULQDQ), 2026-11-29, one thread, 256 MiB out of
memory / a 512 KiB piece in the core's L2 cache: ISA-L's CRC-32 22.4 / 51.7 GB/s, the crc32c package's
CRC32C 12.5 / 25.6 GB/s, zlib's CRC-32 3.9 / 4.0 GB/s. Warm loads (ad hoc, with ``benchmarks/restore.py``'s
shapes and forked loads, 7 alternated loads each, medians): 256 MiB of 4 tensors 31.3 ms with CRC-32
(ISA-L) against 35.1 ms with CRC32C; the 770 MiB many-small state 142 against 149 ms.

The writer computes it over each staging buffer's piece of an item right after the piece is copied there
(``staging.StagedFile.put``), while those bytes are in the CPU's cache, on the data file's own checksum
thread; the reader over the bytes that landed in the destination, on a worker thread (``Verifier``) while
the next reads go on (a warm read checks each 64 KiB in C, through ``crc32_function``, just before copying
it out of a mapping: ``load._read_mapped``; or each piece right after its read: ``load._HOT_BYTES``). The packages
release the GIL on large buffers (crc32c above 32 KiB by default, measured here: a Python loop beside a
crc32c thread ran 7.6x more iterations than with the GIL held; zlib above 5 KiB; ISA-L: a loop beside it
ran at half its speed alone, where a held GIL would stop it), so the checksums overlap the copies, reads
and writes; a save waits for them only where a staging buffer is about to be refilled, a load only for
the check of its last item. Items a GPU copies into the buffers asynchronously are not checksummed.

Cost (gpt2-small + Adam, 1.49 GB, one process, cache dropped, the 2-core machine at a load average of
12-26; ``benchmarks/checksum_overlap.py``, 5 save/load rounds over two runs): the checksums take 0.3-0.64 s
of CPU per save and 0.7-0.95 s per load, off the critical path; the writer thread waited 7-53 ms for them
(0.03-0.5 % of a 11-21 s save; computed inline before, the same CRC was 0.42-0.74 s of the writer thread,
2.8-5.6 % of the save), the reader 5-80 ms at the end of a 12-17 s load (0.04-0.5 %; the whole check was
inline on the read path before). Wall-clock pairs (``benchmarks/emitted_writer.py --pairs 6 --model
gpt2-small``, emitted / emitted-nocrc - 1) are within noise on that machine: cold save median -15 %
(-21..+32 %), warm save -23 % (-55..+28 %), load +6 % (-44..+64 %); the CPU the checksums take shows in
wall time only where no core is idle.
"""

from __future__ import annotations

import ctypes
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NoReturn

import torch

from ckpt_trace import config

try:
    import crc32c as _crc32c
except ImportError:  # pragma: no cover - the torch extra installs it
    _crc32c = None
try:  # ISA-L's CRC-32, zlib's value (isal_zlib.crc32 == zlib.crc32), with carry-less multiplies
    from isal import isal_zlib as _isal_zlib
except ImportError:  # pragma: no cover - the torch extra installs it
    _isal_zlib = None

_crc32 = _isal_zlib.crc32 if _isal_zlib is not None else zlib.crc32


def _kind() -> str:
    """The kind new checkpoints record: ``config.WRITER_CHECKSUM_KIND`` where set and computable, else CRC-32
    where ISA-L is installed, CRC32C where the crc32c package is, else CRC-32 (zlib)."""
    asked = config.WRITER_CHECKSUM_KIND
    if asked == "crc32" or (asked == "crc32c" and _crc32c is not None):
        return asked
    if _isal_zlib is not None:
        return "crc32"
    return "crc32c" if _crc32c is not None else "crc32"


KIND = _kind()


def _view(tensor: torch.Tensor) -> memoryview | None:
    """The bytes of a contiguous CPU tensor, without a copy; None for other tensors."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return None
    size = tensor.numel() * tensor.element_size()
    if not size:
        return memoryview(b"")
    return memoryview((ctypes.c_char * size).from_address(tensor.data_ptr())).cast("B")


def update(value: int, tensor: torch.Tensor) -> int | None:
    """``value`` (a running ``KIND`` checksum) extended by a contiguous CPU tensor's bytes; None for others."""
    view = _view(tensor)
    if view is None:
        return None
    return extend(value, view, KIND)


def extend(value: int, view: memoryview, kind: str) -> int:
    """``value`` (a running ``kind`` checksum, 0 to start) extended by ``view``'s bytes: what ``checksum``
    gives for a tensor, computed a piece at a time (``load``'s warm reads check each piece right after its
    read, while it sits in the CPU's cache). Raises CheckpointError when ``kind`` needs a package that is
    not installed."""
    if kind == "crc32c":
        if _crc32c is None:
            _missing_crc32c()
        return _crc32c.crc32c(view, value)
    return _crc32(view, value)


_CRC32_FUNCTION: list[int | None] = []  # resolved once: [address or None]


def crc32_function() -> int | None:
    """The address of ISA-L's C function ``uint32_t crc32_gzip_refl(uint32_t crc, const unsigned char *buf,
    uint64_t len)`` (CRC-32, zlib's value and chaining), which the isal package's ``isal_zlib`` extension
    exports, for C code that checksums bytes while it copies them (``iolayer.ring.copy_mapped``); None
    where isal is not installed, does not export it, or it does not give zlib's value on a test buffer."""
    if not _CRC32_FUNCTION:
        address = None
        if _isal_zlib is not None:
            try:
                function = ctypes.CDLL(_isal_zlib.__file__).crc32_gzip_refl
                function.restype, function.argtypes = (
                    ctypes.c_uint32,
                    [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint64],
                )
                sample = bytes(range(256)) * 5
                if function(function(0, sample[:100], 100), sample[100:], len(sample) - 100) == zlib.crc32(sample):
                    address = ctypes.cast(function, ctypes.c_void_p).value
            except (OSError, AttributeError):
                address = None
        _CRC32_FUNCTION.append(address)
    return _CRC32_FUNCTION[0]


_CRC32_COMBINE: list = []  # resolved once: [function or None]


def crc32_combine_function() -> Callable[[int, int, int], int] | None:
    """zlib's ``crc32_combine(crc1, crc2, len2)`` (the CRC-32 of A followed by B from A's, B's and B's length
    in bytes; zlib 1.2.x+, libz.so.1) through ctypes, for an item whose bytes two threads checked in two
    parts; None where libz cannot be loaded or does not give zlib's value on a test buffer."""
    if not _CRC32_COMBINE:
        combine = None
        try:
            function = ctypes.CDLL("libz.so.1").crc32_combine
            function.restype, function.argtypes = ctypes.c_ulong, [ctypes.c_ulong, ctypes.c_ulong, ctypes.c_int64]
            first, second = bytes(range(256)), bytes(range(255, -1, -1)) * 3
            if function(zlib.crc32(first), zlib.crc32(second), len(second)) == zlib.crc32(first + second):
                combine = function
        except (OSError, AttributeError):
            combine = None
        _CRC32_COMBINE.append(combine)
    return _CRC32_COMBINE[0]


def _missing_crc32c() -> NoReturn:
    from ckpt_trace.errors import CheckpointError

    raise CheckpointError(
        "this checkpoint's checksums are CRC32C: pip install crc32c (or load with checksums=False in the "
        "reader's WriterOptions)"
    )


def checksum(tensor: torch.Tensor, kind: str = KIND) -> int | None:
    """The ``kind`` checksum of a contiguous CPU tensor's bytes; None for a GPU or strided tensor. Raises
    CheckpointError when ``kind`` needs a package that is not installed."""
    view = _view(tensor)
    if view is None:
        return None
    if kind == "crc32c":
        if _crc32c is None:
            _missing_crc32c()
        return _crc32c.crc32c(view)
    return _crc32(view)


class Verifier:
    """Runs a load's checks (callables raising CheckpointError) on one worker thread, in submission order.

    ``submit(check, held_bytes)`` queues a check (thread-safe) and first raises the error of any check that
    already failed, so a corrupt checkpoint stops the load at the next item; ``held_bytes`` is memory the
    check keeps alive (a scratch tensor): past ``limit_bytes`` of it the caller waits for the oldest checks,
    so a slow CPU bounds memory rather than growing it. ``finish()`` waits for every check and raises the
    first failure in submission order; ``close()`` (always, e.g. in ``finally``) waits without raising.
    """

    def __init__(self, limit_bytes: int = 256 << 20) -> None:
        self.limit_bytes = limit_bytes
        self.pool: ThreadPoolExecutor | None = None
        self.pending: list[tuple[Future, int]] = []
        self.held_bytes = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def submit(self, check: Callable[[], None], held_bytes: int = 0) -> None:
        with self.lock:
            self._raise_failed()
            if self.pool is None:
                self.pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt-trace-verify")
            future = self.pool.submit(check)
            self.pending.append((future, held_bytes))
            self.held_bytes += held_bytes
            self._forget_done()
            waits = []
            while self.held_bytes > self.limit_bytes and self.pending:
                oldest, held = self.pending.pop(0)
                self.held_bytes -= held
                waits.append(oldest)
        for oldest in waits:
            self._record(oldest)
        if waits:
            with self.lock:
                self._raise_failed()

    def finish(self) -> None:
        with self.lock:
            pending, self.pending, self.held_bytes = self.pending, [], 0
        for future, _ in pending:
            self._record(future)
        with self.lock:
            self._raise_failed()

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _record(self, future: Future) -> None:
        error = future.exception()
        if error is not None:
            with self.lock:
                self.error = self.error or error

    def _forget_done(self) -> None:
        """Drop finished checks from the head of the queue (lock held), keeping the first failure."""
        while self.pending and self.pending[0][0].done():
            future, held = self.pending.pop(0)
            self.held_bytes -= held
            if future.exception() is not None and self.error is None:
                self.error = future.exception()

    def _raise_failed(self) -> None:
        if self.error is not None:
            raise self.error
