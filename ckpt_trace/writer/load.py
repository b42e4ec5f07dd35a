"""The load adapter: ``CheckpointReader``, a torch.distributed.checkpoint StorageReader.

DCP calls, in order: ``reset``, ``read_metadata`` (``format.read_metadata``),
``set_up_storage_reader``, ``prepare_local_plan``, ``prepare_global_plan``,
``read_data``. Each file's wanted bytes are read in large aligned O_DIRECT
reads through io_uring (``staging.WindowReader``) and each tensor is copied
out of them into its destination; a missing or truncated data file is a
``CheckpointError`` naming it (torch wraps it in ``CheckpointException``).
"""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ckpt_trace.errors import CheckpointError
from ckpt_trace.iolayer.files import open_file

from .format import StoredItem, io_error, read_metadata
from .layout import plan_reads
from .options import WriterOptions
from .save import DirectoryCheckpoint
from .staging import WindowReader


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
            opened = open_file(path, os.O_RDONLY, direct=self.options.direct_io)
            fd, direct = opened.fd, opened.direct
        except OSError as err:
            raise io_error("opening", path, err) from None
        try:
            for i, s in enumerate(stored):
                if s.size_bytes == 0:
                    self._serve(items[i], s, torch.empty(0, dtype=torch.uint8), planner)
            windows = plan_reads([(i, s.offset, s.size_bytes) for i, s in enumerate(stored) if s.size_bytes],
                                 window_bytes=self.options.buffer_bytes, align_bytes=self.options.align_bytes,
                                 file_size_bytes=expected)
            WindowReader(fd, self.options).run(windows, lambda i, data: self._serve(items[i], stored[i], data,
                                                                                     planner))
        except OSError as err:
            raise io_error("reading", path, err) from None
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
