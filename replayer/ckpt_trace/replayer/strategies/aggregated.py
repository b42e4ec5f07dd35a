"""``aggregated``: the recorded writes coalesced into aligned buffers (``replayer.aggregate``; small files
packed with ``pack_files``, ``replayer.pack``), submitted through io_uring with O_DIRECT."""

from __future__ import annotations

from ckpt_trace import config
from ckpt_trace.errors import ReplayError

from ..aggregate import build_aggregated_plan
from ..engine import Executor
from ..pack import pack_plan
from ..paths import TargetRoot
from ..plan import ReplayPlan
from ..uring import uring_executor
from . import Strategy


def _derive(base: ReplayPlan, *, buffer_bytes: int, block_bytes: int, pack_files: bool) -> ReplayPlan:
    """Aggregated buffers of ``buffer_bytes`` aligned to ``block_bytes``; packed files with ``pack_files``.
    Pure. Raises ReplayError for a buffer size outside 1-64 MiB."""
    try:
        plan = build_aggregated_plan(base, buffer_bytes=buffer_bytes, block_bytes=block_bytes)
    except ValueError as err:
        raise ReplayError(f"{{option}}: {err}", option="buffer_bytes") from None
    return pack_plan(plan, block_bytes=block_bytes, buffer_bytes=buffer_bytes) if pack_files else plan


def _executor(root: TargetRoot, queue_depth: int) -> Executor:
    return uring_executor(root, config.REPLAY_MAX_IO_BYTES, queue_depth=queue_depth, direct=True, strategy="aggregated")


STRATEGY = Strategy(
    name="aggregated",
    summary="writes coalesced into aligned buffers, io_uring with O_DIRECT",
    executor=_executor,
    derive=_derive,
    order=30,
    direct_io=True,
    uses_queue_depth=True,
    uses_buffer_bytes=True,
    packs_files=True,
    named_path="io_uring+O_DIRECT",
    named_path_members=("io_uring_direct",),
    fio_args=("--ioengine=io_uring", "--iodepth={depth}", "--bs=4m", "--direct=1"),
)
