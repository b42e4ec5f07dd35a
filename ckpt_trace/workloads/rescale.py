"""Rescaling: the trace of a recorded N-rank DCP save as the same state dict saved by M ranks.

Pure planning, from the trace alone (its checkpoint layout, ``formats/README.md``), with DCP's own code
(``synth.plan_and_write``: ``DefaultSavePlanner`` per simulated rank on ``meta`` DTensors under a fake
process group, ``create_global_plan``, ``FileSystemWriter`` into a recording file system):

1. **Objects** (``recover_dcp_save``): the layout's rows of the checkpoint's ``.metadata`` give every stored
   item: its FQN, dtype, global shape and chunk, and the data file it is in (``__R_0.distcp``: rank R's,
   one file per rank as ``FileSystemWriter`` names them). A tensor stored as one chunk covering it is
   *replicated* (every rank holds it; DCP writes it once); a tensor stored as N chunks that split one
   dimension as ``torch.chunk`` does (DTensor's ``Shard(dim)`` rule) is *sharded* on that dimension; an
   item without a dtype is a *bytes* object (``torch.save`` of a Python value; its recorded length kept).
   Any other chunking is refused.
2. **Order**: DCP's deduplication (``dedup_save_plans``) gives each replicated item to the rank whose plan
   counts the fewest bytes so far, walking rank 0's plan (the state dict's order); the layout keeps each
   file's order but not the state dict's. The order is recovered by running that rule at N ranks: at each
   step the next item is the least-counted rank's next replicated item, else the next sharded item, else
   the least-counted rank's next bytes object.
3. **Check**: the recovered state dict is planned and written at N ranks; every stored item must land in
   the recorded file, offset and length, else the save was not DCP's default planner and
   ``FileSystemWriter`` (one file per rank) and rescaling is refused. The recorded ranks' write calls are
   compared too (``pattern_reproduced``: the recorded writer's buffer, from the trace's file system block
   size).
4. **Rescale**: the same state dict planned and written at M ranks, in the recorded checkpoint directory
   (``replay --strip-prefix`` maps it as it maps the recorded trace). Times are ``synth``'s placeholders.

Only the DCP save's own operations are in the rescaled trace (other rows of the recording are not).

A recorded **load** (``rescale_dcp_load``: the trace reads the data files and writes none) is rescaled to
the resharded load M ranks do of the same checkpoint: steps 1-2 on its layout, the checkpoint's ``Metadata``
rebuilt from it, DCP's ``DefaultLoadPlanner`` per simulated rank, then ``FileSystemReader.read_data`` run
for real over a file system that serves each stored chunk as ``torch.save`` of zeros of its shape (the
recorded length), so each rank makes the reads the real reader makes (DCP 2.13 reads a rank's items in
plan order, each through a view of a buffered file, ``torch.load`` seeking and reading in it).
"""

from __future__ import annotations

import io
import os
import re
import time
import warnings
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from ckpt_trace.errors import RescaleError

from .synth import LoggedRaw, Synthesis, plan_and_write, write_synthesis

_DATA_FILE = re.compile(r"__(\d+)_(\d+)\.distcp$")


@dataclass(frozen=True)
class StoredObject:
    """One state-dict entry of the recorded save. ``kind``: ``sharded`` (split on ``dim`` as torch.chunk
    does), ``replicated`` (a whole tensor every rank holds) or ``bytes`` (``length`` bytes, a pickled
    value). ``shape``: the global shape; ``dtype``: torch's name (``float32``)."""

    fqn: str
    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    dim: int = 0
    length: int = 0


@dataclass(frozen=True)
class RecoveredSave:
    """A recorded DCP save as rescaling sees it: its directory, ranks, objects in state-dict order, the
    writer's buffer (bytes), and how many steps of the order recovery had to guess (0: none)."""

    directory: str
    ranks: int
    objects: tuple[StoredObject, ...]
    buffer_bytes: int
    guessed_steps: int
    layout: dict  # {(fqn, chunk offsets or None): (file name, offset, length)} as recorded
    chunk_sizes: dict  # {(fqn, chunk offsets): chunk sizes} of the stored tensor chunks


