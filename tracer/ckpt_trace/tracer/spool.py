"""A recording's rows in bounded memory: sorted runs spilled beside the trace, merged when it is written.

``TraceBuilder`` emits rows in the order the calls took effect; a trace holds
them in start-time order (``formats/README.md``). ``RowSpool`` takes the
builder's rows a part at a time (``TraceBuilder.take_rows``, each part at
most ``run_rows`` rows, so the builder never holds more), numbers them in
emission order and sorts each part by (``ts_ns``, that number). Once a
second part exists, every part becomes a run: an Arrow IPC file in a
scratch directory beside the trace (``.<trace name>.runs-*``, lz4), made by
this recording and removed by ``close``. ``write`` merges the runs into the
trace through ``formats.TraceWriter``, a k-way merge over record batches:
memory is one batch per run, however long the recording. The order is
exactly one stable sort of every row by start time (ties in emission
order), so a recording that fits in one part, written by
``formats.write_trace`` as before, and one spilled in many parts give the
same rows in the same order.

Call order: ``RowSpool(output, run_rows=...)``, ``add(columns)`` any number
of times, then ``write(output, metadata, overwrite=...)``; ``close()`` in
every case (it removes the runs). Called by ``tracer.record``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from ckpt_trace.errors import TracerError
from ckpt_trace.formats import COLUMNS, TraceWriter, distinct, int_values, table_from_columns, write_trace

_SEQ = "__emitted"  # a run's extra column: the row's number in emission order
# Rows read from each run at a time: the merge holds one batch per run (a 10 M-row recording spills about 40
# runs; at 65536 rows a batch, its merge held 2.6 M rows, about 500 MB, the recording's peak).
_MERGE_ROWS = 8192


def _by_start(table: pa.Table) -> pa.Table:
    """``table`` sorted by (``ts_ns``, emission order), its dictionaries unified: not taken where it already
    is (rows are handed over in about effect order, often in start order too), else taken in the order of a
    stable sort of ``ts_ns`` (equal to sorting by (``ts_ns``, ``_SEQ``), whose values increase down the
    table)."""
    column = table.column("ts_ns")
    if column.null_count:  # not a trace's rows (ts_ns is required): pyarrow's order, nulls last
        return table.sort_by([("ts_ns", "ascending"), (_SEQ, "ascending")])
    starts = column.to_numpy()
    if (starts[1:] >= starts[:-1]).all():
        return table.unify_dictionaries()  # as take leaves them: an IPC file holds one dictionary per column
    return table.take(pa.array(np.argsort(starts, kind="stable")))


class RowSpool:
    """The rows of one recording (see the module docstring). ``paths`` is every distinct path seen,
    ``written`` those of write rows, ``renames`` the rename rows' (path, new_path) and ``counts`` what
    ``record.unseen_counts`` needs: all accumulate as parts arrive."""

    def __init__(self, output: str | os.PathLike, *, run_rows: int) -> None:
        self.output = Path(output)
        self.run_rows = max(1, run_rows)
        self.rows = 0
        self.paths: set[str] = set()
        self.written: set[str] = set()  # paths of write rows (``record``'s compressibility sample)
        self.renames: list[tuple[str, str]] = []  # (path, new_path) of rename rows, in emission order
        self.counts = {"io_uring_requests": 0, "mapped_pages": 0}
        self._parts: list[pa.Table] = []
        self._runs: list[Path] = []
        self._scratch: Path | None = None
        # Fills columns known only once the recording ended (``cold_bytes``: tracer.page_cache), per table
        # written; None leaves them null.
        self.annotate: Callable[[pa.Table], pa.Table] | None = None

    @property
    def spilled_runs(self) -> int:
        """Runs written to the scratch directory (0: everything stayed in memory)."""
        return len(self._runs)

    def add(self, columns: Mapping[str, list] | pa.Table) -> None:
        """One part of rows (a mapping column -> list, or a table of ``formats.SCHEMA``, as
        ``TraceBuilder.take_rows`` hands them), in emission order. Raises TracerError when a run cannot be
        written (full disk)."""
        table: pa.Table = columns if isinstance(columns, pa.Table) else table_from_columns(columns)  # type: ignore[assignment]
        count = table.num_rows
        if not count:
            return
        self.paths.update(p for p in distinct(table.column("path")) if p)
        op = table.column("op")
        self.written.update(p for p in distinct(pc.filter(table.column("path"), pc.equal(op, "write"))) if p)
        renamed = table.filter(pc.equal(op, "rename"))
        self.renames.extend(
            (old, new)
            for old, new in zip(renamed.column("path").to_pylist(), renamed.column("new_path").to_pylist())
            if old and new
        )
        self.counts["io_uring_requests"] += int(
            pc.sum(pc.filter(table.column("size"), pc.equal(op, "io_uring_enter")), min_count=0).as_py() or 0
        )
        self.counts["mapped_pages"] += int(pc.sum(pc.equal(op, "mmap")).as_py() or 0)
        table = table.append_column(_SEQ, pa.array(np.arange(self.rows, self.rows + count, dtype=np.int64)))
        self.rows += count
        self._parts.append(_by_start(table))
        if len(self._parts) > 1 or self._runs:
            for part in self._parts:
                self._spill(part)
            self._parts = []

    def _spill(self, part: pa.Table) -> None:
        if self._scratch is None:
            self._scratch = Path(
                tempfile.mkdtemp(prefix=f".{self.output.name}.runs-{os.getpid()}-", dir=self.output.parent)
            )
        path = self._scratch / f"run-{len(self._runs):06d}.arrow"
        try:
            with (
                pa.OSFile(str(path), "wb") as sink,
                ipc.new_file(sink, part.schema, options=ipc.IpcWriteOptions(compression="lz4")) as writer,
            ):
                writer.write_table(part, max_chunksize=_MERGE_ROWS)
        except OSError as err:
            raise TracerError(
                f"cannot spill the recording's rows beside {self.output}: {err.strerror or err}"
            ) from None
        self._runs.append(path)

    def write(
        self,
        output: str | os.PathLike,
        metadata: Mapping[str, Any],
        *,
        overwrite: bool,
        batch_rows: int,
        temporary: str | os.PathLike | None = None,
    ) -> int:
        """Write every row, in start-time order, with ``metadata``, atomically to ``output``; return the
        number of rows (``temporary``: the file ``formats.reserve_temporary`` made for it). Raises CkptTraceError/TraceFormatError as ``formats.write_trace`` does."""
        if not self._runs:
            table = (
                pa.concat_tables(self._parts).drop_columns([_SEQ])
                if self._parts
                else table_from_columns({name: [] for name in COLUMNS})
            )
            if self.annotate is not None:
                table = self.annotate(table)
            write_trace(output, table, metadata, overwrite=overwrite, batch_rows=batch_rows, temporary=temporary)
            return table.num_rows
        writer = TraceWriter(output, overwrite=overwrite, batch_rows=batch_rows, temporary=temporary)
        try:
            for table in self._merged():
                writer.write(table if self.annotate is None else self.annotate(table))
            writer.close(metadata)
        except BaseException:
            writer.abort()
            raise
        return self.rows

    def _merged(self) -> Iterator[pa.Table]:
        """The runs' rows in (ts_ns, emission) order, a few batches at a time."""
        readers = [_RunReader(path) for path in self._runs]
        while True:
            live = [r for r in readers if r.fill()]
            if not live:
                return
            bound = min(r.last_key() for r in live)  # every row at or below it is in the batches at hand
            parts = [part for part in (r.take_through(bound) for r in live) if part.num_rows]
            if len(parts) == 1:  # one run's rows: already in order (each run is sorted), nothing to merge
                yield parts[0].unify_dictionaries().drop_columns([_SEQ])
                continue
            table = pa.concat_tables(parts).unify_dictionaries()
            ts, seq = (
                int_values(table.column("ts_ns").combine_chunks()),
                int_values(table.column(_SEQ).combine_chunks()),
            )
            yield table.take(pa.array(np.lexsort((seq, ts)))).drop_columns([_SEQ])

    def close(self) -> None:
        """Remove the runs (only what this spool wrote: its own scratch directory)."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self._parts, self._runs = [], []


class _RunReader:
    """One run, batch by batch: the rows not yet merged (``held``) are a sorted prefix-free tail."""

    def __init__(self, path: Path) -> None:
        self._file = ipc.open_file(pa.memory_map(str(path)))
        self._next = 0
        self.held: pa.Table | None = None

    def fill(self) -> bool:
        """Make sure some rows are held (read the next batch when none are); False when the run is done."""
        while (self.held is None or self.held.num_rows == 0) and self._next < self._file.num_record_batches:
            self.held = pa.Table.from_batches([self._file.get_batch(self._next)])
            self._next += 1
        return self.held is not None and self.held.num_rows > 0

    def _rows(self) -> pa.Table:
        if self.held is None:
            raise ValueError("no rows held: fill() first")
        return self.held

    def last_key(self) -> tuple[int, int]:
        held = self._rows()
        last = held.num_rows - 1
        return held.column("ts_ns")[last].as_py(), held.column(_SEQ)[last].as_py()

    def take_through(self, bound: tuple[int, int]) -> pa.Table:
        """The held rows whose (ts_ns, emission) key is at most ``bound`` (a prefix: the run is sorted)."""
        held = self._rows()
        ts = int_values(held.column("ts_ns").combine_chunks())
        seq = int_values(held.column(_SEQ).combine_chunks())
        count = int(np.count_nonzero((ts < bound[0]) | ((ts == bound[0]) & (seq <= bound[1]))))
        taken, self.held = held.slice(0, count), held.slice(count)
        return taken
