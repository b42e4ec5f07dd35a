"""The layout table: which bytes of a checkpoint's files hold what.

One row per byte range of a checkpoint file (see ``formats/README.md``,
"The checkpoint's layout"): ``path`` (absolute, as the trace names files),
``offset`` and ``length`` in bytes, ``name`` (the tensor's FQN or the
state-dict key, or a name in angle brackets for a file's own structure,
``<safetensors header>``), ``kind`` (``KINDS``), ``dtype``, the tensor's
global ``shape``, the chunk's ``chunk_offsets`` and ``chunk_sizes`` within
the global tensor (sharded tensors), and the file's ``format``
(``FORMATS``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa

KINDS = (
    "model",
    "optimizer.exp_avg",
    "optimizer.exp_avg_sq",
    "optimizer.step",
    "optimizer.other",
    "extra",
    "metadata",
    "index",
    "unknown",
)
FORMATS = ("dcp", "safetensors", "torch_save", "hf_index", "torchsnapshot", "unknown")

LAYOUT_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("dtype", pa.string()),
        pa.field("shape", pa.list_(pa.int64())),
        pa.field("chunk_offsets", pa.list_(pa.int64())),
        pa.field("chunk_sizes", pa.list_(pa.int64())),
        pa.field("format", pa.string(), nullable=False),
    ]
)

_OPTIMIZER_ROOTS = (
    "optim",
    "optimizer",
    "optimizers",
    "optim_state",
    "optimizer_state",
    "optimizer_state_dict",
    "optim_state_dict",
    "optimizer_states",
)
_OPTIMIZER_STATES = {"exp_avg": "optimizer.exp_avg", "exp_avg_sq": "optimizer.exp_avg_sq", "step": "optimizer.step"}


def classify(parts: Sequence, *, tensor: bool) -> str:
    """The kind of a state-dict entry from its key path (``('optim', 'state', 'wte.weight', 'exp_avg')``, or an
    FQN split at dots). The rule, in order: a path whose last part is ``exp_avg``/``exp_avg_sq`` is that
    optimizer state; a path under an optimizer root (its first part one of ``_OPTIMIZER_ROOTS``) is the
    optimizer state its last part named ``exp_avg``, ``exp_avg_sq`` or ``step`` says, else
    ``optimizer.other`` (``param_groups``, momentum buffers); a part ``_extra_state`` or a non-tensor value is ``extra``; any other tensor is ``model``."""
    words = [str(part) for part in parts]
    dotted = [piece for word in words for piece in word.split(".")]
    last = dotted[-1] if dotted else ""
    under_optimizer = bool(dotted) and dotted[0].lower() in _OPTIMIZER_ROOTS
    if last in ("exp_avg", "exp_avg_sq"):
        return _OPTIMIZER_STATES[last]
    if under_optimizer:
        for piece in reversed(dotted):  # optim.exp_avg.<param> as well as optim.state.<param>.exp_avg
            if piece in _OPTIMIZER_STATES:
                return _OPTIMIZER_STATES[piece]
        return "optimizer.other"
    if "_extra_state" in dotted or not tensor:
        return "extra"
    return "model"


@dataclass(frozen=True)
class Entry:
    """One byte range of a checkpoint file and what it holds (a row of the layout table)."""

    path: str
    offset: int
    length: int
    name: str | None
    kind: str
    format: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    chunk_offsets: tuple[int, ...] | None = None
    chunk_sizes: tuple[int, ...] | None = None


def to_table(entries: Iterable[Entry], metadata: dict | None = None) -> pa.Table:
    """The layout table of ``entries``, sorted by (path, offset)."""
    rows = sorted(entries, key=lambda e: (e.path, e.offset, e.length))
    columns = {name: [] for name in LAYOUT_SCHEMA.names}
    for entry in rows:
        for name in LAYOUT_SCHEMA.names:
            value = getattr(entry, name)
            columns[name].append(list(value) if isinstance(value, tuple) else value)
    table = pa.Table.from_arrays([pa.array(columns[f.name], f.type) for f in LAYOUT_SCHEMA], schema=LAYOUT_SCHEMA)
    if metadata:
        import json

        table = table.replace_schema_metadata({b"ckpt_trace_layout": json.dumps(metadata, sort_keys=True).encode()})
    return table
