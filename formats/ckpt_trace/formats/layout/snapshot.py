"""torchsnapshot (pytorch/torchsnapshot, 0.1.0): the ``.snapshot_metadata`` manifest.

The manifest (torchsnapshot/manifest.py, ``SnapshotMetadata.to_yaml``:
JSON, a subset of YAML; older snapshots YAML) is
``{"version", "world_size", "manifest": {"<rank>/<key path>": entry}}``
where an entry is a container (``dict``, ``list``, ``OrderedDict``), a
primitive stored inline (no file bytes), an ``object`` (a whole file at
``location``, torch.save'd), a ``Tensor`` (``location``, ``dtype``,
``shape``, and ``byte_range`` [begin, end) within the file, or the whole
file when null), a ``ShardedTensor`` (``shards``: ``offsets``, ``sizes``
and a Tensor entry each) or a ``ChunkedTensor`` (``dtype``, ``shape``,
``chunks`` like shards). Locations are relative to the snapshot's
directory. Bytes of the files it names that no entry covers are
``unknown``.
"""

from __future__ import annotations

import json
import os

from .parsers import LayoutError, _gaps
from .table import Entry, classify

SNAPSHOT_METADATA = ".snapshot_metadata"


def _load(path: str) -> dict:
    with open(path, "rb") as handle:
        text = handle.read()
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        pass
    try:
        import yaml
    except ImportError:
        raise LayoutError(f"{path}: a YAML manifest needs PyYAML") from None
    try:
        return yaml.safe_load(text)  # plain YAML types only: no object is constructed
    except yaml.YAMLError as err:
        raise LayoutError(f"{path}: not a torchsnapshot manifest ({str(err).splitlines()[0]})") from None


def parse_torchsnapshot(path: str) -> list[Entry]:
    """Entries of a torchsnapshot snapshot from its manifest: the manifest (``metadata``), every tensor (or
    shard, or chunk) at its byte range, every object file, and the uncovered bytes of those files."""
    data = _load(path)
    if not isinstance(data, dict) or not isinstance(data.get("manifest"), dict):
        raise LayoutError(f"{path}: not a torchsnapshot manifest (no manifest)")
    directory = os.path.dirname(path)
    entries = [Entry(path, 0, os.path.getsize(path), "<.snapshot_metadata>", "metadata", "torchsnapshot")]
    sizes: dict[str, int] = {}

    def located(location: str) -> tuple[str, int]:
        file = os.path.normpath(os.path.join(directory, str(location)))
        if file not in sizes:
            if not os.path.isfile(file):
                raise LayoutError(f"{path}: names {location!r}, which is missing")
            sizes[file] = os.path.getsize(file)
        return file, sizes[file]

    def tensor(name: str, parts: list[str], item: dict, shape=None, offsets=None, chunk=None) -> Entry:
        file, size = located(item["location"])
        begin, end = item.get("byte_range") or (0, size)
        if not 0 <= begin <= end <= size:
            raise LayoutError(f"{path}: {name!r} lies outside {item['location']}")
        dtype = str(item.get("dtype", "")).removeprefix("torch.") or None
        return Entry(
            file,
            int(begin),
            int(end) - int(begin),
            name,
            classify(parts, tensor=True),
            "torchsnapshot",
            dtype,
            tuple(shape if shape is not None else item.get("shape") or ()),
            tuple(offsets) if offsets is not None else None,
            tuple(chunk) if chunk is not None else None,
        )

    try:
        for key, item in data["manifest"].items():
            if not isinstance(item, dict):
                raise LayoutError(f"{path}: entry {key!r} is not an object")
            parts = str(key).split("/")[1:]  # the first part is the rank
            kind = item.get("type")
            if kind == "Tensor":
                entries.append(tensor(key, parts, item))
            elif kind in ("ShardedTensor", "ChunkedTensor"):
                entries.extend(
                    tensor(key, parts, shard["tensor"], item.get("shape"), shard["offsets"], shard["sizes"])
                    for shard in item.get("shards") or item.get("chunks") or []
                )
            elif kind == "object":
                file, size = located(item["location"])
                entries.append(Entry(file, 0, size, key, classify(parts, tensor=False), "torchsnapshot"))
    except (KeyError, TypeError, ValueError) as err:
        raise LayoutError(f"{path}: malformed torchsnapshot entry ({type(err).__name__}: {err})") from None
    for file, size in sizes.items():
        entries += _gaps(
            file,
            size,
            [e for e in entries if e.path == file],
            "torchsnapshot",
            "<not in the torchsnapshot manifest>",
            "unknown",
        )
    return entries