def chunk_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """(start, length) of ``rank``'s part of ``rows`` split like ``torch.chunk`` (DTensor's ``Shard``)."""
    per = -(-rows // world)
    start = min(rows, rank * per)
    return start, max(0, min(rows, start + per) - start)


def _buffer_bytes(meta: dict, directory: str) -> int:
    """The block size of the recorded file system holding ``directory`` (Python's ``open`` buffers a file by
    its st_blksize); 4096 when the trace does not say."""
    best, size = "", 4096
    for mount, info in (meta.get("filesystems") or {}).items():
        inside = directory == mount or directory.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best) and isinstance(info, dict) and int(info.get("block_size") or 0) > 1:
            best, size = mount, int(info["block_size"])
    return size


def recover_dcp_save(trace: str | os.PathLike) -> RecoveredSave:
    """The objects of the DCP save recorded in ``trace`` (module docstring, steps 1-2). Raises RescaleError
    when the trace has no layout, its checkpoint is not one DCP checkpoint, a file is not ``__R_0.distcp``,
    or a tensor's chunks follow no ``Shard(dim)`` rule of the recorded ranks."""
    from ckpt_trace.formats import read_metadata
    from ckpt_trace.formats.layout import read_layout

    stored = read_layout(trace)
    if stored is None:
        raise RescaleError(
            f"{trace} has no checkpoint layout (record it with its layout, or add it with "
            "`ckpt-trace annotate`): rescaling needs the checkpoint's objects"
        )
    table, info = stored
    formats = set(table.column("format").to_pylist()) - {"unknown"}
    metadata_files = [p for p, f in (info.get("files") or {}).items() if f == "dcp"]
    if formats != {"dcp"} or len(metadata_files) != 1:
        found = ", ".join(sorted(formats)) or "no known format"
        raise RescaleError(
            f"{trace}'s checkpoint is {found} with {len(metadata_files)} DCP .metadata files: "
            "rescaling knows one DCP checkpoint (DefaultSavePlanner, FileSystemWriter)"
        )
    directory = os.path.dirname(metadata_files[0])
    rows = [r for r in table.to_pylist() if r["format"] == "dcp" and r["kind"] != "metadata"]
    if any(r["kind"] == "unknown" for r in rows):
        raise RescaleError(f"{trace}: bytes of the DCP data files that its .metadata does not describe")
    per_rank: dict[int, list[dict]] = {}
    for row in rows:
        match = _DATA_FILE.search(os.path.basename(row["path"]))
        if match is None or os.path.dirname(row["path"]) != directory:
            raise RescaleError(f"{row['path']} is not a FileSystemWriter data file (__RANK_0.distcp in {directory})")
        if match.group(2) != "0":
            raise RescaleError(
                f"{row['path']}: several files per rank (FileSystemWriter thread_count > 1); "
                "rescaling knows one file per rank"
            )
        per_rank.setdefault(int(match.group(1)), []).append(row)
    ranks = max(per_rank, default=-1) + 1
    if ranks < 2:
        raise RescaleError(f"{trace}: a save by {max(ranks, 0)} rank does not show which tensors are sharded")
    chunks: dict[str, list[tuple[int, dict]]] = {}
    for rank, items in per_rank.items():
        for row in items:
            chunks.setdefault(row["name"], []).append((rank, row))
    objects: dict[str, StoredObject] = {}
    held: dict[str, dict[int, int]] = {}  # sharded fqn -> rank -> the bytes dedup counts for it
    for fqn, parts in chunks.items():
        first = parts[0][1]
        if first["dtype"] is None:
            if len(parts) != 1:
                raise RescaleError(f"{fqn}: a bytes object stored {len(parts)} times")
            objects[fqn] = StoredObject(fqn, "bytes", length=first["length"])
            continue
        shape = tuple(first["shape"] or ())
        if (
            len(parts) == 1
            and tuple(first["chunk_offsets"] or ()) == (0,) * len(shape)
            and tuple(first["chunk_sizes"] or ()) == shape
        ):
            objects[fqn] = StoredObject(fqn, "replicated", first["dtype"], shape)
            continue
        objects[fqn], held[fqn] = _sharded(fqn, first["dtype"], shape, parts, ranks)
    order, guessed = _recover_order(per_rank, objects, held, ranks)
    layout = {
        (r["name"], tuple(r["chunk_offsets"]) if r["chunk_offsets"] is not None else None): (
            os.path.basename(r["path"]),
            r["offset"],
            r["length"],
        )
        for r in rows
    }
    sizes = {
        (r["name"], tuple(r["chunk_offsets"])): tuple(r["chunk_sizes"] or ())
        for r in rows
        if r["chunk_offsets"] is not None
    }
    return RecoveredSave(
        directory,
        ranks,
        tuple(objects[f] for f in order),
        _buffer_bytes(read_metadata(trace), directory),
        guessed,
        layout,
        sizes,
    )


