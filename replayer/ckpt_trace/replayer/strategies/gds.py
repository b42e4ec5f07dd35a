"""``gds``: the recorded reads and writes between the file and GPU memory through cuFile, by KvikIO
(``replayer.gds``). Replayed only when named: it needs a GPU and KvikIO."""

from __future__ import annotations

from ckpt_trace import config
from ckpt_trace.errors import ReplayError

from ..engine import Executor
from ..paths import TargetRoot
from . import Strategy


def _executor(root: TargetRoot, queue_depth: int) -> Executor:
    from ..gds import gds_executor
    from ..gds import probe as gds_probe

    del queue_depth  # no ring
    problem, mode = gds_probe()
    if problem or mode is None:
        raise ReplayError(f"strategy gds: {problem or 'no GDS mode'}")
    return gds_executor(root, config.REPLAY_MAX_IO_BYTES, mode)


STRATEGY = Strategy(
    name="gds",
    summary="reads and writes to and from GPU memory through cuFile (KvikIO)",
    executor=_executor,
    in_all=False,
    only_when_named="GPU + KvikIO",
    order=40,
    direct_io=True,
    named_path="cuFile",
    named_path_members=("cufile",),
)
