"""The save adapter: ``CheckpointWriter``, a torch.distributed.checkpoint StorageWriter.

DCP calls, in order (see torch's ``StorageWriter``):

0. ``reset(checkpoint_id)`` - all ranks: a new save begins (new save id).
1. ``set_up_storage_writer(is_coordinator, rank=...)`` - all ranks.
2. ``prepare_local_plan(plan)`` - all ranks: creates the directory.
3. ``prepare_global_plan(plans)`` - coordinator: gives each rank its file
   prefix and the coordinator's save id.
4. ``write_data(plan, planner)`` - all ranks: writes this rank's data files
   (``layout.plan_files`` places the items, ``staging.StagedFile`` writes
   them, one thread per file).
5. ``finish(metadata, results)`` - coordinator: commits the checkpoint
   (``format``: metadata last, through a renamed temporary file), then
   removes only this writer's stale files.

``dcp.async_save(state_dict, storage_writer=writer)`` first calls
``writer.stage(state_dict)`` (the writer is DCP's ``AsyncStager``): every
tensor is copied into host memory (GPU tensors into page-locked memory kept
between saves, by DCP's own ``DefaultStager``), and the call returns once
those copies are done; the state may then change while steps 0-5 write the
staged copy in the background (the DataStates-LLM and DCP ``async_save``
contract).

Each rank's tensors are copied raw into the staging buffers (no per-tensor
torch.save round trip; non-tensor values arrive from the planner already
pickled). Errors: ``CheckpointError``; inside ``dcp.save`` torch wraps it in
its ``CheckpointException``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from ckpt_trace import config
from ckpt_trace.errors import CheckpointError
from ckpt_trace.formats import fsync_directory

from .checksum import KIND as CHECKSUM_KIND
from .format import METADATA_NAME, RankFiles, StoredItem, io_error, stale_files, write_metadata
from .layout import FileLayout, plan_files
from .options import WriterOptions
from .staging import StagedFile


@dataclasses.dataclass(frozen=True)
class SaveStats:
    """What the last ``write_data`` did on this rank: bytes, files, and whether O_DIRECT was used."""

    bytes_written: int
    files: int
    direct_io: bool


def _tensor_data(item: WriteItem) -> TensorWriteData:
    """A tensor item's chunk and properties, which DCP's planner sets on every item but BYTE_IO ones.
    Raises CheckpointError for a tensor item without them."""
    if item.tensor_data is None:
        raise CheckpointError(f"{item.index.fqn}: the save plan's tensor item has no tensor_data")
    return item.tensor_data


def _tensor_bytes(item: WriteItem) -> int:
    """Bytes of the item's chunk (for a shard, its local part; ``tensor_data.size`` is the global size)."""
    tensor_data = _tensor_data(item)
    numel = 1
    for dim in tensor_data.chunk.sizes:
        numel *= dim
    # torch._utils is private and not re-exported (DCP's own planner and filesystem writer size items with it).
    return numel * torch._utils._element_size(tensor_data.properties.dtype)  # pyright: ignore[reportAttributeAccessIssue]


def _pickled(item: WriteItem, planner: SavePlanner) -> bytes:
    """The pickled bytes the planner resolved for a BYTE_IO item (an ``io.BytesIO``)."""
    data = planner.resolve_data(item)
    if isinstance(data, torch.Tensor):
        raise CheckpointError(f"{item.index.fqn}: planner resolved a tensor for a pickled (BYTE_IO) item")
    return data.getvalue()


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 view of ``tensor``'s elements in row-major order (copied first if not contiguous)."""
    tensor = tensor.detach()
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)


class DirectoryCheckpoint:
    """A checkpoint is a local directory: ``checkpoint_id`` is its path; URLs are not ours."""

    path: Path

    @property
    def checkpoint_id(self) -> Path:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and "://" not in str(checkpoint_id)


def _has_cuda_tensor(value: Any) -> bool:
    """Whether a (nested) state dict holds a tensor on a CUDA device."""
    if isinstance(value, torch.Tensor):
        return value.is_cuda
    if isinstance(value, dict):
        return any(_has_cuda_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_cuda_tensor(v) for v in value)
    return False


