"""The staging pipelines: items into aligned buffers into io_uring writes, and aligned reads back into items.

``StagedFile`` (one writer thread, one data file): each item's bytes are
copied into the current page-aligned staging buffer; a full buffer becomes
one aligned write submitted through the thread's ring with O_DIRECT, and the
next buffer fills while earlier ones are in flight (``queue_depth`` buffers).
Items on a GPU are copied device-to-host asynchronously into staging buffers
page-locked with cudaHostRegister (pinned memory: the copy engine's full
speed, no bounce through pageable memory); a buffer's write is submitted
once its copies completed, so the copies of one buffer overlap the writes of
the earlier ones (as DCP's ``per_thread_copy_ahead`` and DataStates-LLM's
lazy copies do). Where registering fails, copies stay synchronous.
Call order: ``put(offset, src)`` for each item in offset order, then
``close()`` (last buffer zero-padded, every write reaped, fsync); ``abort()``
on failure removes the file. With checksums, each piece's CRC-32 is
computed while it is copied, in one pass, where the CPU allows
(``one_pass_crc32``); elsewhere (and for CRC32C) on the file's own checksum
thread right after the piece is staged (in cache; the package releases the
GIL), beside the next copies and the writes; a buffer is then refilled only
once the checksums reading it are done.

``StreamReader`` (one reader thread, one data file): reads a file's wanted
byte ranges as one stream of aligned O_DIRECT reads (``layout.plan_stream``)
into a fixed arena through one ring, and copies each read's bytes out to the
items it overlaps while later reads are in flight. Items whose destination
is a GPU tensor are copied host-to-device asynchronously from the arena
(page-locked for the load) on the reader's own CUDA stream (``CudaCopier``);
an arena slot is read into again only once the copies out of it completed,
so the copies of one read overlap the reads after it (as the Run:ai streamer
and fastsafetensors overlap reads with device copies).

GPU staging memory is page-locked once per process and reused by every later
save (``PINNED_POOL``): cudaHostRegister costs about as much as copying the
buffer, so a job that saves every N steps pays it once.

Both run on the I/O layer (``iolayer.ring.Ring``, ``AlignedBuffer``,
``files.open_file`` with its O_DIRECT fallback).
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import errno
import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar, cast

import torch

from ckpt_trace import config
from ckpt_trace.iolayer.buffers import AlignedBuffer
from ckpt_trace.iolayer.files import open_file
from ckpt_trace.iolayer.ring import RingUnavailable, copy_crc32, fused_crc_copy, open_ring

from .checksum import KIND as CHECKSUM_KIND
from .checksum import crc32_function
from .checksum import update as update_checksum
from .layout import FileLayout, align_up, plan_stream
from .options import WriterOptions

_INLINE_CHECKSUM_BYTES = 64 << 10  # an item this small is checksummed at once: a worker's hand-off costs more
_Key = TypeVar("_Key", bound=Hashable)  # how a StreamReader's caller names its items


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` done by the calling thread alone where it can be: for two contiguous, dense, not
    quantized CPU tensors of one dtype and shape (no conjugate or negative bit), one glibc ``memmove`` of
    their bytes through ctypes (a CFUNCTYPE call: the GIL is released); anything else goes to
    ``torch.Tensor.copy_``. The save's staging copies use it; a load's copies out of its arena stay ``copy_``
    (``benchmarks/ranks_per_node.py`` found no gain there).

    Why: torch splits a large CPU copy across its OpenMP threads (``at::parallel_for``), whose workers
    spin-wait after each piece. With several ranks on a node each rank's threads spin on cores the other
    ranks need: 4 ranks saving 1.4 GiB on 2 cores spent 2.9 s of CPU in ``write_data`` with ``copy_``, 0.5 s
    with one thread per copy (ad hoc); ``benchmarks/ranks_per_node.py`` measures the saves both ways
    (``config.WRITER_SINGLE_THREAD_COPIES=0`` restores ``copy_``). The staging copies overlap the I/O, so
    one core per copy is enough. Raises what ``copy_`` raises for tensors it cannot copy."""
    if (
        config.WRITER_SINGLE_THREAD_COPIES
        and dst.device.type == "cpu"
        and src.device.type == "cpu"
        and dst.layout == src.layout == torch.strided
        and not (dst.is_quantized or src.is_quantized)
        and dst.dtype == src.dtype
        and dst.shape == src.shape
        and dst.is_contiguous()
        and src.is_contiguous()
        and not (dst.is_conj() or src.is_conj() or dst.is_neg() or src.is_neg())
    ):
        size_bytes = dst.numel() * dst.element_size()
        if size_bytes:
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), size_bytes)
        return
    dst.copy_(src)


