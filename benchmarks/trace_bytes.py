"""Where a trace file's bytes go, as versions 3, 4 and 5 store the same rows (issues 13 and 32).

For each trace given, bytes per row (the trace's own metadata included in every file):

- ``file``: the file as it is on disk, in the version it was written;
- ``version 3``: every column plain, Arrow IPC, zstd at Arrow's default level (1), 65,536-row batches;
- ``version 4``: ``tid``, ``offset`` and ``ret`` stored as differences (``encoding.Encoder``), zstd level
  19 for a file of one batch, 6 otherwise (what version 4's writer did);
- ``version 5``: the file ``formats.write_trace`` writes now (every column plain again, zstd level
  ``ZSTD_LEVEL_ONE_BATCH`` for one batch, ``ZSTD_LEVEL`` otherwise), read back and compared with the rows;
- each column's share of version 5: the bytes the file loses when that column is left out (traces of at
  most 2 M rows: each share costs a compression of the whole table);
- ``estimate``: for ``ts_ns`` (the gaps between rows) and ``dur_ns``, a
  per-row estimate of the information they carry: the entropy of each
  value's power-of-two bucket (its leading bit) plus the bits below the
  leading one, counted as incompressible (in a recorded trace they are
  timing noise). An estimate under that model, not a proven bound.

With ``--levels``, also version 5's bytes per row and write time (best of three under 100,000 rows, else
one) at zstd levels 1, 3, 6, 9 and 19: the measurement the writer's levels were chosen by.

    python benchmarks/trace_bytes.py [TRACE ...] [--generate-rows 1000000] [--levels]

With no TRACE: the demo trace (``traces/demo-dcp.arrow``, a recording of
DCP saves made by ``make demo``) and a generated trace of
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
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from rich.console import Console
from rich.table import Table
from tracegen import generate

from ckpt_trace.formats import METADATA_KEY, SCHEMA, read_trace, write_trace
from ckpt_trace.formats.encoding import Encoder
from ckpt_trace.formats.io import DEFAULT_BATCH_ROWS, ZSTD_LEVEL, ZSTD_LEVEL_ONE_BATCH, conform
from ckpt_trace.formats.schema import STORED_SCHEMA_V4

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent
V4_LEVELS = (19, 6)  # version 4's writer: zstd level for a file of one batch, for a longer one
LEVELS = (1, 3, 6, 9, 19)
COLUMN_SHARES_MAX_ROWS = 2_000_000  # each column's share costs a compression of the whole table: small ones only


def ipc_bytes(table: pa.Table, level: int | None = None, metadata: dict | None = None) -> int:
    """Bytes of ``table`` as an Arrow IPC file with the trace writer's options (zstd, 65,536-row batches);
    ``level``: a zstd level other than Arrow's default; ``metadata``: the trace metadata to store."""
    codec = "zstd" if level is None else pa.Codec("zstd", compression_level=level)
    schema = (
        table.schema
        if metadata is None
        else table.schema.with_metadata({METADATA_KEY: json.dumps(metadata, sort_keys=True).encode()})
    )
    sink = io.BytesIO()
    with ipc.new_file(sink, schema, options=ipc.IpcWriteOptions(compression=codec)) as writer:
        for batch in table.to_batches(max_chunksize=DEFAULT_BATCH_ROWS):
            writer.write_batch(batch)
    return len(sink.getvalue())


def stored_v4(table: pa.Table) -> pa.Table:
    """``table`` (of ``SCHEMA``) as version 4 stored it, in ``DEFAULT_BATCH_ROWS`` batches."""
    encoder = Encoder()
    return pa.Table.from_batches(
        [encoder.encode(batch, STORED_SCHEMA_V4) for batch in table.to_batches(max_chunksize=DEFAULT_BATCH_ROWS)],
        schema=STORED_SCHEMA_V4,
    )


