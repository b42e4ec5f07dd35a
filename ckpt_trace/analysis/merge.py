"""``merge``: the traces of a job's nodes (one ``record`` per node) as one trace of the job.

Call order: ``plan_merge`` reads each trace's metadata and its ``rank`` and ``pid`` columns (a clash of
ranks is refused here, naming both traces), then ``merge_traces`` streams the rows into one trace.

Clocks: each trace's ``ts_ns`` is put on ``CLOCK_REALTIME`` through its anchors (``tracer.clock``:
linear between the start and end anchor pairs), plus ``--clock-offset HOST=NS`` where a host's realtime
clock is known to be off; traces of one boot (the same ``boot_id`` and tracer clock) share the first such
trace's anchors, so their relative order is exact. The merged trace's clock is ``CLOCK_REALTIME`` from the
earliest origin. Its metadata's ``merged.alignment_error_ns`` bounds how far two rows of different traces
may be misplaced against each other: the sum of the two largest per-trace bounds (each: the anchors' read
uncertainty plus the drift between its two anchors); the agreement of different hosts' realtime clocks
themselves (NTP, PTP) is taken as given, which ``merge.note`` says.

Rows: a k-way merge over record batches with a watermark. Each input holds one batch (its text columns
recoded once into the merged trace's dictionaries, which are read from the inputs before any row); the
watermark is the smallest last timestamp among the held batches. Every held row before it is in its final
place, since each trace is sorted by start time; rows at it keep the order of the inputs, so they go out
from the inputs up to the first whose held rows end there (it drains; later inputs hold theirs back until
it has read its next batch). When more than ``step_rows`` rows are ready, only those before a time at most
``step_rows / inputs`` rows into every input go out. A step's rows are sorted once (a stable order by time,
ties in input order, then row order) and gathered column by column with numpy, then written straight into
the file in batches of ``batch_rows`` (``write_trace_batches``: the rows and the last time are known from
the plan, so the metadata is too; compressed once). Only drained inputs read their next batch, and a few
of those that will drain next are read ahead on two threads, so memory is bounded by one batch per input
and a few more, not by the traces' length.

Processes: a pid seen in two traces (two hosts reuse pids; containers all start at 1) is moved, in every
trace after the first that holds it, by ``trace index << 22`` (above Linux's largest ``pid_max``, 2**22),
pid and tid alike, so a replay keeps the processes apart; ``merged.traces[i].pid_offset`` says by how much.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import COLUMNS, SCHEMA, int_values, read_metadata, scan, validity, write_trace_batches
from ckpt_trace.formats.schema import file_schema
from ckpt_trace.tracer import clock as clocks
from ckpt_trace.version import __version__

PID_SHIFT = 22  # Linux's pid_max is at most 2**22 (PID_MAX_LIMIT on 64-bit)
MAX_TRACES = (1 << (31 - PID_SHIFT)) - 1  # a moved pid must stay an int32
TEXT = [f.name for f in SCHEMA if pa.types.is_dictionary(f.type)]
SUMMED_KEYS = ("lost_events", "truncated_paths", "untracked_fd_ops", "late_events", "unreaped_requests", "spilled_runs")
PREFETCH = 4  # batches read ahead, for the sources that drain first (each: a batch of every column)
PREFETCH_THREADS = 2
STEP_BATCHES = 4  # at most about this many batches' rows are sorted at once (the per-step work is per source)
NOTE = (
    "rows of different traces are placed on CLOCK_REALTIME through each trace's anchors; different hosts' "
    "realtime clocks are taken to agree (NTP/PTP): --clock-offset HOST=NS corrects a known difference"
)


@dataclass(frozen=True)
class MergeInput:
    """One trace to merge: where it is, its node, how its rows reach the job's clock and pid space."""

    path: Path
    metadata: Mapping[str, Any]
    host: str
    ranks: tuple[int, ...]
    rows: int
    clock: Mapping[str, Any] | None  # the anchors used (another trace's of the same boot), None: none stored
    offset_ns: int  # --clock-offset of its host
    error_ns: int | None  # alignment error bound of this trace, None: unknown (no anchors)
    pid_offset: int = 0
    last_ts_ns: int | None = None  # its last row's ts_ns (since its origin), None: no rows

    def realtime(self, ts_ns: np.ndarray) -> np.ndarray:
        """``ts_ns`` (since this trace's origin) on CLOCK_REALTIME, int64 ns."""
        if self.clock is None:  # a trace recorded before anchors: its start wall time, to about a second
            return ts_ns + int(self.metadata["start_wall_time_ns"]) + self.offset_ns
        return np.asarray(clocks.to_realtime(self.clock, ts_ns, offset_ns=self.offset_ns), np.int64)


