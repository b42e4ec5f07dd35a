"""The optimized checkpoint writer that ``ckpt-trace emit`` hands to users.

``WriterOptions`` needs nothing but the standard library; ``CheckpointWriter``
and ``CheckpointReader`` (torch.distributed.checkpoint storage layers) import
torch on first use: ``pip install 'ckpt-trace[torch]'``.
"""

from .options import WriterOptions

__all__ = ["CheckpointReader", "CheckpointWriter", "WriterOptions"]


def __getattr__(name: str):
    if name in ("CheckpointReader", "CheckpointWriter"):
        from . import storage

        return getattr(storage, name)
    raise AttributeError(name)
