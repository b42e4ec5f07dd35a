"""Where a trace file's bytes go, column by column, and how far lossless re-encodings would take them (issue 13).

Issue 13 asks for trace files of at most 8 bytes per row for the demo trace
and the 10 M-row trace. This script measures, for each trace given:

- ``stored``: the file's bytes per row, and each column's share: the bytes
  the file loses when that column is left out (same writer: Arrow IPC,
  zstd, 65,536-row batches; ``formats.write_trace``'s options).
- ``zstd 19``: the same file at zstd level 19 (the writer uses zstd's
  default level, 3; Arrow IPC compresses each buffer of each batch alone
  and has no other encoding).
- ``re-encoded``: three lossless column transforms that a new format
  version could store, each column then compressed as above, at zstd 3 and
  19: ``ts_ns`` as the difference from the previous row's; ``ret`` as its
  difference from ``size`` where a size is recorded (a read or write that
  moved every byte it asked for stores 0); ``offset`` as its difference
  from where the same process's previous operation on the same path ended
  (sequential I/O stores 0).
- ``estimate``: for ``ts_ns`` (the gaps between rows) and ``dur_ns``, a
  per-row estimate of the information they carry: the entropy of each
  value's power-of-two bucket (its leading bit) plus the bits below the
  leading one, counted as incompressible (in a recorded trace they are
  timing noise). An estimate under that model, not a proven bound.

    python benchmarks/trace_bytes.py [TRACE ...] [--generate-rows 1000000]

With no TRACE: the demo trace (``traces/demo-dcp.arrow``, a recording of
DCP saves) and a generated trace of ``--generate-rows`` rows
(``tracegen.py``, 64 ranks, DCP-like mix; its timestamps and offsets are
far more regular than a recording's). Each trace is read whole into memory.
Prints a table and writes ``benchmarks/results/trace_bytes.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from rich.console import Console
from rich.table import Table
from tracegen import generate

from ckpt_trace.formats import SCHEMA, read_trace
from ckpt_trace.formats.io import DEFAULT_BATCH_ROWS

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def ipc_bytes(table: pa.Table, level: int | None = None) -> int:
    """Bytes of ``table`` as an Arrow IPC file with the trace writer's options (zstd, 65,536-row batches);
    ``level``: a zstd level other than the default."""
    codec = "zstd" if level is None else pa.Codec("zstd", compression_level=level)
    sink = io.BytesIO()
    with ipc.new_file(sink, table.schema, options=ipc.IpcWriteOptions(compression=codec)) as writer:
        writer.write_table(table, max_chunksize=DEFAULT_BATCH_ROWS)
    return len(sink.getvalue())


def _ints(column: pa.ChunkedArray) -> np.ndarray:
    return column.fill_null(0).to_numpy()


def _streams(table: pa.Table, has_offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the rows in (pid, path, row) order, whether each row in that order continues the previous one's
    stream: the same process on the same path, both offsets known)."""
    path = table["path"].combine_chunks()
    if not pa.types.is_dictionary(path.type):
        path = path.dictionary_encode()
    path_code = path.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    pid = table["pid"].to_numpy().astype(np.int64)
    order = np.lexsort((np.arange(table.num_rows), path_code, pid))
    pid, path_code, known = pid[order], path_code[order], has_offset[order]
    return order, np.r_[False, (pid[1:] == pid[:-1]) & (path_code[1:] == path_code[:-1]) & known[1:] & known[:-1]]


def _replaced(table: pa.Table, columns: dict[str, pa.Array]) -> pa.Table:
    for name, column in columns.items():
        table = table.set_column(table.column_names.index(name), name, column)
    return table


def reencoded(table: pa.Table) -> pa.Table:
    """``table`` with ``ts_ns``, ``ret`` and ``offset`` stored as differences (see the module docstring).
    ``decoded`` inverts it (``measure`` checks that it does)."""
    size, has_size = _ints(table["size"]), table["size"].is_valid().to_numpy(zero_copy_only=False)
    ret = table["ret"].to_numpy()
    offset, has_offset = _ints(table["offset"]), table["offset"].is_valid().to_numpy(zero_copy_only=False)
    order, same = _streams(table, has_offset)
    moved_end = (offset + np.maximum(ret, 0))[order]  # where each operation of a stream ended
    expected = np.where(same, np.r_[0, moved_end[:-1]], 0)
    offset_gap = np.empty(table.num_rows, np.int64)
    offset_gap[order] = offset[order] - expected
    return _replaced(table, {"ts_ns": pa.array(np.diff(table["ts_ns"].to_numpy(), prepend=0)),
                             "ret": pa.array(np.where(has_size, ret - size, ret)),
                             "offset": pa.array(offset_gap, mask=~has_offset)})


