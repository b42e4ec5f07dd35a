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

Rows: a k-way merge over record batches with a watermark. Each input holds one batch; the watermark is
the smallest last timestamp among the held batches; every held row before it (and, from the batch that
sets it, every row at it) is in its final place, since each trace is sorted by start time; rows of one
time keep the order of the inputs. When more than a batch of rows is ready, only those before the
batch's worth of earliest times go out (the sort and the writer copy one batch at a time). Those rows are
sorted (stable: ties keep the inputs' order) and written, and only drained inputs read their next batch,
so memory is bounded by one batch per input (and one the scan reads ahead), not by the traces' length.

Processes: a pid seen in two traces (two hosts reuse pids; containers all start at 1) is moved, in every
trace after the first that holds it, by ``trace index << 22`` (above Linux's largest ``pid_max``, 2**22),
pid and tid alike, so a replay keeps the processes apart; ``merged.traces[i].pid_offset`` says by how much.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import COLUMNS, SCHEMA, TraceWriter, int_values, read_metadata, scan
from ckpt_trace.tracer import clock as clocks
from ckpt_trace.version import __version__

PID_SHIFT = 22  # Linux's pid_max is at most 2**22 (PID_MAX_LIMIT on 64-bit)
MAX_TRACES = (1 << (31 - PID_SHIFT)) - 1  # a moved pid must stay an int32
TEXT = [f.name for f in SCHEMA if pa.types.is_dictionary(f.type)]
SUMMED_KEYS = ("lost_events", "truncated_paths", "untracked_fd_ops", "late_events", "unreaped_requests",
               "spilled_runs")
NOTE = ("rows of different traces are placed on CLOCK_REALTIME through each trace's anchors; different hosts' "
        "realtime clocks are taken to agree (NTP/PTP): --clock-offset HOST=NS corrects a known difference")


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
            raise CkptTraceError(f"{{option}} takes HOST=NS (nanoseconds, may be negative), not {item!r}",
                                 option="clock_offsets") from None
    return out


def _ids(path: Path) -> tuple[set[int], set[int], int]:
    """(ranks >= 0, pids, rows) of a trace, from its rank and pid columns."""
    ranks: set[int] = set()
    pids: set[int] = set()
    rows = 0
    _, batches = scan(path, ["rank", "pid"])
    for batch in batches:
        rows += batch.num_rows
        ranks.update(np.unique(int_values(batch.column("rank"))).tolist())
        pids.update(np.unique(int_values(batch.column("pid"))).tolist())
    ranks.discard(-1)
    return ranks, pids, rows


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
        raise CkptTraceError(f"traces of different architectures ({', '.join(sorted(arches))}) do not merge: "
                             "their open flags differ")
    hosts = [str(m["host"]) for m in metas]
    unknown = sorted(set(offsets) - set(hosts))
    if unknown:
        raise CkptTraceError(f"{{option}} names host {unknown[0]!r}, which no trace has (hosts: "
                             f"{', '.join(sorted(set(hosts)))})", option="clock_offsets")
    owner: dict[int, Path] = {}
    pid_owner: dict[int, int] = {}
    boots: dict[tuple, Mapping] = {}
    inputs = []
    for index, (path, meta, host) in enumerate(zip(paths, metas, hosts)):
        ranks, pids, rows = _ids(path)
        for rank in sorted(ranks):
            if rank in owner:
                raise CkptTraceError(f"rank {rank} is in both {owner[rank]} and {path}: traces of one job hold "
                                     "each rank once (the same recording twice, or two jobs?)")
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
        inputs.append(MergeInput(path=path, metadata=meta, host=host, ranks=tuple(sorted(ranks)), rows=rows,
                                 clock=used, offset_ns=offsets.get(host, 0), error_ns=error, pid_offset=pid_offset))
    origin = min(int(i.realtime(np.zeros(1, np.int64))[0]) for i in inputs)
    errors = [i.error_ns for i in inputs]
    bound = None if any(e is None for e in errors) else (sum(sorted(errors)[-2:]) if len(errors) > 1 else 0)
    return MergePlan(inputs=tuple(inputs), origin_ns=origin, alignment_error_ns=bound, hosts=_hosts(inputs))


def _hosts(inputs: Sequence[MergeInput]) -> dict[str, dict]:
    """Per host: its traces, ranks, rows, and the lost events and unseen counts of its traces summed."""
    out: dict[str, dict] = {}
    for item in inputs:
        entry = out.setdefault(item.host, {"traces": 0, "ranks": [], "rows": 0, "lost_events": 0, "unseen": {},
                                           "boot_ids": []})
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


class _Source:
    """One input's batches on the job's clock, one held at a time."""

    def __init__(self, index: int, item: MergeInput, origin_ns: int, batch_rows: int) -> None:
        self.index, self.item, self.origin_ns = index, item, origin_ns
        _, self._batches = scan(item.path, list(COLUMNS), batch_rows=batch_rows)
        self.table: pa.Table | None = None
        self.ts = np.zeros(0, np.int64)
        self.done = False

    def fill(self) -> None:
        """Hold the next non-empty batch (``done`` when there is none)."""
        while not self.done and len(self.ts) == 0:
            batch = next(self._batches, None)
            if batch is None:
                self.done, self.table = True, None
                return
            if batch.num_rows == 0:
                continue
            ts = self.item.realtime(int_values(batch.column("ts_ns")).astype(np.int64)) - self.origin_ns
            table = pa.Table.from_batches([batch])
            table = table.set_column(table.schema.get_field_index("ts_ns"), "ts_ns", pa.array(ts, pa.int64()))
            if self.item.pid_offset:
                for name in ("pid", "tid"):
                    moved = int_values(batch.column(name)).astype(np.int64) + self.item.pid_offset
                    table = table.set_column(table.schema.get_field_index(name), name, pa.array(moved, pa.int32()))
            self.table, self.ts = table, ts

    def take(self, stop: int) -> pa.Table:
        """The held rows before ``stop`` (a row count), with the ``host`` column."""
        head = self.table.slice(0, stop)
        self.table, self.ts = self.table.slice(stop), self.ts[stop:]
        columns = [head[name] for name in COLUMNS]  # text stays dictionary-encoded (TraceWriter renumbers it)
        columns.append(pa.DictionaryArray.from_arrays(pa.array(np.zeros(head.num_rows, np.int32)),
                                                      pa.array([self.item.host])))
        return pa.Table.from_arrays(columns, names=list(COLUMNS) + ["host"])


def merged_rows(plan: MergePlan, *, batch_rows: int = 65536) -> Iterator[pa.Table]:
    """The rows of every input in global time order, as tables of ``COLUMNS`` plus ``host`` (text as dictionaries),
    in bounded memory (module docstring)."""
    sources = [_Source(i, item, plan.origin_ns, batch_rows) for i, item in enumerate(plan.inputs)]
    while True:
        for source in sources:
            source.fill()
        live = [s for s in sources if not s.done]
        if not live:
            return
        watermark = min(int(s.ts[-1]) for s in live)
        # Sources whose held rows end at the watermark may have more rows at it; ties keep the inputs' order,
        # so rows at the watermark go out only from sources before the second such source (the first such
        # one, which drains, and those whose later rows all come after the watermark).
        ending = [s.index for s in live if int(s.ts[-1]) == watermark]
        tie_limit = ending[1] if len(ending) > 1 else len(sources)
        # At most about batch_rows rows go out at once (the merge's own copies stay one batch): when more are
        # before the watermark, only those before the batch_rows-th smallest time (strictly: ties wait).
        heads = [s.ts[:int(np.searchsorted(s.ts, watermark, side="right"))] for s in live]
        ready = sum(len(h) for h in heads)
        cut = None
        if ready > batch_rows:
            cut = int(np.partition(np.concatenate(heads), batch_rows)[batch_rows])
            if all(len(h) == 0 or int(h[0]) >= cut for h in heads):
                cut = None  # every ready row at one time: the watermark rule, whatever the count
        pieces, times = [], []
        for source in live:
            if cut is not None:
                stop = int(np.searchsorted(source.ts, cut, side="left"))
            else:
                side = "right" if source.index < tie_limit else "left"
                stop = int(np.searchsorted(source.ts, watermark, side=side))
            if stop:
                times.append(source.ts[:stop])
                pieces.append(source.take(stop))
        table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        if len(pieces) > 1:
            order = np.argsort(np.concatenate(times), kind="stable")
            table = table.take(pa.array(order))
        yield table


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
            "traces": [{"path": str(i.path), "host": i.host, "boot_id": i.metadata.get("boot_id"), "rows": i.rows,
                        "ranks": list(i.ranks), "pid_offset": i.pid_offset, "clock_offset_ns": i.offset_ns,
                        "alignment_error_ns": i.error_ns, "job": i.metadata.get("job"),
                        "command": i.metadata.get("command")} for i in plan.inputs],
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


def merge_traces(paths: Sequence[str | os.PathLike], output: str | os.PathLike, *,
                 clock_offsets: Mapping[str, int] | None = None, overwrite: bool = False,
                 batch_rows: int = 65536, progress: Callable[[str, int, int], None] | None = None) -> dict:
    """Merge the traces ``paths`` into one trace at ``output`` (atomically, with a ``host`` column).

    Returns {"output", "rows", "traces", "hosts": {host: {...}}, "ranks", "alignment_error_ns", "elapsed_ns"}.
    Raises CkptTraceError as ``plan_merge`` does, when ``output`` exists and not ``overwrite``, or when it is
    one of the inputs.
    """
    output = Path(output)
    if any(Path(p).resolve() == output.resolve() for p in paths):
        raise CkptTraceError(f"{output} is one of the traces to merge; write the merge elsewhere")
    if output.exists() and not overwrite:
        raise CkptTraceError(f"{output} already exists (use {{option}} to overwrite it)", option="overwrite", switch=True)
    plan = plan_merge(paths, clock_offsets)
    total = sum(i.rows for i in plan.inputs)
    writer = TraceWriter(output, overwrite=overwrite, optional_columns=("host",))
    rows, end = 0, 0
    try:
        for table in merged_rows(plan, batch_rows=batch_rows):
            writer.write(table)
            rows += table.num_rows
            end = max(end, int(table.column("ts_ns")[-1].as_py()))
            if progress is not None:
                progress("merge", rows, total)
        meta = merged_metadata(plan, rows, end)
        writer.close(meta)
    except BaseException:
        writer.abort()
        raise
    return {"output": str(output), "rows": rows, "traces": len(plan.inputs),
            "hosts": {h: {k: e[k] for k in ("traces", "ranks", "rows", "lost_events", "unseen")}
                      for h, e in plan.hosts.items()},
            "ranks": sorted(r for i in plan.inputs for r in i.ranks),
            "alignment_error_ns": plan.alignment_error_ns, "elapsed_ns": end}
