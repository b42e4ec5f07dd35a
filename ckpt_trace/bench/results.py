"""The bench results as an Arrow table: one row per point run, the run's context in one metadata key.

Columns (units in the names): the eight dimensions (``size_bytes``,
``misaligned_bytes``, ``queue_depth``, ``processes``, ``direct``, ``engine``,
``aggregated``, ``preallocated``); ``volume_bytes`` (bytes the point wrote, all processes);
``elapsed_s`` (first process's start to last process's end of the timed
region, fsync included; the median of ``runs_elapsed_s``);
``throughput_bytes_per_s`` (volume / elapsed); ``write_ops`` (file writes
issued); ``latency_p50_ns``, ``latency_p99_ns``, ``latency_max_ns`` (per file
write); ``cpu_s`` (user + system seconds of the writing processes);
``error`` (why the storage refused the point, e.g. O_DIRECT at a 512-byte
offset; the figures are then null).

The schema metadata key ``ckpt_trace.bench`` holds JSON: ``format``
("ckpt-trace-bench"), ``version``, ``values`` (each dimension's swept values),
``baseline``, ``volume_bytes``, ``aggregate_bytes``, ``block_bytes``,
``repeat``, ``environment`` (host, kernel, file system, device),
``elapsed_s`` of the whole bench and ``fio_write_bytes_per_s`` (or null).
"""

from __future__ import annotations

import dataclasses
import json
import os

import pyarrow as pa
from pyarrow import ipc

from ckpt_trace.errors import BenchError
from ckpt_trace.formats import write_bytes_atomic

from .matrix import DIMENSIONS, TITLES, BenchPoint, Matrix, describe, label

BENCH_KEY = b"ckpt_trace.bench"
BENCH_FORMAT = "ckpt-trace-bench"
BENCH_VERSION = 1
TABLE_NAME = "bench.arrow"

SCHEMA = pa.schema([
    ("size_bytes", pa.int64()), ("misaligned_bytes", pa.int64()), ("queue_depth", pa.int32()),
    ("processes", pa.int32()), ("direct", pa.bool_()), ("engine", pa.string()), ("aggregated", pa.bool_()),
    ("preallocated", pa.bool_()),
    ("volume_bytes", pa.int64()), ("elapsed_s", pa.float64()), ("runs_elapsed_s", pa.list_(pa.float64())),
    ("throughput_bytes_per_s", pa.float64()), ("write_ops", pa.int64()), ("latency_p50_ns", pa.int64()),
    ("latency_p99_ns", pa.int64()), ("latency_max_ns", pa.int64()), ("cpu_s", pa.float64()), ("error", pa.string()),
])


def to_table(rows: list[dict], metadata: dict) -> pa.Table:
    """The results table of ``rows`` (dicts keyed by SCHEMA's names) with ``metadata`` under BENCH_KEY."""
    document = {"format": BENCH_FORMAT, "version": BENCH_VERSION, **metadata}
    schema = SCHEMA.with_metadata({BENCH_KEY: json.dumps(document).encode()})
    return pa.Table.from_pylist(rows, schema=schema)


def write_table(table: pa.Table, path: str | os.PathLike) -> None:
    """Write ``table`` as an Arrow IPC file, atomically (a reader never sees half a file)."""
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    write_bytes_atomic(path, sink.getvalue().to_pybytes())


def read_bench(path: str | os.PathLike) -> tuple[pa.Table, dict]:
    """(table, metadata) of a bench results file. Raises BenchError for a missing, corrupt, truncated
    or foreign file, a version this release does not read, or a missing column."""
    try:
        with ipc.open_file(pa.OSFile(str(path))) as reader:
            table = reader.read_all()
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file") from None
    except (pa.ArrowException, OSError) as err:
        raise BenchError(f"{path}: not a readable Arrow file ({str(err).splitlines()[0]})") from None
    raw = (table.schema.metadata or {}).get(BENCH_KEY)
    if raw is None:
        raise BenchError(f"{path}: missing the schema metadata key {BENCH_KEY.decode()}; not a bench results file")
    try:
        metadata = json.loads(raw)
    except ValueError:
        raise BenchError(f"{path}: the {BENCH_KEY.decode()} metadata is not JSON") from None
    if metadata.get("format") != BENCH_FORMAT or metadata.get("version") != BENCH_VERSION:
        raise BenchError(f"{path}: bench format {metadata.get('format')!r} version {metadata.get('version')!r} "
                         f"is not supported (this release reads version {BENCH_VERSION})")
    missing = [name for name in SCHEMA.names if name not in table.column_names]
    if missing:
        raise BenchError(f"{path}: missing column {missing[0]!r}")
    return table, metadata