def _dtype_name(obj) -> str:
    """A layout object's dtype name (``float32``...); RescaleError where the layout has none (not a tensor)."""
    if obj.dtype is None:
        raise RescaleError(f"{obj.fqn}: the checkpoint layout gives this object no dtype")
    return obj.dtype


def _itemsize(dtype: str) -> int:
    import torch

    try:
        return torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    except (AttributeError, TypeError):
        raise RescaleError(f"unknown dtype {dtype!r} in the layout") from None


def _sharded(fqn: str, dtype: str, shape: tuple, parts: list[tuple[int, dict]], ranks: int):
    """(StoredObject, rank -> bytes DCP's dedup counts) of a tensor stored in several chunks, when they split one dimension
    as ``torch.chunk`` does over ``ranks`` with rank R's chunk in R's file; else RescaleError."""
    why = f"{fqn}: {len(parts)} chunks that do not split one dimension as DTensor's Shard(dim) does over {ranks} ranks"
    got = {rank: (tuple(row["chunk_offsets"] or ()), tuple(row["chunk_sizes"] or ())) for rank, row in parts}
    if len(got) != len(parts):
        raise RescaleError(why + " (two chunks in one rank's file)")
    for dim in range(len(shape)):
        expected = {}
        for rank in range(ranks):
            start, length = chunk_rows(shape[dim], rank, ranks)
            offsets = tuple(start if j == dim else 0 for j in range(len(shape)))
            sizes = tuple(length if j == dim else shape[j] for j in range(len(shape)))
            expected[rank] = (offsets, sizes)
        nonempty = {r: c for r, c in expected.items() if 0 not in c[1]}
        if got in (expected, nonempty):
            whole = _itemsize(dtype) * _numel(shape)  # DCP's WriteItem.tensor_storage_size: the global tensor's
            sizes = {r: whole for r in got}
            return StoredObject(fqn, "sharded", dtype, shape, dim), sizes
    raise RescaleError(why)


