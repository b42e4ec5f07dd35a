"""The checkpoint's layout: a table of the byte ranges of a checkpoint's files and what each holds.

``build_layout(paths)`` reads the checkpoint's own index data (DCP's
``.metadata``, safetensors headers, ``torch.save``'s ``data.pkl``, Hugging
Face ``*.index.json``, torchsnapshot's ``.snapshot_metadata``) without
running code from it; files it does not recognise are listed as
``unknown``. ``add_layout`` stores a layout in a trace and ``read_layout``
reads it back; the stored form is documented in ``formats/README.md``
("The checkpoint's layout").
"""

from .build import Layout, build_layout, candidate_files
from .parsers import LayoutError
from .safepickle import UnsafePickleError, safe_loads
from .store import LAYOUT_METADATA_KEY, add_layout, decode_layout, encode_layout, read_layout
from .table import FORMATS, KINDS, LAYOUT_SCHEMA, Entry, classify, to_table

__all__ = [
    "FORMATS",
    "KINDS",
    "LAYOUT_METADATA_KEY",
    "LAYOUT_SCHEMA",
    "Entry",
    "Layout",
    "LayoutError",
    "UnsafePickleError",
    "add_layout",
    "build_layout",
    "candidate_files",
    "classify",
    "decode_layout",
    "encode_layout",
    "read_layout",
    "safe_loads",
    "to_table",
]
