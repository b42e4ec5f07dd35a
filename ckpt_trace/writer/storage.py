"""A torch.distributed.checkpoint StorageWriter and StorageReader built on aggregated, aligned io_uring I/O.

``CheckpointWriter`` (DCP calls, in order; see torch's ``StorageWriter``):

0. ``reset(checkpoint_id)`` - all ranks: a new save begins (new save id).
1. ``set_up_storage_writer(is_coordinator, rank=...)`` - all ranks.
2. ``prepare_local_plan(plan)`` - all ranks: creates the directory.
3. ``prepare_global_plan(plans)`` - coordinator: gives each rank its file
   prefix and the coordinator's save id.
4. ``write_data(plan, planner)`` - all ranks: writes this rank's data files.
5. ``finish(metadata, results)`` - coordinator: commits the checkpoint.

Each rank's tensors are copied straight into page-aligned staging buffers
(raw bytes; no per-tensor torch.save round trip; non-tensor values arrive
from the planner already pickled) and each full buffer is one aligned write
submitted through io_uring with O_DIRECT, ``queue_depth`` buffers in flight,
so copying the next buffer overlaps the writes of the previous ones. Every
data file is fsynced. Data file names carry the save id and are never
reused, so a save killed midway leaves the previous checkpoint untouched;
the commit is the metadata file, written last (temporary file, fsync,
rename, directory fsync). Only after the commit are data files of earlier
saves that the new metadata does not reference removed.

``CheckpointReader`` (DCP calls: ``reset``, ``read_metadata``,
``set_up_storage_reader``, ``prepare_local_plan``, ``prepare_global_plan``,
``read_data``) reads each file's wanted bytes in large aligned O_DIRECT
reads through io_uring and copies each tensor out of them into the
destination tensor; a missing or truncated data file is an error naming it.

Errors: ``CheckpointError`` (a ``CkptTraceError``); inside ``dcp.save`` and
``dcp.load`` torch wraps it in its ``CheckpointException``.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import pickle
import re
import threading
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner, \
    WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ckpt_trace import config
from ckpt_trace.errors import CheckpointError

from .engine import AlignedBuffer, Ring, open_data_file
from .layout import FileLayout, ReadWindow, align_up, plan_files, plan_reads
from .options import WriterOptions

METADATA_NAME = "ckpt-trace.metadata"
METADATA_FORMAT = "ckpt-trace-dcp"
METADATA_VERSION = 1
_DATA_NAME = re.compile(r"^__\d+_\d+-[0-9a-f]{32}\.data$")
_TMP_NAME = re.compile(r"^\.ckpt-trace\.metadata\.[0-9a-f]{32}\.tmp$")


@dataclasses.dataclass(frozen=True)
class StoredItem:
    """Where one item's bytes are: ``relative_path``, ``offset`` and ``size_bytes`` in that data file.

    ``file_size_bytes`` is the data file's size when written (a truncated file
    is detected against it). ``dtype`` ("torch.float32") and ``shape`` are set
    for tensors: their bytes are the raw contiguous elements. Byte items
    (non-tensor values) hold ``torch.save`` output.
    """

    relative_path: str
    offset: int
    size_bytes: int
    file_size_bytes: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class _RankFiles:
    """A rank's data file names: ``{prefix}{file_index}-{save_id}.data``."""

    prefix: str
    save_id: str

    def name(self, file_index: int) -> str:
        return f"{self.prefix}{file_index}-{self.save_id}.data"


@dataclasses.dataclass(frozen=True)
class SaveStats:
    """What the last ``write_data`` did on this rank: bytes, files, and whether O_DIRECT was used."""

    bytes_written: int
    files: int
    direct_io: bool


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"checkpoint names an unknown dtype {name!r}")
    return dtype