def _numel(sizes: tuple) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def _recover_order(
    per_rank: dict[int, list[dict]], objects: dict[str, StoredObject], held: dict[str, dict[int, int]], ranks: int
) -> tuple[list[str], int]:
    """The state dict's order (module docstring, step 2) and how many steps had no consistent choice.

    ``dedup_save_plans`` walks rank 0's plan first (the state dict's order; the other ranks' own chunks come
    after it): a sharded item counts its global tensor's bytes to rank 0 only, a replicated one goes to the
    rank with the least counted so far (ties: the lowest rank) and counts its bytes there, a bytes object
    counts 1."""
    ordered = {r: sorted(per_rank.get(r, []), key=lambda x: x["offset"]) for r in range(ranks)}
    tensors = {
        r: deque(row["name"] for row in rows if objects[row["name"]].kind != "bytes") for r, rows in ordered.items()
    }
    blobs = {
        r: deque(row["name"] for row in rows if objects[row["name"]].kind == "bytes") for r, rows in ordered.items()
    }
    sizes = [0] * ranks
    order: list[str] = []
    guessed = 0

    def take_sharded(fqn: str) -> int:
        consistent = 1
        for rank in held[fqn]:
            if tensors[rank] and tensors[rank][0] == fqn:
                tensors[rank].popleft()
            else:  # a replicated item before it in this rank's file was not placed yet
                tensors[rank].remove(fqn)
                consistent = 0
        sizes[0] += held[fqn].get(0, 0)
        order.append(fqn)
        return 1 - consistent

    def take(rank: int, queue: dict) -> None:
        fqn = queue[rank].popleft()
        obj = objects[fqn]
        sizes[rank] += _itemsize(_dtype_name(obj)) * _numel(obj.shape) if obj.kind == "replicated" else 1
        order.append(fqn)

    while any(tensors.values()) or any(blobs.values()):
        smallest = min(range(ranks), key=lambda r: sizes[r])
        head = tensors[smallest][0] if tensors[smallest] else None
        if head is not None and objects[head].kind == "replicated":
            take(smallest, tensors)
            continue
        sharded = next((q[0] for q in tensors.values() if q and objects[q[0]].kind == "sharded"), None)
        if sharded is not None and (head is None or head == sharded):
            guessed += take_sharded(sharded)
            continue
        if blobs[smallest]:
            take(smallest, blobs)
            continue
        guessed += 1  # no choice agrees with DCP's rule: the least-counted rank's next replicated item or object
        by_size = sorted(range(ranks), key=lambda r: (sizes[r], r))
        rank = next((r for r in by_size if tensors[r] and objects[tensors[r][0]].kind == "replicated"), None)
        if rank is not None:
            take(rank, tensors)
        elif sharded is not None:
            take_sharded(sharded)
        else:
            take(next(r for r in by_size if blobs[r]), blobs)
    return order, guessed


class _Blob:
    """A bytes object's stand-in in the simulated state dict: DCP writes ``length`` bytes for it."""

    def __init__(self, length: int) -> None:
        self.length = length


def _planner():
    """``DefaultSavePlanner`` whose bytes objects serialise to their recorded length (``transform_object``,
    the planner's documented extension point)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.planner import WriteItemType

    class RecordedBytesPlanner(dcp.DefaultSavePlanner):
        def transform_object(self, write_item, object):  # noqa: A002 (DCP's signature)
            if write_item.type == WriteItemType.BYTE_IO and isinstance(object, _Blob):
                return io.BytesIO(bytes(object.length))
            return super().transform_object(write_item, object)

    return RecordedBytesPlanner


def _state_of(objects: tuple[StoredObject, ...]):
    """``state_of(mesh, device)`` for ``plan_and_write``: the flat state dict of ``objects`` at the mesh's
    ranks (sharded: DTensor ``Shard(dim)`` of ``device`` tensors; replicated: untouched CPU tensors)."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    def state_of(mesh, device: str) -> dict[str, Any]:
        rank, world = mesh.get_local_rank(), mesh.size()
        state: dict[str, Any] = {}
        for obj in objects:
            if obj.kind == "bytes":
                state[obj.fqn] = _Blob(obj.length)
                continue
            dtype = getattr(torch, _dtype_name(obj))
            if obj.kind == "replicated":
                state[obj.fqn] = torch.empty(obj.shape, dtype=dtype)
                continue
            _, length = chunk_rows(obj.shape[obj.dim], rank, world)
            local_shape = tuple(length if j == obj.dim else s for j, s in enumerate(obj.shape))
            local = torch.empty(local_shape, dtype=dtype, device=device)
            stride = torch.empty(obj.shape, device="meta").stride()
            state[obj.fqn] = DTensor.from_local(
                local, mesh, [Shard(obj.dim)], run_check=False, shape=torch.Size(obj.shape), stride=stride
            )
        return state

    return state_of


