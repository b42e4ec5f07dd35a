"""A trace of any supported format version rewritten as the current one (``ckpt-trace upgrade``).

The rows are read batch by batch (``io.scan``: versions 1 to 3 upgraded,
version 4's stored differences decoded) and written by ``io.TraceWriter``,
so memory stays bounded by a batch; the metadata is kept, with
``format_version`` set to the current version and the optional key
``upgraded_from`` ({"format_version", "sha256"} of the original) added;
other schema-metadata keys (a layout) are carried as they are. The original
is never modified.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from .errors import CkptTraceError
from .io import DEFAULT_BATCH_ROWS, TraceWriter, scan, sha256_file
from .schema import FORMAT_VERSION, METADATA_KEY, OPTIONAL_COLUMNS


def upgrade_trace(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    overwrite: bool = False,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    on_batch: Callable[[int, int], None] | None = None,
) -> dict:
    """Write the trace at ``source`` (any of ``SUPPORTED_VERSIONS``) to ``output`` as ``FORMAT_VERSION``.

    Returns {"input", "output", "from_version", "to_version", "rows", "input_bytes", "output_bytes"}.
    ``on_batch(done, count)``: progress over the input's record batches.
    Raises CkptTraceError when ``output`` is ``source`` (the same file, by any name) or exists and
    ``overwrite`` is false, or the file system refuses; TraceFormatError when ``source`` is not a readable
    trace. Nothing is left at ``output`` on failure.
    """
    source, output = Path(source), Path(output)
    if output.resolve() == source.resolve() or (
        output.exists() and source.exists() and os.path.samefile(output, source)
    ):
        raise CkptTraceError(f"{output} is the input trace; write the upgraded trace to another file")
    meta, batches = scan(source, batch_rows=batch_rows, on_batch=on_batch)
    with pa.OSFile(str(source)) as handle:
        schema = ipc.open_file(handle).schema
    other_keys = {key: value for key, value in (schema.metadata or {}).items() if key != METADATA_KEY}
    optional = [name for name in schema.names if name in OPTIONAL_COLUMNS] if meta["format_version"] >= 5 else []
    original = meta["format_version"]
    metadata = {key: value for key, value in meta.items() if key != "format_version"}
    metadata["upgraded_from"] = {"format_version": original, "sha256": sha256_file(source)}
    writer = TraceWriter(output, overwrite=overwrite, batch_rows=batch_rows, optional_columns=optional)
    try:
        for batch in batches:
            writer.write(batch)
        writer.close(metadata, other_keys=other_keys)
    except BaseException:
        writer.abort()
        raise
    return {
        "input": str(source),
        "output": str(output),
        "from_version": original,
        "to_version": FORMAT_VERSION,
        "rows": writer.rows,
        "input_bytes": source.stat().st_size,
        "output_bytes": output.stat().st_size,
    }
