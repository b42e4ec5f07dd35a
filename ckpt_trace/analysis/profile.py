"""The report's figures as aggregates: per rank, per file, per operation and per time bin, from record batches.

``profile_file(path)`` reads a trace twice in record batches (``formats.scan``)
and never holds it whole: memory is bounded by a batch plus the aggregates,
whose size grows with the number of ranks, files, distinct request sizes and
time bins, not with the number of rows. The first pass also feeds the
``summary`` (``analysis.summary``), so the report is one summary plus this.

What is computed (owners are ranks; rows without a rank belong to their
process, labelled ``pid N``):

- **window**: the report's time axes start at the first data operation (read,
  write or a GPU copy) and end with the last operation; ``lead_in_ns`` says how
  long the recording ran before (imports, rendezvous).
- **per owner**: bytes written and read, data operations, ``io_time_ns`` (the
  time in system calls on files, data and metadata: Darshan's cumulative I/O
  time per rank), and the first and last file operation. The slowest owner has
  the most I/O time, as in Darshan's job summary.
- **per file**: bytes, data and metadata operations, syncs, time in calls,
  owners, and the access pattern as Darshan's POSIX module counts it
  (darshan-runtime, ``POSIX_SEQ_WRITES``/``POSIX_CONSEC_WRITES``): a data
  operation is *sequential* when its offset is at or after the end of the
  previous one of the same direction by the same owner on the same file, and
  *consecutive* when it starts exactly there; the first access counts as
  neither.
- **request sizes**: the most common exact sizes of data operations.
- **latency** per op: p50, p90, p99 and max from ``stats.LatencyHistogram``
  (exact nearest-rank up to its sample limit, as the replay's table and the
  summary compute them; within 1.1 % past it), and for the chart the
  durations in quarter-octave buckets (bucket ``b`` holds
  ``[2**(b/4), 2**((b+1)/4))`` ns).
- **per time bin** (``TIME_BINS`` over the window, bytes attributed at each
  operation's completion): bytes per owner (the heat map), bytes written and
  read, and for the top files the bytes per (time bin, offset bin).
- **timelines** of the slowest and one chosen owner: the operations of their
  threads that touched files, merged where shorter than one pixel-wide bin
  (``TIMELINE_BINS`` over the window), so a lane has at most a few thousand bars.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ckpt_trace.formats import dictionary_codes, scan
from ckpt_trace.formats import vocabulary as v
from ckpt_trace.stats import LatencyHistogram

from .summary import SUMMARY_COLUMNS, Accumulator, Progress, gpu_summary, on_batch, summary_document

TIME_BINS = 240
OFFSET_BINS = 120
TIMELINE_BINS = 1500
TOP_FILES = 6
TOP_SIZES = 8
LATENCY_STEPS = 4  # the chart's buckets per power of two (LatencyHistogram.STEPS must be a multiple)
LATENCY_BUCKETS = 64 * LATENCY_STEPS
KINDS = ("write", "read", "fsync", "copy", "other")  # timeline bar kinds (the ``kind`` column of ``timelines``)
_PASS_TWO = ("ts_ns", "dur_ns", "pid", "tid", "rank", "op", "path", "offset", "size", "ret", "interface")


class _Registry(dict):
    """name -> dense id, growing as batches bring new names."""

    def codes(self, array: pa.Array) -> np.ndarray:
        """The ids of a (dictionary or plain) string column's values; -1 for nulls."""
        codes, values = dictionary_codes(array)
        lut = np.array([self.setdefault(value, len(self)) for value in values.to_pylist()] + [-1], dtype=np.int64)
        return lut[codes]

    def mask(self, names) -> np.ndarray:
        """Boolean lookup table over the ids (index -1, the last slot, is a null)."""
        lut = np.zeros(len(self) + 1, dtype=bool)
        for name, code in self.items():
            lut[code] = name in names
        return lut