def _stored(results: list) -> dict:
    """{(fqn, chunk offsets or None): (file name, offset, length)} of a save's ``WriteResult`` lists."""
    out = {}
    for rank_results in results:
        for r in rank_results:
            offsets = tuple(int(v) for v in r.index.offset) if r.index.offset is not None else None
            out[(r.index.fqn, offsets)] = (r.storage_data.relative_path, r.storage_data.offset, r.storage_data.length)
    return out


def _recorded_writes(trace, directory: str) -> dict[int, Counter]:
    """rank -> Counter of (path, offset, size) of the trace's writes to the checkpoint's data files."""
    import pyarrow as pa

    from ckpt_trace.formats import scan

    _, batches = scan(trace, ["rank", "op", "path", "offset", "size"])
    out: dict[int, Counter] = {}
    for batch in batches:
        for row in pa.Table.from_batches([batch]).to_pylist():
            if (
                row["op"] == "write"
                and row["path"]
                and row["path"].startswith(directory + "/")
                and row["path"].endswith(".distcp")
            ):
                out.setdefault(row["rank"], Counter())[(row["path"], row["offset"], row["size"])] += 1
    return out


def _log_writes(logs: dict) -> dict[int, Counter]:
    out: dict[int, Counter] = {}
    for rank, log in logs.items():
        for op in log.ops:
            if op[0] == "write" and op[1].endswith(".distcp"):
                out.setdefault(rank, Counter())[(op[1], op[2], op[3])] += 1
    return out


def _require(ranks: int) -> None:
    """Raise RescaleError for fewer than one rank, WorkloadError without torch."""
    if ranks < 1:
        raise RescaleError("{option} must be at least 1", option="ranks")
    try:
        import torch.distributed.checkpoint  # noqa: F401
    except ImportError:
        from ckpt_trace.errors import WorkloadError

        raise WorkloadError("rescaling needs torch: pip install 'ckpt-trace[torch]'") from None


def rescale_dcp_save(trace: str | os.PathLike, ranks: int) -> Synthesis:
    """The DCP save recorded in ``trace`` as ``ranks`` ranks would write it (module docstring). Returns the
    ``Synthesis`` (per rank its operations; figures: recorded and new ranks, files, data bytes, whether the
    recorded save and its write calls were reproduced at its own ranks, seconds). Raises RescaleError when
    it cannot be rescaled (the reason in the message), WorkloadError without torch."""
    _require(ranks)
    started = time.perf_counter()
    save = recover_dcp_save(trace)
    planner = _planner()
    state_of = _state_of(save.objects)
    logs, results, _, _ = plan_and_write(
        state_of, save.ranks, out=save.directory, buffer_bytes=save.buffer_bytes, planner=planner
    )
    replanned = _stored(results)
    if replanned != save.layout:
        differ = sorted(k for k in set(replanned) | set(save.layout) if replanned.get(k) != save.layout.get(k))
        key = differ[0]
        raise RescaleError(
            f"{trace}: DCP's default planner at the recorded {save.ranks} ranks does not reproduce "
            f"the recorded save ({len(differ)} items differ; {key[0]}: recorded "
            f"{save.layout.get(key)}, replanned {replanned.get(key)}): not a DefaultSavePlanner + "
            "FileSystemWriter save, or another torch version's serialisation"
        )
    pattern = _log_writes(logs) == _recorded_writes(trace, save.directory)
    checked_s = time.perf_counter() - started
    logs, results, _, _ = plan_and_write(
        state_of, ranks, out=save.directory, buffer_bytes=save.buffer_bytes, planner=planner
    )
    files: dict[str, int] = {}
    for rank_results in results:
        for r in rank_results:
            name = r.storage_data.relative_path
            files[name] = max(files.get(name, 0), r.storage_data.offset + r.storage_data.length)
    counts = Counter(o.kind for o in save.objects)
    figures = {
        "trace": str(trace),
        "out": save.directory,
        "direction": "save",
        "recorded_ranks": save.ranks,
        "ranks": ranks,
        "objects": dict(counts),
        "buffer_bytes": save.buffer_bytes,
        "order_guessed_steps": save.guessed_steps,
        "recorded_save_reproduced": True,
        "pattern_reproduced": pattern,
        "data_bytes": sum(r.size_in_bytes for rank_results in results for r in rank_results),
        "data_files": dict(sorted(files.items())),
        "files": sorted({op[1] for log in logs.values() for op in log.ops if op[0] == "open"}),
        "check_s": checked_s,
        "elapsed_s": time.perf_counter() - started,
    }
    return Synthesis(logs={rank: log.ops for rank, log in logs.items()}, figures=figures)


