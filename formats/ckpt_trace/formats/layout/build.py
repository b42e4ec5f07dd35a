"""Building a layout from a checkpoint's files (``build_layout``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from .parsers import (
    LayoutError,
    _iter_files,
    hf_index_shards,
    is_torch_save,
    parse_dcp,
    parse_hf_index,
    parse_safetensors,
    parse_torch_save,
)
from .snapshot import SNAPSHOT_METADATA, parse_torchsnapshot
from .table import Entry, to_table


@dataclass
class Layout:
    """A built layout: ``table`` (``LAYOUT_SCHEMA``) and what went into it: ``files`` {path: format} parsed,
    ``unknown`` files listed as unknown (with ``errors`` {path: why} for those that looked like a
    checkpoint format and did not parse), ``elapsed_s``, and ``complete`` false when the time bound stopped it."""

    table: pa.Table
    files: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0
    complete: bool = True

    def info(self) -> dict:
        """The JSON object stored beside the table (``store.encode_layout``)."""
        return {
            "files": self.files,
            "unknown": self.unknown,
            "errors": self.errors,
            "elapsed_s": round(self.elapsed_s, 6),
            "complete": self.complete,
        }


def candidate_files(paths: Iterable[str]) -> list[str]:
    """The files a layout of ``paths`` (files the traced command wrote or read) covers: those files, plus
    the ``.metadata`` of a directory holding a touched ``.distcp`` file and the
    ``.snapshot_metadata`` of a torchsnapshot directory, when they exist."""
    files = set()
    manifests: dict[str, str | None] = {}  # directory -> the manifest found from it (a job reads thousands of
    # files from a few directories, its libraries': looked up once per directory, 0.2 s less, 2026-11-30)
    for path in paths:
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            continue
        files.add(path)
        directory = os.path.dirname(path)
        if path.endswith(".distcp") and os.path.isfile(os.path.join(directory, ".metadata")):
            files.add(os.path.join(directory, ".metadata"))
        if directory not in manifests:
            manifests[directory] = _snapshot_manifest(directory)
        if manifests[directory] is not None:
            files.add(manifests[directory])
    return sorted(files)


def _snapshot_manifest(directory: str) -> str | None:
    """The torchsnapshot manifest in ``directory`` or in one of its 7 nearest ancestors (its files lie up to a
    few levels under it: <rank>/<key path>), the nearest first; None when there is none."""
    up = directory
    for _ in range(8):
        if os.path.isfile(os.path.join(up, SNAPSHOT_METADATA)):
            return os.path.join(up, SNAPSHOT_METADATA)
        if os.path.dirname(up) == up:
            break
        up = os.path.dirname(up)
    return None


def build_layout(paths: Iterable[str], *, time_limit_s: float = 60.0, expand_dirs: bool = True) -> Layout:
    """The layout of the checkpoint files among ``paths`` (files, or directories searched recursively when
    ``expand_dirs``). Recognised: a DCP ``.metadata`` (with the data files it names), ``*.safetensors``,
    ``*.index.json`` with a ``weight_map``, a ``torch.save`` zip (any name), torchsnapshot's
    ``.snapshot_metadata``. Every other file is one ``unknown`` entry; so is a file whose parser failed
    (its reason in ``errors``), and every file left when ``time_limit_s`` runs out (``complete`` false).
    Never raises for a file's content; OSError from the file system propagates."""
    started = time.monotonic()
    files = _iter_files(paths) if expand_dirs else sorted({os.path.abspath(p) for p in paths if os.path.isfile(p)})
    entries: list[Entry] = []
    layout = Layout(table=to_table([]))
    covered: set[str] = set()

    def parsed(path: str, fmt: str, items: list[Entry]) -> None:
        entries.extend(items)
        layout.files[path] = fmt
        covered.update(e.path for e in items)

    ordered = sorted(files, key=lambda p: (os.path.basename(p) not in (".metadata", SNAPSHOT_METADATA), p))
    for path in ordered:  # index files first: they cover the data files they name
        if path in covered:
            continue
        if time.monotonic() - started > time_limit_s:
            layout.complete = False
            layout.errors[path] = f"not parsed: the layout's time bound ({time_limit_s:g} s) ran out"
            continue
        name = os.path.basename(path)
        try:
            if name == ".metadata":
                parsed(path, "dcp", parse_dcp(path))
            elif name == SNAPSHOT_METADATA:
                parsed(path, "torchsnapshot", parse_torchsnapshot(path))
            elif name.endswith(".safetensors"):
                parsed(path, "safetensors", parse_safetensors(path))
            elif name.endswith(".index.json"):
                parsed(path, "hf_index", parse_hf_index(path))
                layout.files.update({shard: "hf_shard" for shard in hf_index_shards(path) if not os.path.exists(shard)})
            elif is_torch_save(path):
                parsed(path, "torch_save", parse_torch_save(path))
        except LayoutError as err:
            layout.errors[path] = str(err)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, MemoryError) as err:
            layout.errors[path] = f"{path}: unreadable as a checkpoint file ({type(err).__name__}: {err})"
    for path in files:
        if path not in covered:
            try:
                size = os.path.getsize(path)
            except OSError as err:  # gone since it was listed
                layout.errors[path] = f"{path}: {err.strerror or err}"
                continue
            layout.unknown.append(path)
            entries.append(Entry(path, 0, size, None, "unknown", "unknown"))
    layout.files = {path: fmt for path, fmt in layout.files.items() if fmt != "hf_shard"}
    layout.elapsed_s = time.monotonic() - started
    layout.table = to_table(entries)
    return layout