class _Sums:
    """Columns of int64 sums indexed by a dense id, grown as ids appear."""

    def __init__(self, *names: str) -> None:
        self.data = {name: np.zeros(0, np.int64) for name in names}

    def add(self, name: str, ids: np.ndarray, weights: np.ndarray | None = None) -> None:
        if len(ids) == 0:
            return
        size = int(ids.max()) + 1
        column = self.data[name]
        if len(column) < size:
            column = self.data[name] = np.concatenate([column, np.zeros(size - len(column), np.int64)])
        if weights is None:
            column[:size] += np.bincount(ids, minlength=size)
        else:  # float64 sums of integers are exact below 2**53 bytes (8 PiB) per batch
            column[:size] += np.rint(np.bincount(ids, weights=weights, minlength=size)).astype(np.int64)

    def get(self, name: str, size: int) -> np.ndarray:
        column = self.data[name]
        return np.concatenate([column, np.zeros(max(0, size - len(column)), np.int64)])[:size]


class _Counts:
    """Exact counts of distinct int64 values (request sizes), as sorted numpy arrays merged batch by batch:
    memory grows with the distinct values, not the rows."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)

    def add(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        keys, counts = np.unique(values, return_counts=True)
        where = np.searchsorted(self.keys, keys)
        found = where < len(self.keys)
        found[found] = self.keys[where[found]] == keys[found]
        np.add.at(self.counts, where[found], counts[found])
        if not found.all():  # both sorted: insert the new values in place (one copy, no sort)
            self.keys = np.insert(self.keys, where[~found], keys[~found])
            self.counts = np.insert(self.counts, where[~found], counts[~found])

    def top(self, n: int) -> list[dict[str, int]]:
        """The ``n`` most common values, most common first (ties: the smaller value first)."""
        order = np.lexsort((self.keys, -self.counts))[:n]
        return [{"size_bytes": int(self.keys[i]), "count": int(self.counts[i])} for i in order.tolist()]

    def total(self) -> int:
        return int(self.counts.sum())


@dataclass
class _Batch:
    """One record batch as numpy arrays with dense ids (the pass's shared vocabulary)."""

    ts: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    owner: np.ndarray
    tid: np.ndarray
    op: np.ndarray
    path: np.ndarray
    offset: np.ndarray
    has_offset: np.ndarray
    size: np.ndarray
    moved: np.ndarray
    syscall: np.ndarray
    data: np.ndarray  # read or write
    copies: np.ndarray  # host<->device copies
    syncs: np.ndarray
    meta: np.ndarray  # metadata operations (formats' METADATA_OPS)
    writes: np.ndarray  # the write op


@dataclass
class _State:
    ops: _Registry = field(default_factory=_Registry)
    paths: _Registry = field(default_factory=_Registry)
    owners: _Registry = field(default_factory=_Registry)
    interfaces: _Registry = field(default_factory=_Registry)
    _special: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=bool))

    def batch(self, batch: pa.RecordBatch) -> _Batch:
        get = batch.column
        rank = get("rank").to_numpy().astype(np.int64)
        pid = get("pid").to_numpy().astype(np.int64)
        raw_owner = np.where(rank >= 0, rank, -pid - 1)  # ranks, then processes without a rank as -(pid+1)
        values, inverse = np.unique(raw_owner, return_inverse=True)
        lut = np.array([self.owners.setdefault(int(x), len(self.owners)) for x in values], dtype=np.int64)
        ts = get("ts_ns").to_numpy().astype(np.int64)
        dur = get("dur_ns").to_numpy().astype(np.int64)
        offset_col = get("offset")
        ret = get("ret").to_numpy().astype(np.int64)
        op = self.ops.codes(get("op"))
        return _Batch(
            ts=ts,
            end=ts + dur,
            dur=dur,
            owner=lut[inverse.reshape(-1)],
            tid=get("tid").to_numpy().astype(np.int64),
            op=op,
            path=self.paths.codes(get("path")),
            data=self.ops.mask(v.DATA_OPS)[op],
            copies=self.ops.mask(v.COPY_OPS)[op],
            syncs=self.ops.mask(v.SYNC_OPS)[op],
            meta=self.ops.mask(v.METADATA_OPS)[op],
            writes=op == self.ops.get(v.WRITE, -2),
            offset=offset_col.fill_null(0).to_numpy().astype(np.int64),
            has_offset=offset_col.is_valid().to_numpy(zero_copy_only=False),
            size=get("size").fill_null(0).to_numpy().astype(np.int64),
            moved=np.maximum(ret, 0),
            syscall=self.interfaces.codes(get("interface"))
            == self.interfaces.setdefault(v.SYSCALL, len(self.interfaces)),
        )

    def special(self) -> np.ndarray:
        """Per path id: True for pseudo files and non-files (pipes, sockets, io_uring instances); the last slot
        (id -1, no path) False. Judged once per path, as paths first appear."""
        known = len(self._special) - 1
        if known < len(self.paths):
            grown = np.zeros(len(self.paths) + 1, dtype=bool)
            grown[:known] = self._special[:known]
            for code, name in enumerate(itertools.islice(self.paths, known, None), start=known):  # ids in order
                grown[code] = name.startswith(v.SPECIAL_PREFIXES) or name in v.SPECIAL_PATHS
            self._special = grown
        return self._special


