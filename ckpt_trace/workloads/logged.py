"""The small command-line frame of the workloads that log what they did (``aio_threads``, ``copies``,
``mapped``): ``python -m ckpt_trace.workloads.NAME OUT LOG [N]``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable


def run_logged(argv: list[str], run: Callable[[str, int], list], default: int) -> int:
    """Run ``run(OUT, N)`` (N from the third argument, else ``default``) after creating OUT, and write the
    list it returns, the program's own log of what it did, as JSON to LOG. Returns the exit status (0)."""
    out, log_path = argv[0], argv[1]
    count = int(argv[2]) if len(argv) > 2 else default
    os.makedirs(out, exist_ok=True)
    log = run(out, count)
    with open(log_path, "w") as handle:
        json.dump(log, handle)
    return 0
