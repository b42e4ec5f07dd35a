"""The optimized checkpoint writer that ``ckpt-trace emit`` hands to users.

``layout`` places items (pure), ``format`` is the on-disk format and the
commit, ``staging`` moves bytes through aligned buffers and io_uring (the I/O
layer), ``save`` and ``load`` adapt them to DCP's StorageWriter and
StorageReader, ``emit`` chooses the options and writes the module.

``WriterOptions`` needs nothing but the standard library; ``CheckpointWriter``
and ``CheckpointReader`` (torch.distributed.checkpoint storage layers) import
torch on first use. All but ``emit`` ship alone as ckpt-trace-runtime (torch
and numpy; no pyarrow), what an emitted module needs in a training image:
``pip wheel --no-deps ./runtime`` in ckpt-trace's repository builds it.
"""

from .options import WriterOptions

__all__ = ["CheckpointReader", "CheckpointWriter", "WriterOptions"]


def __getattr__(name: str):
    if name == "CheckpointWriter":
        from .save import CheckpointWriter

        return CheckpointWriter
    if name == "CheckpointReader":
        from .load import CheckpointReader

        return CheckpointReader
    raise AttributeError(name)