@dataclass(frozen=True)
class MergePlan:
    """The inputs, in the order given, and the job's clock origin (CLOCK_REALTIME ns of the merged ts 0)."""

    inputs: tuple[MergeInput, ...]
    origin_ns: int
    alignment_error_ns: int | None
    hosts: Mapping[str, dict] = field(default_factory=dict)


def parse_clock_offsets(items: Sequence[str]) -> dict[str, int]:
    """``["HOST=NS", ...]`` as {host: ns}. Raises CkptTraceError for a malformed item."""
    out: dict[str, int] = {}
    for item in items:
        host, sep, value = item.rpartition("=")
        try:
            if not sep or not host:
                raise ValueError
            out[host] = int(value)
        except ValueError:
            raise CkptTraceError(
                f"{{option}} takes HOST=NS (nanoseconds, may be negative), not {item!r}", option="clock_offsets"
            ) from None
    return out


def _ids(path: Path) -> tuple[set[int], set[int], int, int | None]:
    """(ranks >= 0, pids, rows, last row's ts_ns or None) of a trace, from its rank, pid and ts_ns columns."""
    ranks: set[int] = set()
    pids: set[int] = set()
    rows, last = 0, None
    _, batches = scan(path, ["rank", "pid", "ts_ns"])
    for batch in batches:
        if not batch.num_rows:
            continue
        rows += batch.num_rows
        ranks.update(pc.unique(batch.column("rank")).to_pylist())
        pids.update(pc.unique(batch.column("pid")).to_pylist())
        last = int(int_values(batch.column("ts_ns"))[-1])
    ranks.discard(-1)
    return ranks, pids, rows, last


def plan_merge(paths: Sequence[str | os.PathLike], clock_offsets: Mapping[str, int] | None = None) -> MergePlan:
    """Read each trace's metadata and its rank and pid columns; choose clocks and pid offsets.

    Raises CkptTraceError for fewer than one trace, a trace named twice, traces of different architectures,
    a rank recorded in two traces (naming both), a ``--clock-offset`` host no trace has; TraceFormatError
    for an unreadable trace.
    """
    offsets = dict(clock_offsets or {})
    paths = [Path(p) for p in paths]
    if not paths:
        raise CkptTraceError("nothing to merge: name at least one trace")
    if len(paths) > MAX_TRACES:
        raise CkptTraceError(f"at most {MAX_TRACES} traces merge into one (pids are moved by trace index)")
    seen_paths = {}
    for path in paths:
        key = path.resolve()
        if key in seen_paths:
            raise CkptTraceError(f"{path} is named twice")
        seen_paths[key] = path
    metas = [read_metadata(p) for p in paths]
    arches = {m["arch"] for m in metas}
    if len(arches) > 1:
        raise CkptTraceError(
            f"traces of different architectures ({', '.join(sorted(arches))}) do not merge: their open flags differ"
        )
    hosts = [str(m["host"]) for m in metas]
    unknown = sorted(set(offsets) - set(hosts))
    if unknown:
        raise CkptTraceError(
            f"{{option}} names host {unknown[0]!r}, which no trace has (hosts: {', '.join(sorted(set(hosts)))})",
            option="clock_offsets",
        )
    owner: dict[int, Path] = {}
    pid_owner: dict[int, int] = {}
    boots: dict[tuple, Mapping] = {}
    inputs = []
    for index, (path, meta, host) in enumerate(zip(paths, metas, hosts)):
        ranks, pids, rows, last = _ids(path)
        for rank in sorted(ranks):
            if rank in owner:
                raise CkptTraceError(
                    f"rank {rank} is in both {owner[rank]} and {path}: traces of one job hold "
                    "each rank once (the same recording twice, or two jobs?)"
                )
            owner[rank] = path
        clash = any(pid in pid_owner for pid in pids)
        pid_offset = (index << PID_SHIFT) if clash else 0
        for pid in pids:
            pid_owner.setdefault(pid + pid_offset, index)
        own = meta.get("clock")
        used, error = None, None
        if own and own.get("anchors"):
            boot = (meta.get("boot_id"), own["name"]) if meta.get("boot_id") else None
            reference = boots.setdefault(boot, own) if boot else own  # one boot, one clock: one set of anchors
            used = {**reference, "origin_ns": own["origin_ns"]} if own["name"] != "CLOCK_REALTIME" else own
            error = clocks.alignment_error_ns(used)
        inputs.append(
            MergeInput(
                path=path,
                metadata=meta,
                host=host,
                ranks=tuple(sorted(ranks)),
                rows=rows,
                clock=used,
                offset_ns=offsets.get(host, 0),
                error_ns=error,
                pid_offset=pid_offset,
                last_ts_ns=last,
            )
        )
    origin = min(int(i.realtime(np.zeros(1, np.int64))[0]) for i in inputs)
    errors = [i.error_ns for i in inputs]
    bound = None if any(e is None for e in errors) else (sum(sorted(errors)[-2:]) if len(errors) > 1 else 0)
    return MergePlan(inputs=tuple(inputs), origin_ns=origin, alignment_error_ns=bound, hosts=_hosts(inputs))


