"""The optimized checkpoint writer that ``ckpt-trace emit`` hands to users.

``layout`` places items (pure), ``format`` is the on-disk format and the
commit, ``staging`` moves bytes through aligned buffers and io_uring (the I/O
layer), ``save`` and ``load`` adapt them to DCP's StorageWriter and
StorageReader, ``emit`` chooses the options and writes the module.

``WriterOptions`` needs nothing but the standard library; ``CheckpointWriter``
and ``CheckpointReader`` (torch.distributed.checkpoint storage layers) and
``load_state_dict`` (a one-process restore without DCP's planner) import
torch on first use. All but ``emit`` ship alone as ckpt-trace-runtime (torch
and numpy; no pyarrow), what an emitted module needs in a training image:
``pip wheel --no-deps ./runtime`` in ckpt-trace's repository builds it.
"""

from typing import TYPE_CHECKING

from .options import WriterOptions

if TYPE_CHECKING:  # imported on first use (``__getattr__``): importing this package imports no torch
    from .load import CheckpointReader, load_state_dict
    from .save import CheckpointWriter

__all__ = ["CheckpointReader", "CheckpointWriter", "WriterOptions", "load_state_dict"]


def __getattr__(name: str):
    if name == "CheckpointWriter":
        from .save import CheckpointWriter

        return CheckpointWriter
    if name == "CheckpointReader":
        from .load import CheckpointReader

        return CheckpointReader
    if name == "load_state_dict":
        from .load import load_state_dict

        return load_state_dict
    raise AttributeError(name)
