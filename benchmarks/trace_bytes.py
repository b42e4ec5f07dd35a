"""Where a trace file's bytes go, column by column, as version 3 stored them and as version 4 does (issue 13).

Issue 13 asks for trace files of at most 8 bytes per row for the demo trace
and the 10 M-row trace. This script measures, for each trace given, bytes
per row:

- ``file``: the file as it is on disk (a trace recorded before version 4
  is a version 3 file);
- ``version 3``: the rows stored as version 3 stored them (every column
  plain, Arrow IPC, zstd at Arrow's default level, 1, 65,536-row batches);
- ``version 4``: the rows written by ``formats.write_trace`` now, with the
  trace's own metadata (``tid``, ``offset`` and ``ret`` stored as
  differences, ``formats/ckpt_trace/formats/encoding.py``; zstd level 19 for a
  file of one batch, 6 otherwise), read
  back and compared with the rows, then the same at zstd 19;
- each column's share of version 4: the bytes the stored rows lose when
  that column is left out (at the level the writer would choose);
- ``estimate``: for ``ts_ns`` (the gaps between rows) and ``dur_ns``, a
  per-row estimate of the information they carry: the entropy of each
  value's power-of-two bucket (its leading bit) plus the bits below the
  leading one, counted as incompressible (in a recorded trace they are
  timing noise). An estimate under that model, not a proven bound: these
  two columns are what is left of a version 4 row.

    python benchmarks/trace_bytes.py [TRACE ...] [--generate-rows 1000000]

With no TRACE: the demo trace (``traces/demo-dcp.arrow``, a recording of
DCP saves made by ``make demo``, or by ``replay_strategies.py`` when none
is there) and a generated trace of
``--generate-rows`` rows (``tracegen.py``, 64 ranks, DCP-like mix; its
timestamps and offsets are far more regular than a recording's). Each trace
is read whole into memory. Prints a table and writes
``benchmarks/results/trace_bytes.json``.
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

from ckpt_trace.formats import SCHEMA, read_trace, write_trace
from ckpt_trace.formats.encoding import LOGICAL_OF, Encoder
from ckpt_trace.formats.io import DEFAULT_BATCH_ROWS, ZSTD_LEVEL, ZSTD_LEVEL_ONE_BATCH
from ckpt_trace.formats.schema import STORED_SCHEMA

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


def stored(table: pa.Table) -> pa.Table:
    """``table`` (of ``SCHEMA``) as version 4 stores it, in ``DEFAULT_BATCH_ROWS`` batches."""
    encoder = Encoder()
    return pa.Table.from_batches([encoder.encode(batch, STORED_SCHEMA)
                                  for batch in table.combine_chunks().to_batches(max_chunksize=DEFAULT_BATCH_ROWS)],
                                 schema=STORED_SCHEMA)


def bucket_estimate_bytes(values: np.ndarray) -> float:
    """Per value, bytes to code its power-of-two bucket (entropy) plus its bits below the leading one."""
    magnitude = np.abs(values.astype(np.int64)) + 1
    bucket = np.floor(np.log2(magnitude.astype(np.float64))).astype(np.int64)
    _, counts = np.unique(bucket, return_counts=True)
    p = counts / counts.sum()
    return float((-(p * np.log2(p)).sum() + bucket.mean()) / 8)


def measure(path: Path, scratch: Path) -> dict:
    trace = read_trace(path)
    table = trace.table.replace_schema_metadata(None)
    n = table.num_rows
    rewritten = write_trace(scratch / f"v4-{path.name}", table, trace.metadata)
    back = read_trace(rewritten).table
    if any(back[name].to_pylist() != table[name].to_pylist() for name in table.column_names):
        raise SystemExit(f"trace_bytes.py: {path} written as version 4 does not read back to its rows")
    v4 = stored(table)
    level = ZSTD_LEVEL_ONE_BATCH if n <= DEFAULT_BATCH_ROWS else ZSTD_LEVEL  # the writer's choice
    whole = ipc_bytes(v4, level)
    columns = {LOGICAL_OF.get(name, name): (whole - ipc_bytes(v4.drop_columns([name]), level)) / n
               for name in v4.column_names}
    ts = table["ts_ns"].to_numpy()
    return {
        "trace": str(path), "rows": n, "file_bytes_per_row": os.path.getsize(path) / n,
        "file_format_version": trace.metadata["format_version"],
        "v3_bytes_per_row": ipc_bytes(table) / n,
        "v4_file_bytes_per_row": os.path.getsize(rewritten) / n,
        "v4_zstd19_bytes_per_row": ipc_bytes(v4, 19) / n,
        "v4_columns_bytes_per_row": columns,
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
        results = [measure(path, Path(scratch)) for path in traces]
    names = [Path(r["trace"]).name for r in results]
    table = Table(title="Trace bytes per row (one run; Arrow IPC, zstd)")
    table.add_column("bytes per row")
    for name, r in zip(names, results):
        table.add_column(f"{name}\n{r['rows']:,} rows", justify="right")
    table.add_row("file (format version)", *(f"{r['file_bytes_per_row']:.2f} (v{r['file_format_version']})"
                                              for r in results))
    for label, key in (("version 3 (plain, zstd 1)", "v3_bytes_per_row"),
                       ("version 4 (written now)", "v4_file_bytes_per_row"),
                       ("version 4, zstd 19", "v4_zstd19_bytes_per_row")):
        table.add_row(label, *(f"{r[key]:.2f}" for r in results))
    for name in SCHEMA.names:
        shares = [r["v4_columns_bytes_per_row"][name] for r in results]
        if max(shares) >= 0.05:
            table.add_row(f"  v4: {name}", *(f"{s:.2f}" for s in shares))
    for label in results[0]["estimate_bytes_per_row"]:
        table.add_row(f"estimate: {label}", *(f"{r['estimate_bytes_per_row'][label]:.2f}" for r in results))
    Console(width=100).print(table)
    args.results.write_text(json.dumps({"benchmark": "trace_bytes", "results": results}, indent=1))
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
