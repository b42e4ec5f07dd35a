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
on failure removes the file.

``StreamReader`` (one reader thread, one data file): reads a file's wanted
byte ranges as one stream of aligned O_DIRECT reads (``layout.plan_stream``)
into a fixed arena through one ring, and copies each read's bytes out to the
items it overlaps while later reads are in flight.

Both run on the I/O layer (``iolayer.ring.Ring``, ``AlignedBuffer``,
``files.open_file`` with its O_DIRECT fallback).
"""

from __future__ import annotations

import bisect
import errno
import os
from collections.abc import Callable, Hashable

import torch

from ckpt_trace.iolayer.buffers import AlignedBuffer
from ckpt_trace.iolayer.files import open_file
from ckpt_trace.iolayer.ring import Ring

from .layout import FileLayout, align_up, plan_stream
from .options import WriterOptions


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
        self.pinned: set[int] = set()  # staging buffers page-locked for the GPU (cudaHostRegister)
        self.copying: set[int] = set()  # buffers with device-to-host copies still in flight
        self.copy_stream = None  # the stream the copies were queued on
        opened = open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, direct=options.direct_io)
        self.fd, self.direct = opened.fd, opened.direct
        try:
            self.ring = Ring(options.queue_depth)
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
            self.free.append(self.ring.wait().tag)
        return self.free.pop()

    def _pin(self, index: int) -> bool:
        """Page-lock staging buffer ``index`` for asynchronous device-to-host copies; False if CUDA refuses."""
        if index not in self.pinned:
            buffer = self.buffers[index]
            try:
                torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(buffer.ptr, buffer.size_bytes, 0))
            except RuntimeError:
                return False
            self.pinned.add(index)
        return True

    def _flush(self) -> None:
        if self.current in self.copying:  # its bytes are still on their way from the GPU
            self.copy_stream.synchronize()
            self.copying.clear()
        size = align_up(self.fill, self.options.align_bytes)
        view = self.views[self.current]
        if size > self.fill:
            view[self.fill:size].zero_()
        self.ring.submit("write", self.fd, self.buffers[self.current].ptr, size, self.file_offset, tag=self.current)
        self.file_offset += self.options.buffer_bytes
        self.current, self.fill = None, 0

    def put(self, offset: int, src: torch.Tensor) -> None:
        """Stage ``src`` (1-D uint8, any device) at file ``offset`` (>= the previous item's end)."""
        gap = offset - (self.file_offset + self.fill)
        position, total = 0, src.numel()
        on_gpu = src.is_cuda
        if on_gpu:
            self.copy_stream = torch.cuda.current_stream(src.device)
        while gap > 0 or position < total:
            if self.current is None:
                self.current = self._take_buffer()
            room = self.options.buffer_bytes - self.fill
            view = self.views[self.current]
            if gap > 0:
                step = min(gap, room)
                view[self.fill:self.fill + step].zero_()
                gap -= step
            else:
                step = min(total - position, room)
                asynchronous = on_gpu and self._pin(self.current)
                view[self.fill:self.fill + step].copy_(src[position:position + step], non_blocking=asynchronous)
                if asynchronous:
                    self.copying.add(self.current)
                position += step
            self.fill += step
            if self.fill == self.options.buffer_bytes:
                self._flush()

    def close(self) -> None:
        """Write the last buffer (zero-padded to the alignment), wait for every write, fsync and close."""
        if self.current is not None and self.fill:
            self._flush()
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
        if self.copying:
            self.copy_stream.synchronize()  # no copy may land in a buffer about to be freed
            self.copying.clear()
        self.ring.close()
        os.close(self.fd)
        self.fd = -1
        self.views.clear()
        for index in self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.buffers[index].ptr)
        self.pinned.clear()
        for buffer in self.buffers:
            buffer.close()


class StreamReader:
    """Reads wanted byte ranges of data files with O_DIRECT as a stream of aligned reads, through one ring per
    file, into one arena of ``queue_depth`` slots of ``buffer_bytes``, allocated and faulted in once and
    reused for every file of the load.

    Call order (``CheckpointReader.read_data``, one thread): construct with the largest file's size (the
    arena holds no more slots than that file has reads), ``run(fd, wanted, file_size_bytes, sink, done)``
    for each file, ``close()``. For each read that lands, ``sink(key, item_offset, data)`` is
    called for every wanted item it overlaps, with ``data`` (a uint8 tensor over the slot, valid only during
    the call) holding the item's bytes from ``item_offset`` on; the slot's next read is submitted after
    that. ``done(key)`` follows an item's last ``sink``. Reads land in any order, so an item's pieces may
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

    def close(self) -> None:
        if self.arena is not None:
            self.arena.close()
            self.arena = None

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _arena(self) -> AlignedBuffer:
        """The arena, allocated and faulted in at the first file that reads through it."""
        if self.arena is None:
            self.arena = AlignedBuffer(self.arena_bytes).prefault()
        return self.arena

    def run(self, fd: int, wanted: list[tuple[Hashable, int, int]], file_size_bytes: int,
            sink: Callable[[Hashable, int, torch.Tensor], None], done: Callable[[Hashable], None]) -> None:
        items = sorted((offset, size, key) for key, offset, size in wanted if size > 0)
        if not items:
            return
        piece = self.options.buffer_bytes
        reads = plan_stream([(offset, size) for offset, size, _ in items], piece_bytes=piece,
                            align_bytes=self.options.align_bytes, file_size_bytes=file_size_bytes)
        ends = [offset + size for offset, size, _ in items]
        left = {key: size for _, size, key in items}
        arena = self._arena()
        slots = min(len(reads), arena.size_bytes // piece)
        memory = torch.frombuffer(arena.mmap, dtype=torch.uint8)
        ring = Ring(slots)
        try:
            free, position = list(range(slots)), 0
            while position < len(reads) or ring.pending:
                while position < len(reads) and free:
                    slot = free.pop()
                    offset, size = reads[position]
                    ring.submit("read", fd, arena.ptr + slot * piece, size, offset, tag=slot)
                    position += 1
                request, moved = ring.wait_result()
                self._serve(request.offset, request.size_bytes, moved, request.tag * piece, memory, items,
                            ends, left, sink, done)
                free.append(request.tag)
        finally:
            ring.close()  # waits for what is still in flight, so the arena is no longer written
            del memory

    @staticmethod
    def _serve(start: int, requested: int, landed: int, base: int, memory: torch.Tensor, items: list,
               ends: list[int], left: dict, sink, done) -> None:
        """Hand out the items overlapping the read of [start, start + requested), whose first ``landed`` bytes
        arrived and sit at ``base`` of ``memory``."""
        i = bisect.bisect_right(ends, start)  # the first item ending after start
        while i < len(items) and items[i][0] < start + requested:
            offset, size, key = items[i]
            lo, hi = max(start, offset), min(offset + size, start + requested)
            if hi > start + landed:
                raise OSError(errno.EIO, f"read ended at {start + landed:,} bytes, inside an item of {size:,} "
                                         f"bytes at {offset:,}")
            sink(key, lo - offset, memory[base + lo - start:base + hi - start])
            left[key] -= hi - lo
            if left[key] == 0:
                done(key)
            i += 1