def _tensor_bytes(item: WriteItem) -> int:
    """Bytes of the item's chunk (for a shard, its local part; ``tensor_data.size`` is the global size)."""
    numel = 1
    for dim in item.tensor_data.chunk.sizes:
        numel *= dim
    return numel * torch._utils._element_size(item.tensor_data.properties.dtype)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 view of ``tensor``'s elements in row-major order (copied first if not contiguous)."""
    tensor = tensor.detach()
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)


class _StagedFile:
    """One data file written from a ring of page-aligned staging buffers (one writer thread).

    Call order: ``put(offset, src)`` for each item in offset order, then
    ``close()``; ``abort()`` on failure.
    """

    def __init__(self, path: str, layout: FileLayout, options: WriterOptions) -> None:
        self.path, self.options = path, options
        self.buffers: list[AlignedBuffer] = []
        self.views: list[torch.Tensor] = []
        self.free: list[int] = []
        self.current: int | None = None
        self.fill = 0  # bytes staged in the current buffer
        self.file_offset = 0  # file offset of the current buffer's first byte
        self.fd, self.direct = open_data_file(path, write=True, direct=options.direct_io)
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

    def _flush(self) -> None:
        size = align_up(self.fill, self.options.align_bytes)
        view = self.views[self.current]
        if size > self.fill:
            view[self.fill:size].zero_()
        self.ring.submit("write", self.fd, self.buffers[self.current].ptr, size, self.file_offset, self.current)
        self.file_offset += self.options.buffer_bytes
        self.current, self.fill = None, 0

    def put(self, offset: int, src: torch.Tensor) -> None:
        """Stage ``src`` (1-D uint8, any device) at file ``offset`` (>= the previous item's end)."""
        gap = offset - (self.file_offset + self.fill)
        position, total = 0, src.numel()
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
                view[self.fill:self.fill + step].copy_(src[position:position + step])
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
        self.ring.close()
        os.close(self.fd)
        self.fd = -1
        self.views.clear()
        for buffer in self.buffers:
            buffer.close()



def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _io_error(action: str, path: str | Path, err: OSError) -> CheckpointError:
    if err.errno == errno.ENOSPC:
        return CheckpointError(f"no space left on device {action} {path}")
    return CheckpointError(f"{action} {path} failed: {err.strerror or err}")


class _DirectoryCheckpoint:
    """A checkpoint is a local directory: ``checkpoint_id`` is its path; URLs are not ours."""

    path: Path

    @property
    def checkpoint_id(self) -> Path:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and "://" not in str(checkpoint_id)


