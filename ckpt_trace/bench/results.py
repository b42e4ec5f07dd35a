"""The bench results as an Arrow table: one row per point run, the run's context in one metadata key.

Columns (units in the names): the nine dimensions (``size_bytes``,
``misaligned_bytes``, ``queue_depth``, ``processes``, ``direct``, ``engine``,
``aggregated``, ``preallocated``, ``direction``: write or read);
``volume_bytes`` (bytes the point wrote or read, all processes);
``elapsed_s`` (first process's start to last process's end of the timed
region, fsync included for writes; the median of ``runs_elapsed_s``);
``throughput_bytes_per_s`` (volume / elapsed); ``io_ops`` (file writes or
reads issued); ``latency_p50_ns``, ``latency_p99_ns``, ``latency_max_ns``
(per file write or read); ``cpu_s`` (user + system seconds of the point's
processes); ``error`` (why the storage refused the point, e.g. O_DIRECT at a
512-byte offset; the figures are then null).

The schema metadata key ``ckpt_trace.bench`` holds JSON: ``format``
("ckpt-trace-bench"), ``version``, ``values`` (each dimension's swept values),
``baseline``, ``volume_bytes``, ``aggregate_bytes``, ``block_bytes``,
``repeat``, ``environment`` (host, kernel, file system, device),
``elapsed_s`` of the whole bench, ``fio_write_bytes_per_s`` and
``fio_read_bytes_per_s`` (or null).

Versions: 1 had writes only (``write_ops`` for ``io_ops``, no ``direction``);
``read_bench`` reads a version 1 file as version 2, every row a write.
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
BENCH_VERSION = 2
BENCH_SUPPORTED_VERSIONS = (1, 2)
TABLE_NAME = "bench.arrow"

SCHEMA = pa.schema(
    [
        ("size_bytes", pa.int64()),
        ("misaligned_bytes", pa.int64()),
        ("queue_depth", pa.int32()),
        ("processes", pa.int32()),
        ("direct", pa.bool_()),
        ("engine", pa.string()),
        ("aggregated", pa.bool_()),
        ("preallocated", pa.bool_()),
        ("direction", pa.string()),
        ("volume_bytes", pa.int64()),
        ("elapsed_s", pa.float64()),
        ("runs_elapsed_s", pa.list_(pa.float64())),
        ("throughput_bytes_per_s", pa.float64()),
        ("io_ops", pa.int64()),
        ("latency_p50_ns", pa.int64()),
        ("latency_p99_ns", pa.int64()),
        ("latency_max_ns", pa.int64()),
        ("cpu_s", pa.float64()),
        ("error", pa.string()),
    ]
)


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
    if metadata.get("format") != BENCH_FORMAT or metadata.get("version") not in BENCH_SUPPORTED_VERSIONS:
        raise BenchError(
            f"{path}: bench format {metadata.get('format')!r} version {metadata.get('version')!r} "
            f"is not supported (this release reads versions "
            f"{', '.join(map(str, BENCH_SUPPORTED_VERSIONS))})"
        )
    if metadata["version"] == 1 and "write_ops" in table.column_names:
        table = table.rename_columns(["io_ops" if n == "write_ops" else n for n in table.column_names])
        table = table.append_column("direction", pa.array(["write"] * table.num_rows, pa.string()))
        metadata = {
            **metadata,
            "version": BENCH_VERSION,
            "fio_read_bytes_per_s": None,
            "values": {**metadata.get("values", {}), "direction": ["write"]},
        }
    missing = [name for name in SCHEMA.names if name not in table.column_names]
    if missing:
        raise BenchError(f"{path}: missing column {missing[0]!r}")
    return table.select(SCHEMA.names), metadata


def ranked(table: pa.Table, count: int | None = None, direction: str | None = None) -> list[dict]:
    """Rows that ran (of ``direction`` only, when given), fastest first (ties: less CPU first), at most ``count``."""
    rows = [
        row
        for row in table.to_pylist()
        if row["error"] is None and row["throughput_bytes_per_s"] and direction in (None, row["direction"])
    ]
    rows.sort(key=lambda row: (-row["throughput_bytes_per_s"], row["cpu_s"]))
    return rows[:count] if count is not None else rows


def _described(row: dict) -> dict:
    return {**row, "description": describe(point_of(row))}


def point_of(row: dict) -> BenchPoint:
    """The BenchPoint a results row was measured at."""
    return BenchPoint(**{name: row[name] for name in DIMENSIONS})


def effects(table: pa.Table, matrix: Matrix, direction: str | None = None) -> list[dict]:
    """Per dimension, the throughput of each of its values with every other dimension at the baseline of
    ``direction`` (the matrix baseline's by default).

    One dict per dimension that varies (not the direction itself; not
    preallocation for reads): ``dimension``, ``title``, ``values`` (list of
    {``label``, ``throughput_bytes_per_s`` or None if refused}), ``fastest``
    and ``slowest`` labels and ``ratio`` (fastest / slowest; None when fewer
    than two values ran). The baseline's one-factor sweeps, read off the
    heat maps' grids.
    """
    direction = direction or matrix.baseline.direction
    base = matrix.at(direction)
    swept = {name for pair in matrix.pairs(direction) for name in pair}
    speeds = {point_of(row): row["throughput_bytes_per_s"] for row in table.to_pylist()}
    found = []
    for name in DIMENSIONS:
        if name not in swept:
            continue
        values = [
            {
                "label": label(name, value),
                "throughput_bytes_per_s": speeds.get(dataclasses.replace(base, **{name: value}).canonical()),
            }
            for value in matrix.values[name]
        ]
        ran = [v for v in values if v["throughput_bytes_per_s"]]
        fastest = max(ran, key=lambda v: v["throughput_bytes_per_s"], default=None)
        slowest = min(ran, key=lambda v: v["throughput_bytes_per_s"], default=None)
        found.append(
            {
                "dimension": name,
                "title": TITLES[name],
                "values": values,
                "fastest": fastest and fastest["label"],
                "slowest": slowest and slowest["label"],
                "ratio": fastest["throughput_bytes_per_s"] / slowest["throughput_bytes_per_s"]
                if fastest and slowest and len(ran) > 1
                else None,
            }
        )
    return sorted(found, key=lambda e: -(e["ratio"] or 0))


def summarize(table: pa.Table, metadata: dict, matrix: Matrix, top: int, near_fraction: float = 0.05) -> dict:
    """What ``bench`` reports: per direction swept, the best configuration, the ``top`` fastest, each
    dimension's effect and fio's limit; the refused points.

    Keys: ``points``; ``directions``: {direction: {``best`` (a row plus
    ``description``, ``fraction_of_fio``, and ``near_best``: how many other
    points came within ``near_fraction`` (also returned) of it, which one run
    cannot rank; None when every point was refused), ``top`` (rows with
    ``description``), ``effects`` (see ``effects``, largest ratio first),
    ``fio_bytes_per_s``}}; ``best``, ``top`` and ``effects`` of the first
    direction again at the top level; ``refused`` (list of {description,
    error}); ``elapsed_s``, ``volume_bytes``, ``fio_write_bytes_per_s``,
    ``fio_read_bytes_per_s``, ``environment``.
    """
    sections = {}
    for direction in matrix.directions:
        fio = metadata.get(f"fio_{direction}_bytes_per_s")
        ordered = ranked(table, direction=direction)
        fastest = [_described(row) for row in ordered[:top]]
        best = dict(fastest[0]) if fastest else None
        if best is not None:
            best["fraction_of_fio"] = best["throughput_bytes_per_s"] / fio if fio else None
            floor = best["throughput_bytes_per_s"] * (1 - near_fraction)
            best["near_best"] = sum(row["throughput_bytes_per_s"] >= floor for row in ordered[1:])
            best["near_fraction"] = near_fraction
        sections[direction] = {
            "best": best,
            "top": fastest,
            "effects": effects(table, matrix, direction),
            "fio_bytes_per_s": fio,
        }
    first = sections[matrix.directions[0]]
    refused = [_described(row) for row in table.to_pylist() if row["error"] is not None]
    return {
        "points": table.num_rows,
        "best": first["best"],
        "top": first["top"],
        "effects": first["effects"],
        "directions": sections,
        "refused": [{"description": row["description"], "error": row["error"]} for row in refused],
        "elapsed_s": metadata.get("elapsed_s"),
        "volume_bytes": metadata.get("volume_bytes"),
        "fio_write_bytes_per_s": metadata.get("fio_write_bytes_per_s"),
        "fio_read_bytes_per_s": metadata.get("fio_read_bytes_per_s"),
        "environment": metadata.get("environment"),
    }