def _hosts(inputs: Sequence[MergeInput]) -> dict[str, dict]:
    """Per host: its traces, ranks, rows, and the lost events and unseen counts of its traces summed."""
    out: dict[str, dict] = {}
    for item in inputs:
        entry = out.setdefault(
            item.host, {"traces": 0, "ranks": [], "rows": 0, "lost_events": 0, "unseen": {}, "boot_ids": []}
        )
        entry["traces"] += 1
        entry["ranks"] = sorted(set(entry["ranks"]) | set(item.ranks))
        entry["rows"] += item.rows
        entry["lost_events"] += int(item.metadata.get("lost_events") or 0)
        if item.metadata.get("boot_id") and item.metadata["boot_id"] not in entry["boot_ids"]:
            entry["boot_ids"].append(item.metadata["boot_id"])
        for capture, seen in (item.metadata.get("unseen") or {}).items():
            slot = entry["unseen"].setdefault(capture, {"reason": seen.get("reason"), "count": 0})
            slot["count"] += int(seen.get("count") or 0)
    return out


def merge_dictionaries(plan: MergePlan) -> dict[str, pa.Array]:
    """Per text column, the merged trace's one dictionary: every input's values, in input order, each once.

    Read from each input's first batch (an Arrow IPC file's batches share one dictionary per column: a
    delta is read when the file opens), every batch of a trace of an older version (upgraded batches may
    bring their own). The ``host`` column's dictionary is the plan's hosts."""
    words: dict[str, dict] = {name: {} for name in TEXT}
    for item in plan.inputs:
        meta, batches = scan(item.path, TEXT, read_ahead=False)
        try:
            for batch in batches:
                for name in TEXT:
                    for word in batch.column(name).dictionary.to_pylist():
                        if word is not None:
                            words[name].setdefault(word, len(words[name]))
                if meta["format_version"] >= 5:
                    break
        finally:
            batches.close()  # scan's generator: its file closes with it
    out = {name: pa.array(list(found), pa.string()) for name, found in words.items()}
    out["host"] = pa.array(list(plan.hosts), pa.string())
    return out


ALL_NULL = True  # a column's null mask when every row of the batch is null (its values are not kept)
_Column = tuple  # (values: np.ndarray | None, null mask: np.ndarray | None | ALL_NULL) of one column of a batch


