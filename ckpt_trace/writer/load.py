"""The load adapter: ``CheckpointReader``, a torch.distributed.checkpoint StorageReader.

DCP calls, in order: ``reset``, ``read_metadata`` (``format.read_metadata``),
``set_up_storage_reader``, ``prepare_local_plan``, ``prepare_global_plan``,
``read_data``. How a data file is read (``WriterOptions.load_policy``):

- auto (default): the page cache is asked first how much of the file it holds
  (cachestat(2), else RWF_NOWAIT probes: ``iolayer.pagecache``; one call, no
  byte read): at least ``config.READER_WARM_SHARE``, the whole file buffered;
  less than ``_SEGMENT_BYTES``, the whole file with O_DIRECT; between, each
  stretch of consecutive items of at most ``_SEGMENT_BYTES`` is asked on its
  own and read the way its share says (a mixed file). O_DIRECT on cached pages
  would read the device again (issue 36: 0.69-0.76 s against 0.05 s warm).
  What the cache does not hold (cold) is read the way measured faster on the
  file's device (``_cold_way``): the first cold file of at least
  ``2 * _PROBE_BYTES`` in a process reads its first ``_PROBE_BYTES`` of cold
  items with O_DIRECT and the next ``_PROBE_BYTES`` buffered, each timed as it
  places its items; the rest of that file, and every later cold byte on that
  device in the process, goes buffered unless O_DIRECT was at least
  ``_DIRECT_MARGIN`` times faster: for a CPU destination the O_DIRECT stream
  copies each byte once more (out of its arena), and one probe on a shared
  machine is noisy. Before any measurement (too few cold bytes), and for a load
  with GPU destinations (pinned arena, asynchronous host-to-device copies),
  O_DIRECT. On the project's VM (a virtual disk backed by its host) buffered
  won every cold cell of benchmarks/restore.py: 0.13 s against 0.18 s O_DIRECT
  for 4 x 64 MiB, 0.29 against 0.58 s for 770 MiB of 610 tensors (medians of 5,
  one run, load average 2-2.6); the probe reads only bytes the load needs.
  The way measured is kept for later processes of the same boot
  (``config.READER_COLD_WAYS``, a JSON file in the user's cache directory;
  ``_store_cold_way``), so a restarted job does not measure again;
- direct: O_DIRECT whatever the cache holds (buffered where O_DIRECT is refused);
- buffered: through the page cache.

Buffered: the items in file order, cut into ``load_streams`` stretches read by
as many threads; consecutive items (at most ``_MAX_GAP_BYTES`` apart) are read
by one scattering preadv(2) of up to ``_BATCH_BYTES`` and ``_IOV_MAX`` pieces
straight into each destination's memory where the destination is a contiguous
CPU tensor of the stored dtype and shape (what DCP's in-place load hands
over), else into a scratch tensor copied from once; so 600 tensors under
64 KiB take a handful of reads, not 600, and nothing is copied twice.

Warm (the page cache holds the file, policy auto): the file's wanted bytes
are cut into ``load_streams`` runs of equal size (an item split where a cut
falls in it, its CRC-32 parts joined by zlib's ``crc32_combine``), each
copied out of a mapping of the file by one call into C on its own thread
(``iolayer.ring.copy_mapped``, ``_read_mapped``): each 64 KiB checksummed
where the mapping holds it (ISA-L's CRC-32), then copied from the core's cache
with non-temporal stores, so each byte crosses memory once each way and no
read(2) call is made. A file truncated by another process during that copy
raises SIGBUS, as it does for ``torch.load(mmap=True)`` and safetensors;
``CKPT_TRACE_READER_MAPPED_COPY=0`` reads with preadv(2) instead, which the
reader also does for CRC32C checkpoints, without ISA-L, or without the ring
library: batches read ``_HOT_BYTES`` (512 KiB) a call, each piece's checksum
extended right after its read while the piece is in the core's cache.

O_DIRECT: the file's wanted items as one stream of aligned reads of
``buffer_bytes`` through io_uring into a fixed arena (``staging.StreamReader``),
each read's bytes copied into the destination tensors (where they fit as
stored, else a scratch tensor) while later reads are in flight; small items
share reads; no page cache is filled and no memory allocated per read.

``CheckpointReader.last_load_stats`` says what the last load did: the policy,
files read each way (``direct_files``, ``buffered_files``, ``mixed_files``),
item bytes and read calls each way (``*_bytes``, ``direct_reads`` submitted to
the ring, ``buffered_reads`` preadv calls; of the buffered bytes, those copied
out of a mapping, ``mapped_bytes``, and its mmap(2) calls, ``mapped_calls``; ``mapped_checks``: how
their checksums were computed, ``one pass`` with the copy where the CPU has AVX-512 and VPCLMULQDQ,
``before each copy`` by ISA-L elsewhere or under ``CKPT_TRACE_ONE_PASS_CHECKS=0``, None when none was),
what the cache held
(``resident_bytes``), the probe used, and the probes' count and time
(``probes``, ``probe_ns``); the cold way (``cold_way``: direct, buffered or
None when nothing was cold), where it came from (``cold_way_source``:
``measured`` in this load, ``earlier load`` on the same device in this
process, ``earlier process`` of this boot (stored), ``default``, ``options``: ``load_measure_cold_way`` off, ``GPU
destinations``) and the two rates measured (``cold_direct_bytes_per_s``,
``cold_buffered_bytes_per_s``, None where not measured).

A missing or truncated data file is a ``CheckpointError`` naming it (torch
wraps it in ``CheckpointException``).
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ckpt_trace import config
from ckpt_trace.errors import CheckpointError
from ckpt_trace.iolayer.files import open_file
from ckpt_trace.iolayer.pagecache import resident_share
from ckpt_trace.iolayer.ring import PIECE_DTYPE, RingUnavailable, copy_mapped, fused_crc_copy, library

from .checksum import Verifier, checksum, crc32_combine_function, crc32_function, extend
from .format import StoredItem, io_error, read_metadata
from .options import WriterOptions
from .save import DirectoryCheckpoint
from .staging import Copier, CudaCopier, StreamReader


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"checkpoint names an unknown dtype {name!r}")
    return dtype


class CheckpointReader(DirectoryCheckpoint, StorageReader):
    """DCP StorageReader for checkpoints of ``CheckpointWriter``; see the module docstring.

    Raises CheckpointError (wrapped by DCP) when the metadata is missing or
    not this writer's, or a data file is missing, truncated or unreadable,
    naming the file.
    """

    def __init__(self, path: str | os.PathLike, options: WriterOptions | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.options = (options or WriterOptions()).validate()
        self.storage_data: dict[MetadataIndex, StoredItem] = {}
        self.load_id = uuid.uuid4().hex
        self.last_load_direct_io: bool | None = None
        # Which way the last load read its files: counts and bytes, O_DIRECT or buffered, and what the page
        # cache held when asked (``load_cache_aware``).
        self.last_load_stats: dict = {}
        self._stats_lock = threading.Lock()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self) -> Metadata:
        metadata = read_metadata(self.path)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data or {}

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[int]] = {}
        for i, item in enumerate(plan.items):
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(i)
        direct = True
        largest = max(
            (s.offset + s.size_bytes for s in (self.storage_data[item.storage_index] for item in plan.items)), default=0
        )
        self._copier = None  # made at the first GPU destination (``_device_copier``)
        self.last_load_stats = {
            "policy": self.options.load_policy,
            "files": 0,
            "direct_files": 0,
            "buffered_files": 0,
            "mixed_files": 0,
            "direct_bytes": 0,
            "buffered_bytes": 0,
            "direct_reads": 0,
            "buffered_reads": 0,
            "mapped_bytes": 0,
            "mapped_calls": 0,
            "mapped_checks": None,
            "resident_bytes": 0,
            "cache_probe": None,
            "probes": 0,
            "probe_ns": 0,
            "cold_way": None,
            "cold_way_source": None,
            "cold_direct_bytes_per_s": None,
            "cold_buffered_bytes_per_s": None,
        }
        self._verifier = Verifier()  # the checksums, checked on a worker thread beside the reads (``_check``)
        with StreamReader(self.options, largest) as stream:  # one O_DIRECT arena for every file of this load
            try:
                for relative_path, indices in per_file.items():
                    direct &= self._read_file(relative_path, [plan.items[i] for i in indices], planner, stream)
                self._verifier.finish()  # the last items' checks: a corrupt item fails the load before it returns
            finally:
                self._verifier.close()
                if self._copier:
                    self._copier.close()  # unregisters the arena before the reader frees it
                self._copier = None
        self.last_load_direct_io = direct
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_file(self, relative_path: str, items: list, planner: LoadPlanner, stream: StreamReader) -> bool:
        path = self.path / relative_path
        stored = [self.storage_data[item.storage_index] for item in items]
        expected = max(s.file_size_bytes for s in stored)
        try:
            actual = os.stat(path).st_size
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint data file missing: {path}") from None
        if actual < expected:
            raise CheckpointError(
                f"checkpoint data file truncated: {path} has {actual:,} bytes, the metadata records {expected:,}"
            )
        if actual > expected and self.options.checksums and any(s.checksum is not None for s in stored):
            raise CheckpointError(
                f"checkpoint data file extended: {path} has {actual:,} bytes, the metadata "
                f"records {expected:,} (pass checksums=False in the reader's options to load it)"
            )
        try:
            plan = self._plan_file(path, actual, stored)
        except OSError as err:
            raise io_error("opening", path, err) from None
        try:
            warm = self.options.load_policy == "auto"  # what auto reads buffered here, the page cache holds
            self._read_buffered(plan, path, items, stored, planner, plan.buffered, warm=warm)
            cold = plan.direct
            if self.options.load_policy == "auto" and cold:
                cold = self._cold_way(plan, path, items, stored, planner, stream, expected)
            self._read_direct(plan, path, items, stored, planner, stream, expected, cold)
        except OSError as err:
            raise io_error("reading", path, err) from None
        finally:
            plan.close()
        stats = self.last_load_stats
        stats["files"] += 1
        way = "mixed" if plan.direct and plan.buffered else "direct" if plan.direct else "buffered"
        stats[f"{way}_files"] += 1
        stats["direct_bytes"] += sum(stored[i].size_bytes for i in plan.direct)
        stats["buffered_bytes"] += sum(stored[i].size_bytes for i in plan.buffered)
        return not plan.buffered

    def _read_buffered(
        self,
        plan: _FilePlan,
        path: Path,
        items: list,
        stored: list[StoredItem],
        planner: LoadPlanner,
        which: list[int],
        *,
        warm: bool = False,
    ) -> None:
        """Read the items ``which`` through the page cache (``_read_in_place``); ``warm``: the cache holds
        them, so each reading thread verifies its own batches' checksums."""
        if plan.buffered_fd is not None and which:
            self._read_in_place(
                plan.buffered_fd, path, [items[i] for i in which], [stored[i] for i in which], planner, warm
            )

    def _read_direct(
        self,
        plan: _FilePlan,
        path: Path,
        items: list,
        stored: list[StoredItem],
        planner: LoadPlanner,
        stream: StreamReader,
        file_size_bytes: int,
        which: list[int],
    ) -> None:
        if plan.direct_fd is None or not which:
            return
        for i in which:
            if stored[i].size_bytes == 0:
                self._serve(items[i], stored[i], torch.empty(0, dtype=torch.uint8), planner)
        before = stream.reads
        self._stream(
            stream,
            plan.direct_fd,
            [items[i] for i in which],
            [stored[i] for i in which],
            file_size_bytes,
            planner,
            path,
        )
        self.last_load_stats["direct_reads"] += stream.reads - before

    def _cold_way(
        self,
        plan: _FilePlan,
        path: Path,
        items: list,
        stored: list[StoredItem],
        planner: LoadPlanner,
        stream: StreamReader,
        file_size_bytes: int,
    ) -> list[int]:
        """Read the cold items (``plan.direct``) the way measured faster on the file's device (module
        docstring): with no measurement yet for the device and at least ``2 * _PROBE_BYTES`` of cold items,
        the first ``_PROBE_BYTES`` are read with O_DIRECT and the next buffered, each timed; the rest read
        buffered here unless O_DIRECT won by ``_DIRECT_MARGIN`` (moved from ``plan.direct`` to ``plan.buffered``, the buffered
        descriptor opened if needed). Returns the items still to read with O_DIRECT. Raises OSError from
        open(2) and the reads."""
        stats = self.last_load_stats
        device = os.fstat(plan.direct_fd).st_dev if plan.direct_fd is not None else None
        cold = list(plan.direct)
        way = _COLD_WAYS.get(device)
        if not self.options.load_measure_cold_way:
            stats["cold_way"], stats["cold_way_source"] = "direct", "options"
            return cold
        if any(_on_gpu(items[i], planner) for i in cold):
            stats["cold_way"], stats["cold_way_source"] = "direct", "GPU destinations"
            return cold
        if way is None:
            way = _stored_cold_way(device)
            if way is not None:
                _COLD_WAYS[device] = way
                stats["cold_way_source"] = stats["cold_way_source"] or "earlier process"
        elif stats["cold_way_source"] is None:
            stats["cold_way_source"] = "earlier load"
        if way is None:
            first, second, rest = _split_bytes(stored, cold, _PROBE_BYTES)
            if not rest and sum(stored[i].size_bytes for i in second) < _PROBE_BYTES:
                stats["cold_way"] = stats["cold_way"] or "direct"
                stats["cold_way_source"] = stats["cold_way_source"] or "default"
                return cold
            plan.open_buffered(path)
            stream.prepare()  # the arena's allocation is not the device's speed
            started = time.perf_counter()
            self._read_direct(plan, path, items, stored, planner, stream, file_size_bytes, first)
            direct_s = time.perf_counter() - started
            started = time.perf_counter()
            self._read_buffered(plan, path, items, stored, planner, second)
            buffered_s = time.perf_counter() - started
            direct_rate = sum(stored[i].size_bytes for i in first) / max(direct_s, 1e-9)
            buffered_rate = sum(stored[i].size_bytes for i in second) / max(buffered_s, 1e-9)
            way = "direct" if direct_rate >= _DIRECT_MARGIN * buffered_rate else "buffered"
            _COLD_WAYS[device] = way
            _store_cold_way(device, way, direct_rate, buffered_rate)
            stats.update(
                cold_way_source="measured",
                cold_direct_bytes_per_s=round(direct_rate),
                cold_buffered_bytes_per_s=round(buffered_rate),
            )
            plan.to_buffered(second)
            cold = rest
        stats["cold_way"] = way
        if way == "direct":
            return cold
        plan.open_buffered(path)
        plan.to_buffered(cold)
        self._read_buffered(plan, path, items, stored, planner, cold)
        return []

    def _plan_file(self, path: Path, size_bytes: int, stored: list[StoredItem]) -> _FilePlan:
        """Which items of a data file are read which way, and the descriptors: ``options.load_policy``
        buffered (every item through the page cache), direct (every item with O_DIRECT, where the file
        system allows it), or auto: the page cache asked first (``_resident``), what it holds read buffered,
        the rest with O_DIRECT. Raises OSError from open(2)."""
        order = sorted(range(len(stored)), key=lambda i: stored[i].offset)
        policy = self.options.load_policy
        if policy != "auto":
            opened = open_file(path, os.O_RDONLY, direct=policy == "direct")
            if opened.direct:
                return _FilePlan(opened.fd, None, order, [])
            return _FilePlan(None, opened.fd, [], order)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            resident = self._resident(fd, size_bytes, stored, order)
            direct = [i for i in order if i not in resident]
            direct_fd = None
            if direct:
                opened = open_file(path, os.O_RDONLY, direct=True)
                if opened.direct:
                    direct_fd = opened.fd
                else:  # O_DIRECT refused: everything through the cache
                    os.close(opened.fd)
                    resident, direct = set(order), []
        except OSError:
            os.close(fd)
            raise
        buffered = [i for i in order if i in resident]
        if not buffered:
            os.close(fd)
            return _FilePlan(direct_fd, None, direct, [])
        return _FilePlan(direct_fd, fd, direct, buffered)

    def _resident(self, fd: int, size_bytes: int, stored: list[StoredItem], order: list[int]) -> set[int]:
        """The items (indices into ``stored``, ``order`` is theirs by offset) whose pages the page cache
        holds (``iolayer.pagecache``: cachestat(2), else RWF_NOWAIT probes; nothing read from the device).
        The whole file is asked first: at least ``config.READER_WARM_SHARE`` resident, every item; less than
        one ``_SEGMENT_BYTES`` resident, none; between (a mixed file), each stretch of consecutive items of
        at most ``_SEGMENT_BYTES`` is asked on its own and counts as resident at the same share. The
        probes' count and time go to ``last_load_stats`` (``probes``, ``probe_ns``)."""
        stats = self.last_load_stats
        started = time.perf_counter_ns()
        share, method = resident_share(fd, size_bytes)
        stats["cache_probe"] = method
        stats["probes"] += 1
        stats["resident_bytes"] += int(share * size_bytes)
        resident: set[int] = set()
        if share >= config.READER_WARM_SHARE:
            resident = set(order)
        elif share * size_bytes >= _SEGMENT_BYTES:
            for segment in _segments(stored, order):
                first, last = stored[segment[0]], stored[segment[-1]]
                span = last.offset + last.size_bytes - first.offset
                if span <= 0:
                    continue
                part, _ = resident_share(fd, span, offset=first.offset)
                stats["probes"] += 1
                if part >= config.READER_WARM_SHARE:
                    resident.update(segment)
        stats["probe_ns"] += time.perf_counter_ns() - started
        return resident

    def _read_in_place(
        self, fd: int, path: Path, items: list, stored: list[StoredItem], planner: LoadPlanner, warm: bool = False
    ) -> None:
        """Buffered reads in file order: the file is cut into ``load_streams`` consecutive stretches of about
        equal bytes, each read by its own thread, the first by the calling thread (the copies out of the page
        cache run on several cores, and the device sees as many read-ahead streams); each stretch's items are
        read in batches (``_read_batches``; warm: out of a mapping, ``_read_mapped``), each tensor straight
        into its destination where it fits as is. ``warm`` (the
        page cache holds the items): each thread verifies its batches' checksums itself, right after their
        copy, rather than handing them to the load's one ``Verifier`` thread: there is no device time to
        overlap, and the checks spread over the cores (256 MiB of 4 tensors from the page cache, 2 threads,
        in a fresh process: 0.036 s against 0.045 s, 3 runs each, 2026-11-29)."""
        order = sorted(range(len(items)), key=lambda i: stored[i].offset)
        if warm and self._read_mapped(fd, path, [items[i] for i in order], [stored[i] for i in order], planner):
            return
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # posix_fadvise(2): a larger read-ahead window
        total = sum(stored[i].size_bytes for i in order) or 1
        streams: list[list[int]] = [[] for _ in range(max(1, min(self.options.load_streams, len(order))))]
        done = 0
        for i in order:
            streams[min(len(streams) - 1, done * len(streams) // total)].append(i)
            done += stored[i].size_bytes

        def read(stream: list[int]) -> int:
            return self._read_batches(fd, path, [items[i] for i in stream], [stored[i] for i in stream], planner, warm)

        if len(streams) == 1:
            calls = read(streams[0])
        else:  # the calling thread reads the first stretch: one thread fewer to start
            with ThreadPoolExecutor(len(streams) - 1, thread_name_prefix="ckpt-trace-read") as pool:
                futures = [pool.submit(read, stream) for stream in streams[1:]]
                calls = read(streams[0]) + sum(future.result() for future in futures)
        with self._stats_lock:
            self.last_load_stats["buffered_reads"] += calls

    def _read_batches(
        self, fd: int, path: Path, items: list, stored: list[StoredItem], planner: LoadPlanner, inline: bool = False
    ) -> int:
        """Read ``items`` (in file order) with as few preadv(2) calls as their layout allows: consecutive
        items at most ``_MAX_GAP_BYTES`` apart form one batch of up to ``_BATCH_BYTES`` and ``_IOV_MAX``
        pieces, read by one scattering preadv straight into each item's memory: the destination tensor where
        it fits as stored (no copy), else a scratch tensor copied from once (``_serve``); the bytes between
        items land in a throwaway buffer. Returns the number of preadv calls."""
        calls = 0
        gap = memoryview(bytearray(_MAX_GAP_BYTES))
        batch: list[tuple[int, torch.Tensor, torch.Tensor | None]] = []  # (index, memory, target if in place)
        views: list[memoryview] = []
        owners: list[int] = []  # per view, its place in ``batch`` (-1: a gap)
        # inline: each piece checked right after its read, while in the CPU's cache (``_HOT_BYTES`` a call)
        hot = inline and self.options.checksums
        kinds: list[str | None] = []  # per batch entry: the checksum kind to compute, None for none
        found: list[int] = []  # per batch entry: the running checksum
        start = end = 0

        def landed(view: int, part: memoryview) -> None:
            owner = owners[view]
            if owner >= 0 and (kind := kinds[owner]) is not None:
                found[owner] = extend(found[owner], part, kind)

        def flush() -> None:
            nonlocal calls
            if hot:
                calls += _preadv_full(fd, path, views, start, _HOT_BYTES, landed)
            else:
                calls += _preadv_full(fd, path, views, start)
            self._place(
                path,
                [(items[i], stored[i], memory, target) for i, memory, target in batch],
                planner,
                inline,
                [found[k] if kinds[k] is not None else None for k in range(len(batch))] if hot else None,
            )
            batch.clear()
            views.clear()
            owners.clear()
            kinds.clear()
            found.clear()

        for i, (item, s) in enumerate(zip(items, stored)):
            if not s.size_bytes:
                self._serve(item, s, torch.empty(0, dtype=torch.uint8), planner)
                continue
            if batch and (
                s.offset < end
                or s.offset - end > _MAX_GAP_BYTES
                or len(views) + 2 > _IOV_MAX
                or s.offset + s.size_bytes - start > _BATCH_BYTES
            ):
                flush()
            if not batch:
                start = end = s.offset
            memory, target = self._landing(item, s, planner)
            if s.offset > end:
                views.append(gap[: s.offset - end])
                owners.append(-1)
            views.append(_memory_view(memory))
            owners.append(len(batch))
            checked = hot and s.checksum is not None and item.type != LoadItemType.BYTE_IO
            kinds.append((s.checksum_kind or "crc32") if checked else None)
            found.append(0)
            batch.append((i, memory, target))
            end = s.offset + s.size_bytes
        if batch:
            flush()
        return calls

    def _read_mapped(self, fd: int, path: Path, items: list, stored: list[StoredItem], planner: LoadPlanner) -> bool:
        """Copy ``items`` (a warm file's, in file order) out of a mapping of the file into their memory (the
        destination where it fits as stored, else a scratch tensor), then place them (``_place``). The bytes
        are cut into ``load_streams`` runs of equal size, an item split between two where a cut falls in it
        (its CRC-32 then joined by zlib's ``crc32_combine``); each run is one call into C
        (``iolayer.ring.copy_mapped``: non-temporal stores; each 64 KiB checksummed while it is copied, in
        one pass, where the CPU has AVX-512 and VPCLMULQDQ, else just before its copy while the core's cache
        holds it), the first on the calling thread. Cut at items, the 770 MiB of
        many-small split 460/310 MiB and dcp-adam's 307 MiB 176/131. 256 MiB of 4 tensors out of the page
        cache on the project's 2-core EPYC, 2 threads: 15-20 ms with the checks against 29 ms for preadv(2)
        without them and 17-23 ms for torch's ``copy_`` out of a mapping (ad hoc, medians of 9-15 loads,
        2026-11-29). Returns False, having read nothing, where it cannot be used: ``config.READER_MAPPED_COPY``
        off, the ring library not built, an item to check whose kind is not CRC-32 or no ISA-L to compute
        it, or more than ``_MAPPED_SCRATCH_BYTES`` of items that do not fit their destination as stored (a
        GPU tensor, a strided one: their scratch tensors would all be held at once) (the preadv(2) path then
        reads them). Raises CheckpointError for a corrupt item, OSError when mmap(2) fails."""
        if not config.READER_MAPPED_COPY:
            return False
        checked = [
            self.options.checksums and s.checksum is not None and item.type != LoadItemType.BYTE_IO and s.size_bytes > 0
            for item, s in zip(items, stored)
        ]
        crc_function = crc32_function() if any(checked) else None
        if any(checked) and (
            crc_function is None or any((s.checksum_kind or "crc32") != "crc32" for s, c in zip(stored, checked) if c)
        ):
            return False
        try:
            library()
        except RingUnavailable:
            return False
        landed, parts = [], []  # parts: (index into landed, dst, offset, size_bytes, check)
        for item, s, check in zip(items, stored, checked):
            if s.size_bytes:
                memory, target = self._landing(item, s, planner)
                parts.append((len(landed), memory.data_ptr(), s.offset, s.size_bytes, check))
                landed.append((item, s, memory, target))
        if sum(s.size_bytes for _, s, _, target in landed if target is None) > _MAPPED_SCRATCH_BYTES:
            return False  # (the scratch tensors, never touched, are freed): preadv's batches bound that memory
        for item, s in zip(items, stored):
            if not s.size_bytes:
                self._serve(item, s, torch.empty(0, dtype=torch.uint8), planner)
        if not parts:
            return True
        runs = _balanced_runs(parts, max(1, self.options.load_streams), crc32_combine_function() is not None)
        tables = [
            np.array([(dst, off, size, int(check), 0) for _, dst, off, size, check in run], PIECE_DTYPE) for run in runs
        ]

        one_pass = bool(config.ONE_PASS_CHECKS) and fused_crc_copy()

        def copy(table: np.ndarray) -> tuple[int, int]:
            return copy_mapped(fd, table, crc_function, fused=one_pass)

        if len(tables) == 1:
            done = [copy(tables[0])]
        else:
            with ThreadPoolExecutor(len(tables) - 1, thread_name_prefix="ckpt-trace-read") as pool:
                futures = [pool.submit(copy, table) for table in tables[1:]]
                done = [copy(tables[0])] + [future.result() for future in futures]
        found: list[int | None] = [None] * len(landed)
        combine = crc32_combine_function()
        for run, table in zip(runs, tables):
            for (k, _, _, size, check), crc in zip(run, table["crc"].tolist()):
                if check:  # the parts of a split item come in file order: run after run
                    found[k] = crc if found[k] is None or combine is None else combine(found[k], crc, size)
        with self._stats_lock:
            self.last_load_stats["mapped_bytes"] += sum(copied for copied, _ in done)
            self.last_load_stats["mapped_calls"] += sum(maps for _, maps in done)
            if crc_function is not None:
                self.last_load_stats["mapped_checks"] = "one pass" if one_pass else "before each copy"
        self._place(path, landed, planner, True, found)
        return True

    def _landing(self, item, stored: StoredItem, planner: LoadPlanner) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the contiguous CPU memory an item's bytes are read into, the destination tensor when that memory
        is the destination's own, else None: a scratch tensor, served by ``_serve``)."""
        if item.type != LoadItemType.BYTE_IO:
            target = planner.resolve_tensor(item).detach()
            if _fits_as_stored(item, stored, target):
                return target, target
        return torch.empty(stored.size_bytes, dtype=torch.uint8), None

    def _place(
        self, path: Path, landed: list, planner: LoadPlanner, inline: bool = False, found: list | None = None
    ) -> None:
        """Hand a batch's items (item, stored, memory, target or None) to the planner: the checksums of its
        tensors queued as one check on the load's ``Verifier`` (``inline``: checked here, by the calling
        thread; ``found``: per item, its checksum computed already as its bytes landed, or None; a pickle's
        checked at once, before unpickling), then each committed (read in place) or served from its scratch
        tensor. Raises CheckpointError for a corrupt item checked here."""
        if self.options.checksums:
            checked = [
                (item, s, memory, found[k] if found is not None else None)
                for k, (item, s, memory, _) in enumerate(landed)
                if s.checksum is not None and item.type != LoadItemType.BYTE_IO
            ]
            if checked:
                held = sum(s.size_bytes for _, s, memory, target in landed if target is None)

                def check() -> None:
                    for item, s, memory, value in checked:
                        if value is None:
                            self._verify(item, s, memory, path)
                        elif s.size_bytes and value != s.checksum:
                            self._corrupt(item, s, value, path)

                if inline:
                    check()
                else:
                    self._verifier.submit(check, held)
        for item, s, memory, target in landed:
            if target is not None:
                planner.commit_tensor(item, target)
                continue
            if item.type == LoadItemType.BYTE_IO:
                self._check(item, s, memory, path, in_place=False)
            self._serve(item, s, memory, planner)

    def _check(self, item, stored: StoredItem, data: torch.Tensor, path: Path, in_place: bool) -> None:
        """Queue the check of ``data`` (the bytes that landed: the destination's memory, which nothing writes
        again during the load, or a scratch tensor, kept alive until checked) on the load's ``Verifier``;
        it raises CheckpointError (``_verify``) at a later ``_check`` or before ``read_data`` returns.
        A pickled item's bytes are checked at once, before anything unpickles them.
        Nothing when the options say ``checksums=False`` or no checksum was stored."""
        if stored.checksum is None or not self.options.checksums or not stored.size_bytes:
            return
        if item.type == LoadItemType.BYTE_IO:  # a pickle: checked before it is unpickled, here (it is small)
            self._verify(item, stored, data, path)
            return
        self._verifier.submit(lambda: self._verify(item, stored, data, path), 0 if in_place else stored.size_bytes)

    @staticmethod
    def _verify(item, stored: StoredItem, data: torch.Tensor, path: Path) -> None:
        """Raise CheckpointError naming the item, the file and the byte range when ``data`` does not have
        the stored checksum."""
        # No kind recorded: crc32, as checksum() computes for every kind but crc32c.
        found = checksum(data, stored.checksum_kind or "crc32")
        if found is not None and found != stored.checksum:
            CheckpointReader._corrupt(item, stored, found, path)

    @staticmethod
    def _corrupt(item, stored: StoredItem, found: int, path: Path):
        """Raise CheckpointError naming the item, the file and the byte range, the checksum found and the
        one recorded."""
        name = item.storage_index.fqn if hasattr(item, "storage_index") else "an item"
        raise CheckpointError(
            f"checkpoint item {name} in {path} (bytes {stored.offset:,}+{stored.size_bytes:,}) "
            f"is corrupt: {stored.checksum_kind} {found:08x}, recorded {stored.checksum:08x}"
        )

    def _stream(
        self,
        stream: StreamReader,
        fd: int,
        items: list,
        stored: list[StoredItem],
        file_size_bytes: int,
        planner: LoadPlanner,
        path: Path,
    ) -> None:
        """O_DIRECT: the file's items as one stream of aligned reads (``staging.StreamReader``), each read's
        bytes copied into the destination tensors where they fit as stored (a GPU tensor too: asynchronous
        host-to-device copies out of the page-locked arena, ``staging.CudaCopier``), else into a scratch
        tensor served whole once its last byte has landed."""
        # i -> (bytes, target (None for a pickle), in place: bytes is target's memory)
        destinations: dict[int, tuple[torch.Tensor, torch.Tensor | None, bool]] = {}

        def destination(i: int) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
            if i not in destinations:
                item, s = items[i], stored[i]
                target = planner.resolve_tensor(item).detach() if item.type != LoadItemType.BYTE_IO else None
                if target is not None and _fits_as_stored(item, s, target, self._device_copier(stream, target)):
                    destinations[i] = (target.reshape(-1).view(torch.uint8), target, True)
                else:
                    destinations[i] = (torch.empty(s.size_bytes, dtype=torch.uint8), target, False)
            return destinations[i]

        def done(i: int) -> None:
            memory, target, in_place = destinations.pop(i)
            if memory.device.type == "cpu":  # a GPU destination's bytes are checked nowhere on the host
                self._check(items[i], stored[i], memory, path, in_place)
            if in_place and target is not None:  # (in place only into a target: destination above)
                planner.commit_tensor(items[i], target)
            else:
                self._serve(items[i], stored[i], memory, planner)

        stream.run(
            fd,
            [(i, s.offset, s.size_bytes) for i, s in enumerate(stored)],
            file_size_bytes,
            lambda i: destination(i)[0],
            done,
            _LoadCopier(self),
        )

    def _device_copier(self, stream: StreamReader, target: torch.Tensor):
        """The copier for a destination on ``target``'s device: None for a CPU target; for a GPU target the
        load's ``CudaCopier`` (made at the first GPU target; False where its device differs or CUDA refused
        to page-lock the arena, so the item goes through a scratch tensor)."""
        if not target.is_cuda:
            return None
        if self._copier is None:
            self._copier = stream.cuda_copier(target.device)
        copier = self._copier
        if not isinstance(copier, CudaCopier) or copier.stream.device != target.device:
            return False
        return copier

    @staticmethod
    def _serve(item, stored: StoredItem, data: torch.Tensor, planner: LoadPlanner) -> None:
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(data.numpy().tobytes()))
            return
        if stored.dtype is None or stored.shape is None:
            raise CheckpointError(f"{item.storage_index.fqn}: the checkpoint records no dtype or shape for this tensor")
        tensor = data.view(_dtype(stored.dtype)).reshape(stored.shape)
        for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
            tensor = tensor.narrow(dim, start, length)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise CheckpointError(
                f"{item.storage_index.fqn}: stored chunk {tuple(tensor.size())} does not fit "
                f"destination {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(item, target)


# a warm read's preadv(2) when it checks what it read: the piece still in the core's L2 cache (1 MiB on the
# project's EPYC) when the checksum reads it (CRC32C: 12.5 GB/s out of memory, 25.6 GB/s out of L2 here;
# 256 MiB of 4 tensors warm, two sets of 5 forked loads per size: 64 KiB 47-51 ms, 256 KiB 37-38, 512 KiB
# 36-40, 1 MiB 40-43; 2026-11-29)
_HOT_BYTES = 512 << 10
_MAPPED_SCRATCH_BYTES = 256 << 20  # most scratch memory the warm mapped copy holds at once (``_read_mapped``)
_CHUNK_BYTES = 64 << 20  # one preadv(2) at most: Ctrl-C is seen between chunks; Linux caps one read below 2 GiB
_BATCH_BYTES = 16 << 20  # consecutive small items read by one scattering preadv(2), at most this span
_MAX_GAP_BYTES = 64 << 10  # items this far apart still share a read: the gap costs less than another call
_IOV_MAX = 1024  # iovecs in one preadv(2) (IOV_MAX, limits.h, on Linux)
_SEGMENT_BYTES = 16 << 20  # a mixed file's page cache is asked about stretches of this size
_PROBE_BYTES = 32 << 20  # cold bytes read each way to choose the cold way (``CheckpointReader._cold_way``)
_DIRECT_MARGIN = 1.25  # O_DIRECT must read cold bytes this many times faster than buffered to be chosen
# The cold way measured per device (st_dev) in this process: "direct" or "buffered".
_COLD_WAYS: dict[int | None, str] = {}


def _cold_way_key(device: int | None) -> str | None:
    """The stored cold ways' key of a device: this boot (``/proc/sys/kernel/random/boot_id``: device numbers
    and what backs them may change at a reboot) and its major:minor; None where either is unknown."""
    if device is None:
        return None
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{boot}:{os.major(device)}:{os.minor(device)}"


def _stored_ways() -> dict:
    """The cold ways stored by earlier processes (``config.READER_COLD_WAYS``, JSON: key -> {"way", the two
    rates}); {} when there is none, it cannot be read, or it is not such a file."""
    if not config.READER_COLD_WAYS:
        return {}
    try:
        data = json.loads(Path(config.READER_COLD_WAYS).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stored_cold_way(device: int | None) -> str | None:
    """The cold way an earlier process of this boot measured on ``device``, or None."""
    key = _cold_way_key(device)
    entry = _stored_ways().get(key) if key is not None else None
    way = entry.get("way") if isinstance(entry, dict) else None
    return way if way in ("direct", "buffered") else None


def _store_cold_way(device: int | None, way: str, direct_rate: float, buffered_rate: float) -> None:
    """Keep the measured cold way of ``device`` for later processes of this boot (a restart measures once per
    machine, not once per process: the measurement costs a fresh process about 50 ms of a 0.1-0.2 s load of
    256-770 MiB on the project's VM, benchmarks/restore.py). Written whole to a temporary file renamed over
    the file (mode 0600); entries of other boots are dropped. Best effort: a file that cannot be written
    leaves the measurement in this process only."""
    key = _cold_way_key(device)
    if key is None or not config.READER_COLD_WAYS:
        return
    boot = key.split(":", 1)[0]
    ways = {k: v for k, v in _stored_ways().items() if isinstance(k, str) and k.startswith(boot + ":")}
    ways[key] = {"way": way, "direct_bytes_per_s": round(direct_rate), "buffered_bytes_per_s": round(buffered_rate)}
    path = Path(config.READER_COLD_WAYS)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(ways, handle)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)  # ours: made with O_EXCL above


def load_state_dict(
    state_dict: dict, path: str | os.PathLike, options: WriterOptions | None = None
) -> CheckpointReader:
    """Fill ``state_dict`` in place from the checkpoint at ``path``, in this process, as
    ``dcp.load(state_dict, storage_reader=CheckpointReader(path, options))`` does, without DCP's planner
    where it is not needed: a dict (of dicts) whose every leaf is a whole, plain ``torch.Tensor`` (CPU or
    GPU) that the checkpoint holds unsharded with the same shape and dtype is planned here, one read item
    per tensor, and read by ``CheckpointReader.read_data``. That skips what ``dcp.load`` itself spends per
    item before and after the reads (its logging, a ``Stateful`` protocol check per value, flattening and
    the default load plan: about 36 ms for 610 tensors in a forked process on the project's 2-core VM,
    2026-11-29, where safetensors' whole warm load of the same 770 MiB took 89 ms). Any other state dict
    (values that are not tensors, DTensors, lists, a key the checkpoint lacks, a changed shape or dtype)
    goes through ``dcp.load`` itself, so the result and the errors are always DCP's.

    Nested dicts are named as DCP flattens them (keys joined by "."). One process: it does not gather
    plans across ranks (each rank of a job that saved unsharded tensors may call it on its own).
    Returns the reader (``last_load_stats``, whose ``planner`` says "direct" or "dcp"). Raises
    CheckpointError (bad or missing files, a corrupt item) and, on DCP's path, what ``dcp.load`` raises.
    """
    reader = CheckpointReader(path, options)
    metadata = reader.read_metadata()
    targets: dict[str, torch.Tensor] = {}
    items = _direct_items(state_dict, metadata, targets)
    if items is None:
        import torch.distributed.checkpoint as dcp

        reader.reset(path)
        dcp.load(state_dict, storage_reader=reader)
        reader.last_load_stats["planner"] = "dcp"
        return reader
    reader.set_up_storage_reader(metadata, True)
    reader.read_data(LoadPlan(items), _DirectPlanner(targets)).wait()  # type: ignore[arg-type]
    reader.last_load_stats["planner"] = "direct"
    return reader


def _direct_items(state_dict: dict, metadata: Metadata, targets: dict) -> list[ReadItem] | None:
    """One read item per tensor of ``state_dict`` (filling ``targets``: name -> tensor), or None when any
    leaf is not a whole plain tensor stored unsharded with its shape and dtype (``load_state_dict``)."""
    stored = metadata.state_dict_metadata
    storage = metadata.storage_data or {}
    items: list[ReadItem] = []
    pending: list[tuple[str, dict]] = [("", state_dict)]
    while pending:
        prefix, values = pending.pop()
        for key, value in values.items():
            if not isinstance(key, str):
                return None
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                pending.append((f"{name}.", value))
                continue
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                return None
            entry = stored.get(name)
            if not isinstance(entry, TensorStorageMetadata) or len(entry.chunks) != 1:
                return None
            chunk = entry.chunks[0]
            if any(chunk.offsets) or chunk.sizes != value.shape or entry.properties.dtype != value.dtype:
                return None
            index = MetadataIndex(name, chunk.offsets, 0)
            if index not in storage or name in targets:
                return None
            targets[name] = value
            items.append(ReadItem(LoadItemType.TENSOR, index, chunk.offsets, index, chunk.offsets, chunk.sizes))
    return items


class _DirectPlanner:
    """What ``CheckpointReader.read_data`` asks of a planner, for ``load_state_dict``'s whole tensors:
    the destination of each item, and nothing to do once it is filled (DCP's default planner does the same
    for tensors loaded in place)."""

    def __init__(self, targets: dict[str, torch.Tensor]) -> None:
        self.targets = targets

    def resolve_tensor(self, item: ReadItem) -> torch.Tensor:
        return self.targets[item.dest_index.fqn]

    def commit_tensor(self, item: ReadItem, tensor: torch.Tensor) -> None:
        pass

    def load_bytes(self, item: ReadItem, value: io.BytesIO) -> None:  # pragma: no cover - no byte items planned
        raise CheckpointError(f"{item.dest_index.fqn}: load_state_dict plans no pickled values")


def _balanced_runs(parts: list[tuple], count: int, may_split: bool) -> list[list[tuple]]:
    """``parts`` (index, dst address, file offset, size_bytes, check), in file order, cut into at most
    ``count`` consecutive runs of about equal bytes (run ``j`` ends at ``total * j // count``): a part a cut
    falls in is split there into two (its address and offset advanced) where ``may_split``, else it goes
    whole to the run it starts in."""
    total = sum(part[3] for part in parts)
    count = max(1, min(count, total))
    runs: list[list[tuple]] = [[]]
    before = current = 0  # bytes in the runs before the last, in the last
    for k, dst, offset, size, check in parts:
        while True:
            room = total * len(runs) // count - before - current
            if len(runs) == count or size <= room or (room > 0 and not may_split):
                runs[-1].append((k, dst, offset, size, check))
                current += size
                break
            if room > 0:  # the cut falls inside this part: its head ends this run
                runs[-1].append((k, dst, offset, room, check))
                dst, offset, size = dst + room, offset + room, size - room
                current += room
            before, current = before + current, 0
            runs.append([])
    return [run for run in runs if run]


def _on_gpu(item, planner: LoadPlanner) -> bool:
    """Whether a load item's destination is a tensor on a GPU."""
    return item.type != LoadItemType.BYTE_IO and planner.resolve_tensor(item).is_cuda


def _split_bytes(stored: list[StoredItem], order: list[int], size_bytes: int) -> tuple[list[int], list[int], list[int]]:
    """``order`` (item indices by offset) cut into a first run of at least ``size_bytes`` of items (or all
    of them), a second such run, and the rest."""
    runs: list[list[int]] = [[], [], []]
    run = filled = 0
    for i in order:
        runs[run].append(i)
        filled += stored[i].size_bytes
        if run < 2 and filled >= size_bytes:
            run, filled = run + 1, 0
    return runs[0], runs[1], runs[2]


class _LoadCopier(Copier):
    """The copier of one file of a load: the load's ``CudaCopier`` once a GPU destination made one, else
    synchronous copies (the copier is only known after the first destination is resolved)."""

    def __init__(self, reader: CheckpointReader) -> None:
        self.reader = reader

    def _target(self) -> Copier:
        return self.reader._copier or _SYNC

    def copy(self, dst: torch.Tensor, src: torch.Tensor, slot: int) -> None:
        self._target().copy(dst, src, slot)

    def wait(self, slot: int) -> None:
        self._target().wait(slot)

    def wait_all(self) -> None:
        self._target().wait_all()


_SYNC = Copier()


def _fits_as_stored(item, stored: StoredItem, target: torch.Tensor, device_copier=None) -> bool:
    """Whether the stored bytes are exactly ``target``'s memory: a whole, contiguous tensor of the stored
    dtype and shape, on the CPU (``device_copier`` None) or on a GPU the load's copier serves."""
    on_device = device_copier is None if target.device.type == "cpu" else bool(device_copier)
    return (
        on_device
        and target.is_contiguous()
        and stored.shape is not None
        and str(target.dtype) == stored.dtype
        and tuple(target.shape) == tuple(stored.shape)
        and not any(item.storage_offsets)
        and target.numel() * target.element_size() == stored.size_bytes
    )


def _memory_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of the contiguous CPU ``tensor`` as a writable memoryview (no copy)."""
    size = tensor.numel() * tensor.element_size()
    return memoryview((ctypes.c_char * size).from_address(tensor.data_ptr())).cast("B")


def _preadv_full(
    fd: int,
    path: Path,
    views: list[memoryview],
    offset: int,
    call_bytes: int = _CHUNK_BYTES,
    landed: Callable[[int, memoryview], None] | None = None,
) -> int:
    """Fill ``views`` in order from ``offset`` of ``fd`` with preadv(2), at most ``call_bytes`` a call,
    again after a short read; after each call, ``landed(index into views, the part of that view it filled)``
    for each view it reached. Returns the number of calls. Raises CheckpointError when the file ends
    first, OSError for a failed read, and what ``landed`` raises."""
    pending = [(index, view) for index, view in enumerate(views) if len(view)]
    calls = 0
    while pending:
        call, size = [], 0
        for _, view in pending:
            if size >= call_bytes or len(call) == _IOV_MAX:
                break
            call.append(view[: call_bytes - size])
            size += len(call[-1])
        moved = os.preadv(fd, call, offset)
        calls += 1
        if moved == 0:
            raise CheckpointError(
                f"checkpoint data file truncated: {path} ends at {offset:,} bytes, "
                f"inside a read of {sum(len(view) for _, view in pending):,} bytes"
            )
        offset += moved
        while moved:
            index, view = pending[0]
            step = min(moved, len(view))
            moved -= step
            if landed is not None:
                landed(index, view[:step])
            if step == len(view):
                pending.pop(0)
            else:
                pending[0] = (index, view[step:])
    return calls


def _segments(stored: list[StoredItem], order: list[int]) -> list[list[int]]:
    """``order`` (indices into ``stored`` by offset) cut into runs of consecutive items spanning at most
    ``_SEGMENT_BYTES`` each (an item larger than that is a run of its own): what a mixed file is asked
    about, a piece at a time."""
    runs: list[list[int]] = []
    start = 0
    for i in order:
        s = stored[i]
        if runs and s.offset + s.size_bytes - start <= _SEGMENT_BYTES:
            runs[-1].append(i)
        else:
            runs.append([i])
            start = s.offset
    return runs


@dataclass
class _FilePlan:
    """How one data file is read: its O_DIRECT and buffered descriptors (None where unused) and the items
    (indices, by offset) each reads."""

    direct_fd: int | None
    buffered_fd: int | None
    direct: list[int]
    buffered: list[int]

    def open_buffered(self, path: Path) -> None:
        """Open the buffered descriptor if the plan has none yet. Raises OSError from open(2)."""
        if self.buffered_fd is None:
            self.buffered_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def to_buffered(self, moved: list[int]) -> None:
        """Count these items (of ``direct``) as read buffered."""
        gone = set(moved)
        self.direct = [i for i in self.direct if i not in gone]
        self.buffered += moved

    def close(self) -> None:
        for fd in {self.direct_fd, self.buffered_fd}:
            if fd is not None:
                os.close(fd)
