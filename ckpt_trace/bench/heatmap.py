"""One heat map per dimension pair: write throughput (MB/s) over the pair's grid, other dimensions at baseline.

Cells the storage refused (e.g. O_DIRECT at a misaligned offset) are left
blank and marked "refused". The colour scale is shared by all maps of one
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


def grid_values(table: pa.Table, matrix: Matrix, row: str, column: str) -> list[list[float | None]]:
    """Throughput (bytes/s) of each cell of ``matrix.grid(row, column)``; None where refused or not run."""
    lookup = {point_of(row): row["throughput_bytes_per_s"] for row in table.to_pylist()}
    return [[lookup.get(point.canonical()) for point in line] for line in matrix.grid(row, column)]


def _others(matrix: Matrix, row: str, column: str) -> str:
    fixed = [f"{TITLES[name]} {label(name, getattr(matrix.baseline, name))}" for name in DIMENSIONS
             if name not in (row, column)]
    return "others at baseline: " + ", ".join(fixed)


def heatmap_png(table: pa.Table, matrix: Matrix, row: str, column: str, vmax_bytes_per_s: float) -> bytes:
    """The PNG of one dimension pair (see the module docstring)."""
    plt = pyplot()
    values = grid_values(table, matrix, row, column)
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
    ax.set_title(f"write MB/s by {TITLES[row]} and {TITLES[column]}\n{_others(matrix, row, column)}", fontsize=8)
    fig.colorbar(image, ax=ax, label="MB/s")
    return png_bytes(fig)


def write_heatmaps(table: pa.Table, matrix: Matrix, output: Path) -> list[Path]:
    """Write ``heatmap-<row>-<column>.png`` for every pair of ``matrix``; return the paths."""
    speeds = [v for v in table.column("throughput_bytes_per_s").to_pylist() if v is not None]
    vmax = max(speeds, default=1.0)
    paths = []
    for row, column in matrix.pairs():
        path = output / f"heatmap-{row}-{column}.png"
        write_bytes_atomic(path, heatmap_png(table, matrix, row, column, vmax))
        paths.append(path)
    return paths


def matrix_of(metadata: dict) -> Matrix:
    """The Matrix a results file was run with (its ``values`` and ``baseline`` metadata)."""
    values = {name: tuple(metadata["values"][name]) for name in DIMENSIONS}
    baseline = BenchPoint(**metadata["baseline"])
    return Matrix(values=values, baseline=baseline, volume_bytes=metadata["volume_bytes"],
                  aggregate_bytes=metadata["aggregate_bytes"])