def _same(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """Whether two columns hold the same values (text compared as text: the writers' dictionaries differ)."""
    if pa.types.is_dictionary(a.type):
        a, b = a.cast(pa.string()), b.cast(pa.string())
    return a.equals(b)


def level_figures(table: pa.Table, metadata: dict) -> dict:
    """{level: (bytes per row, write seconds)} of ``table`` stored plain (version 5) at each of ``LEVELS``."""
    out = {}
    for level in LEVELS:
        best = float("inf")
        for _ in range(3 if table.num_rows < 100_000 else 1):
            started = time.perf_counter()
            size = ipc_bytes(table, level, metadata)
            best = min(best, time.perf_counter() - started)
        out[level] = (size / table.num_rows, best)
    return out


def bucket_estimate_bytes(values: np.ndarray) -> float:
    """Per value, bytes to code its power-of-two bucket (entropy) plus its bits below the leading one."""
    magnitude = np.abs(values.astype(np.int64)) + 1
    bucket = np.floor(np.log2(magnitude.astype(np.float64))).astype(np.int64)
    _, counts = np.unique(bucket, return_counts=True)
    p = counts / counts.sum()
    return float((-(p * np.log2(p)).sum() + bucket.mean()) / 8)


def measure(path: Path, scratch: Path, levels: bool) -> dict:
    trace = read_trace(path)
    table = conform(trace.table.replace_schema_metadata(None)).combine_chunks()
    n = table.num_rows
    meta = dict(trace.metadata)
    meta.pop("format_version", None)
    rewritten = write_trace(scratch / f"v5-{path.name}", table, meta)
    back = read_trace(rewritten).table
    if not all(_same(back[name], table[name]) for name in table.column_names):
        raise SystemExit(f"trace_bytes.py: {path} written as version 5 does not read back to its rows")
    v5 = os.path.getsize(rewritten)
    level = ZSTD_LEVEL_ONE_BATCH if n <= DEFAULT_BATCH_ROWS else ZSTD_LEVEL  # the writer's choice
    whole = ipc_bytes(table, level, meta) if n <= COLUMN_SHARES_MAX_ROWS else 0
    columns = {
        name: (whole - ipc_bytes(table.drop_columns([name]), level, meta)) / n if whole else float("nan")
        for name in table.column_names
    }
    ts = table["ts_ns"].to_numpy()
    result = {
        "trace": str(path),
        "rows": n,
        "file_bytes_per_row": os.path.getsize(path) / n,
        "file_format_version": trace.metadata["format_version"],
        "v3_bytes_per_row": ipc_bytes(table, None, {**meta, "format_version": 3}) / n,
        "v4_bytes_per_row": ipc_bytes(
            stored_v4(table), V4_LEVELS[0] if n <= DEFAULT_BATCH_ROWS else V4_LEVELS[1], {**meta, "format_version": 4}
        )
        / n,
        "v5_bytes_per_row": v5 / n,
        "v5_columns_bytes_per_row": columns,
        "estimate_bytes_per_row": {
            "ts_ns (gaps)": bucket_estimate_bytes(np.diff(ts)) if n > 1 else 0.0,
            "dur_ns": bucket_estimate_bytes(table["dur_ns"].to_numpy()),
        },
    }
    if levels:
        result["v5_levels"] = level_figures(table, {**meta, "format_version": 5})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument(
        "--generate-rows",
        type=int,
        default=1_000_000,
        help="rows of the generated trace measured when no TRACE is given (0: none)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS / "trace_bytes.json")
    parser.add_argument("--levels", action="store_true", help="also version 5's size and write time per zstd level")
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
        results = [measure(path, Path(scratch), args.levels) for path in traces]
    names = [Path(r["trace"]).name for r in results]
    table = Table(title="Trace bytes per row (one run; Arrow IPC, zstd; metadata included)")
    table.add_column("bytes per row")
    for name, r in zip(names, results):
        table.add_column(f"{name}\n{r['rows']:,} rows", justify="right")
    table.add_row(
        "file (format version)", *(f"{r['file_bytes_per_row']:.2f} (v{r['file_format_version']})" for r in results)
    )
    for label, key in (
        ("version 3 (plain, zstd 1)", "v3_bytes_per_row"),
        ("version 4 (differences, zstd 19/6)", "v4_bytes_per_row"),
        (f"version 5 (plain, zstd {ZSTD_LEVEL_ONE_BATCH}/{ZSTD_LEVEL})", "v5_bytes_per_row"),
    ):
        table.add_row(label, *(f"{r[key]:.2f}" for r in results))
    for name in SCHEMA.names:
        shares = [r["v5_columns_bytes_per_row"][name] for r in results]
        if max((share for share in shares if share == share), default=0) >= 0.05:  # NaN: not measured
            table.add_row(f"  v5: {name}", *(f"{s:.2f}" for s in shares))
    for label in results[0]["estimate_bytes_per_row"]:
        table.add_row(f"estimate: {label}", *(f"{r['estimate_bytes_per_row'][label]:.2f}" for r in results))
    if args.levels:
        for level in LEVELS:
            table.add_row(
                f"v5 at zstd {level}: B/row, write s",
                *(f"{r['v5_levels'][level][0]:.2f}, {r['v5_levels'][level][1]:.3f}" for r in results),
            )
    Console(width=120).print(table)
    args.results.write_text(json.dumps({"benchmark": "trace_bytes", "results": results}, indent=1))
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