def write_rescaled(trace: str | os.PathLike, ranks: int, output: str | os.PathLike, *, overwrite: bool = False) -> dict:
    """``rescale_dcp_load`` (a trace that only reads the checkpoint's data files) or ``rescale_dcp_save``
    written as a trace at ``output`` (backend ``synth``, the figures under the
    metadata key ``synth``). Returns the figures with ``rows``. Raises RescaleError, CkptTraceError."""
    if ranks < 1:
        raise RescaleError("{option} must be at least 1", option="ranks")
    result = rescale_dcp_load(trace, ranks) if is_load(trace) else rescale_dcp_save(trace, ranks)
    rows = write_synthesis(
        result, output, command=["ckpt-trace", "replay", str(trace), "--ranks", str(ranks)], overwrite=overwrite
    )
    return {**result.figures, "rows": rows, "rescaled_trace": str(output)}


# -- loads ------------------------------------------------------------------------------------------------------
O_RDONLY_CLOEXEC = os.O_RDONLY | 0o2000000


class _Content:
    """The bytes of the recorded checkpoint's data files as DCP's reader needs them, made on demand: each
    tensor chunk is ``torch.save`` of zeros of its shape and dtype (the recorded length, else RescaleError),
    each bytes object zeros (never unpickled: ``load_bytes`` skips it); the last few items are kept."""

    def __init__(self, save: RecoveredSave) -> None:
        self.save = save
        self.items: dict[str, list[tuple[int, int, str, tuple | None]]] = {}
        for (fqn, offsets), (name, offset, length) in save.layout.items():
            self.items.setdefault(os.path.join(save.directory, name), []).append((offset, length, fqn, offsets))
        for entries in self.items.values():
            entries.sort()
        self.kinds = {o.fqn: o for o in save.objects}
        self.cache: dict[tuple, bytes] = {}

    def size(self, path: str) -> int:
        entries = self.items.get(path, [])
        return max((offset + length for offset, length, _, _ in entries), default=0)

    def _bytes(self, offset: int, length: int, fqn: str, offsets: tuple | None) -> bytes:
        key = (fqn, offsets)
        if key not in self.cache:
            obj = self.kinds[fqn]
            if obj.kind == "bytes":
                data = bytes(length)
            else:
                import torch

                buffer = io.BytesIO()
                torch.save(torch.zeros(self.save.chunk_sizes[key], dtype=getattr(torch, _dtype_name(obj))), buffer)
                data = buffer.getvalue()
                if len(data) != length:
                    raise RescaleError(
                        f"{fqn}: torch.save of its chunk is {len(data):,} bytes here, {length:,} "
                        "in the recorded checkpoint (another torch version's serialisation)"
                    )
            if len(self.cache) >= 4:
                self.cache.pop(next(iter(self.cache)))
            self.cache[key] = data
        return self.cache[key]

    def read(self, path: str, pos: int, count: int) -> bytes:
        out = bytearray(count)
        for offset, length, fqn, offsets in self.items.get(path, []):
            start, end = max(pos, offset), min(pos + count, offset + length)
            if start < end:
                out[start - pos : end - pos] = self._bytes(offset, length, fqn, offsets)[start - offset : end - offset]
        return bytes(out)