def decoded(table: pa.Table) -> pa.Table:
    """The inverse of ``reencoded``: cumulative sums (per stream for ``offset``) and an addition."""
    size, has_size = _ints(table["size"]), table["size"].is_valid().to_numpy(zero_copy_only=False)
    ret = np.where(has_size, table["ret"].to_numpy() + size, table["ret"].to_numpy())
    gap, has_offset = _ints(table["offset"]), table["offset"].is_valid().to_numpy(zero_copy_only=False)
    order, same = _streams(table, has_offset)
    moved = np.maximum(ret, 0)[order]
    step = gap[order] + np.where(same, np.r_[0, moved[:-1]], 0)  # offset = previous offset + moved + gap
    total = np.cumsum(step)
    stream_start = np.flatnonzero(~same)
    before = np.repeat(total[stream_start] - step[stream_start], np.diff(np.r_[stream_start, len(step)]))
    offset = np.empty(table.num_rows, np.int64)
    offset[order] = total - before
    return _replaced(table, {"ts_ns": pa.array(np.cumsum(table["ts_ns"].to_numpy())), "ret": pa.array(ret),
                             "offset": pa.array(offset, mask=~has_offset)})


def bucket_estimate_bytes(values: np.ndarray) -> float:
    """Per value, bytes to code its power-of-two bucket (entropy) plus its bits below the leading one."""
    magnitude = np.abs(values.astype(np.int64)) + 1
    bucket = np.floor(np.log2(magnitude.astype(np.float64))).astype(np.int64)
    _, counts = np.unique(bucket, return_counts=True)
    p = counts / counts.sum()
    return float((-(p * np.log2(p)).sum() + bucket.mean()) / 8)


def measure(path: Path) -> dict:
    trace = read_trace(path)
    table = trace.table.replace_schema_metadata(None)
    n = table.num_rows
    whole = ipc_bytes(table)
    columns = {}
    for name in SCHEMA.names:
        columns[name] = (whole - ipc_bytes(table.drop_columns([name]))) / n
    re_table = reencoded(table)
    back = decoded(re_table)
    if any(not back[name].equals(table[name]) for name in table.column_names):
        raise SystemExit(f"trace_bytes.py: the re-encoding of {path} does not decode to its rows")
    ts = table["ts_ns"].to_numpy()
    return {
        "trace": str(path), "rows": n, "file_bytes_per_row": os.path.getsize(path) / n,
        "stored_bytes_per_row": whole / n, "zstd19_bytes_per_row": ipc_bytes(table, 19) / n,
        "reencoded_bytes_per_row": ipc_bytes(re_table) / n, "reencoded_zstd19_bytes_per_row": ipc_bytes(re_table, 19) / n,
        "columns_bytes_per_row": columns,
        "estimate_bytes_per_row": {"ts_ns (gaps)": bucket_estimate_bytes(np.diff(ts)) if n > 1 else 0.0,
                                   "dur_ns": bucket_estimate_bytes(table["dur_ns"].to_numpy())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--generate-rows", type=int, default=1_000_000,
                        help="rows of the generated trace measured when no TRACE is given (0: none)")
    parser.add_argument("--results", type=Path, default=RESULTS / "trace_bytes.json")
    args = parser.parse_args()
    args.results.parent.mkdir(parents=True, exist_ok=True)
    traces = list(args.traces)
    with tempfile.TemporaryDirectory(prefix="ckpt-trace-bytes-") as scratch:
        if not traces:
            traces.append(REPO / "traces" / "demo-dcp.arrow")
            if args.generate_rows:
                generated = Path(scratch) / f"generated-{args.generate_rows}.arrow"
                generate(generated, args.generate_rows, 64, mix="dcp")
                traces.append(generated)
        results = [measure(path) for path in traces]
    names = [Path(r["trace"]).name for r in results]
    table = Table(title="Trace bytes per row (one run; Arrow IPC, zstd)")
    table.add_column("bytes per row")
    for name, r in zip(names, results):
        table.add_column(f"{name}\n{r['rows']:,} rows", justify="right")
    for label, key in (("file", "file_bytes_per_row"), ("stored (rewritten)", "stored_bytes_per_row"),
                       ("zstd 19", "zstd19_bytes_per_row"), ("re-encoded", "reencoded_bytes_per_row"),
                       ("re-encoded, zstd 19", "reencoded_zstd19_bytes_per_row")):
        table.add_row(label, *(f"{r[key]:.2f}" for r in results))
    for name in SCHEMA.names:
        shares = [r["columns_bytes_per_row"][name] for r in results]
        if max(shares) >= 0.05:
            table.add_row(f"  {name}", *(f"{s:.2f}" for s in shares))
    for label in results[0]["estimate_bytes_per_row"]:
        table.add_row(f"estimate: {label}", *(f"{r['estimate_bytes_per_row'][label]:.2f}" for r in results))
    Console(width=100).print(table)
    args.results.write_text(json.dumps({"benchmark": "trace_bytes", "results": results}, indent=1))
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
