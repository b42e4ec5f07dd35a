"""The writer's tunable parameters: what ``ckpt-trace emit`` chooses and pins."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ckpt_trace import config
from ckpt_trace.errors import CheckpointError


@dataclass(frozen=True)
class WriterOptions:
    """Parameters of ``CheckpointWriter`` / ``CheckpointReader``.

    - ``buffer_bytes``: size of one staging buffer, which is one write (or
      read) request; a multiple of ``align_bytes``. The 1-4 MiB range is the
      one arXiv 2512.24511 measured as best for aggregated checkpoint writes.
    - ``queue_depth``: io_uring requests in flight per thread; also the number
      of staging buffers, so staging memory is ``queue_depth * buffer_bytes``
      per thread.
    - ``direct_io``: open data files with O_DIRECT (bypass the page cache);
      where the file system refuses O_DIRECT the writer falls back to buffered
      I/O and warns.
    - ``writer_threads``: threads per rank, each writing its own data file.
    - ``align_bytes``: O_DIRECT alignment of offsets, sizes and buffer
      addresses (open(2), "O_DIRECT"); 4096 covers 512 B and 4 KiB devices.
    - ``preallocate``: fallocate(2) each data file to its final size first,
      so a full disk fails before any byte is written.
    - ``load_direct_io``: how ``CheckpointReader`` reads. True (default):
      O_DIRECT is allowed: cold bytes may be read as a stream of O_DIRECT reads
      of ``buffer_bytes`` through io_uring into a fixed arena, copied out into
      the destinations while later reads are in flight (no page cache filled;
      where O_DIRECT is refused, the buffered way), as ``load_cache_aware`` and
      ``load_measure_cold_way`` decide; False: buffered reads only, in file
      order, straight into each destination tensor's memory (no copy-out),
      riding the kernel's read-ahead. Which is faster depends on the device:
      fio's O_DIRECT read beat its buffered read on this project's disk in
      issue 14's table (1,097 against 715 MB/s), its buffered read won every
      cold cell of ``benchmarks/restore.py`` at stop 44 (2.4-3.1 against
      1.8-2.1 GB/s); a replayed load (``emit``) can pin it for a device.
    - ``load_measure_cold_way``: with ``load_direct_io`` and ``load_cache_aware``
      (the ``auto`` policy), the reader measures which way reads cold bytes
      faster on each device, on the load's own first cold bytes, and reads the
      rest that way (True, the default; ``load.CheckpointReader._cold_way``);
      False: cold bytes always go O_DIRECT (what ``emit`` pins when a replayed
      load's verdict clearly favours O_DIRECT).
    - ``load_streams``: buffered loads (``load_direct_io=False``): threads reading one data file, each a
      consecutive stretch of about equal bytes (2 matched ``torch.load(mmap=True)``
      on the 2-core machine of ``benchmarks/restore.py``, where one thread
      did not: the copies out of the page cache need a core each).
    - ``load_cache_aware``: with ``load_direct_io``, a data file whose pages are at least
      ``config.READER_WARM_SHARE`` in the page cache (asked with cachestat(2), ``iolayer.pagecache``;
      nothing is read to ask) is read the buffered way instead, from memory: O_DIRECT would bypass the
      copy already in memory and read the device again (issue 36: 0.69-0.76 s against 0.05 s for a
      warm 770 MiB load). A file partly in the cache is asked again a stretch of items at a time and read
      both ways. True by default; the reader's ``last_load_stats`` says which way each file went, the bytes
      and read calls of each way, and the probes' count and time. ``load_policy`` names the combination.
    - ``checksums``: the writer stores each item's checksum (CRC-32 or CRC32C, ``checksum.py``) in the metadata and
      the reader checks every item it loads, and that each data file has exactly its recorded size
      (True, the default); False: neither (a reader with False loads without checking). Both sides
      compute them on a helper thread beside the I/O; what they cost is measured in ``checksum.py``.

    Raises CheckpointError from ``validate()`` for values out of range.
    """

    buffer_bytes: int = config.WRITER_BUFFER_BYTES
    queue_depth: int = config.WRITER_QUEUE_DEPTH
    direct_io: bool = True
    writer_threads: int = config.WRITER_THREADS
    align_bytes: int = config.WRITER_ALIGN_BYTES
    preallocate: bool = True
    load_direct_io: bool = True
    load_streams: int = 2
    load_cache_aware: bool = True
    checksums: bool = True
    load_measure_cold_way: bool = True

    @property
    def load_policy(self) -> str:
        """How ``CheckpointReader`` chooses between the page cache and O_DIRECT, from the two load flags:
        ``auto`` (``load_direct_io`` and ``load_cache_aware``, the default: what the page cache holds read
        buffered, the rest with O_DIRECT, per file or per stretch of a partly cached file), ``direct``
        (``load_cache_aware=False``: O_DIRECT even when cached) or ``buffered`` (``load_direct_io=False``)."""
        if not self.load_direct_io:
            return "buffered"
        return "auto" if self.load_cache_aware else "direct"

    @classmethod
    def load_flags(cls, policy: str) -> dict[str, bool]:
        """The ``load_direct_io``/``load_cache_aware`` values of a ``load_policy`` (auto | direct | buffered),
        e.g. ``WriterOptions(**WriterOptions.load_flags("direct"))``. Raises CheckpointError for another."""
        flags = {
            "auto": {"load_direct_io": True, "load_cache_aware": True},
            "direct": {"load_direct_io": True, "load_cache_aware": False},
            "buffered": {"load_direct_io": False, "load_cache_aware": True},
        }
        if policy not in flags:
            raise CheckpointError(f"load policy must be auto, direct or buffered, not {policy!r}")
        return flags[policy]

    def validate(self) -> WriterOptions:
        if self.align_bytes < 512 or self.align_bytes & (self.align_bytes - 1):
            raise CheckpointError(f"align_bytes must be a power of two >= 512, not {self.align_bytes}")
        if self.buffer_bytes < self.align_bytes or self.buffer_bytes % self.align_bytes:
            raise CheckpointError(f"buffer_bytes must be a multiple of {self.align_bytes}, not {self.buffer_bytes}")
        if not 1 <= self.queue_depth <= 4096:
            raise CheckpointError(f"queue_depth must be 1..4096, not {self.queue_depth}")
        if not 1 <= self.load_streams <= 64:
            raise CheckpointError(f"load_streams must be 1..64, not {self.load_streams}")
        if not 1 <= self.writer_threads <= 256:
            raise CheckpointError(f"writer_threads must be 1..256, not {self.writer_threads}")
        return self

    def to_json(self) -> dict:
        return asdict(self)
