"""The load adapter: ``CheckpointReader``, a torch.distributed.checkpoint StorageReader.

DCP calls, in order: ``reset``, ``read_metadata`` (``format.read_metadata``),
``set_up_storage_reader``, ``prepare_local_plan``, ``prepare_global_plan``,
``read_data``. How a data file is read (``WriterOptions.load_direct_io``):

- buffered (``load_direct_io=False``, where O_DIRECT is refused, or, with
  ``load_cache_aware``, where the page cache already holds the file: cachestat(2)
  asked first, ``iolayer.pagecache``): its
  items in file order, each tensor read by preadv(2) straight into its
  destination's memory where the destination is a
  contiguous CPU tensor of the stored dtype and shape (what DCP's in-place
  load hands over), else into a scratch tensor copied from; the kernel's
  read-ahead keeps the device streaming and nothing is copied twice;
- O_DIRECT (default): the file as one stream of aligned reads of ``buffer_bytes``
  through io_uring into a fixed arena (``staging.StreamReader``), each read's
  bytes copied into the destination tensors (where they fit as stored, else
  a scratch tensor) while later reads are in flight; no page cache is
  filled and no memory allocated per read.

A missing or truncated data file is a ``CheckpointError`` naming it (torch
wraps it in ``CheckpointException``).
"""

from __future__ import annotations

import ctypes
import io
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ckpt_trace import config
from ckpt_trace.errors import CheckpointError
from ckpt_trace.iolayer.files import open_file
from ckpt_trace.iolayer.pagecache import resident_share

from .checksum import Verifier, checksum
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
            "files": 0,
            "direct_files": 0,
            "buffered_files": 0,
            "direct_bytes": 0,
            "buffered_bytes": 0,
            "resident_bytes": 0,
            "cache_probe": None,
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
            fd, direct = self._open_data(path, actual)
        except OSError as err:
            raise io_error("opening", path, err) from None
        stats = self.last_load_stats
        stats["files"] += 1
        stats["direct_files" if direct else "buffered_files"] += 1
        stats["direct_bytes" if direct else "buffered_bytes"] += actual
        if not direct:
            try:
                self._read_in_place(fd, path, items, stored, planner)
            except OSError as err:
                raise io_error("reading", path, err) from None
            finally:
                os.close(fd)
            return False
        try:
            for i, s in enumerate(stored):
                if s.size_bytes == 0:
                    self._serve(items[i], s, torch.empty(0, dtype=torch.uint8), planner)
            self._stream(stream, fd, items, stored, expected, planner, path)
        except OSError as err:
            raise io_error("reading", path, err) from None
        finally:
            os.close(fd)
        return direct

    def _open_data(self, path: Path, size_bytes: int) -> tuple[int, bool]:
        """(fd, O_DIRECT?) of a data file: O_DIRECT as the options ask, unless ``load_cache_aware`` finds the
        file warm (``iolayer.pagecache``): then the buffered descriptor it asked through."""
        if self.options.load_direct_io and self.options.load_cache_aware:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                share, method = resident_share(fd, size_bytes)
            except OSError:
                os.close(fd)
                raise
            self.last_load_stats["cache_probe"] = method
            self.last_load_stats["resident_bytes"] += int(share * size_bytes)
            if share >= config.READER_WARM_SHARE:
                return fd, False
            os.close(fd)
        opened = open_file(path, os.O_RDONLY, direct=self.options.load_direct_io)
        return opened.fd, opened.direct

    def _read_in_place(self, fd: int, path: Path, items: list, stored: list[StoredItem], planner: LoadPlanner) -> None:
        """Buffered reads in file order, each tensor straight into its destination where it fits as is;
        the file is cut into ``load_streams`` consecutive stretches of about equal bytes, each read by its
        own thread (the copies out of the page cache run on several cores, and the device sees as many
        read-ahead streams)."""
        order = sorted(range(len(items)), key=lambda i: stored[i].offset)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # posix_fadvise(2): a larger read-ahead window
        total = sum(stored[i].size_bytes for i in order) or 1
        streams: list[list[int]] = [[] for _ in range(max(1, min(self.options.load_streams, len(order))))]
        done = 0
        for i in order:
            streams[min(len(streams) - 1, done * len(streams) // total)].append(i)
            done += stored[i].size_bytes

        def read(stream: list[int]) -> None:
            for i in stream:
                item, s = items[i], stored[i]
                if item.type != LoadItemType.BYTE_IO and s.size_bytes:
                    target = planner.resolve_tensor(item).detach()
                    if _fits_as_stored(item, s, target):
                        _pread_into(fd, path, target, s.offset)
                        self._check(item, s, target, path, in_place=True)
                        planner.commit_tensor(item, target)
                        continue
                scratch = torch.empty(s.size_bytes, dtype=torch.uint8)
                _pread_into(fd, path, scratch, s.offset)
                self._check(item, s, scratch, path, in_place=False)
                self._serve(item, s, scratch, planner)

        if len(streams) == 1:
            read(streams[0])
            return
        with ThreadPoolExecutor(len(streams), thread_name_prefix="ckpt-trace-read") as pool:
            for future in [pool.submit(read, stream) for stream in streams]:
                future.result()

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


_CHUNK_BYTES = 64 << 20  # one preadv(2) at most: Ctrl-C is seen between chunks; Linux caps one read below 2 GiB


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


def _pread_into(fd: int, path: Path, tensor: torch.Tensor, offset: int) -> None:
    """Fill the contiguous CPU ``tensor``'s bytes from ``offset`` of ``fd`` with preadv(2). Raises
    CheckpointError when the file ends first."""
    size = tensor.numel() * tensor.element_size()
    if not size:
        return
    view = memoryview((ctypes.c_char * size).from_address(tensor.data_ptr())).cast("B")
    done = 0
    while done < size:
        moved = os.preadv(fd, [view[done : done + _CHUNK_BYTES]], offset + done)
        if moved == 0:
            raise CheckpointError(
                f"checkpoint data file truncated: {path} ends at {offset + done:,} bytes, "
                f"inside an item of {size:,} bytes at {offset:,}"
            )
        done += moved
