"""Raw ring records on their way to the builder: compressed to a scratch file, and decoded while they come.

``RawSpill`` holds groups of raw BPF records (a group: what every ring gave
between two points, as {ring name: [records, ...]}) zstd-compressed in a
scratch file, unlinked from the start, each group read back by its number.

``StreamDecoder`` decodes and feeds groups in a background thread while the
traced command runs (``bcc_backend.BccTracer.run``), in the order they were
put: the consumer thread only copies the rings and puts what it copied, so
it keeps reading them however slow decoding is. Groups queued in memory are
bounded by ``limit_bytes``; past it, what the consumer copies goes to the
spill file and is read back in its turn. Groups waiting in memory next to
each other are decoded as one (records from several polls, in one pass): the
further the decoder falls behind, the larger its batches. After the
command's exit, ``close`` decodes what is left and joins the thread.

Call order: ``StreamDecoder(feed, spill, limit_bytes=...)``, ``put(group)``
any number of times (from one thread), ``close()`` once. Called by
``tracer.bcc_backend``.
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

Group = dict[str, list[np.ndarray]]


class RawSpill:
    """Raw ring records compressed into a scratch file in ``directory`` (created at the first write,
    unlinked at once: nothing is left behind, even after SIGKILL). A group is written as a count of
    frames, then per chunk of records one zstd frame after a header (ring index, records, bytes). Groups
    are read back by number (``group``), from any thread, while more are written."""

    _GROUP = struct.Struct("<I")
    _FRAME = struct.Struct("<BQQ")

    def __init__(self, directory: str | os.PathLike, dtypes: dict[str, np.dtype]) -> None:
        self.directory, self.dtypes = Path(directory), dtypes
        self.names = list(dtypes)
        self.bytes = 0  # written so far (the next group's offset)
        self._file = None
        self._offsets: list[int] = []

    @property
    def count(self) -> int:
        """Groups written."""
        return len(self._offsets)

    def write(self, chunks: Group) -> int:
        """Append one group (every chunk of ``chunks``, ring by ring); return its number. Raises OSError
        (a full disk)."""
        if self._file is None:
            # Unbuffered: a group is on the file (readable by pread) once write returns.
            self._file = tempfile.TemporaryFile(prefix=".ckpt-trace-raw-", dir=self.directory, buffering=0)  # noqa: SIM115 - closed by close()
        frames = [(index, records) for index, name in enumerate(self.names) for records in chunks.get(name, ())]
        parts = [self._GROUP.pack(len(frames))]
        for index, records in frames:
            packed = pa.compress(records.tobytes(), codec="zstd", asbytes=True)
            parts += [self._FRAME.pack(index, len(records), len(packed)), packed]
        size = sum(map(len, parts))
        data = memoryview(b"".join(parts))
        while data:  # a raw file may write less than asked
            data = data[self._file.write(data) or 0 :]
        self._offsets.append(self.bytes)
        self.bytes += size
        return len(self._offsets) - 1

    def group(self, number: int) -> Group:
        """Group ``number`` as written, as {ring name: [records, ...]}."""
        if self._file is None:
            raise IndexError(f"no group {number}: nothing was spilled")
        fd = self._file.fileno()
        offset = self._offsets[number]
        (frames,) = self._GROUP.unpack(os.pread(fd, self._GROUP.size, offset))
        offset += self._GROUP.size
        group: Group = {name: [] for name in self.names}
        for _ in range(frames):
            index, count, size = self._FRAME.unpack(os.pread(fd, self._FRAME.size, offset))
            offset += self._FRAME.size
            dtype = self.dtypes[self.names[index]]
            raw = pa.decompress(
                os.pread(fd, size, offset), decompressed_size=count * dtype.itemsize, codec="zstd", asbytes=True
            )
            offset += size
            group[self.names[index]].append(np.frombuffer(raw, dtype))
        return group

    def groups(self) -> Iterator[Group]:
        """Each group written, in order."""
        for number in range(self.count):
            yield self.group(number)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class StreamDecoder:
    """Feeds groups of raw records to ``feed(group)`` in a background thread, in the order ``put`` got
    them (see the module docstring). ``feed`` runs only in that thread; an exception it raises is raised
    again by the next ``put`` or by ``close``."""

    def __init__(
        self,
        feed: Callable[[Group], None],
        spill: RawSpill,
        *,
        limit_bytes: int,
        batch_bytes: int = 0,
        batch_wait_s: float = 0.0,
    ) -> None:
        self._feed = feed
        self._spill = spill
        self.limit_bytes = max(1, limit_bytes)
        # A decoder that keeps up would otherwise feed every poll's few hundred records on its own, and each
        # feed has a fixed cost (numpy calls per ring and per call type): it waits until ``batch_bytes`` are
        # queued, or ``batch_wait_s`` passed since it last fed, whichever comes first.
        self.batch_bytes = min(max(0, batch_bytes), self.limit_bytes)
        self.batch_wait_s = max(0.0, batch_wait_s)
        self.queued_bytes = 0  # raw bytes put and not yet fed, in memory
        self.peak_queued_bytes = 0
        self.pending_bytes = 0  # raw bytes put and not yet fed, in memory or spilled
        self.groups_fed = 0
        self._queue: deque[Group | int] = deque()  # a group held, or the number of a spilled one
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="ckpt-trace-decoder", daemon=True)
        self._thread.start()

    def put(self, group: Group) -> None:
        """Queue one group (ring name -> chunks of records); spilled when the queue holds ``limit_bytes``
        already. Raises what ``feed`` raised, or OSError from spilling."""
        self._raise()
        size = sum(records.nbytes for chunks in group.values() for records in chunks)
        if not size:
            return
        with self._cond:
            held = self.queued_bytes + size <= self.limit_bytes
            self.pending_bytes += size
            if held:
                self.queued_bytes += size
                self.peak_queued_bytes = max(self.peak_queued_bytes, self.queued_bytes)
        item: Group | int = group if held else self._spill.write(group)  # compressed outside the lock
        with self._cond:
            self._queue.append(item)
            self._cond.notify()

    def close(self) -> None:
        """Feed everything queued, then stop the thread. Raises what ``feed`` raised."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._raise()

    def abandon(self) -> None:
        """Drop what is queued and let the thread end after the group it is feeding (the recording failed)."""
        with self._cond:
            self._queue.clear()
            self._closed = True
            self._cond.notify()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _take(self) -> tuple[Group | None, int]:
        """The next thing to feed: a spilled group, or every held group queued before the next spilled one
        (merged); with the bytes it holds in memory. (None, 0) once closed and empty."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self.batch_bytes and self.batch_wait_s:
                deadline = time.monotonic() + self.batch_wait_s
                while (
                    not self._closed
                    and self.queued_bytes < self.batch_bytes
                    and not any(isinstance(item, int) for item in self._queue)
                    and (left := deadline - time.monotonic()) > 0
                ):
                    self._cond.wait(left)
            if not self._queue:
                return None, 0
            first = self._queue.popleft()
            if isinstance(first, int):
                spilled = first
            else:
                spilled = None
                merged: Group = {name: list(chunks) for name, chunks in first.items()}
                while self._queue and not isinstance(self._queue[0], int):
                    nxt = self._queue.popleft()
                    assert not isinstance(nxt, int)
                    for name, chunks in nxt.items():
                        merged.setdefault(name, []).extend(chunks)
        if spilled is not None:
            return self._spill.group(spilled), 0  # read and decompressed outside the lock
        size = sum(records.nbytes for chunks in merged.values() for records in chunks)
        return merged, size

    def _work(self) -> None:
        try:
            while True:
                group, size = self._take()
                if group is None:
                    return
                self._feed(group)
                self.groups_fed += 1
                with self._cond:
                    self.queued_bytes -= size
                    self.pending_bytes -= sum(records.nbytes for chunks in group.values() for records in chunks)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer thread, raised there
            self._error = err
            with self._cond:  # stop taking: what is queued stays queued, ``close`` raises
                self._queue.clear()