class CheckpointWriter(DirectoryCheckpoint, StorageWriter, AsyncStager):
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
        self._stagers: dict[bool, DefaultStager] = {}  # on a GPU? -> DCP's stager, kept for its cached memory
        self._stage_lock = threading.Lock()

    _synchronize_after_execute = False  # stage() returns once every copy is done

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``dcp.async_save``'s staging step: a copy of ``state_dict`` in host memory, returned once every
        device-to-host copy completed (GPU tensors: non-blocking copies into page-locked memory, which DCP's
        ``DefaultStager`` caches for the next save; CPU tensors: a plain copy). The caller may change the
        state as soon as this returns."""
        on_gpu = _has_cuda_tensor(state_dict) and torch.cuda.is_available()
        with self._stage_lock:
            stager = self._stagers.get(on_gpu)
            if stager is None:
                options = StagingOptions(
                    use_pinned_memory=on_gpu,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=on_gpu,
                )
                stager = self._stagers[on_gpu] = DefaultStager(options)
            # use_async_staging=False: stage returns the staged dict itself, never its Future.
            return cast(dict[str, Any], stager.stage(state_dict))

    def close(self) -> None:
        """Nothing to release between saves: some torch releases call ``close()`` on a storage writer that
        stages (``AsyncStager``) after each ``async_save``, and the page-locked copies ``stage`` keeps are
        what makes the next save's staging cheap (torch 2.11 on an H100: a stager closed that way failed the
        next save with ``KeyError: <class 'type'>``). ``release_staging()`` frees them."""

    def release_staging(self) -> None:
        """Free the staging memory ``stage`` kept (page-locked host copies of the state dict); the next
        ``async_save`` allocates it again. Call it when the job saves no more."""
        with self._stage_lock:
            stagers = list(self._stagers.values())
            self._stagers.clear()
        for stager in stagers:
            stager.close()

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
            raise io_error("creating checkpoint directory", self.path, err) from None
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [
            dataclasses.replace(plan, storage_data=RankFiles(f"__{i}_", self.save_id)) for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        files = plan.storage_data
        if not isinstance(files, RankFiles):
            files = RankFiles(f"__{self.rank}_", self.save_id)
        pickled = {
            i: _pickled(item, planner) for i, item in enumerate(plan.items) if item.type == WriteItemType.BYTE_IO
        }
        sizes = [(i, len(pickled[i]) if i in pickled else _tensor_bytes(item)) for i, item in enumerate(plan.items)]
        layouts = plan_files(
            sizes,
            self.options.writer_threads,
            align_bytes=self.options.align_bytes,
            item_align_bytes=config.WRITER_ITEM_ALIGN_BYTES,
        )
        written: list[StagedFile] = []
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
            warnings.warn(
                f"O_DIRECT refused by the file system of {self.path}; wrote through the page cache",
                RuntimeWarning,
                stacklevel=2,
            )
        self.last_save = SaveStats(sum(layout.size_bytes for layout in layouts), len(layouts), direct)
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _write_file(
        self,
        layout: FileLayout,
        files: RankFiles,
        plan: SavePlan,
        planner: SavePlanner,
        pickled: dict[int, bytes],
        written: list,
        lock: threading.Lock,
    ) -> list[WriteResult]:
        name = files.name(layout.file_index)
        path = self.path / name
        try:
            staged = StagedFile(str(path), layout, self.options)
        except OSError as err:
            raise io_error("creating", path, err) from None
        with lock:
            written.append(staged)
        staged_items = []
        try:
            for placement in layout.placements:
                index = cast(int, placement.key)  # plan_files was given the items' indices as keys (write_data)
                item = plan.items[index]
                data = self._item_bytes(item, planner, pickled.get(index))
                crc = staged.put(placement.offset, data, checksum=self.options.checksums)  # while in cache
                staged_items.append((item, placement, crc))
            staged.close()  # every write and checksum done
        except OSError as err:
            raise io_error("writing", path, err) from None
        return [
            self._result(
                item,
                name,
                placement.offset,
                placement.size_bytes,
                layout.size_bytes,
                crc.result() if crc is not None else None,
            )
            for item, placement, crc in staged_items
        ]

    @staticmethod
    def _item_bytes(item: WriteItem, planner: SavePlanner, pickled: bytes | None) -> torch.Tensor:
        if pickled is not None:
            return (
                torch.frombuffer(bytearray(pickled), dtype=torch.uint8)
                if pickled
                else torch.empty(0, dtype=torch.uint8)
            )
        tensor = planner.resolve_data(item)
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"{item.index.fqn}: planner resolved {type(tensor).__name__}, not a tensor")
        expected = _tensor_bytes(item)
        data = _as_bytes(tensor)
        if data.numel() != expected:
            raise CheckpointError(f"{item.index.fqn}: planner resolved {data.numel()} bytes, plan says {expected}")
        return data

    @staticmethod
    def _result(
        item: WriteItem, name: str, offset: int, size_bytes: int, file_size_bytes: int, crc: int | None = None
    ) -> WriteResult:
        kind = CHECKSUM_KIND if crc is not None else None
        if item.type == WriteItemType.BYTE_IO:
            stored = StoredItem(name, offset, size_bytes, file_size_bytes, checksum=crc, checksum_kind=kind)
        else:
            tensor_data = _tensor_data(item)
            stored = StoredItem(
                name,
                offset,
                size_bytes,
                file_size_bytes,
                str(tensor_data.properties.dtype),
                tuple(tensor_data.chunk.sizes),
                checksum=crc,
                checksum_kind=kind,
            )
        return WriteResult(index=item.index, size_in_bytes=size_bytes, storage_data=stored)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit: metadata to a temporary file, fsync, rename, directory fsync; then drop stale data files."""
        metadata.storage_data = {wr.index: wr.storage_data for part in results for wr in part}
        metadata.storage_meta = self.storage_meta()
        referenced = {stored.relative_path for stored in metadata.storage_data.values()}
        tmp = self.path / f".{METADATA_NAME}.{self.save_id}.tmp"
        try:
            fsync_directory(self.path)
            write_metadata(tmp, metadata)
            os.replace(tmp, self.path / METADATA_NAME)
            fsync_directory(self.path)
        except OSError as err:
            for name in (tmp.name, *referenced):
                (self.path / name).unlink(missing_ok=True)
            raise io_error("committing checkpoint metadata in", self.path, err) from None
        self._remove_stale(referenced)

    def _remove_stale(self, referenced: set[str]) -> None:
        """Data files and temporary metadata of earlier or interrupted saves (only this writer's own names)."""
        for path in stale_files(self.path, referenced):
            path.unlink(missing_ok=True)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.path), save_id=self.save_id)
