"""Reading a BPF ring buffer in bulk, without a Python call per record.

bcc's ``open_ring_buffer`` calls back into Python for every record: at a
hundred thousand io_uring requests a second that costs the traced program
more than the BPF programs do (on a 2-core machine, the callbacks take the
CPU the program needs). This reader maps the ring buffer map into memory
and copies every committed record in one numpy operation per poll.

The layout is the kernel's user-space ABI for BPF_MAP_TYPE_RINGBUF
(kernel/bpf/ringbuf.c; Documentation/bpf/ringbuf.rst): at offset 0 of the
map fd, one page holding ``consumer_pos`` (written by the reader); at the
next page, one page holding ``producer_pos``, followed by the data area
mapped twice in a row, so a record that wraps is contiguous in memory.
Each record is an 8-byte header (u32 length with ``BUSY`` bit 31 while the
producer writes it and ``DISCARD`` bit 30, u32 page offset) and the sample,
padded to 8 bytes. Both rings of ours carry one fixed-size record type, so
the committed part of the ring is an array of equal strides.

Memory ordering (the kernel's side: smp_store_release of each header and of
``producer_pos``; the reader's, as libbpf's ringbuf.c does it): ``producer_pos``
is read with an acquire load, the headers are read before an acquire fence and
the samples after it, and ``consumer_pos`` is published with a release store
once the samples are copied, so that the kernel never reuses space still being
read. numpy's loads and stores carry no ordering, so these three are calls into
iolayer's C library (``ckr_load_acquire_u64``, ``ckr_fence_acquire``,
``ckr_store_release_u64``). On x86-64, where every aligned load is an acquire
and every store a release (the TSO model), plain loads and stores are used when
that library is not built; elsewhere the library is required.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
from typing import Any

import numpy as np

from ckpt_trace.iolayer import ring as _ring

BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
HEADER_BYTES = 8
_TSO_MACHINES = ("x86_64", "amd64", "i386", "i686")


class _Ordering:
    """Acquire loads and release stores of one u64 array element, and an acquire fence (see the module
    docstring). ``plain`` (numpy loads and stores) is only chosen where the hardware orders them itself."""

    def __init__(self) -> None:
        try:
            lib = _ring.library()
        except _ring.RingUnavailable:
            if platform.machine().lower() not in _TSO_MACHINES:
                raise
            self.plain = True
        else:
            self.plain = False
            self.load, self.store, self.fence = (
                lib.ckr_load_acquire_u64,
                lib.ckr_store_release_u64,
                lib.ckr_fence_acquire,
            )

    def load_acquire(self, cell: np.ndarray, address: int) -> int:
        """``cell[0]``; ``address`` is ``cell.ctypes.data``, which the caller keeps (making it costs more
        than the load)."""
        return int(cell[0]) if self.plain else int(self.load(address))

    def store_release(self, cell: np.ndarray, address: int, value: int) -> None:
        if self.plain:
            cell[0] = value
        else:
            self.store(address, value)

    def fence_acquire(self) -> None:
        if not self.plain:
            self.fence()


def sample_dtype(ctypes_class: type) -> np.dtype:
    """The numpy dtype of a ctypes Structure class (bcc's event class): same fields, offsets and size;
    char arrays become uint8 arrays (their bytes past the first NUL are not meaningful)."""
    names, formats, offsets = [], [], []
    for name, kind in ctypes_class._fields_:
        field = getattr(ctypes_class, name)
        if issubclass(kind, ctypes.Array):
            base: Any = kind._type_  # a ctypes array class's element type
            fmt = (
                ("u1", kind._length_)
                if base in (ctypes.c_char, ctypes.c_ubyte)
                else (np.dtype(base).str, kind._length_)
            )
        else:
            fmt = np.dtype(kind).str
        names.append(name)
        formats.append(fmt)
        offsets.append(field.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": ctypes.sizeof(ctypes_class)})


class RingReader:
    """Reads the ring buffer map ``map_fd`` of ``size_bytes`` (a power of two pages) whose records are all
    samples of ``dtype``. Call order: ``read()`` as often as wanted (returns the records committed since
    the last call, copied), ``close()`` at the end. Raises OSError from mmap(2), and RingUnavailable off
    x86-64 when iolayer's C library (the ordered loads and stores) is not built.
    """

    def __init__(self, map_fd: int, size_bytes: int, dtype: np.dtype) -> None:
        page = mmap.PAGESIZE
        self.mask = size_bytes - 1
        self.dtype = dtype
        self.stride = -(-(HEADER_BYTES + dtype.itemsize) // 8) * 8
        self._consumer = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._producer = mmap.mmap(map_fd, page + 2 * size_bytes, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        self._data = np.frombuffer(self._producer, dtype=np.uint8, offset=page)
        # One aligned 8-byte load or store each (a u64 array element): the kernel must never see a torn
        # consumer_pos, which would make it think the ring full and drop records.
        self._consumer_pos = np.frombuffer(self._consumer, dtype=np.uint64, count=1)
        self._producer_pos = np.frombuffer(self._producer, dtype=np.uint64, count=1)
        self._ordering = _Ordering()
        self._consumer_address = self._consumer_pos.ctypes.data
        self._producer_address = self._producer_pos.ctypes.data

    def read(self) -> np.ndarray:
        """Every record committed since the previous call, as an array of ``dtype`` (a copy)."""
        order = self._ordering
        consumer = int(self._consumer_pos[0])  # written by this reader only
        producer = order.load_acquire(self._producer_pos, self._producer_address)
        available = (producer - consumer) // self.stride
        if available <= 0:
            return np.empty(0, dtype=self.dtype)
        start = consumer & self.mask
        rows = self._data[start : start + available * self.stride].reshape(available, self.stride)
        lengths = rows[:, :4].view("<u4")[:, 0] & (BUSY_BIT | DISCARD_BIT)  # one load of each header
        busy = np.flatnonzero(lengths & BUSY_BIT)
        committed = int(busy[0]) if len(busy) else available  # records after a busy one wait for it
        order.fence_acquire()  # the samples are read after their headers said committed
        keep = (lengths[:committed] & DISCARD_BIT) == 0
        samples = np.ascontiguousarray(rows[:committed, HEADER_BYTES : HEADER_BYTES + self.dtype.itemsize][keep])
        # after the copy
        order.store_release(self._consumer_pos, self._consumer_address, consumer + committed * self.stride)
        return samples.view(self.dtype).reshape(-1)

    def close(self) -> None:
        del self._data, self._consumer_pos, self._producer_pos
        self._producer.close()
        self._consumer.close()