def one_pass_crc32() -> int | None:
    """The address of ISA-L's CRC-32 function (``checksum.crc32_function``) where the staging copies can
    checksum in the same pass as they copy (``iolayer.ring.copy_crc32``): checkpoints record CRC-32
    (``checksum.KIND``), ISA-L is there for the bytes the one pass leaves (before the staging buffer's
    first 64-byte boundary, after the last 256-byte block), the ring library loads, the CPU has AVX-512
    and VPCLMULQDQ (``iolayer.ring.fused_crc_copy``) and ``config.ONE_PASS_CHECKS`` is on; else None
    (each piece is then checksummed after its copy, on the file's checksum thread). Asked at each item
    (the library's state is cached by ``iolayer.ring``). The pass costs what the copy alone costs
    (256 MiB, 2 threads, on the project's 2-core EPYC: 14.4 ms against 14.6 ms for the copy alone and
    18.6 ms checksumming first, ``_ring.c``)."""
    if CHECKSUM_KIND != "crc32" or not config.ONE_PASS_CHECKS:
        return None
    function = crc32_function()
    if function is None:
        return None
    try:
        return function if fused_crc_copy() else None
    except RingUnavailable:
        return None


class ItemChecksum:
    """The running ``checksum.KIND`` value of one item's staged pieces, extended in order: by the staging
    copy itself (one pass) or on the file's checksum thread (one thread: its queue keeps the order).
    ``result()`` (after ``StagedFile.close``) is the value, or None where a piece was copied asynchronously
    from a GPU (not seen by the CPU)."""

    def __init__(self) -> None:
        self.value: int | None = 0

    def extend(self, piece: torch.Tensor) -> None:
        if self.value is not None:
            self.value = update_checksum(self.value, piece)

    def drop(self) -> None:
        self.value = None

    def result(self) -> int | None:
        return self.value


