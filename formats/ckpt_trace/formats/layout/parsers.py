"""Parsers of checkpoint files into layout entries (``table.Entry``), from the checkpoints' own index data.

- DCP (``torch.distributed.checkpoint``): the ``.metadata`` pickle, read by
  ``safepickle`` (strict: only DCP's metadata classes), maps every
  (FQN, chunk offset) to ``_StorageInfo(relative_path, offset, length)``;
  ``planner_data`` gives each FQN's key path, ``state_dict_metadata`` its
  dtype, global shape and chunks (torch/distributed/checkpoint/metadata.py,
  filesystem.py).
- safetensors: 8 bytes little-endian header length N, N bytes of JSON
  header ``{name: {dtype, shape, data_offsets: [begin, end]}}`` with offsets
  relative to the end of the header (huggingface/safetensors, "Format").
- ``torch.save`` (the zip format, torch >= 1.6): a stored (uncompressed) zip
  whose ``*/data.pkl`` maps state-dict keys to storages, persistent ids
  ``('storage', type, key, location, numel)`` that name the entries
  ``*/data/<key>``; entry data offsets from each local file header
  (PKWARE APPNOTE 4.3.7: 30 bytes + name + extra field).
- Hugging Face ``*.index.json``: ``{"metadata": ..., "weight_map": {name:
  shard file}}``; the index file itself is ``index``, the shards are parsed
  as safetensors (or torch.save) files.

Bytes of a recognised file that its index data does not describe are
listed as ``unknown`` (never guessed). Each parser raises LayoutError when
the file is not what it claims to be.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from collections.abc import Iterable

from ..errors import CkptTraceError
from .safepickle import Dtype, Record, StorageRef, TensorRef, UnsafePickleError, safe_loads
from .table import Entry, classify


class LayoutError(CkptTraceError):
    """A checkpoint file that cannot be read as the format it looks like."""


def _gaps(path: str, size: int, entries: list[Entry], fmt: str, name: str, kind: str) -> list[Entry]:
    """Entries for the bytes of ``path`` (``size`` bytes) that ``entries`` leave uncovered."""
    gaps, end = [], 0
    for entry in sorted(entries, key=lambda e: e.offset):
        if entry.offset > end:
            gaps.append(Entry(path, end, entry.offset - end, name, kind, fmt))
        end = max(end, entry.offset + entry.length)
    if size > end:
        gaps.append(Entry(path, end, size - end, name, kind, fmt))
    return gaps


# ----------------------------------------------------------------------------------------------------- DCP
def parse_dcp(metadata_path: str) -> list[Entry]:
    """Entries of a DCP checkpoint from its ``.metadata`` file: the metadata file, every stored item of every
    data file it names, and the bytes of those files it does not describe (``unknown``)."""
    directory = os.path.dirname(metadata_path)
    with open(metadata_path, "rb") as handle:
        data = handle.read()
    try:
        meta = safe_loads(data, strict=True)
    except UnsafePickleError as err:
        raise LayoutError(f"{metadata_path}: {err}") from None
    storage_data = getattr(meta, "storage_data", None)
    if not isinstance(meta, Record) or not isinstance(storage_data, dict):
        raise LayoutError(f"{metadata_path}: not a DCP metadata file (no storage_data)")
    described = getattr(meta, "state_dict_metadata", None) or {}
    planner = getattr(meta, "planner_data", None) or {}
    entries = [Entry(metadata_path, 0, len(data), "<dcp .metadata>", "metadata", "dcp")]
    per_file: dict[str, list[Entry]] = {}
    for index, info in storage_data.items():
        fqn = str(getattr(index, "fqn", index))
        relative = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(relative, str) or not isinstance(offset, int) or not isinstance(length, int):
            raise LayoutError(f"{metadata_path}: storage entry of {fqn!r} has no (relative_path, offset, length)")
        item = described.get(fqn)
        tensor = item is not None and getattr(item, "_name", "") == "TensorStorageMetadata"
        recorded_path = planner.get(fqn)
        parts = recorded_path if isinstance(recorded_path, (tuple, list)) else fqn.split(".")
        dtype = shape = chunk_offsets = chunk_sizes = None
        if tensor:
            properties = getattr(item, "properties", None)
            dtype_value = getattr(properties, "dtype", None)
            state = getattr(properties, "state", None)  # TensorProperties pickles (dtype, layout, ...) as a tuple
            if dtype_value is None and isinstance(state, tuple) and state:
                dtype_value = state[0]
            dtype = str(dtype_value) if isinstance(dtype_value, Dtype) else None
            shape = tuple(int(v) for v in getattr(item, "size", ()) or ())
            chunk_offsets = tuple(int(v) for v in (getattr(index, "offset", None) or ()))
            for chunk in getattr(item, "chunks", None) or ():
                if tuple(int(v) for v in getattr(chunk, "offsets", ())) == chunk_offsets:
                    chunk_sizes = tuple(int(v) for v in getattr(chunk, "sizes", ()))
                    break
        path = os.path.normpath(os.path.join(directory, relative))
        entry = Entry(
            path, offset, length, fqn, classify(parts, tensor=tensor), "dcp", dtype, shape, chunk_offsets, chunk_sizes
        )
        per_file.setdefault(path, []).append(entry)
    for path, items in per_file.items():
        entries += items
        if os.path.isfile(path):
            entries += _gaps(path, os.path.getsize(path), items, "dcp", "<not in the DCP metadata>", "unknown")
    return entries


# ---------------------------------------------------------------------------------------------- safetensors
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
_MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit


def parse_safetensors(path: str) -> list[Entry]:
    """Entries of a safetensors file: its header (``metadata``) and every tensor."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise LayoutError(f"{path}: too short for a safetensors file")
        (header_bytes,) = struct.unpack("<Q", head)
        if header_bytes > min(size - 8, _MAX_HEADER_BYTES):
            raise LayoutError(f"{path}: not a safetensors file (header length {header_bytes})")
        try:
            header = json.loads(handle.read(header_bytes))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise LayoutError(f"{path}: not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise LayoutError(f"{path}: not a safetensors file (header is not an object)")
    base = 8 + header_bytes
    entries = [Entry(path, 0, base, "<safetensors header>", "metadata", "safetensors")]
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(v) for v in info["data_offsets"])
            shape = tuple(int(v) for v in info["shape"])
        except (KeyError, TypeError, ValueError):
            raise LayoutError(f"{path}: tensor {name!r} has no data_offsets/shape") from None
        if not 0 <= begin <= end <= size - base:
            raise LayoutError(f"{path}: tensor {name!r} lies outside the file")
        entries.append(
            Entry(
                path,
                base + begin,
                end - begin,
                name,
                classify(name.split("."), tensor=True),
                "safetensors",
                _SAFETENSORS_DTYPES.get(str(info.get("dtype")), str(info.get("dtype"))),
                shape,
            )
        )
    tensors = entries[1:]
    entries += _gaps(path, size, entries, "safetensors", "<not in the safetensors header>", "unknown")
    del tensors
    return entries


