"""One heat map per dimension pair and direction: write (read) throughput (MB/s) over the pair's grid, other
dimensions at the direction's baseline. Write maps are ``heatmap-<row>-<column>.png``, read maps
``heatmap-read-<row>-<column>.png``.

Cells the storage refused (e.g. O_DIRECT at a misaligned offset) are left
blank and marked "refused". The colour scale is shared by all maps of one direction in one
run (0 to the fastest point), so maps compare at a glance.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa

from ckpt_trace.formats import write_bytes_atomic
from ckpt_trace.report.figures import png_bytes, pyplot

from .matrix import DIMENSIONS, TITLES, BenchPoint, Matrix, label
from .results import point_of


def grid_values(
    table: pa.Table, matrix: Matrix, row: str, column: str, direction: str | None = None
) -> list[list[float | None]]:
    """Throughput (bytes/s) of each cell of ``matrix.grid(row, column, direction)``; None where refused or not run."""
    lookup = {point_of(row): row["throughput_bytes_per_s"] for row in table.to_pylist()}
    return [[lookup.get(point.canonical()) for point in line] for line in matrix.grid(row, column, direction)]


def _others(matrix: Matrix, row: str, column: str, direction: str) -> str:
    base = matrix.at(direction)
    fixed = [
        f"{TITLES[name]} {label(name, getattr(base, name))}"
        for name in matrix.dimensions(direction)
        if name not in (row, column)
    ]
    return "others at baseline: " + ", ".join(fixed)


def heatmap_png(
    table: pa.Table, matrix: Matrix, row: str, column: str, vmax_bytes_per_s: float, direction: str | None = None
) -> bytes:
    """The PNG of one dimension pair of ``direction`` (the baseline's by default; see the module docstring)."""
    direction = direction or matrix.baseline.direction
    plt = pyplot()
    values = grid_values(table, matrix, row, column, direction)
    mb = [[math.nan if v is None else v / 1e6 for v in line] for line in values]
    rows, columns = matrix.values[row], matrix.values[column]
    fig, ax = plt.subplots(figsize=(1.2 + 1.05 * len(columns), 1.3 + 0.55 * len(rows)))
    image = ax.imshow(mb, cmap="viridis", vmin=0, vmax=max(vmax_bytes_per_s / 1e6, 1e-9), aspect="auto")
    ax.set_xticks(range(len(columns)), [label(column, v) for v in columns])
    ax.set_yticks(range(len(rows)), [label(row, v) for v in rows])
    ax.set_xlabel(TITLES[column])
    ax.set_ylabel(TITLES[row])
    for i, line in enumerate(mb):
        for j, value in enumerate(line):
            text = "refused" if math.isnan(value) else f"{value:,.0f}"
            bright = not math.isnan(value) and value > 0.6 * vmax_bytes_per_s / 1e6
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black" if bright else "white")
    ax.set_title(
        f"{direction} MB/s by {TITLES[row]} and {TITLES[column]}\n{_others(matrix, row, column, direction)}", fontsize=8
    )
    fig.colorbar(image, ax=ax, label="MB/s")
    return png_bytes(fig)


def write_heatmaps(table: pa.Table, matrix: Matrix, output: Path) -> list[Path]:
    """Write ``heatmap-<row>-<column>.png`` (``heatmap-read-...`` for reads) for every pair of ``matrix`` and
    direction swept; return the paths. One colour scale per direction."""
    paths = []
    for direction in matrix.directions:
        speeds = [
            row["throughput_bytes_per_s"]
            for row in table.to_pylist()
            if row["direction"] == direction and row["throughput_bytes_per_s"] is not None
        ]
        vmax = max(speeds, default=1.0)
        prefix = "heatmap-read" if direction == "read" else "heatmap"
        for row, column in matrix.pairs(direction):
            path = output / f"{prefix}-{row}-{column}.png"
            write_bytes_atomic(path, heatmap_png(table, matrix, row, column, vmax, direction))
            paths.append(path)
    return paths


def matrix_of(metadata: dict) -> Matrix:
    """The Matrix a results file was run with (its ``values`` and ``baseline`` metadata)."""
    values = {
        name: tuple(metadata["values"].get(name, ("write",) if name == "direction" else ())) for name in DIMENSIONS
    }
    baseline = BenchPoint(**metadata["baseline"])
    return Matrix(
        values=values,
        baseline=baseline,
        volume_bytes=metadata["volume_bytes"],
        aggregate_bytes=metadata["aggregate_bytes"],
    )