class StagedFile:
    """One data file written from a ring of page-aligned staging buffers (see the module docstring).

    Created exclusively (O_CREAT | O_EXCL); ``direct`` tells whether O_DIRECT
    is on. Raises OSError (ENOSPC from fallocate or a completion, EEXIST...).
    """

    def __init__(self, path: str, layout: FileLayout, options: WriterOptions) -> None:
        self.path, self.options = path, options
        self.buffers: list[AlignedBuffer] = []
        self.views: list[torch.Tensor] = []
        self.free: list[int] = []
        self.current: int | None = None
        self.fill = 0  # bytes staged in the current buffer
        self.file_offset = 0  # file offset of the current buffer's first byte
        self.pinned: set[int] = set()  # staging buffers page-locked for the GPU (from PINNED_POOL)
        self.copying: dict[int, tuple] = {}  # buffer -> (CUDA event after its copies, the sources kept alive)
        self.copy_stream = None  # this file's own CUDA stream for device-to-host copies
        self.checksum_thread: ThreadPoolExecutor | None = None  # computes the pieces' checksums (``put``)
        self.checksumming: dict[int, list[Future]] = {}  # buffer -> checksums still reading it
        opened = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, direct=options.direct_io)
        self.fd, self.direct = opened.fd, opened.direct
        try:
            self.ring = open_ring(options.queue_depth)
        except BaseException:
            os.close(self.fd)
            os.unlink(path)
            raise
        if options.preallocate:
            try:
                self._preallocate(layout.size_bytes)
            except BaseException:
                self.abort()
                raise

    def _preallocate(self, size_bytes: int) -> None:
        try:
            os.posix_fallocate(self.fd, 0, size_bytes)
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise

    def _take_buffer(self) -> int:
        if not self.free and len(self.buffers) < self.options.queue_depth:
            buffer = AlignedBuffer(self.options.buffer_bytes)
            self.buffers.append(buffer)
            self.views.append(torch.frombuffer(buffer.mmap, dtype=torch.uint8))
            return len(self.buffers) - 1
        while not self.free:
            self.free.append(cast(int, self.ring.wait().tag))  # Ring tags are objects; ours are buffer indices
        index = self.free.pop()
        self._wait_checksums(index)  # its pieces' checksums may still be reading it
        return index

    def _wait_checksums(self, index: int) -> None:
        for future in self.checksumming.pop(index, ()):
            future.result()

    def _checksum(self, crc: ItemChecksum, piece: torch.Tensor, whole_item: bool) -> None:
        """Extend ``crc`` by ``piece`` (just staged in buffer ``current``): at once for a small whole item,
        else on the checksum thread, which reads the buffer beside its write."""
        if whole_item and piece.numel() <= _INLINE_CHECKSUM_BYTES:
            crc.extend(piece)
            return
        if self.checksum_thread is None:
            self.checksum_thread = ThreadPoolExecutor(1, thread_name_prefix="ckpt-trace-crc")
        self.checksumming.setdefault(self._current(), []).append(self.checksum_thread.submit(crc.extend, piece))

    def _pin(self, index: int) -> bool:
        """Make staging buffer ``index`` page-locked for asynchronous device-to-host copies: swapped for a
        buffer of ``PINNED_POOL`` (registered once per process, reused by later saves). False if CUDA
        refuses to register memory (the copies then stay synchronous)."""
        if index in self.pinned:
            return True
        pinned = PINNED_POOL.take(self.options.buffer_bytes)
        if pinned is None:
            return False
        self._wait_checksums(index)  # the buffer about to be swapped and freed
        view = torch.frombuffer(pinned.mmap, dtype=torch.uint8)
        if index == self.current and self.fill:
            copy_bytes(view[: self.fill], self.views[index][: self.fill])  # what this buffer staged so far
        self.buffers[index].close()
        self.buffers[index], self.views[index] = pinned, view
        self.pinned.add(index)
        return True

    def _copy_stream(self, device: torch.device):
        """This file's CUDA stream for device-to-host copies, ordered after the work the caller queued on its
        current stream (the tensors' producers); the caller's stream is never blocked by our copies."""
        if self.copy_stream is None:
            self.copy_stream = torch.cuda.Stream(device)
        self.copy_stream.wait_stream(torch.cuda.current_stream(device))
        return self.copy_stream

    def _current(self) -> int:
        """The staging buffer being filled (``put`` takes one before staging; none between buffers)."""
        if self.current is None:
            raise ValueError("no staging buffer is being filled")
        return self.current

    def _wait_copies(self, index: int) -> None:
        """Block until the device-to-host copies into buffer ``index`` completed (its CUDA event)."""
        pending = self.copying.pop(index, None)
        if pending is not None:
            pending[0].synchronize()

    def _flush(self) -> None:
        current = self._current()
        self._wait_copies(current)  # its bytes may still be on their way from the GPU
        size = align_up(self.fill, self.options.align_bytes)
        view = self.views[current]
        if size > self.fill:
            view[self.fill : size].zero_()
        self.ring.submit("write", self.fd, self.buffers[current].ptr, size, self.file_offset, tag=current)
        self.file_offset += self.options.buffer_bytes
        self.current, self.fill = None, 0

    def put(self, offset: int, src: torch.Tensor, checksum: bool = False) -> ItemChecksum | None:
        """Stage ``src`` (1-D uint8, any device) at file ``offset`` (>= the previous item's end). With
        ``checksum``, return its ``ItemChecksum``, extended by each piece: while the piece is copied into a
        staging buffer, in one pass, where ``one_pass_crc32()`` (a contiguous CPU source), else right after
        the copy (in cache) on the checksum thread; its ``result()`` is known after ``close()`` (None when a
        piece was copied asynchronously from a GPU). Without, None."""
        gap = offset - (self.file_offset + self.fill)
        position, total = 0, src.numel()
        crc = ItemChecksum() if checksum else None
        on_gpu = src.is_cuda
        one_pass = one_pass_crc32() if checksum and not on_gpu else None
        stream = self._copy_stream(src.device) if on_gpu else None
        while gap > 0 or position < total:
            if self.current is None:
                self.current = self._take_buffer()
            room = self.options.buffer_bytes - self.fill
            view = self.views[self.current]
            if gap > 0:
                step = min(gap, room)
                view[self.fill : self.fill + step].zero_()
                gap -= step
            else:
                step = min(total - position, room)
                asynchronous = on_gpu and self._pin(self.current)
                view = self.views[self.current]
                if asynchronous:
                    with torch.cuda.stream(stream):
                        view[self.fill : self.fill + step].copy_(src[position : position + step], non_blocking=True)
                        event = torch.cuda.Event()
                        event.record(stream)
                    kept = self.copying.get(self.current, (None, ()))[1]
                    self.copying[self.current] = (event, (*kept, src))  # src lives until its copy is done
                    if crc is not None:
                        crc.drop()
                elif crc is not None and crc.value is not None and one_pass is not None and src.is_contiguous():
                    # checksummed while copied, on this thread: no second pass over the staged bytes
                    address = view.data_ptr() + self.fill
                    crc.value = copy_crc32(address, src.data_ptr() + position, step, crc.value, one_pass)
                else:
                    copy_bytes(view[self.fill : self.fill + step], src[position : position + step])
                    if crc is not None:
                        self._checksum(crc, view[self.fill : self.fill + step], step == total)
                position += step
            self.fill += step
            if self.fill == self.options.buffer_bytes:
                self._flush()
        return crc

    def close(self) -> None:
        """Write the last buffer (zero-padded to the alignment), wait for every write, fsync and close."""
        if self.current is not None and self.fill:
            self._flush()
        for index in list(self.checksumming):
            self._wait_checksums(index)  # the last pieces' checksums, beside the last writes
        self.ring.drain()
        os.fsync(self.fd)
        self._release()

    def abort(self) -> None:
        self._release()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _release(self) -> None:
        if self.fd < 0:
            return
        for index in list(self.copying):
            self._wait_copies(index)  # no copy may land in a buffer about to be reused or freed
        if self.checksum_thread is not None:
            self.checksum_thread.shutdown(wait=True, cancel_futures=True)  # none may read a buffer being freed
            self.checksum_thread = None
        self.checksumming.clear()
        self.ring.close()
        os.close(self.fd)
        self.fd = -1
        self.views.clear()
        for index, buffer in enumerate(self.buffers):
            if index in self.pinned:
                PINNED_POOL.give(buffer)  # page-locked: kept for the next save
            else:
                buffer.close()
        self.pinned.clear()
        self.buffers.clear()


