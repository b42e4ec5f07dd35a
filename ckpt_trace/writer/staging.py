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

``WindowReader`` (one reader thread, one data file): reads a file's wanted
items in aligned windows (``layout.plan_reads``) through one ring, and hands
each window's items to ``serve`` once all its requests landed.

Both run on the I/O layer (``iolayer.ring.Ring``, ``AlignedBuffer``,
``files.open_file`` with its O_DIRECT fallback).
"""

from __future__ import annotations

import errno
import os

import torch

from ckpt_trace.iolayer.buffers import AlignedBuffer
from ckpt_trace.iolayer.files import open_file
from ckpt_trace.iolayer.ring import Ring

from .layout import FileLayout, ReadWindow, align_up
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


class WindowReader:
    """Reads windows of one file through one ring; each window's items are served once all its requests land.

    Windows are read into buffers of a whole number of ``buffer_bytes``,
    kept in a free list by size and reused (same-shaped tensors reuse the
    same memory, so its pages are faulted in once). Windows start while at
    most ``queue_depth`` requests are in flight and the buffers in use stay
    within ``queue_depth * buffer_bytes`` (or hold a single window).
    """

    def __init__(self, fd: int, options: WriterOptions) -> None:
        self.fd, self.options = fd, options
        self.free: dict[int, list[AlignedBuffer]] = {}
        self.budget_bytes = options.queue_depth * options.buffer_bytes
        self.in_use_bytes = 0

    def run(self, windows: list[ReadWindow], serve) -> None:
        ring = Ring(self.options.queue_depth)
        pending: dict[int, list] = {}  # window index -> [buffer, view, requests left]
        queue = [(w, offset, size) for w, window in enumerate(windows)
                 for offset, size in window.requests(self.options.buffer_bytes)]
        try:
            position = 0
            while position < len(queue) or ring.pending:
                while position < len(queue) and ring.has_room:
                    w, offset, size = queue[position]
                    if w not in pending:
                        if pending and self.in_use_bytes + self._size(windows[w]) > self.budget_bytes:
                            break
                        pending[w] = self._start(windows[w])
                    buffer = pending[w][0]
                    ring.submit("read", self.fd, buffer.ptr + offset - windows[w].start, size, offset, tag=w)
                    position += 1
                w = ring.wait().tag
                pending[w][2] -= 1
                if pending[w][2] == 0:
                    self._finish(windows[w], pending.pop(w), serve)
        finally:
            ring.close()
            for buffer, view, _ in pending.values():
                self._release(buffer, view)
            for buffers in self.free.values():
                for buffer in buffers:
                    buffer.close()

    def _size(self, window: ReadWindow) -> int:
        return align_up(window.size_bytes, self.options.buffer_bytes)

    def _start(self, window: ReadWindow) -> list:
        size = self._size(window)
        spare = self.free.get(size)
        buffer = spare.pop() if spare else AlignedBuffer(size)
        self.in_use_bytes += size
        view = torch.frombuffer(buffer.mmap, dtype=torch.uint8)
        return [buffer, view, len(window.requests(self.options.buffer_bytes))]

    def _finish(self, window: ReadWindow, entry: list, serve) -> None:
        buffer, view, _ = entry
        for key, offset, size in window.members:
            serve(key, view[offset - window.start:offset - window.start + size])
        self._release(buffer, view)

    def _release(self, buffer: AlignedBuffer, view: torch.Tensor) -> None:
        del view
        self.in_use_bytes -= buffer.size_bytes
        spare = self.free.setdefault(buffer.size_bytes, [])
        if sum(b.size_bytes for bs in self.free.values() for b in bs) + buffer.size_bytes <= self.budget_bytes:
            spare.append(buffer)
        else:
            buffer.close()
