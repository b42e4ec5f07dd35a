"""fio's own log of what it did, as the golden-trace tests compare the traces with it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def fio_iolog(path: Path) -> Counter:
    """(file, direction, offset, bytes) of every read and write in a fio version 3 iolog."""
    ops = Counter()
    for line in path.read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) == 5 and parts[2] in ("read", "write"):
            ops[(parts[1], parts[2], int(parts[3]), int(parts[4]))] += 1
    return ops