class PinnedPool:
    """Page-locked staging buffers kept for the life of the process (thread-safe).

    ``take(size_bytes)`` returns an ``AlignedBuffer`` registered with
    cudaHostRegister (reused if one of that size is free, else allocated and
    registered), or None where CUDA refuses; ``give(buffer)`` returns it for
    the next save. At most ``limit_bytes`` of free buffers are kept (default
    ``config.PINNED_POOL_BYTES``); beyond it a returned buffer is unregistered
    and freed. ``clear()`` frees every free buffer. ``registered`` counts the
    cudaHostRegister calls made (a repeated save makes none).
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.free: dict[int, list[AlignedBuffer]] = {}
        self.registered = 0
        self.lock = threading.Lock()

    def take(self, size_bytes: int) -> AlignedBuffer | None:
        with self.lock:
            kept = self.free.get(size_bytes)
            if kept:
                return kept.pop()
        buffer = AlignedBuffer(size_bytes)
        try:
            torch.cuda.check_error(_cudart().cudaHostRegister(buffer.ptr, buffer.size_bytes, 0))
        except RuntimeError:
            buffer.close()
            return None
        with self.lock:
            self.registered += 1
        return buffer

    def give(self, buffer: AlignedBuffer) -> None:
        with self.lock:
            kept = sum(size * len(buffers) for size, buffers in self.free.items())
            if kept + buffer.size_bytes <= self.limit_bytes:
                self.free.setdefault(buffer.size_bytes, []).append(buffer)
                return
        _unregister(buffer)

    def clear(self) -> None:
        with self.lock:
            buffers = [b for kept in self.free.values() for b in kept]
            self.free.clear()
        for buffer in buffers:
            _unregister(buffer)


def _cudart():
    """``torch.cuda.cudart()``, the CUDA runtime module. torch types it optional (its cache is None where torch
    has no CUDA), but its lazy CUDA initialisation raises there rather than return None."""
    runtime = torch.cuda.cudart()
    assert runtime is not None  # torch.cuda._lazy_init raised otherwise
    return runtime


def _unregister(buffer: AlignedBuffer) -> None:
    _cudart().cudaHostUnregister(buffer.ptr)
    buffer.close()


PINNED_POOL = PinnedPool(config.PINNED_POOL_BYTES)


class Copier:
    """Copies a landed read out of the reader's arena into a destination tensor (the CPU case: at once).

    Call order (``StreamReader.run``): ``copy(dst, src, slot)`` for each piece
    of arena slot ``slot`` handed out, then ``wait(slot)`` before the slot is
    read into again, ``wait_all()`` at the end of a file. ``CudaCopier``
    makes ``copy`` asynchronous for GPU destinations.
    """

    def copy(self, dst: torch.Tensor, src: torch.Tensor, slot: int) -> None:
        dst.copy_(src)  # a load's copies stay torch's (benchmarks/ranks_per_node.py: memmove gained nothing)

    def wait(self, slot: int) -> None:
        pass

    def wait_all(self) -> None:
        pass

    def close(self) -> None:
        pass


class CudaCopier(Copier):
    """Host-to-device copies out of an arena page-locked for the load (cudaHostRegister), queued on the
    reader's own CUDA stream with one event per slot: ``wait(slot)`` blocks only on that slot's copies.
    Copies to CPU destinations stay synchronous. Raises RuntimeError if the arena cannot be registered."""

    def __init__(self, arena: AlignedBuffer, device: torch.device) -> None:
        torch.cuda.check_error(_cudart().cudaHostRegister(arena.ptr, arena.size_bytes, 0))
        self.arena = arena
        self.stream = torch.cuda.Stream(device)
        self.events: dict[int, torch.cuda.Event] = {}

    def copy(self, dst: torch.Tensor, src: torch.Tensor, slot: int) -> None:
        if not dst.is_cuda:
            dst.copy_(src)
            return
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            event = self.events.get(slot) or torch.cuda.Event()
            event.record(self.stream)
        self.events[slot] = event

    def wait(self, slot: int) -> None:
        event = self.events.pop(slot, None)
        if event is not None:
            event.synchronize()

    def wait_all(self) -> None:
        self.stream.synchronize()
        self.events.clear()

    def close(self) -> None:
        self.wait_all()
        _cudart().cudaHostUnregister(self.arena.ptr)


class StreamReader:
    """Reads wanted byte ranges of data files with O_DIRECT as a stream of aligned reads, through one ring per
    file, into one arena of ``queue_depth`` slots of ``buffer_bytes``, allocated and faulted in once and
    reused for every file of the load.

    Call order (``CheckpointReader.read_data``, one thread): construct with the largest file's size (the
    arena holds no more slots than that file has reads), ``run(fd, wanted, file_size_bytes, destination, done, copier)``
    for each file, ``close()``. ``destination(key)`` gives the 1-D uint8 tensor an item's bytes go to
    (any device ``copier`` serves); for each read that lands, the bytes of every wanted item it overlaps
    are copied there with ``copier.copy(dst, src, slot)`` (``src`` a view of arena slot ``slot``, valid
    until ``copier.wait(slot)``, which the reader calls before reading into that slot again; ``Copier``
    copies at once). ``done(key)`` follows the completion of an item's last copy. Reads land in any order, so an item's pieces may
    come out of order. The copies of one read overlap the reads still in flight; no memory is allocated per
    read (fresh pages fault in, and on a virtual machine that reports free pages, fault on the host too).
    Raises OSError for a failed read, or one that ends before the bytes an item needs (the file is shorter
    than its metadata says).
    """

    def __init__(self, options: WriterOptions, largest_file_bytes: int) -> None:
        self.options = options
        reads = -(-align_up(largest_file_bytes, options.align_bytes) // options.buffer_bytes)
        self.arena_bytes = max(1, min(options.queue_depth, reads)) * options.buffer_bytes
        self.arena: AlignedBuffer | None = None
        self.reads = 0  # reads submitted by every ``run`` so far

    def close(self) -> None:
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def cuda_copier(self, device: torch.device) -> Copier:
        """A ``CudaCopier`` over this reader's arena (page-locked until its ``close``), or the synchronous
        ``Copier`` where CUDA refuses to register it."""
        try:
            return CudaCopier(self._arena(), device)
        except RuntimeError:
            return Copier()

    def _arena(self) -> AlignedBuffer:
        """The arena, allocated and faulted in at the first file that reads through it."""
        if self.arena is None:
            self.arena = AlignedBuffer(self.arena_bytes).prefault()
        return self.arena

    def prepare(self) -> None:
        """Allocate and fault in the arena now (else at the first ``run``): before a timed read."""
        self._arena()

    def run(
        self,
        fd: int,
        wanted: list[tuple[_Key, int, int]],
        file_size_bytes: int,
        destination: Callable[[_Key], torch.Tensor],
        done: Callable[[_Key], None],
        copier: Copier | None = None,
    ) -> None:
        items = sorted((offset, size, key) for key, offset, size in wanted if size > 0)
        if not items:
            return
        copier = copier or Copier()
        piece = self.options.buffer_bytes
        reads = plan_stream(
            [(offset, size) for offset, size, _ in items],
            piece_bytes=piece,
            align_bytes=self.options.align_bytes,
            file_size_bytes=file_size_bytes,
        )
        self.reads += len(reads)
        ends = [offset + size for offset, size, _ in items]
        left = {key: size for _, size, key in items}
        arena = self._arena()
        slots = min(len(reads), arena.size_bytes // piece)
        memory = torch.frombuffer(arena.mmap, dtype=torch.uint8)
        ring = open_ring(slots)
        try:
            # A served slot waits in ``copying`` until the copies out of it are done; it is read into again
            # only when no slot is free, oldest first, so copies overlap the reads submitted after them.
            # An item is done once the copies out of the slot holding its last bytes are (``finished``).
            free, copying, position = list(range(slots)), collections.deque(), 0
            finished: dict[int, list[_Key]] = {}
            while position < len(reads) or ring.pending:
                while position < len(reads) and (free or copying):
                    if free:
                        slot = free.pop()
                    else:
                        slot = copying.popleft()
                        copier.wait(slot)
                        for key in finished.pop(slot, ()):
                            done(key)
                    offset, size = reads[position]
                    ring.submit("read", fd, arena.ptr + slot * piece, size, offset, tag=slot)
                    position += 1
                request, moved = ring.wait_result()
                served = cast(int, request.tag)  # Ring tags are objects; ours are arena slots (submit above)
                finished[served] = self._serve(
                    request.offset,
                    request.size_bytes,
                    moved,
                    served,
                    piece,
                    memory,
                    items,
                    ends,
                    left,
                    destination,
                    copier,
                )
                copying.append(served)
            copier.wait_all()
            for slot in copying:
                for key in finished.pop(slot, ()):
                    done(key)
        finally:
            ring.close()  # waits for what is still in flight, so the arena is no longer written
            del memory

    @staticmethod
    def _serve(
        start: int,
        requested: int,
        landed: int,
        slot: int,
        piece: int,
        memory: torch.Tensor,
        items: list[tuple[int, int, _Key]],
        ends: list[int],
        left: dict[_Key, int],
        destination: Callable[[_Key], torch.Tensor],
        copier: Copier,
    ) -> list[_Key]:
        """Copy out the items overlapping the read of [start, start + requested) into arena ``slot``, whose
        first ``landed`` bytes arrived; returns the keys of the items whose last bytes these were."""
        base = slot * piece
        finished: list[_Key] = []
        i = bisect.bisect_right(ends, start)  # the first item ending after start
        while i < len(items) and items[i][0] < start + requested:
            offset, size, key = items[i]
            lo, hi = max(start, offset), min(offset + size, start + requested)
            if hi > start + landed:
                raise OSError(
                    errno.EIO, f"read ended at {start + landed:,} bytes, inside an item of {size:,} bytes at {offset:,}"
                )
            copier.copy(
                destination(key)[lo - offset : hi - offset], memory[base + lo - start : base + hi - start], slot
            )
            left[key] -= hi - lo
            if left[key] == 0:
                finished.append(key)
            i += 1
        return finished