class _Source:
    """One input's rows on the job's clock: one batch held at a time (``pos``: how many already went out),
    its text columns as codes into the merged dictionaries (``merge_dictionaries``)."""

    def __init__(
        self, index: int, item: MergeInput, origin_ns: int, batch_rows: int, codes: Mapping[str, Mapping[str, int]]
    ) -> None:
        self.index, self.item, self.origin_ns = index, item, origin_ns
        _, self._batches = scan(item.path, list(COLUMNS), batch_rows=batch_rows, read_ahead=False)
        self._codes = codes
        self._luts: dict[str, tuple] = {}
        self._next: Future | None = None  # the next batch, read on the merge's prefetch thread
        self.columns: list[_Column] = []
        self.ts = np.zeros(0, np.int64)
        self.pos = 0
        self.done = False

    @property
    def held(self) -> int:
        return len(self.ts) - self.pos

    @property
    def prefetching(self) -> bool:
        return self._next is not None

    def prefetch(self, pool: ThreadPoolExecutor) -> None:
        """Read and convert the next batch on ``pool`` while the held one goes out."""
        if self._next is None and not self.done:
            self._next = pool.submit(self._read)

    def fill(self) -> None:
        """Hold the next non-empty batch once the held one has gone out (``done`` when there is none)."""
        if self.done or self.held:
            return
        if self._next is not None:
            got, self._next = self._next.result(), None
        else:
            got = self._read()
        if got is None:
            self.done, self.columns = True, []
            return
        self.columns, self.ts = got
        self.pos = 0

    def _read(self) -> tuple[list[_Column], np.ndarray] | None:
        """The next non-empty batch's columns (ts on the job's clock, pids moved, text recoded) and times."""
        for batch in self._batches:
            if batch.num_rows:
                break
        else:
            return None
        ts = self.item.realtime(int_values(batch.column("ts_ns")).astype(np.int64)) - self.origin_ns
        columns = []
        for name in COLUMNS:
            column = batch.column(name)
            if name == "ts_ns":
                columns.append((ts, None))
            elif column.null_count == len(column):
                columns.append((None, ALL_NULL))
            elif name in self._codes:
                columns.append(self._recode(name, column))
            else:
                values = int_values(column)
                if name in ("pid", "tid") and self.item.pid_offset:
                    values = (values.astype(np.int64) + self.item.pid_offset).astype(np.int32)
                columns.append((values, ~validity(column) if column.null_count else None))
        return columns, ts

    def _recode(self, name: str, column: pa.DictionaryArray) -> _Column:
        """A text column's indices as int32 codes of the merged dictionary (a null row: code 0, masked).
        Each distinct batch dictionary is looked up once; the rows are renumbered by one numpy gather."""
        words = column.dictionary
        cached = self._luts.get(name)
        if cached is None or not (cached[0] is words or cached[0].equals(words)):
            codes = self._codes[name]
            lut = np.array([-1 if word is None else codes.get(word, -2) for word in words.to_pylist()], np.int32)
            if (lut == -2).any():
                raise CkptTraceError(
                    f"{self.item.path}: a batch holds {name} values its first batch's dictionary "
                    "lacks (the file is not one Arrow IPC file of one dictionary per column)"
                )
            cached = self._luts[name] = (words, lut, bool(np.array_equal(lut, np.arange(len(lut)))))
        _, lut, identity = cached
        indices = column.indices
        values = int_values(indices)
        if identity and not indices.null_count:
            return values, None
        valid = validity(indices)
        numbers = lut[np.where(valid, values, 0)] if len(lut) else np.full(len(values), -1, np.int32)
        null = ~valid | (numbers < 0)
        if null.any():
            return np.where(null, 0, numbers).astype(np.int32), null
        return numbers, None

    def stop_at(self, ts_ns: int, side: Literal["left", "right"]) -> int:
        """How many held rows lie before ``ts_ns`` (``side`` 'right': at it too)."""
        return int(np.searchsorted(self.ts[self.pos :], ts_ns, side=side))

    def take(self, count: int) -> tuple[list[_Column], np.ndarray]:
        """The next ``count`` held rows (per column of ``COLUMNS`` its values and null mask, as numpy views,
        and their times); they go out."""
        start, self.pos = self.pos, self.pos + count
        return [
            (
                values if values is None else values[start : self.pos],
                mask if mask is None or mask is ALL_NULL else mask[start : self.pos],
            )
            for values, mask in self.columns
        ], self.ts[start : self.pos]


