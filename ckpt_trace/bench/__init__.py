"""``ckpt-trace bench``: the micro-benchmark matrix of arXiv 2512.24511 run on one storage target.

``matrix`` plans (pure), ``worker`` writes (reads) one process's stream, ``run``
runs every point in fresh processes, ``results`` is the Arrow table,
``heatmap`` draws one PNG per dimension pair, ``fio`` is the device limit.
"""

from .matrix import DIMENSIONS, BenchPoint, Matrix, describe, make_matrix
from .results import ranked, read_bench
from .run import check_output, run_bench, write_outputs

__all__ = [
    "DIMENSIONS",
    "BenchPoint",
    "Matrix",
    "check_output",
    "describe",
    "make_matrix",
    "ranked",
    "read_bench",
    "run_bench",
    "write_outputs",
]
