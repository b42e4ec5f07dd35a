"""``uring-direct``: the recorded reads and writes submitted through io_uring with O_DIRECT
(``replayer.uring``; what O_DIRECT cannot take goes buffered, counted)."""

from __future__ import annotations

from ckpt_trace import config

from ..engine import Executor
from ..paths import TargetRoot
from ..uring import uring_executor
from . import Strategy


def _executor(root: TargetRoot, queue_depth: int) -> Executor:
    return uring_executor(
        root, config.REPLAY_MAX_IO_BYTES, queue_depth=queue_depth, direct=True, strategy="uring-direct"
    )


STRATEGY = Strategy(
    name="uring-direct",
    summary="the recorded reads and writes through io_uring with O_DIRECT",
    executor=_executor,
    order=20,
    direct_io=True,
    uses_queue_depth=True,
    named_path="io_uring+O_DIRECT",
    named_path_members=("io_uring_direct",),
    fio_args=("--ioengine=io_uring", "--iodepth={depth}", "--bs=4k", "--direct=1", "--fallocate=none"),
)
