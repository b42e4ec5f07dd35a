"""``posix``: the recorded operations as recorded, by POSIX system calls (``replayer.posix``). The reference
every other strategy is compared with."""

from __future__ import annotations

from ckpt_trace import config

from ..engine import Executor
from ..paths import TargetRoot
from ..posix import posix_executor
from . import Strategy


def _executor(root: TargetRoot, queue_depth: int) -> Executor:
    del queue_depth  # no ring
    return posix_executor(root, config.REPLAY_MAX_IO_BYTES)


STRATEGY = Strategy(
    name="posix",
    summary="the recorded system calls, as recorded",
    executor=_executor,
    order=0,
    fio_args=("--ioengine=psync", "--bs=4k", "--fallocate=none"),
)