class _RecordingReadRaw(LoggedRaw):
    """A raw file that serves ``_Content``'s bytes and logs its calls as ``FileIO`` makes them."""

    def __init__(self, log, path: str, content: _Content) -> None:
        self.content, self.end = content, content.size(path)
        super().__init__(log, path, O_RDONLY_CLOEXEC)

    def readable(self) -> bool:
        return True

    def size(self) -> int:
        return self.end

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        count = max(0, min(len(view), self.end - self.pos, 0x7FFFF000))
        view[:count] = self.content.read(self.path, self.pos, count)
        self.log.ops.append(("read", self.path, self.pos, len(view), count, None, None, self._fd))
        self.pos += count
        return count


def _reading_fs(log, content: _Content, buffer_bytes: int):
    """A ``FileSystem`` stand-in for DCP's reader: streams are ``io.BufferedReader``s of ``buffer_bytes``
    over ``_RecordingReadRaw``."""
    import contextlib

    from torch.distributed.checkpoint.filesystem import FileSystem

    class ReadingFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path, mode):
            stream = io.BufferedReader(_RecordingReadRaw(log, str(path), content), buffer_size=buffer_bytes)
            try:
                yield stream
            finally:
                stream.close()

    return ReadingFileSystem()


def _metadata(save: RecoveredSave):
    """DCP's ``Metadata`` of the recorded checkpoint, rebuilt from its layout (key paths flat: one FQN each)."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    described: dict[str, Any] = {}
    storage = {}
    for obj in save.objects:
        if obj.kind == "bytes":
            described[obj.fqn] = BytesStorageMetadata()
            continue
        chunks = [
            ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
            for (fqn, offsets), sizes in save.chunk_sizes.items()
            if fqn == obj.fqn
        ]
        described[obj.fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=getattr(torch, _dtype_name(obj))),
            size=torch.Size(obj.shape),
            chunks=chunks,
        )
    for (fqn, offsets), (name, offset, length) in save.layout.items():
        index = MetadataIndex(fqn, torch.Size(offsets) if offsets is not None else None)
        storage[index] = _StorageInfo(relative_path=name, offset=offset, length=length)
    return Metadata(
        state_dict_metadata=described, planner_data={o.fqn: (o.fqn,) for o in save.objects}, storage_data=storage
    )


def _load_planner():
    """``DefaultLoadPlanner`` that does not unpickle bytes objects (``load_bytes``: their bytes are zeros)."""
    import torch.distributed.checkpoint as dcp

    class SkipBytesLoadPlanner(dcp.DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            return None

    return SkipBytesLoadPlanner


def _recorded_metadata_reads(trace, metadata_path: str) -> list[tuple]:
    """The first recorded rank's operations on the checkpoint's ``.metadata`` (open, reads, lseeks, close), as
    ``_Log`` operations without descriptors."""
    import pyarrow as pa

    from ckpt_trace.formats import scan

    _, batches = scan(trace, ["rank", "op", "path", "offset", "size", "ret", "flags"])
    rows = [
        r
        for batch in batches
        for r in pa.Table.from_batches([batch]).to_pylist()
        if r["path"] == metadata_path and r["op"] in ("open", "read", "lseek", "close")
    ]
    if not rows:
        return []
    first = min(r["rank"] for r in rows if r["rank"] is not None) if any(r["rank"] is not None for r in rows) else None
    return [(r["op"], r["path"], r["offset"], r["size"], r["ret"], r["flags"]) for r in rows if r["rank"] == first]


def is_load(trace: str | os.PathLike) -> bool:
    """Whether ``trace`` reads its DCP checkpoint's data files and writes none of them (a load)."""
    import pyarrow as pa

    from ckpt_trace.formats import scan

    _, batches = scan(trace, ["op", "path"])
    ops = set()
    for batch in batches:
        for row in pa.Table.from_batches([batch]).to_pylist():
            if row["path"] and row["path"].endswith(".distcp") and row["op"] in ("read", "write"):
                ops.add(row["op"])
    return ops == {"read"}


