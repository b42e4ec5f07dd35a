"""``uring-buffered``: the recorded reads and writes submitted through io_uring, through the page cache
(``replayer.uring``)."""

from __future__ import annotations

from ckpt_trace import config

from ..engine import Executor
from ..paths import TargetRoot
from ..uring import uring_executor
from . import Strategy


def _executor(root: TargetRoot, queue_depth: int) -> Executor:
    return uring_executor(
        root, config.REPLAY_MAX_IO_BYTES, queue_depth=queue_depth, direct=False, strategy="uring-buffered"
    )


STRATEGY = Strategy(
    name="uring-buffered",
    summary="the recorded reads and writes through io_uring, buffered",
    executor=_executor,
    order=10,
    uses_queue_depth=True,
    named_path="io_uring",
    named_path_members=("io_uring_buffered", "io_uring_direct"),
    fio_args=("--ioengine=io_uring", "--iodepth={depth}", "--bs=4k", "--fallocate=none"),
)