def ranked(table: pa.Table, count: int | None = None) -> list[dict]:
    """Rows that ran, fastest first (ties: less CPU first), at most ``count``."""
    rows = [row for row in table.to_pylist() if row["error"] is None and row["throughput_bytes_per_s"]]
    rows.sort(key=lambda row: (-row["throughput_bytes_per_s"], row["cpu_s"]))
    return rows[:count] if count is not None else rows


def _described(row: dict) -> dict:
    return {**row, "description": describe(point_of(row))}


def point_of(row: dict) -> BenchPoint:
    """The BenchPoint a results row was measured at."""
    return BenchPoint(**{name: row[name] for name in DIMENSIONS})


def effects(table: pa.Table, matrix: Matrix) -> list[dict]:
    """Per dimension, the throughput of each of its values with every other dimension at the baseline.

    One dict per dimension that varies: ``dimension``, ``title``, ``values``
    (list of {``label``, ``throughput_bytes_per_s`` or None if refused}),
    ``fastest`` and ``slowest`` labels and ``ratio`` (fastest / slowest;
    None when fewer than two values ran). The baseline's one-factor sweeps,
    read off the heat maps' grids.
    """
    speeds = {point_of(row): row["throughput_bytes_per_s"] for row in table.to_pylist()}
    found = []
    for name in DIMENSIONS:
        if len(matrix.values[name]) < 2:
            continue
        values = [{"label": label(name, value),
                   "throughput_bytes_per_s": speeds.get(dataclasses.replace(matrix.baseline, **{name: value}).canonical())}
                  for value in matrix.values[name]]
        ran = [v for v in values if v["throughput_bytes_per_s"]]
        fastest = max(ran, key=lambda v: v["throughput_bytes_per_s"], default=None)
        slowest = min(ran, key=lambda v: v["throughput_bytes_per_s"], default=None)
        found.append({"dimension": name, "title": TITLES[name], "values": values,
                      "fastest": fastest and fastest["label"], "slowest": slowest and slowest["label"],
                      "ratio": fastest["throughput_bytes_per_s"] / slowest["throughput_bytes_per_s"]
                      if len(ran) > 1 else None})
    return sorted(found, key=lambda e: -(e["ratio"] or 0))


def summarize(table: pa.Table, metadata: dict, matrix: Matrix, top: int, near_fraction: float = 0.05) -> dict:
    """What ``bench`` reports: the best configuration, the ``top`` fastest, each dimension's effect,
    the refused points, fio's limit.

    Keys: ``points``; ``best`` (a row plus ``description``,
    ``fraction_of_fio``, and ``near_best``: how many other points came within
    ``near_fraction`` (also returned) of it, which one run cannot rank; None when
    every point was refused); ``top`` (rows with ``description``);
    ``effects`` (see ``effects``, largest ratio first); ``refused`` (list of
    {description, error}); ``elapsed_s``, ``volume_bytes``,
    ``fio_write_bytes_per_s``, ``environment``.
    """
    fio = metadata.get("fio_write_bytes_per_s")
    ordered = ranked(table)
    fastest = [_described(row) for row in ordered[:top]]
    best = dict(fastest[0]) if fastest else None
    if best is not None:
        best["fraction_of_fio"] = best["throughput_bytes_per_s"] / fio if fio else None
        floor = best["throughput_bytes_per_s"] * (1 - near_fraction)
        best["near_best"] = sum(row["throughput_bytes_per_s"] >= floor for row in ordered[1:])
        best["near_fraction"] = near_fraction
    refused = [_described(row) for row in table.to_pylist() if row["error"] is not None]
    return {"points": table.num_rows, "best": best, "top": fastest, "effects": effects(table, matrix),
            "refused": [{"description": row["description"], "error": row["error"]} for row in refused],
            "elapsed_s": metadata.get("elapsed_s"), "volume_bytes": metadata.get("volume_bytes"),
            "fio_write_bytes_per_s": fio, "environment": metadata.get("environment")}