class CheckpointWriter(_DirectoryCheckpoint, StorageWriter):
    """DCP StorageWriter writing aggregated, aligned io_uring (O_DIRECT) writes; see the module docstring.

    ``path`` is the checkpoint directory (created if missing); it may hold an
    earlier checkpoint of this writer, which stays loadable until the new
    one commits. ``last_save`` holds this rank's ``SaveStats`` after a save.
    Raises CheckpointError (wrapped by DCP) for I/O failures, naming the file.
    """

    def __init__(self, path: str | os.PathLike, options: WriterOptions | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.options = (options or WriterOptions()).validate()
        self.save_id = uuid.uuid4().hex
        self.rank = 0
        self.last_save: SaveStats | None = None

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = kwargs.get("rank") or 0

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _io_error("creating checkpoint directory", self.path, err) from None
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(plan, storage_data=_RankFiles(f"__{i}_", self.save_id))
                for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        files = plan.storage_data
        if not isinstance(files, _RankFiles):
            files = _RankFiles(f"__{self.rank}_", self.save_id)
        pickled = {i: planner.resolve_data(item).getvalue() for i, item in enumerate(plan.items)
                   if item.type == WriteItemType.BYTE_IO}
        sizes = [(i, len(pickled[i]) if i in pickled else _tensor_bytes(item)) for i, item in enumerate(plan.items)]
        layouts = plan_files(sizes, self.options.writer_threads, align_bytes=self.options.align_bytes,
                             item_align_bytes=config.WRITER_ITEM_ALIGN_BYTES)
        written: list[_StagedFile] = []
        lock = threading.Lock()

        def write_file(layout: FileLayout) -> list[WriteResult]:
            return self._write_file(layout, files, plan, planner, pickled, written, lock)

        try:
            if len(layouts) <= 1:  # a rank can have nothing to write (DCP deduplicates replicated tensors)
                results = [result for layout in layouts for result in write_file(layout)]
            else:
                with ThreadPoolExecutor(len(layouts), thread_name_prefix="ckpt-trace-writer") as pool:
                    results = [r for part in pool.map(write_file, layouts) for r in part]
        except BaseException:
            for staged in written:
                staged.abort()
            raise
        direct = all(staged.direct for staged in written)
        if self.options.direct_io and not direct:
            warnings.warn(f"O_DIRECT refused by the file system of {self.path}; wrote through the page cache",
                          RuntimeWarning, stacklevel=2)
        self.last_save = SaveStats(sum(layout.size_bytes for layout in layouts), len(layouts), direct)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _write_file(self, layout: FileLayout, files: _RankFiles, plan: SavePlan, planner: SavePlanner,
                    pickled: dict[int, bytes], written: list, lock: threading.Lock) -> list[WriteResult]:
        name = files.name(layout.file_index)
        path = self.path / name
        try:
            staged = _StagedFile(str(path), layout, self.options)
        except OSError as err:
            raise _io_error("creating", path, err) from None
        with lock:
            written.append(staged)
        results = []
        try:
            for placement in layout.placements:
                item = plan.items[placement.key]
                staged.put(placement.offset, self._item_bytes(item, planner, pickled.get(placement.key)))
                results.append(self._result(item, name, placement.offset, placement.size_bytes, layout.size_bytes))
            staged.close()
        except OSError as err:
            raise _io_error("writing", path, err) from None
        return results

    @staticmethod
    def _item_bytes(item: WriteItem, planner: SavePlanner, pickled: bytes | None) -> torch.Tensor:
        if pickled is not None:
            return torch.frombuffer(bytearray(pickled), dtype=torch.uint8) if pickled else torch.empty(0, dtype=torch.uint8)
        tensor = planner.resolve_data(item)
        expected = _tensor_bytes(item)
        data = _as_bytes(tensor)
        if data.numel() != expected:
            raise CheckpointError(f"{item.index.fqn}: planner resolved {data.numel()} bytes, plan says {expected}")
        return data

    @staticmethod
    def _result(item: WriteItem, name: str, offset: int, size_bytes: int, file_size_bytes: int) -> WriteResult:
        if item.type == WriteItemType.BYTE_IO:
            stored = StoredItem(name, offset, size_bytes, file_size_bytes)
        else:
            stored = StoredItem(name, offset, size_bytes, file_size_bytes, str(item.tensor_data.properties.dtype),
                                tuple(item.tensor_data.chunk.sizes))
        return WriteResult(index=item.index, size_in_bytes=size_bytes, storage_data=stored)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit: metadata to a temporary file, fsync, rename, directory fsync; then drop stale data files."""
        metadata.storage_data = {wr.index: wr.storage_data for part in results for wr in part}
        metadata.storage_meta = self.storage_meta()
        referenced = {stored.relative_path for stored in metadata.storage_data.values()}
        tmp = self.path / f".{METADATA_NAME}.{self.save_id}.tmp"
        try:
            _fsync_directory(self.path)
            self._write_metadata(tmp, metadata)
            os.replace(tmp, self.path / METADATA_NAME)
            _fsync_directory(self.path)
        except OSError as err:
            for name in (tmp.name, *referenced):
                (self.path / name).unlink(missing_ok=True)
            raise _io_error("committing checkpoint metadata in", self.path, err) from None
        self._remove_stale(referenced)

    @staticmethod
    def _write_metadata(tmp: Path, metadata: Metadata) -> None:
        payload = pickle.dumps({"format": METADATA_FORMAT, "version": METADATA_VERSION, "metadata": metadata})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _remove_stale(self, referenced: set[str]) -> None:
        """Data files and temporary metadata of earlier or interrupted saves (only this writer's own names)."""
        for entry in os.scandir(self.path):
            stale_data = _DATA_NAME.match(entry.name) and entry.name not in referenced
            if stale_data or _TMP_NAME.match(entry.name):
                Path(entry.path).unlink(missing_ok=True)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.path), save_id=self.save_id)