def _plan_and_read(
    ranks, metadata, content, save, state_of, planner_class, recorded_metadata, logs, local_plans
) -> None:
    """``rescale_dcp_load``'s DCP part: every rank's local load plan on ``meta`` tensors, the global plan, then
    each rank's ``.metadata`` reads (as recorded) and ``read_data`` into ``logs``."""
    import torch.distributed.checkpoint as dcp

    from .synth import _fake_rank

    for rank in range(ranks):
        with _fake_rank(rank, ranks) as mesh:
            planner = planner_class()
            planner.set_up_planner(state_of(mesh, "meta"), metadata, rank == 0)
            local_plans.append(planner.create_local_plan())
            if rank == 0:
                coordinator = planner
    global_plans = coordinator.create_global_plan(local_plans)
    for rank in range(ranks):
        log = logs[rank]
        fd = None
        for op, path, offset, size, ret, flags in recorded_metadata:
            if op == "open":
                fd, _ = log.fd(path)
            log.ops.append((op, path, offset, size, fd if op == "open" else ret, flags, None, fd))
        with _fake_rank(rank, ranks) as mesh:
            planner = planner_class()
            planner.set_up_planner(state_of(mesh, "cpu"), metadata, rank == 0)
            reader = dcp.FileSystemReader(save.directory)
            reader.fs = _reading_fs(log, content, save.buffer_bytes)
            reader.set_up_storage_reader(metadata, rank == 0)
            reader.read_data(planner.finish_plan(global_plans[rank]), planner).wait()


def rescale_dcp_load(trace: str | os.PathLike, ranks: int) -> Synthesis:
    """The DCP load recorded in ``trace`` as ``ranks`` ranks would do it, resharding the recorded checkpoint:
    DCP's ``DefaultLoadPlanner`` per simulated rank (``meta`` DTensors ``Shard(dim)`` at ``ranks``, the
    checkpoint's ``Metadata`` rebuilt from the layout), then each rank's ``FileSystemReader.read_data`` for
    real over a recording file system that serves the chunks' bytes (``_Content``), so each rank reads the
    byte ranges and makes the calls the real reader would; each rank first reads ``.metadata`` as the recorded
    first rank did. Raises RescaleError as ``recover_dcp_save`` does."""
    _require(ranks)
    from .synth import _Log

    started = time.perf_counter()
    save = recover_dcp_save(trace)
    metadata = _metadata(save)
    content = _Content(save)
    planner_class = _load_planner()
    state_of = _state_of(save.objects)
    metadata_path = os.path.join(save.directory, ".metadata")
    recorded_metadata = _recorded_metadata_reads(trace, metadata_path)
    logs = {rank: _Log() for rank in range(ranks)}
    local_plans: list = []
    with warnings.catch_warnings():  # DCP's load planner warns about the fake process group's default device
        warnings.simplefilter("ignore", UserWarning)
        _plan_and_read(ranks, metadata, content, save, state_of, planner_class, recorded_metadata, logs, local_plans)
    read = sum(op[4] for log in logs.values() for op in log.ops if op[0] == "read" and op[1].endswith(".distcp"))
    figures = {
        "trace": str(trace),
        "out": save.directory,
        "direction": "load",
        "checkpoint_ranks": save.ranks,
        "ranks": ranks,
        "objects": dict(Counter(o.kind for o in save.objects)),
        "buffer_bytes": save.buffer_bytes,
        "order_guessed_steps": save.guessed_steps,
        "data_bytes_read": read,
        "metadata_ops_per_rank": len(recorded_metadata),
        "files": sorted({op[1] for log in logs.values() for op in log.ops if op[0] == "open"}),
        "elapsed_s": time.perf_counter() - started,
    }
    return Synthesis(logs={rank: log.ops for rank, log in logs.items()}, figures=figures)