def _file_rows(state: _State, b: _Batch) -> np.ndarray:
    """Rows about files: data operations, GPU copies, and calls on regular (not special) paths."""
    special = state.special()
    return b.data | b.copies | ((b.path >= 0) & ~special[b.path])


class _PassOne:
    """Per owner, per file, per op and per size aggregates (see the module docstring)."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.owner = _Sums("written", "read", "data_ops", "copies", "io_time_ns")
        self.owner_first = np.zeros(0, np.int64)
        self.owner_last = np.zeros(0, np.int64)
        self.file = _Sums(
            "written", "read", "data_ops", "meta_ops", "syncs", "time_ns", "sequential", "consecutive", "max_end"
        )
        self.file_owners: set[tuple[int, int]] = set()
        self.sizes = _Counts()
        self.latency: dict[int, LatencyHistogram] = {}
        self.start = self.end = self.first_data = None
        self.last_end: dict[int, int] = {}  # (owner, path, direction) key -> end of its last data op

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        s, b = self.state, self.state.batch(batch)
        data, copies, syncs, meta, writes = b.data, b.copies, b.syncs, b.meta, b.writes
        files = _file_rows(s, b)
        self.start = min(int(b.ts.min()), self.start if self.start is not None else 1 << 62)
        self.end = max(int(b.end.max()), self.end or 0)
        if (data | copies).any():
            first = int(b.ts[data | copies].min())
            self.first_data = first if self.first_data is None else min(self.first_data, first)
        # per owner
        self.owner.add("written", b.owner[data & writes], b.moved[data & writes])
        self.owner.add("read", b.owner[data & ~writes], b.moved[data & ~writes])
        self.owner.add("data_ops", b.owner[data])
        self.owner.add("copies", b.owner[copies])
        timed = files & b.syscall & (data | meta)
        self.owner.add("io_time_ns", b.owner[timed], b.dur[timed])
        self._owner_extent(b, files & (data | meta | copies))
        # per file
        on_file = b.path >= 0
        self.file.add("written", b.path[on_file & data & writes], b.moved[on_file & data & writes])
        self.file.add("read", b.path[on_file & data & ~writes], b.moved[on_file & data & ~writes])
        self.file.add("data_ops", b.path[on_file & data])
        self.file.add("meta_ops", b.path[on_file & meta])
        self.file.add("syncs", b.path[on_file & syncs])
        self.file.add(
            "time_ns", b.path[on_file & b.syscall & (data | meta)], b.dur[on_file & b.syscall & (data | meta)]
        )
        pairs = np.unique(b.path[on_file & (data | meta)] * (1 << 24) + b.owner[on_file & (data | meta)])
        self.file_owners.update((int(p) >> 24, int(p) & ((1 << 24) - 1)) for p in pairs)
        self._pattern(b, on_file & data & b.has_offset, writes)
        # sizes, latency
        self.sizes.add(b.size[data])
        for op in np.unique(b.op).tolist():
            self.latency.setdefault(op, LatencyHistogram()).add(b.dur[b.op == op])

    def _owner_extent(self, b: _Batch, rows: np.ndarray) -> None:
        n = len(self.state.owners)
        first = np.full(n, 1 << 62, np.int64)
        last = np.zeros(n, np.int64)
        if rows.any():
            np.minimum.at(first, b.owner[rows], b.ts[rows])
            np.maximum.at(last, b.owner[rows], b.end[rows])
        grow = n - len(self.owner_first)
        self.owner_first = np.minimum(np.concatenate([self.owner_first, np.full(grow, 1 << 62, np.int64)]), first)
        self.owner_last = np.maximum(np.concatenate([self.owner_last, np.zeros(grow, np.int64)]), last)

    def _pattern(self, b: _Batch, rows: np.ndarray, writes: np.ndarray) -> None:
        """Sequential and consecutive data operations per file (see the module docstring), carried across
        batches by the end of each (owner, file, direction)'s last operation."""
        if not rows.any():
            return
        key = (b.path[rows] * (1 << 24) + b.owner[rows]) * 2 + writes[rows]
        ts, off = b.ts[rows], b.offset[rows]
        end = off + b.size[rows]
        order = np.lexsort((ts, key))
        key, off, end, path = key[order], off[order], end[order], b.path[rows][order]
        first = np.r_[True, key[1:] != key[:-1]]
        prev_end = np.r_[0, end[:-1]]
        known = ~first
        starts = np.flatnonzero(first)
        for i in starts.tolist():
            carried = self.last_end.get(int(key[i]))
            if carried is not None:
                prev_end[i], known[i] = carried, True
        last = np.r_[starts[1:] - 1, len(key) - 1]
        self.last_end.update(zip(key[last].tolist(), end[last].tolist()))
        self.file.add("sequential", path[known & (off >= prev_end)])
        self.file.add("consecutive", path[known & (off == prev_end)])
        ends = np.zeros(int(path.max()) + 1, np.int64)
        np.maximum.at(ends, path, end)
        column = self.file.data["max_end"]
        if len(column) < len(ends):
            column = self.file.data["max_end"] = np.concatenate([column, np.zeros(len(ends) - len(column), np.int64)])
        column[: len(ends)] = np.maximum(column[: len(ends)], ends)