# ----------------------------------------------------------------------------------------------- torch.save
def _tensor_paths(obj, prefix: tuple, found: dict[str, list[tuple[tuple, TensorRef]]], depth: int = 0) -> None:
    """Collect (key path, TensorRef) of every tensor in ``obj``, per storage key."""
    if depth > 64:
        return
    if isinstance(obj, TensorRef):
        if isinstance(obj.storage, StorageRef):
            found.setdefault(obj.storage.key, []).append((prefix, obj))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _tensor_paths(value, prefix + (key,), found, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _tensor_paths(value, prefix + (i,), found, depth + 1)
    elif isinstance(obj, Record):
        for key, value in obj.__dict__.items():
            if key not in ("module", "name"):
                _tensor_paths(value, prefix + (key,), found, depth + 1)


def _zip_data_offset(handle, info: zipfile.ZipInfo) -> int:
    handle.seek(info.header_offset)
    local = handle.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise LayoutError(f"bad local header of {info.filename}")
    name_bytes, extra_bytes = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_bytes + extra_bytes


def is_torch_save(path: str) -> bool:
    """Whether ``path`` is a zip holding a ``*/data.pkl`` (torch.save's format since torch 1.6)."""
    try:
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") and name.count("/") == 1 for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def parse_torch_save(path: str) -> list[Entry]:
    """Entries of a ``torch.save`` zip: each storage (``*/data/<key>``) named by the state-dict keys of the
    tensors that view it; ``data.pkl`` and the other records and the zip's own headers as ``metadata``."""
    size = os.path.getsize(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as err:
        raise LayoutError(f"{path}: not a torch.save zip ({err})") from None
    with archive, open(path, "rb") as handle:
        infos = archive.infolist()
        pickles = [i for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
        if not pickles:
            raise LayoutError(f"{path}: a zip without */data.pkl is not a torch.save file")
        root = pickles[0].filename[: -len("data.pkl")]
        for info in infos:  # before anything is read: a compressed entry could inflate without bound
            if info.compress_type != zipfile.ZIP_STORED:
                raise LayoutError(f"{path}: entry {info.filename} is compressed (torch.save stores entries)")
        try:
            state = safe_loads(archive.read(pickles[0]), strict=False)
        except UnsafePickleError as err:
            raise LayoutError(f"{path}: data.pkl: {err}") from None
        found: dict[str, list[tuple[tuple, TensorRef]]] = {}
        _tensor_paths(state, (), found)
        entries = []
        for info in infos:
            start = _zip_data_offset(handle, info)
            key = info.filename[len(root) + len("data/") :] if info.filename.startswith(root + "data/") else None
            if key is not None and key in found:
                views = found[key]
                names = [".".join(str(p) for p in prefix) for prefix, _ in views]
                parts, ref = views[0]
                entries.append(
                    Entry(
                        path,
                        start,
                        info.compress_size,
                        ", ".join(names),
                        classify(parts, tensor=True),
                        "torch_save",
                        ref.storage.dtype,
                        ref.size,
                    )
                )
            elif key is not None:
                entries.append(Entry(path, start, info.compress_size, info.filename, "unknown", "torch_save"))
            else:
                entries.append(Entry(path, start, info.compress_size, f"<{info.filename}>", "metadata", "torch_save"))
    entries += _gaps(path, size, entries, "torch_save", "<zip headers>", "metadata")
    return entries


# ------------------------------------------------------------------------------------------------- HF index
def parse_hf_index(path: str) -> list[Entry]:
    """The Hugging Face index file itself (``index``); its shards are parsed on their own."""
    try:
        with open(path, "rb") as handle:
            data = json.load(handle)
    except (UnicodeDecodeError, json.JSONDecodeError, OSError):
        raise LayoutError(f"{path}: not a JSON index file") from None
    if not isinstance(data, dict) or not isinstance(data.get("weight_map"), dict):
        raise LayoutError(f"{path}: not a Hugging Face index (no weight_map)")
    return [Entry(path, 0, os.path.getsize(path), "<weight_map index>", "index", "hf_index")]


def hf_index_shards(path: str) -> list[str]:
    """The shard files a Hugging Face index names (absolute paths)."""
    with open(path, "rb") as handle:
        data = json.load(handle)
    directory = os.path.dirname(path)
    return sorted({os.path.normpath(os.path.join(directory, str(f))) for f in data["weight_map"].values()})


def _iter_files(paths: Iterable[str]) -> list[str]:
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in os.walk(path):
                files += [os.path.join(root, name) for name in names]
        elif os.path.isfile(path):
            files.append(path)
    return sorted({os.path.abspath(f) for f in files})