def _steps(sources: list[_Source], step_rows: int, pool: ThreadPoolExecutor) -> Iterator[list[tuple[_Source, int]]]:
    """Per step, the (source, row count) of the held rows now in their final place (module docstring)."""
    while True:
        for source in sources:
            source.fill()
        live = [s for s in sources if not s.done]
        if not live:
            return
        # The sources whose held rows end first drain first: their next batches are read meanwhile.
        free = PREFETCH - sum(s.prefetching for s in live)
        if free > 0:
            for source in sorted((s for s in live if not s.prefetching), key=lambda s: int(s.ts[-1]))[:free]:
                source.prefetch(pool)
        watermark = min(int(s.ts[-1]) for s in live)
        # Bounded step: when more than step_rows rows may be ready, only those strictly before a time at
        # most step_rows / len(live) rows into every source go out (ties at that time wait).
        reach = max(1, step_rows // len(live))
        cut = min((int(s.ts[s.pos + reach]) for s in live if s.held > reach), default=watermark)
        if cut < watermark:
            stops = [(s, s.stop_at(cut, "left")) for s in live]
            if any(stop for _, stop in stops):
                yield [(s, stop) for s, stop in stops if stop]
                continue
        # Watermark: every held row before it is final, since each trace is in time order. Rows at it keep
        # the inputs' order: the first source whose held rows end there may have more at it in its next
        # batch, so sources after it hold theirs back; it drains, so the next step reads its next batch.
        first_ending = min(s.index for s in live if int(s.ts[-1]) == watermark)
        stops = [(s, s.stop_at(watermark, "right" if s.index <= first_ending else "left")) for s in live]
        yield [(s, stop) for s, stop in stops if stop]


def merged_rows(
    plan: MergePlan,
    *,
    batch_rows: int = 65536,
    dictionaries: Mapping[str, pa.Array] | None = None,
    step_rows: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of every input in global time order (ties: in the order of the inputs, then of their rows), as
    record batches of ``batch_rows`` rows (the last one shorter) of the file schema with ``host``, text
    columns over ``dictionaries`` (``merge_dictionaries(plan)`` when None), in bounded memory (module
    docstring). ``step_rows``: at most about that many rows are sorted at once (``STEP_BATCHES`` batches)."""
    dictionaries = dict(dictionaries or merge_dictionaries(plan))
    codes = {
        name: {word: i for i, word in enumerate(values.to_pylist())}
        for name, values in dictionaries.items()
        if name in TEXT
    }
    schema = file_schema(("host",))
    host_codes = {host: i for i, host in enumerate(dictionaries["host"].to_pylist())}
    sources = [_Source(i, item, plan.origin_ns, batch_rows, codes) for i, item in enumerate(plan.inputs)]
    step_rows = max(1, step_rows or STEP_BATCHES * batch_rows)
    with ThreadPoolExecutor(max_workers=PREFETCH_THREADS, thread_name_prefix="ckpt-trace-merge") as pool:
        yield from _merged_steps(_steps(sources, step_rows, pool), host_codes, codes, dictionaries, schema, batch_rows)


def _merged_steps(steps, host_codes, codes, dictionaries, schema, batch_rows) -> Iterator[pa.RecordBatch]:
    """Each step's rows, sorted by time (stable), as record batches of ``schema`` of ``batch_rows`` rows (zstd
    compresses a full batch better than many small ones): per column, the pieces' values concatenated and
    gathered in time order by numpy (no Arrow array per piece). The rows short of a full batch are carried
    into the next step as its first piece (they precede its rows), so no row is copied twice."""
    types = [pa.int32() if name in codes else SCHEMA.field(name).type for name in COLUMNS]
    dtypes = [np.dtype(t.to_pandas_dtype()) for t in types]
    carry = None
    for step in steps:
        pieces = [
            source.take(count) + (np.full(count, host_codes[source.item.host], np.int32),) for source, count in step
        ]
        if carry is not None:
            pieces.insert(0, carry)
        counts = [len(piece[1]) for piece in pieces]
        if len(pieces) == 1:
            columns, ts, hosts = pieces[0]
        else:
            ts = np.concatenate([piece[1] for piece in pieces])
            order = _time_order(ts)
            ts, hosts = ts[order], np.concatenate([piece[2] for piece in pieces])[order]
            columns = []
            for j, dtype in enumerate(dtypes):
                parts = [piece[0][j] for piece in pieces]
                if all(mask is ALL_NULL for _, mask in parts):
                    columns.append((None, ALL_NULL))
                    continue
                values = np.concatenate(
                    [np.zeros(n, dtype) if m is ALL_NULL else v for (v, m), n in zip(parts, counts)]
                )[order]
                mask = None
                if any(m is not None for _, m in parts):
                    mask = np.concatenate(
                        [
                            np.zeros(n, bool) if m is None else np.ones(n, bool) if m is ALL_NULL else m
                            for (_, m), n in zip(parts, counts)
                        ]
                    )[order]
                columns.append((values, mask))
        rows = len(ts)
        whole = rows - rows % batch_rows
        for start in range(0, whole, batch_rows):
            yield _record_batch(columns, hosts, start, start + batch_rows, types, dictionaries, codes, schema)
        carry = None
        if whole < rows:
            carry = (
                [(v if v is None else v[whole:], m if m is None or m is ALL_NULL else m[whole:]) for v, m in columns],
                ts[whole:],
                hosts[whole:],
            )
    if carry is not None:
        yield _record_batch(carry[0], carry[2], 0, len(carry[1]), types, dictionaries, codes, schema)


def _record_batch(columns, hosts, start, stop, types, dictionaries, codes, schema) -> pa.RecordBatch:
    """Rows ``start``..``stop`` of a step's numpy columns as a record batch of ``schema`` (values zero-copy)."""
    rows = stop - start
    arrays = []
    for name, kind, (values, mask) in zip(COLUMNS, types, columns):
        if mask is ALL_NULL:
            column = pa.nulls(rows, kind)
            if name in codes:  # an index inside the dictionary under each null (polars checks them)
                column = pa.array(np.zeros(rows, np.int32), kind, mask=np.ones(rows, bool))
        else:
            mask = None if mask is None else mask[start:stop]
            column = pa.array(values[start:stop], kind, mask=mask if mask is not None and mask.any() else None)
        arrays.append(pa.DictionaryArray.from_arrays(column, dictionaries[name]) if name in codes else column)
    arrays.append(pa.DictionaryArray.from_arrays(pa.array(hosts[start:stop], pa.int32()), dictionaries["host"]))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _time_order(ts: np.ndarray) -> np.ndarray:
    """The stable sort's permutation of ``ts`` (ties keep their positions' order: the inputs', then their
    rows'). Each time is made unique by its position in its low bits and the keys are sorted by value, which
    numpy does several times faster than a stable argsort (20 against 58 ns a row for 64 sorted runs);
    a step spanning too long a time for that takes the stable argsort."""
    bits = max(1, (len(ts) - 1).bit_length())
    low = int(ts.min())
    if int(ts.max()) - low >= 1 << (62 - bits):
        return np.argsort(ts, kind="stable")
    return np.sort(((ts - low) << bits) | np.arange(len(ts), dtype=np.int64)) & ((1 << bits) - 1)


def _ahead(batches: Iterator[pa.RecordBatch], depth: int = 2) -> Iterator[pa.RecordBatch]:
    """``batches``, made on a thread of their own up to ``depth`` ahead of the consumer, so the merge's sorting
    and gathering (numpy) overlaps the writer's compression (Arrow): both let go of the GIL. What the
    producer raises is raised here; when the consumer stops early, the producer stops at its next batch."""
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        failure = None
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        slots.put((batch, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except Exception as err:  # noqa: BLE001 (handed to the consumer, raised there)
            failure = err
        finally:
            if not stop.is_set():
                slots.put((end, failure))

    thread = threading.Thread(target=produce, name="ckpt-trace-merge-rows", daemon=True)
    thread.start()
    try:
        while True:
            batch, err = slots.get()
            if batch is end:
                if err is not None:
                    raise err
                return
            yield batch
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue, then let it end
            try:
                slots.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()


def merged_metadata(plan: MergePlan, rows: int, end_ns: int) -> dict:
    """The merged trace's metadata: the required keys, counts summed, the job's clock, and ``merged``."""
    metas = [i.metadata for i in plan.inputs]
    first = metas[0]
    unseen: dict[str, dict] = {}
    for entry in plan.hosts.values():
        for capture, seen in entry["unseen"].items():
            slot = unseen.setdefault(capture, {"reason": seen["reason"], "count": 0})
            slot["count"] += seen["count"]
    filesystems: dict = {}
    for meta in metas:
        filesystems.update(meta.get("filesystems") or {})
    jobs = {tuple(sorted(m["job"].items())) for m in metas if m.get("job")}
    anchor_start = {"realtime_ns": plan.origin_ns, "clock_ns": plan.origin_ns, "uncertainty_ns": 0}
    anchor_end = {"realtime_ns": plan.origin_ns + end_ns, "clock_ns": plan.origin_ns + end_ns, "uncertainty_ns": 0}
    meta = {
        "creator": "ckpt-trace",
        "creator_version": __version__,
        "host": ",".join(plan.hosts),
        "kernel": ",".join(sorted({str(m["kernel"]) for m in metas})),
        "arch": first["arch"],
        "command": list(first["command"]),
        "backend": ",".join(sorted({str(m["backend"]) for m in metas})),
        "start_wall_time_ns": plan.origin_ns,
        "elapsed_ns": int(end_ns),
        "filesystems": filesystems,
        "unseen": unseen,
        "clock": clocks.clock_metadata("CLOCK_REALTIME", plan.origin_ns, anchor_start, anchor_end),
        **({"job": dict(next(iter(jobs)))} if len(jobs) == 1 else {}),
        "merged": {
            "traces": [
                {
                    "path": str(i.path),
                    "host": i.host,
                    "boot_id": i.metadata.get("boot_id"),
                    "rows": i.rows,
                    "ranks": list(i.ranks),
                    "pid_offset": i.pid_offset,
                    "clock_offset_ns": i.offset_ns,
                    "alignment_error_ns": i.error_ns,
                    "job": i.metadata.get("job"),
                    "command": i.metadata.get("command"),
                }
                for i in plan.inputs
            ],
            "hosts": {host: dict(entry) for host, entry in plan.hosts.items()},
            "alignment_error_ns": plan.alignment_error_ns,
            "note": NOTE,
            "rows": rows,
        },
    }
    for key in SUMMED_KEYS:
        meta[key] = sum(int(m.get(key) or 0) for m in metas)
    if len(jobs) > 1:
        meta["merged"]["jobs"] = [dict(j) for j in sorted(jobs)]
    return meta


def merge_traces(
    paths: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    clock_offsets: Mapping[str, int] | None = None,
    overwrite: bool = False,
    batch_rows: int = 65536,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Merge the traces ``paths`` into one trace at ``output`` (atomically, with a ``host`` column).

    The metadata (rows, the last row's time) and the text dictionaries are known from the plan before the
    first row, so the rows are written straight into the file (``write_trace_batches``: compressed once).

    Returns {"output", "rows", "traces", "hosts": {host: {...}}, "ranks", "alignment_error_ns", "elapsed_ns"}.
    Raises CkptTraceError as ``plan_merge`` does, when ``output`` exists and not ``overwrite``, or when it is
    one of the inputs.
    """
    output = Path(output)
    if any(Path(p).resolve() == output.resolve() for p in paths):
        raise CkptTraceError(f"{output} is one of the traces to merge; write the merge elsewhere")
    if output.exists() and not overwrite:
        raise CkptTraceError(
            f"{output} already exists (use {{option}} to overwrite it)", option="overwrite", switch=True
        )
    plan = plan_merge(paths, clock_offsets)
    total = sum(i.rows for i in plan.inputs)
    ends = [
        int(i.realtime(np.array([i.last_ts_ns], np.int64))[0]) - plan.origin_ns
        for i in plan.inputs
        if i.rows and i.last_ts_ns is not None
    ]
    end = max(ends, default=0)
    meta = merged_metadata(plan, total, end)

    def counted() -> Iterator[pa.RecordBatch]:
        rows = 0
        for batch in merged_rows(plan, batch_rows=batch_rows):
            rows += batch.num_rows
            if progress is not None:
                progress("merge", rows, total)
            yield batch
        if rows != total:  # an input changed while it was merged: the metadata would lie
            raise CkptTraceError(
                f"the traces held {total} rows when planned and {rows} when merged; "
                "was one of them rewritten meanwhile?"
            )

    write_trace_batches(
        output, _ahead(counted()), meta, optional_columns=("host",), expected_rows=total, overwrite=overwrite
    )
    return {
        "output": str(output),
        "rows": total,
        "traces": len(plan.inputs),
        "hosts": {
            h: {k: e[k] for k in ("traces", "ranks", "rows", "lost_events", "unseen")} for h, e in plan.hosts.items()
        },
        "ranks": sorted(r for i in plan.inputs for r in i.ranks),
        "alignment_error_ns": plan.alignment_error_ns,
        "elapsed_ns": end,
    }
