"""Per rank and per host: time in I/O calls, the save's span, bytes; the slowest rank two ways.

Two figures name a job's slowest rank, and they differ:

- **most time in I/O calls** (Darshan's slowest rank, ``darshan-parser --perf``: the rank with the largest
  cumulative I/O time): the sum of ``dur_ns`` of the rank's file operations (system calls, requests, pages;
  GPU copies are not file I/O and are left out);
- **save time** (MLPerf Storage's checkpointing figure, DLIO ``checkpoint``: a rank's time from the start of
  its first checkpoint write to the end of its last; the benchmark reports the slowest rank's): the span of
  the rank's ``write`` rows.

``RankTimes`` folds record batches in (bounded memory: one entry per rank and per host), ``result`` gives
{"rank_times": {rank: {...}}, "hosts": {host: {...}}, "slowest_rank": {...}, "slowest_save": {...}}. Rows
without a rank (-1: a launcher, a helper process) count for their host but not as a rank. Times in ns.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.formats import int_values

COLUMNS = ("ts_ns", "dur_ns", "rank", "op", "size", "ret", "interface")
_FIELDS = ("rows", "io_time_ns", "writes", "bytes_written", "bytes_read", "first_write_ns", "last_write_end_ns")


def _mask(column: pa.Array, names: tuple[str, ...]) -> np.ndarray:
    return pc.fill_null(
        pc.is_in(
            column.cast(pa.string()) if pa.types.is_dictionary(column.type) else column, pa.array(names, pa.string())
        ),
        False,
    ).to_numpy(zero_copy_only=False)


class RankTimes:
    """Per rank and per host sums, batch by batch (``add``), then ``result``."""

    def __init__(self, default_host: str | None = None) -> None:
        self.default_host = default_host  # the host of rows without a host column (a trace of one node)
        self.ranks: dict[int, dict[str, Any]] = {}
        self.hosts: dict[str, dict[str, Any]] = {}

    @staticmethod
    def _entry() -> dict[str, Any]:
        return {
            "rows": 0,
            "io_time_ns": 0,
            "writes": 0,
            "bytes_written": 0,
            "bytes_read": 0,
            "first_write_ns": -1,
            "last_write_end_ns": -1,
        }

    def add(self, batch: pa.RecordBatch) -> None:
        """Fold in a batch holding ``COLUMNS`` (and ``host`` when the trace has one)."""
        if batch.num_rows == 0:
            return
        ts = int_values(batch.column("ts_ns")).astype(np.int64)
        dur = int_values(batch.column("dur_ns")).astype(np.int64)
        rank = int_values(batch.column("rank")).astype(np.int64)
        file_io = ~_mask(batch.column("interface"), ("cuda",))
        write = _mask(batch.column("op"), ("write",)) & file_io
        read = _mask(batch.column("op"), ("read",)) & file_io
        ret = int_values(pc.fill_null(batch.column("ret"), 0)).astype(np.int64)
        moved = np.maximum(ret, 0)
        if "host" in batch.schema.names and batch.column("host").null_count < batch.num_rows:
            host_col = batch.column("host")
            if not pa.types.is_dictionary(host_col.type):
                host_col = pc.dictionary_encode(host_col)
            names = host_col.dictionary.to_pylist() + [None]
            codes = int_values(pc.fill_null(host_col.indices, len(names) - 1)).astype(np.intp)
        else:
            names, codes = [self.default_host], np.zeros(batch.num_rows, np.intp)
        # ranks (-1 gathers the rows without one) and hosts: one pass of grouped sums each
        for keys, labels, table in ((rank, None, self.ranks), (codes, names, self.hosts)):
            uniq, inverse = np.unique(keys, return_inverse=True)
            groups = len(uniq)
            rows = np.bincount(inverse, minlength=groups)
            io = np.bincount(inverse, weights=np.where(file_io, dur, 0), minlength=groups)
            writes = np.bincount(inverse, weights=write, minlength=groups)
            written = np.bincount(inverse, weights=np.where(write, moved, 0), minlength=groups)
            read_bytes = np.bincount(inverse, weights=np.where(read, moved, 0), minlength=groups)
            big = np.iinfo(np.int64).max
            first = np.full(groups, big, np.int64)
            np.minimum.at(first, inverse[write], ts[write])
            last = np.full(groups, -1, np.int64)
            np.maximum.at(last, inverse[write], ts[write] + dur[write])
            for i, key in enumerate(uniq.tolist()):
                label = key if labels is None else labels[key]
                entry = table.setdefault(label, self._entry())
                entry["rows"] += int(rows[i])
                entry["io_time_ns"] += int(io[i])
                entry["writes"] += int(writes[i])
                entry["bytes_written"] += int(written[i])
                entry["bytes_read"] += int(read_bytes[i])
                if first[i] != big:
                    entry["first_write_ns"] = (
                        int(first[i]) if entry["first_write_ns"] < 0 else min(entry["first_write_ns"], int(first[i]))
                    )
                    entry["last_write_end_ns"] = max(entry["last_write_end_ns"], int(last[i]))
                if labels is not None:
                    entry.setdefault("ranks", set())
            if labels is not None:  # which ranks each host holds
                for i, key in enumerate(uniq.tolist()):
                    held = np.unique(rank[inverse == i])
                    table[labels[key]]["ranks"].update(int(r) for r in held if r >= 0)

    def result(self) -> dict[str, Any]:
        """{"rank_times", "hosts", "slowest_rank", "slowest_save"}; a save time is null for a rank that wrote
        nothing."""

        def finish(entry: dict) -> dict:
            out = {k: entry[k] for k in ("rows", "io_time_ns", "writes", "bytes_written", "bytes_read")}
            has = entry["first_write_ns"] >= 0
            out["first_write_ns"] = entry["first_write_ns"] if has else None
            out["save_time_ns"] = entry["last_write_end_ns"] - entry["first_write_ns"] if has else None
            if "ranks" in entry:
                out["ranks"] = sorted(entry["ranks"])
            return out

        ranks = {r: finish(e) for r, e in sorted(self.ranks.items()) if r >= 0}
        hosts = {h: finish(e) for h, e in self.hosts.items() if h is not None}
        slowest = max(ranks, key=lambda r: (ranks[r]["io_time_ns"], -r)) if ranks else None
        saving = [r for r in ranks if ranks[r]["save_time_ns"] is not None]
        slowest_save = max(saving, key=lambda r: (ranks[r]["save_time_ns"], -r)) if saving else None
        host_of = {r: h for h, e in hosts.items() for r in e.get("ranks", [])}

        def slowest_entry(rank: int | None, times: tuple[str, str]) -> dict[str, Any] | None:
            """The rank named, its host and its ``times`` (keys of its entry, in that order); None for no rank."""
            return (
                None
                if rank is None
                else {"rank": rank, "host": host_of.get(rank), **{k: ranks[rank][k] for k in times}}
            )

        return {
            "rank_times": {str(r): e for r, e in ranks.items()},
            "hosts": hosts,
            "slowest_rank": slowest_entry(slowest, ("io_time_ns", "save_time_ns")),
            "slowest_save": slowest_entry(slowest_save, ("save_time_ns", "io_time_ns")),
        }


def rank_times_file(path, *, batch_rows: int = 1 << 20) -> dict[str, Any]:
    """``RankTimes.result`` of the trace file at ``path``, read in batches of ``COLUMNS`` (and ``host`` for a
    merged trace). Raises TraceFormatError for a bad trace."""
    from ckpt_trace.formats import read_metadata, scan

    meta = read_metadata(path)
    _, batches = scan(path, COLUMNS + (("host",) if "merged" in meta else ()), batch_rows=batch_rows)
    times = RankTimes(default_host=str(meta.get("host")))
    for batch in batches:
        times.add(batch)
    return times.result()
