"""``posix``: the recorded operations as recorded, by POSIX system calls (``replayer.posix``). The reference
every other strategy is compared with."""

from __future__ import annotations

from ckpt_trace import config

from ..paths import TargetRoot
from ..posix import PosixExecutor
from . import Strategy


def _executor(root: TargetRoot, queue_depth: int) -> PosixExecutor:
    del queue_depth  # no ring
    return PosixExecutor(root, config.REPLAY_MAX_IO_BYTES)


STRATEGY = Strategy(
    name="posix",
    summary="the recorded system calls, as recorded",
    executor=_executor,
    order=0,
    fio_args=("--ioengine=psync", "--bs=4k", "--fallocate=none"),
)
