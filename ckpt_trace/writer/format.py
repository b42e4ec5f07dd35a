"""The on-disk format of a checkpoint written by ``CheckpointWriter``: names, item records, metadata, commit.

A checkpoint is a directory holding:

- data files ``__{rank}_{file_index}-{save_id}.data``: each item's raw bytes
  (tensors: their contiguous elements; other values: ``torch.save`` output)
  at a 64-byte multiple, each file a multiple of 4 KiB. Names carry the save
  id and are never reused, so a new save never overwrites the files the
  committed metadata points to.
- ``ckpt-trace.metadata``: a pickled ``{"format", "version", "metadata"}``
  holding DCP's ``Metadata`` whose ``storage_data`` maps each item to its
  ``StoredItem``. Written last, through a temporary file that is fsynced and
  renamed over the old one (then the directory is fsynced): the commit.

No torch here beyond the pickled DCP metadata it reads and writes.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import re
from pathlib import Path

from ckpt_trace.errors import CheckpointError

METADATA_NAME = "ckpt-trace.metadata"
METADATA_FORMAT = "ckpt-trace-dcp"
METADATA_VERSION = 1
DATA_NAME = re.compile(r"^__\d+_\d+-[0-9a-f]{32}\.data$")
TMP_NAME = re.compile(r"^\.ckpt-trace\.metadata\.[0-9a-f]{32}\.tmp$")


@dataclasses.dataclass(frozen=True)
class StoredItem:
    """Where one item's bytes are: ``relative_path``, ``offset`` and ``size_bytes`` in that data file.

    ``file_size_bytes`` is the data file's size when written (a truncated file
    is detected against it, and so is a longer one). ``checksum`` (of
    ``checksum_kind``) is the item's bytes' checksum, checked by the reader. ``dtype`` ("torch.float32") and ``shape`` are set
    for tensors: their bytes are the raw contiguous elements. Byte items
    (non-tensor values) hold ``torch.save`` output.
    """

    relative_path: str
    offset: int
    size_bytes: int
    file_size_bytes: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    checksum: int | None = None  # of the item's bytes (``checksum.py``), None: not computed (a GPU item)
    checksum_kind: str | None = None  # "crc32c" or "crc32"


@dataclasses.dataclass(frozen=True)
class RankFiles:
    """A rank's data file names: ``{prefix}{file_index}-{save_id}.data``."""

    prefix: str
    save_id: str

    def name(self, file_index: int) -> str:
        return f"{self.prefix}{file_index}-{self.save_id}.data"


def io_error(action: str, path: str | Path, err: OSError) -> CheckpointError:
    """One line for an I/O failure on a checkpoint file, naming it."""
    if err.errno == 28:  # ENOSPC
        return CheckpointError(f"no space left on device {action} {path}")
    return CheckpointError(f"{action} {path} failed: {err.strerror or err}")


def write_metadata(tmp: Path, metadata) -> None:
    """Pickle ``metadata`` into the new file ``tmp`` (exclusive create) and fsync it. Raises OSError."""
    payload = pickle.dumps({"format": METADATA_FORMAT, "version": METADATA_VERSION, "metadata": metadata})
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


class _MetadataUnpickler(pickle.Unpickler):
    """The default unpickler, but a ``torch.layout`` is looked up by its name (``_layout``): torch's own
    ``torch.serialization._get_layout`` walks the whole ``torch`` namespace the first time a process
    unpickles one, 2.3-2.5 ms of a warm 256 MiB load in a freshly forked process (each object it touches is
    copied on write) against 0.1 ms for the whole unpickle afterwards (measured 2026-11-29)."""

    def find_class(self, module: str, name: str):
        if module == "torch.serialization" and name == "_get_layout":
            return _layout
        return super().find_class(module, name)


def _layout(name: str):
    """The ``torch.layout`` whose ``str`` is ``name`` ("torch.strided"), as ``_get_layout`` returns it."""
    import torch

    value = getattr(torch, name.removeprefix("torch."), None)
    if isinstance(value, torch.layout) and str(value) == name:
        return value
    from torch.serialization import _get_layout

    return _get_layout(name)


def _unpickle(handle):
    """Unpickle the metadata with the cyclic garbage collector paused: the thousands of objects it creates
    (610 items: 6.6 ms against 11-12 ms, in a process forked as benchmarks/restore.py does, where each
    collection of the older generations walks, and copies on write, the parent's objects; 2026-11-29) would
    otherwise set off collections that free nothing (the metadata holds no cycles)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _MetadataUnpickler(handle).load()
    finally:
        if paused:
            gc.enable()


def read_metadata(directory: Path):
    """The committed DCP ``Metadata`` of the checkpoint in ``directory``. Raises CheckpointError when it is
    missing, corrupt, not this writer's, or of another version."""
    path = directory / METADATA_NAME
    try:
        with open(path, "rb") as handle:
            payload = _unpickle(handle)
    except FileNotFoundError:
        raise CheckpointError(f"no committed checkpoint in {directory}: {METADATA_NAME} is missing") from None
    except OSError as err:
        raise io_error("reading", path, err) from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError):
        raise CheckpointError(f"{path} is corrupt or truncated") from None
    if not isinstance(payload, dict) or payload.get("format") != METADATA_FORMAT:
        raise CheckpointError(f"{path} is not a ckpt-trace checkpoint metadata file")
    if payload.get("version") != METADATA_VERSION:
        raise CheckpointError(
            f"{path} has format version {payload.get('version')}, this reader supports {METADATA_VERSION}"
        )
    return payload["metadata"]


def stale_files(directory: Path, referenced: set[str]) -> list[Path]:
    """Data files no committed metadata references and temporary metadata of interrupted saves: only this
    writer's own names (``DATA_NAME``, ``TMP_NAME``), nothing else in the directory."""
    return [
        Path(entry.path)
        for entry in os.scandir(directory)
        if (DATA_NAME.match(entry.name) and entry.name not in referenced) or TMP_NAME.match(entry.name)
    ]