class CheckpointReader(_DirectoryCheckpoint, StorageReader):
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

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self) -> Metadata:
        path = self.path / METADATA_NAME
        try:
            with open(path, "rb") as handle:
                payload = pickle.load(handle)
        except FileNotFoundError:
            raise CheckpointError(f"no committed checkpoint in {self.path}: {METADATA_NAME} is missing") from None
        except OSError as err:
            raise _io_error("reading", path, err) from None
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError):
            raise CheckpointError(f"{path} is corrupt or truncated") from None
        if not isinstance(payload, dict) or payload.get("format") != METADATA_FORMAT:
            raise CheckpointError(f"{path} is not a ckpt-trace checkpoint metadata file")
        if payload.get("version") != METADATA_VERSION:
            raise CheckpointError(f"{path} has format version {payload.get('version')}, this reader supports "
                                  f"{METADATA_VERSION}")
        metadata = payload["metadata"]
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
        for relative_path, indices in per_file.items():
            direct &= self._read_file(relative_path, [plan.items[i] for i in indices], planner)
        self.last_load_direct_io = direct
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_file(self, relative_path: str, items: list, planner: LoadPlanner) -> bool:
        path = self.path / relative_path
        stored = [self.storage_data[item.storage_index] for item in items]
        expected = max(s.file_size_bytes for s in stored)
        try:
            actual = os.stat(path).st_size
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint data file missing: {path}") from None
        if actual < expected:
            raise CheckpointError(f"checkpoint data file truncated: {path} has {actual:,} bytes, the metadata "
                                  f"records {expected:,}")
        try:
            fd, direct = open_data_file(str(path), write=False, direct=self.options.direct_io)
        except OSError as err:
            raise _io_error("opening", path, err) from None
        try:
            for i, s in enumerate(stored):
                if s.size_bytes == 0:
                    self._serve(items[i], s, torch.empty(0, dtype=torch.uint8), planner)
            windows = plan_reads([(i, s.offset, s.size_bytes) for i, s in enumerate(stored) if s.size_bytes],
                                 window_bytes=self.options.buffer_bytes, align_bytes=self.options.align_bytes,
                                 file_size_bytes=expected)
            _WindowReader(fd, self.options).run(windows, lambda i, data: self._serve(items[i], stored[i], data,
                                                                                     planner))
        except OSError as err:
            raise _io_error("reading", path, err) from None
        finally:
            os.close(fd)
        return direct

    @staticmethod
    def _serve(item, stored: StoredItem, data: torch.Tensor, planner: LoadPlanner) -> None:
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(data.numpy().tobytes()))
            return
        tensor = data.view(_dtype(stored.dtype)).reshape(stored.shape)
        for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
            tensor = tensor.narrow(dim, start, length)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise CheckpointError(f"{item.storage_index.fqn}: stored chunk {tuple(tensor.size())} does not fit "
                                  f"destination {tuple(target.size())}")
        target.copy_(tensor)
        planner.commit_tensor(item, target)


class _WindowReader:
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
            while position < len(queue) or ring.in_flight:
                while position < len(queue) and ring.has_room:
                    w, offset, size = queue[position]
                    if w not in pending:
                        if pending and self.in_use_bytes + self._size(windows[w]) > self.budget_bytes:
                            break
                        pending[w] = self._start(windows[w])
                    buffer = pending[w][0]
                    ring.submit("read", self.fd, buffer.ptr + offset - windows[w].start, size, offset, w)
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
