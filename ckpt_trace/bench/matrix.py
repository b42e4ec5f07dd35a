"""The micro-benchmark matrix: dimensions, points, and each process's write stream. Pure, no I/O.

A point is one configuration of the seven dimensions of arXiv 2512.24511's
write study (Gossman et al., "Understanding LLM Checkpoint/Restore I/O
Strategies and Patterns"): request size, alignment, queue depth, processes,
buffered or O_DIRECT, POSIX or io_uring, aggregated or not; and an eighth,
whether the file is preallocated with fallocate(2) first. On ext4 and XFS an
O_DIRECT write past the end of the file is an extending write that
serializes on the inode and that io_uring hands to its io-wq threads, so
preallocation decides whether queue depth helps at all (fio preallocates by
default: its ``fallocate`` option). Every point writes the same total volume.

Each point has a direction: ``write`` (the paper's study) or ``read`` (a
restore: the same stream read back from a file written, fsynced and dropped
from the page cache before the clock starts). The pairwise design below is
laid out once per direction swept; a read point is never preallocated (its
file is complete before it starts), so read grids leave that dimension out.

The design is pairwise: for each pair of dimensions, the full grid of their
values with every other dimension at the baseline value (fio's usual
one-factor sweeps, taken two at a time so each pair gives a heat map). The
union of the grids, without repeats, is what runs. POSIX has no queue (one
synchronous syscall at a time), so a POSIX point's queue depth is 1 and the
grid cells that ask for more share that point.

The stream of one process: the application hands over ``volume`` bytes in
``size_bytes`` pieces, the first at file offset ``misaligned_bytes`` (0 or
512: a header in front of the data, as torch.save's zip entries have).
Without aggregation each piece is one write at its own offset. With
aggregation (the paper's 1-4 MiB aligned buffers) the pieces are copied into
staging buffers of ``aggregate_bytes`` that each cover one aligned stretch
of the file, and each buffer is one write; the last is rounded up to the
block size and the file truncated back to the stream's end. A read stream is
the mirror image: each piece one read into its place in the destination, or
(aggregated) each aligned staging buffer one read, copied out piece by piece.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

ENGINES = ("posix", "uring")
DIRECTIONS = ("write", "read")
MISALIGNMENT_BYTES = 512


@dataclass(frozen=True, slots=True)
class BenchPoint:
    """One configuration. ``size_bytes``: one application write (bytes); ``misaligned_bytes``: 0 or 512,
    the stream's start offset; ``queue_depth``: io_uring requests in flight per process (1 for POSIX);
    ``processes``: concurrent writers (readers), one file each; ``direct``: O_DIRECT; ``engine``: posix or
    uring; ``aggregated``: copy through aligned staging buffers; ``preallocated``: fallocate(2) the file to
    its final size before the first write (inside the timed region); ``direction``: write or read."""

    size_bytes: int
    misaligned_bytes: int
    queue_depth: int
    processes: int
    direct: bool
    engine: str
    aggregated: bool
    preallocated: bool
    direction: str = "write"

    def canonical(self) -> BenchPoint:
        """The point that is actually run: POSIX points have queue depth 1; read points are not preallocated."""
        point = dataclasses.replace(self, queue_depth=1) if self.engine == "posix" else self
        return dataclasses.replace(point, preallocated=False) if point.direction == "read" else point


DIMENSIONS = tuple(field.name for field in dataclasses.fields(BenchPoint))


@dataclass(frozen=True)
class Matrix:
    """The values swept per dimension, the baseline point, and the volume each point writes.

    ``values`` maps each of ``DIMENSIONS`` to its values, in display order;
    ``volume_bytes`` is the total written per point, over all processes;
    ``aggregate_bytes`` the staging buffer of aggregated points.
    Raises ValueError when the baseline lies outside the values or a size is not positive.
    """

    values: dict[str, tuple]
    baseline: BenchPoint
    volume_bytes: int
    aggregate_bytes: int = 4 << 20

    def __post_init__(self) -> None:
        if self.volume_bytes < 1 or self.aggregate_bytes < 1:
            raise ValueError("the volume and the aggregation buffer must be at least one byte")
        for name in DIMENSIONS:
            if not self.values.get(name):
                raise ValueError(f"no values for {name}")
            if getattr(self.baseline, name) not in self.values[name]:
                raise ValueError(f"the baseline {name} {getattr(self.baseline, name)} is not among its values")

    @property
    def directions(self) -> tuple[str, ...]:
        """The directions swept, in order (the first is the baseline's)."""
        return self.values["direction"]

    def at(self, direction: str) -> BenchPoint:
        """The baseline point of ``direction``."""
        return dataclasses.replace(self.baseline, direction=direction)

    @staticmethod
    def dimensions(direction: str) -> list[str]:
        """The dimensions a point of ``direction`` has, in ``DIMENSIONS`` order: all but the direction
        itself, and for ``read`` not ``preallocated`` (a read point's file is complete before it starts)."""
        return [
            name for name in DIMENSIONS if name != "direction" and not (direction == "read" and name == "preallocated")
        ]

    def pairs(self, direction: str | None = None) -> list[tuple[str, str]]:
        """Every pair of ``dimensions(direction)`` (the baseline's direction by default) that has more than
        one value each."""
        varying = [name for name in self.dimensions(direction or self.baseline.direction) if len(self.values[name]) > 1]
        return list(itertools.combinations(varying, 2))

    def grid(self, row: str, column: str, direction: str | None = None) -> list[list[BenchPoint]]:
        """The points of one heat map of ``direction`` (the baseline's by default): ``grid[i][j]`` has
        ``row``'s i-th and ``column``'s j-th value."""
        base = self.at(direction or self.baseline.direction)
        return [
            [dataclasses.replace(base, **{row: a, column: b}) for b in self.values[column]] for a in self.values[row]
        ]

    def points(self) -> list[BenchPoint]:
        """The canonical points of every grid of every direction (a direction's baseline alone when nothing
        varies), each once, direction by direction, grid by grid."""
        found = []
        for direction in self.directions:
            grids = [self.grid(row, column, direction) for row, column in self.pairs(direction)]
            found += [point.canonical() for grid in grids for line in grid for point in line] or [
                self.at(direction).canonical()
            ]
        return list(dict.fromkeys(found))


def powers_of_two_up_to(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit``, and ``limit`` itself: [1, 2, 4, 6] for 6."""
    values = [1 << k for k in range(limit.bit_length()) if 1 << k <= limit]
    return tuple(values + ([limit] if values[-1] != limit else []))


KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
FULL_SIZES = (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB)
FULL_QUEUE_DEPTHS = (1, 2, 4, 8, 16, 32, 64, 128)
QUICK_SIZES = (4 * KIB, 64 * KIB, MIB, 16 * MIB)
QUICK_QUEUE_DEPTHS = (1, 8, 32)
BASELINE = BenchPoint(
    size_bytes=MIB,
    misaligned_bytes=0,
    queue_depth=32,
    processes=1,
    direct=True,
    engine="uring",
    aggregated=False,
    preallocated=True,
)


def make_matrix(
    *,
    quick: bool,
    max_processes: int | None = None,
    volume_bytes: int | None = None,
    sizes: tuple[int, ...] | None = None,
    queue_depths: tuple[int, ...] | None = None,
    aggregate_bytes: int = 4 << 20,
    directions: tuple[str, ...] = ("write",),
) -> Matrix:
    """The full matrix (8 sizes 4 KiB-64 MiB, queue depths 1-128, 1 GiB per point) or the quick one
    (4 sizes, queue depths 1/8/32, 1 and ``max_processes`` processes, 256 MiB per point).
    ``max_processes`` defaults to the CPU count, at least 4 (writers wait on the device, not the CPU).

    ``sizes`` and ``queue_depths`` replace the swept values; the baseline's
    size and queue depth then become the size nearest 1 MiB on a log scale and the
    largest queue depth up to 32. ``directions`` are swept in order (write, read or both). Raises
    ValueError on empty or non-positive values or an unknown direction.
    """
    if not directions or any(d not in DIRECTIONS for d in directions):
        raise ValueError(f"directions must be among {', '.join(DIRECTIONS)}")
    max_processes = max(4, os.cpu_count() or 1) if max_processes is None else max_processes
    sizes = tuple(sorted(set(sizes or (QUICK_SIZES if quick else FULL_SIZES))))
    depths = tuple(sorted(set(queue_depths or (QUICK_QUEUE_DEPTHS if quick else FULL_QUEUE_DEPTHS))))
    if max_processes < 1 or min(sizes) < 1 or min(depths) < 1:
        raise ValueError("sizes, queue depths and processes must be positive")
    processes = (1, max_processes) if quick and max_processes > 1 else powers_of_two_up_to(max_processes)
    baseline = dataclasses.replace(
        BASELINE,
        direction=directions[0],
        size_bytes=min(sizes, key=lambda s: (abs(math.log2(s / MIB)), s)),
        queue_depth=max([d for d in depths if d <= BASELINE.queue_depth] or [min(depths)]),
    )
    values = {
        "size_bytes": sizes,
        "misaligned_bytes": (0, MISALIGNMENT_BYTES),
        "queue_depth": depths,
        "processes": processes,
        "direct": (False, True),
        "engine": ENGINES,
        "aggregated": (False, True),
        "preallocated": (False, True),
        "direction": tuple(dict.fromkeys(directions)),
    }
    volume = (256 * MIB if quick else GIB) if volume_bytes is None else volume_bytes
    return Matrix(values=values, baseline=baseline, volume_bytes=volume, aggregate_bytes=aggregate_bytes)


def stream_bytes(point: BenchPoint, volume_bytes: int) -> int:
    """Bytes one process of ``point`` writes (or reads): its share of the volume in whole pieces, at least one piece."""
    share = volume_bytes // point.processes
    return max(point.size_bytes, share // point.size_bytes * point.size_bytes)


def pieces(point: BenchPoint, stream: int) -> Iterator[tuple[int, int]]:
    """(file offset, bytes) of each application write of a stream of ``stream`` bytes, in order."""
    for start in range(0, stream, point.size_bytes):
        yield point.misaligned_bytes + start, min(point.size_bytes, stream - start)


def staging_writes(point: BenchPoint, stream: int, aggregate_bytes: int, block_bytes: int) -> list[tuple[int, int]]:
    """(file offset, bytes) of each staging-buffer write of an aggregated stream, in order.

    Buffer j covers the file's [j*aggregate_bytes, (j+1)*aggregate_bytes);
    every write starts there and is a multiple of ``block_bytes`` (the last
    rounded up), so O_DIRECT takes all of them.
    """
    end = point.misaligned_bytes + stream
    writes = []
    for offset in range(0, end, aggregate_bytes):
        size = min(aggregate_bytes, end - offset)
        writes.append((offset, -(-size // block_bytes) * block_bytes))
    return writes


def label(dimension: str, value) -> str:
    """A value as the heat maps and tables show it: 4096 -> '4 KiB', direct True -> 'O_DIRECT'."""
    if dimension == "size_bytes":
        return (
            f"{value >> 20} MiB"
            if value >= MIB and value % MIB == 0
            else (f"{value >> 10} KiB" if value % KIB == 0 else f"{value} B")
        )
    if dimension == "misaligned_bytes":
        return f"+{value} B" if value else "aligned"
    if dimension == "direct":
        return "O_DIRECT" if value else "buffered"
    if dimension == "engine":
        return "io_uring" if value == "uring" else "POSIX"
    if dimension == "aggregated":
        return "aggregated" if value else "not aggregated"
    if dimension == "preallocated":
        return "fallocate" if value else "no fallocate"
    if dimension == "direction":
        return "reads" if value == "read" else "writes"
    return str(value)


TITLES = {
    "size_bytes": "request size",
    "misaligned_bytes": "alignment",
    "queue_depth": "queue depth",
    "processes": "processes",
    "direct": "page cache",
    "engine": "engine",
    "aggregated": "aggregation",
    "preallocated": "preallocation",
    "direction": "direction",
}


def describe(point: BenchPoint) -> str:
    """One line for a person: '1 MiB aligned writes, io_uring QD 32, O_DIRECT, not aggregated, fallocate, 1 process'
    ('1 MiB aligned reads, POSIX pread, ...' for reads, which have no preallocation)."""
    reads = point.direction == "read"
    engine = (
        f"io_uring QD {point.queue_depth}" if point.engine == "uring" else ("POSIX pread" if reads else "POSIX pwrite")
    )
    processes = f"{point.processes} process" + ("es" if point.processes > 1 else "")
    prealloc = "" if reads else f"{label('preallocated', point.preallocated)}, "
    return (
        f"{label('size_bytes', point.size_bytes)} {label('misaligned_bytes', point.misaligned_bytes)} "
        f"{label('direction', point.direction)}, {engine}, {label('direct', point.direct)}, "
        f"{label('aggregated', point.aggregated)}, {prealloc}{processes}"
    )
