"""``export``: a trace as Chrome trace-event JSON (Perfetto) or as Parquet partitioned by rank, streamed.

Perfetto: the Trace Event Format (Chrome, "JSON Array/Object Format"):
``ts``/``dur`` in microseconds; each process and thread is named with "M"
metadata events; each operation is an async pair ("b"/"e") with its own id
(its row number in the trace), so operations that overlap in time on one
track still render (complete "X" events on a track must nest, which
concurrent I/O does not). ``args`` carry syscall, path, offset, size and
return value. ui.perfetto.dev opens the file. A browser holds the whole JSON
in memory, so the export is for a selection a browser can open: the rows
that meet the ``filter`` conditions (ranks, processes, path glob, ops, time
window), at most ``max_ops`` operations (DEFAULT_MAX_OPS, about 400 MB of
JSON); a bigger selection is refused before anything is written, naming its
size and the options that narrow it.

Parquet: one Hive-style directory per rank (``rank=0/...``) readable by
Spark, Dask, DuckDB and pyarrow.dataset; the trace's metadata is kept in
``_ckpt_trace.json`` beside the partitions. Any trace size: the batches
stream from the trace into the partitions.

Both read the trace in record batches (``formats.scan``: memory bounded by a
batch), check their output before reading the trace, and never remove what
they did not write.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace.analysis.filter import Conditions, batch_mask
from ckpt_trace.analysis.summary import Progress, on_batch
from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import COLUMNS, scan, write_bytes_atomic
from ckpt_trace.formats.atomic import AtomicFile, make_temporary_directory
from ckpt_trace.iolayer.outputs import check_output_dir, check_output_file

FORMATS = ("perfetto", "parquet")
METADATA_FILE = "_ckpt_trace.json"
ROW_GROUP_ROWS = 1 << 16  # rows per Parquet row group
DEFAULT_MAX_OPS = 1_000_000  # two events each, ~200 bytes per event: ~400 MB, what ui.perfetto.dev opens
_ARG_COLUMNS = ("syscall", "path", "new_path", "offset", "size", "ret", "fd", "flags", "rank")
_PERFETTO_COLUMNS = ("ts_ns", "dur_ns", "pid", "tid", "op", "comm") + _ARG_COLUMNS


def _selected(
    trace_path: Path, columns, conditions: Conditions, progress: Progress | None = None
) -> tuple[dict, Iterator[pa.RecordBatch]]:
    """(metadata, the selected rows of each record batch, with a ``row`` column: their row numbers in the
    trace)."""
    mask = batch_mask(conditions)
    meta, batches = scan(trace_path, columns, on_batch=on_batch(progress, "writing"))

    def selected() -> Iterator[pa.RecordBatch]:
        first = 0
        for batch in batches:
            numbered = batch.append_column("row", pa.array(np.arange(first, first + batch.num_rows, dtype=np.int64)))
            first += batch.num_rows
            kept = numbered.filter(mask(batch))
            if kept.num_rows:
                yield kept

    return meta, selected()


def count_selected(trace_path: str | os.PathLike, conditions: Conditions, progress: Progress | None = None) -> int:
    """Rows of the trace that meet ``conditions`` (one pass over the columns the conditions read)."""
    needed = ["ts_ns", "rank", "pid", "op", "path"]
    mask = batch_mask(conditions)
    _, batches = scan(trace_path, needed, on_batch=on_batch(progress, "counting"))
    return sum(int(pc.sum(pc.cast(mask(b), pa.int64())).as_py() or 0) for b in batches)


def _write_perfetto(meta: dict, selected, handle) -> int:
    handle.write('{"displayTimeUnit": "ns", "otherData": ')
    handle.write(json.dumps({"ckpt_trace": dict(meta)}))
    handle.write(', "traceEvents": [\n')
    count, seen_pids, seen_tids = 0, set(), set()
    escaped: dict[object, str] = {}  # text values (paths, names) JSON-escaped once each

    def text(value) -> str:
        if value not in escaped:
            escaped[value] = json.dumps(value)
        return escaped[value]

    for batch in selected:
        cols = {name: batch.column(name).to_pylist() for name in (*_PERFETTO_COLUMNS, "row")}
        lines = []
        for i in range(batch.num_rows):
            pid, tid, comm, rank = cols["pid"][i], cols["tid"][i], cols["comm"][i], cols["rank"][i]
            if pid not in seen_pids:
                seen_pids.add(pid)
                label = f"{comm or 'process'} (rank {rank})" if rank is not None and rank >= 0 else (comm or "process")
                lines.append(f'{{"ph": "M", "name": "process_name", "pid": {pid}, "args": {{"name": {text(label)}}}}}')
            if (pid, tid) not in seen_tids:
                seen_tids.add((pid, tid))
                name = text(f"{comm or ''} {tid}")
                lines.append(
                    f'{{"ph": "M", "name": "thread_name", "pid": {pid}, "tid": {tid}, "args": {{"name": {name}}}}}'
                )
            args = ", ".join(
                f'"{c}": {text(cols[c][i]) if isinstance(cols[c][i], str) else cols[c][i]}'
                for c in _ARG_COLUMNS
                if cols[c][i] is not None
            )
            base = f'"cat": "io", "name": {text(cols["op"][i])}, "id": {cols["row"][i]}, "pid": {pid}, "tid": {tid}'
            ts = cols["ts_ns"][i]
            lines.append(f'{{{base}, "ph": "b", "ts": {ts / 1000!r}, "args": {{{args}}}}}')
            lines.append(f'{{{base}, "ph": "e", "ts": {(ts + cols["dur_ns"][i]) / 1000!r}}}')
        if lines:
            handle.write(("," if count else "") + ",\n".join(lines) + "\n")
            count += len(lines)
    handle.write("]}\n")
    return count


def export_perfetto(
    trace_path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    conditions: Conditions = Conditions(),
    max_ops: int = DEFAULT_MAX_OPS,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> int:
    """Write the rows of the trace at ``trace_path`` that meet ``conditions`` as Chrome trace-event JSON to
    ``output`` atomically; return the number of events.

    Raises CkptTraceError when ``output`` exists and ``overwrite`` is false, when the selection holds more
    than ``max_ops`` operations (counted before anything is written), or on a write failure (the temporary
    file is removed; ``output`` is untouched); TraceFormatError for a bad trace.
    """
    output = check_output_file(output, overwrite, inputs=(trace_path,))
    batch_mask(conditions)  # parse errors first
    selected_rows = count_selected(trace_path, conditions, progress)
    if selected_rows > max_ops:
        how = "narrow it with --rank, --time, --pid, --op or --path" + (
            "" if conditions.to_json() else " (ckpt-trace summary shows the ranks and the duration)"
        )
        raise CkptTraceError(
            f"the selection holds {selected_rows:,} operations (about "
            f"{selected_rows * 400 / 1e9:,.1f} GB of JSON); a browser opens about "
            f"{max_ops:,}: {how}, or raise --max-ops; --format parquet takes any size"
        )
    meta, selected = _selected(Path(trace_path), _PERFETTO_COLUMNS, conditions, progress)
    sink = AtomicFile(output)
    try:
        with open(sink.sink_path, "w") as handle:
            count = _write_perfetto(meta, selected, handle)
    except BaseException as err:
        sink.discard()
        if isinstance(err, OSError):
            raise CkptTraceError(f"cannot write {output}: {err.strerror}") from None
        raise
    sink.commit()
    return count


def export_parquet(
    trace_path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    conditions: Conditions = Conditions(),
    overwrite: bool = False,
    progress: Progress | None = None,
) -> int:
    """Write the rows of the trace at ``trace_path`` that meet ``conditions`` as Parquet partitioned by rank
    under the directory ``output``; return the row count.

    A new directory is built beside ``output`` and renamed into place. With
    ``overwrite`` an existing directory is allowed: the partitions are
    written into it under names of this export (``part-{uuid}-N.parquet``)
    and nothing in it is removed, but a directory holding an earlier export
    is refused (its partitions would add to this one's rows). On failure,
    only the files this export wrote are removed. Raises CkptTraceError, TraceFormatError.
    """
    output = Path(output)
    batch_mask(conditions)  # parse errors first
    if output.exists():
        check_output_dir(output, overwrite)
        earlier = [p.name for p in output.iterdir() if p.name == METADATA_FILE or p.name.startswith("rank=")]
        if earlier:
            raise CkptTraceError(
                f"{output} holds an earlier export ({earlier[0]}); its partitions would mix with "
                "this one's: choose a new directory"
            )
        return _write_partitions(trace_path, conditions, output, output, cleanup_root=False, progress=progress)
    check_output_dir(output.parent if str(output.parent) else Path("."), True, create=False)
    try:
        tmp = make_temporary_directory(output)  # a new, random name: nothing planted there is adopted
    except OSError as err:
        raise CkptTraceError(f"cannot write {output}: {err.strerror}") from None
    count = _write_partitions(trace_path, conditions, tmp, output, cleanup_root=True, progress=progress)
    try:
        os.replace(tmp, output)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CkptTraceError(f"cannot write {output}: {err.strerror}") from None
    return count


class _Partitions:
    """Hive partitions by rank (``rank=R/part-{uuid}-N.parquet``, the rank column in the directory name), one
    ``pyarrow.parquet.ParquetWriter`` per rank. Rows wait per rank until ROW_GROUP_ROWS of them make a row
    group, and at most BUFFERED_ROWS wait in all (the largest waiting group is written first), so memory is
    bounded however many rows and ranks the trace has. (``pyarrow.dataset.write_dataset`` queues up to 64 Mi
    rows ahead of its writers, 5 GB for a 50 M-row trace.)"""

    BUFFERED_ROWS = 1 << 20

    def __init__(self, directory: Path, written: list[str]) -> None:
        self.directory, self.written = directory, written
        self.prefix = f"part-{uuid.uuid4().hex}"
        self.writers: dict[int, Any] = {}
        self.waiting: dict[int, list[pa.Table]] = {}
        self.waiting_rows: dict[int, int] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        table = pa.Table.from_batches([batch])
        table = table.take(pc.sort_indices(table["rank"]))
        ranks = table["rank"].to_numpy()
        starts = np.r_[0, np.flatnonzero(np.diff(ranks)) + 1]
        ends = np.r_[starts[1:], len(ranks)]
        rest = table.drop_columns(["rank"])
        for start, end in zip(starts.tolist(), ends.tolist()):
            rank = int(ranks[start])
            self.waiting.setdefault(rank, []).append(rest.slice(start, end - start))
            self.waiting_rows[rank] = self.waiting_rows.get(rank, 0) + end - start
            if self.waiting_rows[rank] >= ROW_GROUP_ROWS:
                self._flush(rank)
        while sum(self.waiting_rows.values()) > self.BUFFERED_ROWS:
            self._flush(max(self.waiting_rows, key=lambda r: self.waiting_rows[r]))

    def _flush(self, rank: int) -> None:
        tables = self.waiting.pop(rank, [])
        self.waiting_rows.pop(rank, None)
        if not tables:
            return
        table = pa.concat_tables(tables)
        writer = self.writers.get(rank)
        if writer is None:
            import pyarrow.parquet as pq

            folder = self.directory / f"rank={rank}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{self.prefix}-0.parquet"
            writer = self.writers[rank] = pq.ParquetWriter(str(path), table.schema)
            self.written.append(str(path))
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)

    def close(self) -> None:
        for rank in list(self.waiting):
            self._flush(rank)
        for writer in self.writers.values():
            writer.close()


def _write_partitions(
    trace_path,
    conditions: Conditions,
    directory: Path,
    output: Path,
    cleanup_root: bool,
    progress: Progress | None = None,
) -> int:
    written: list[str] = []
    meta, selected = _selected(Path(trace_path), COLUMNS, conditions, progress)
    rows = 0
    partitions = _Partitions(directory, written)
    try:
        directory.mkdir(exist_ok=True)
        for batch in selected:
            rows += batch.num_rows
            # plain strings: every file of a partition has one column type, whatever each batch's dictionary
            partitions.add(
                pa.RecordBatch.from_arrays(
                    [
                        pc.cast(batch.column(name), pa.string())
                        if pa.types.is_dictionary(batch.column(name).type)
                        else batch.column(name)
                        for name in COLUMNS
                    ],
                    names=list(COLUMNS),
                )
            )
        partitions.close()
        write_bytes_atomic(directory / METADATA_FILE, json.dumps(dict(meta), indent=1, sort_keys=True).encode())
    except BaseException as err:
        for writer in partitions.writers.values():
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - removing its file below is what matters
                pass
        if cleanup_root:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for path in written:
                Path(path).unlink(missing_ok=True)
            for path in {Path(p).parent for p in written}:
                try:
                    path.rmdir()
                except OSError:
                    pass
        if isinstance(err, OSError):
            raise CkptTraceError(f"cannot write {output}: {err.strerror or err}") from None
        raise
    return rows