class _PassTwo:
    """Time-binned aggregates over the window, once the window, top files and chosen owners are known."""

    def __init__(self, state: _State, start: int, end: int, files: list[int], owners: list[int]) -> None:
        self.state, self.start = state, start
        self.width = max(1, (end - start) // TIME_BINS + 1)
        self.files = files
        self.file_ends = {}
        self.owners = owners
        n = len(state.owners)
        self.heat = np.zeros((n, TIME_BINS))
        self.direction = np.zeros((2, TIME_BINS))  # written, read
        self.offsets = {(f, d): np.zeros((TIME_BINS, OFFSET_BINS)) for f in files for d in (0, 1)}
        self.pixel = max(1, (end - start) // TIMELINE_BINS + 1)
        self.bars: list[np.ndarray] = []  # rows of (owner, tid, kind, start, duration)

    def set_file_ends(self, ends: dict[int, int]) -> None:
        self.file_ends = ends

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        s, b = self.state, self.state.batch(batch)
        data, copies, writes = b.data, b.copies, b.writes
        bins = np.clip((b.end - self.start) // self.width, 0, TIME_BINS - 1)
        moving = data & (b.moved > 0)
        heat = np.bincount(
            b.owner[moving] * TIME_BINS + bins[moving], weights=b.moved[moving], minlength=self.heat.size
        )
        if heat.size > self.heat.size:  # owners seen first in this pass (none in a pass-one-complete state)
            self.heat = np.vstack([self.heat, np.zeros((heat.size // TIME_BINS - len(self.heat), TIME_BINS))])
        self.heat += heat.reshape(-1, TIME_BINS)
        for direction, rows in ((0, moving & writes), (1, moving & ~writes)):
            self.direction[direction] += np.bincount(bins[rows], weights=b.moved[rows], minlength=TIME_BINS)
            for f in self.files:
                mine = rows & (b.path == f) & b.has_offset
                if mine.any():
                    span = max(1, self.file_ends.get(f, 1))
                    o = np.clip(b.offset[mine] * OFFSET_BINS // span, 0, OFFSET_BINS - 1)
                    self.offsets[(f, direction)] += np.bincount(
                        bins[mine] * OFFSET_BINS + o, weights=b.moved[mine], minlength=TIME_BINS * OFFSET_BINS
                    ).reshape(TIME_BINS, OFFSET_BINS)
        chosen = np.isin(b.owner, self.owners) & _file_rows(s, b)
        if chosen.any():
            kind = np.full(len(b.op), 4, np.int64)
            kind[data & writes] = 0
            kind[data & ~writes] = 1
            kind[b.syncs] = 2
            kind[copies] = 3
            rows = np.stack(
                [b.owner[chosen], b.tid[chosen], kind[chosen], b.ts[chosen] - self.start, np.maximum(b.dur[chosen], 1)],
                axis=1,
            )
            self.bars.append(self._merge(rows))

    def _merge(self, rows: np.ndarray) -> np.ndarray:
        """Bars at least one pixel wide: operations shorter than a pixel merge into one bar per pixel."""
        long = rows[:, 4] >= self.pixel
        short = rows[~long].copy()
        short[:, 3] = short[:, 3] // self.pixel * self.pixel
        short[:, 4] = self.pixel
        return np.concatenate([rows[long], np.unique(short, axis=0)])

    def timelines(self) -> np.ndarray:
        """(owner, tid, kind, start ns since the window, duration ns) rows, sorted, without repeats."""
        return np.unique(self._merge(np.concatenate(self.bars)), axis=0) if self.bars else np.zeros((0, 5), np.int64)


def _bucket_ns(bucket: int) -> float:
    """The geometric middle of a latency bucket, ns."""
    return 2 ** ((bucket + 0.5) / LATENCY_STEPS)


def _latency_entry(histogram: LatencyHistogram) -> dict[str, Any]:
    figures = histogram.percentiles_ns()
    counts = histogram.counts.reshape(LATENCY_BUCKETS, -1).sum(axis=1)  # 1/64-octave buckets, 16 a chart bucket
    nonzero = np.flatnonzero(counts)
    return {
        "count": histogram.count,
        "p50_ns": figures["p50"],
        "p90_ns": figures["p90"],
        "p99_ns": figures["p99"],
        "max_ns": figures["max"],
        "buckets": [[round(_bucket_ns(int(b))), int(counts[b])] for b in nonzero.tolist()],
    }


def profile_file(
    path: str | os.PathLike, *, rank: int | None = None, batch_rows: int = 1 << 20, progress: Progress | None = None
) -> dict[str, Any]:
    """The report's aggregates of the trace at ``path`` (module docstring), as one JSON-able dict:
    ``summary`` (``analysis.summary``), ``window``, ``owners``, ``files``, ``sizes``, ``latency``, ``bins``
    (heat map and throughput), ``offsets``, ``timelines``.

    ``rank`` picks the owner shown beside the slowest one (default: rank 0, or the first owner). Two passes
    over the file in batches of ``batch_rows`` rows, fed to ``progress`` (``analysis.summary.Progress``). Raises TraceFormatError for a bad trace, CkptTraceError
    for one with no operations.
    """
    from ckpt_trace.errors import CkptTraceError

    meta, batches = scan(path, SUMMARY_COLUMNS, batch_rows=batch_rows, on_batch=on_batch(progress, "pass 1 of 2"))
    state = _State()
    summary_acc, one = Accumulator(), _PassOne(state)
    for batch in batches:
        summary_acc.add(batch)
        one.add(batch)
    if one.start is None:
        raise CkptTraceError(f"{path} holds no operations to report")
    summary = summary_document(path, meta, summary_acc.result(), gpu_summary(path, summary_acc, batch_rows))
    n_owners, n_paths = len(state.owners), len(state.paths)
    owners = _owners(state, one, n_owners)
    movers = [o["first_ns"] for o in owners if o["data_ops"] and o["first_ns"] is not None]
    start = min(movers) if movers else one.first_data if one.first_data is not None else one.start
    end = max(one.end, start + 1)
    files = _files(state, one, n_paths)
    top = [f["id"] for f in files if f["written"] + f["read"] > 0][:TOP_FILES]
    slowest = max(owners, key=lambda o: (o["io_time_ns"], -o["id"]))["id"] if owners else 0
    chosen = _chosen(state, owners, rank)
    two = _PassTwo(state, start, end, top, sorted({slowest, chosen}))
    two.set_file_ends({f: int(one.file.get("max_end", n_paths)[f]) for f in top})
    _, again = scan(path, _PASS_TWO, batch_rows=batch_rows, on_batch=on_batch(progress, "pass 2 of 2"))
    for batch in again:
        two.add(batch)
    names = {code: name for name, code in state.paths.items()}
    return {
        "summary": summary,
        "metadata": {
            key: meta.get(key)
            for key in (
                "command",
                "host",
                "kernel",
                "arch",
                "backend",
                "backend_reason",
                "format_version",
                "filesystems",
                "path_filters",
                "elapsed_ns",
                "exit_code",
                "lost_events",
            )
        },
        "window": {
            "start_ns": start,
            "end_ns": end,
            "lead_in_ns": start - one.start,
            "bin_ns": two.width,
            "bins": TIME_BINS,
        },
        "owners": owners,
        "slowest": slowest,
        "chosen": chosen,
        "files": [{k: val for k, val in f.items() if k != "id"} | {"path": names[f["id"]]} for f in files],
        "sizes": one.sizes.top(TOP_SIZES),
        "data_ops": one.sizes.total(),
        "latency": {
            name: _latency_entry(one.latency[code])
            for name, code in sorted(
                state.ops.items(), key=lambda item: -(one.latency[item[1]].count if item[1] in one.latency else 0)
            )
            if code in one.latency
        },
        "heat": two.heat[[o["id"] for o in owners]] if owners else np.zeros((0, TIME_BINS)),
        "throughput": two.direction,
        "offsets": [
            {
                "path": names[f],
                "size_bytes": int(one.file.get("max_end", n_paths)[f]),
                "write": two.offsets[(f, 0)],
                "read": two.offsets[(f, 1)],
            }
            for f in top
        ],
        "timelines": two.timelines(),
        "owner_labels": {o["id"]: o["label"] for o in owners},
    }


def _owners(state: _State, one: _PassOne, n: int) -> list[dict[str, Any]]:
    """Per owner, in rank order (processes without a rank after the ranks)."""
    sums = {name: one.owner.get(name, n) for name in ("written", "read", "data_ops", "copies", "io_time_ns")}
    first = np.concatenate([one.owner_first, np.full(n - len(one.owner_first), 1 << 62, np.int64)])
    last = np.concatenate([one.owner_last, np.zeros(n - len(one.owner_last), np.int64)])
    rows = []
    for raw, code in state.owners.items():
        has_io = first[code] < (1 << 62)
        if not sums["data_ops"][code] and not sums["copies"][code]:
            continue  # moved no data: a launcher's probe, a store thread's process
        rows.append(
            {
                "id": code,
                "label": f"rank {raw}" if raw >= 0 else f"pid {-raw - 1}",
                "rank": raw if raw >= 0 else None,
                "pid": -raw - 1 if raw < 0 else None,
                "bytes_written": int(sums["written"][code]),
                "bytes_read": int(sums["read"][code]),
                "data_ops": int(sums["data_ops"][code]),
                "copies": int(sums["copies"][code]),
                "io_time_ns": int(sums["io_time_ns"][code]),
                "first_ns": int(first[code]) if has_io else None,
                "last_ns": int(last[code]) if has_io else None,
            }
        )
    return sorted(rows, key=lambda r: (r["rank"] is None, r["rank"] if r["rank"] is not None else r["pid"]))


def _files(state: _State, one: _PassOne, n: int) -> list[dict[str, Any]]:
    """Per file, most bytes first; special paths (pipes, sockets, io_uring instances) left out."""
    special = state.special()
    sums = {name: one.file.get(name, n) for name in one.file.data}
    owners: dict[int, int] = {}
    for path, _ in one.file_owners:
        owners[path] = owners.get(path, 0) + 1
    rows = []
    for code in state.paths.values():
        if special[code]:
            continue
        data_ops = int(sums["data_ops"][code])
        rows.append(
            {
                "id": code,
                "written": int(sums["written"][code]),
                "read": int(sums["read"][code]),
                "data_ops": data_ops,
                "meta_ops": int(sums["meta_ops"][code]),
                "syncs": int(sums["syncs"][code]),
                "time_ns": int(sums["time_ns"][code]),
                "owners": owners.get(code, 0),
                "sequential": int(sums["sequential"][code]),
                "consecutive": int(sums["consecutive"][code]),
            }
        )
    return sorted(rows, key=lambda r: (-(r["written"] + r["read"]), -r["time_ns"], r["id"]))


def _chosen(state: _State, owners: list[dict], rank: int | None) -> int:
    from ckpt_trace.errors import CkptTraceError

    if rank is not None:
        for o in owners:
            if o["rank"] == rank:
                return o["id"]
        known = [o["rank"] for o in owners if o["rank"] is not None]
        raise CkptTraceError(f"no rank {rank} in the trace (ranks: {format_ranges(known) or 'none'})")
    return owners[0]["id"] if owners else 0


def format_ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, values = [], sorted(values)
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(out)
