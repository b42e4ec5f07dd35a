"""``ckpt-trace anonymize``: a trace that can be shared with a vendor, with the I/O pattern intact.

Replaced, in the rows and in the metadata:

- every path component (``path``, ``new_path``, mount points, paths inside any metadata text) by a stable
  keyed hash, ``p`` and 10 hex digits, keeping the directory structure (``/``, ``.`` and ``..`` stay) and
  a short file extension (``.distcp``, ``.safetensors``: what engine wrote it): one name always becomes
  the same hash, so each file keeps its identity and the replay its pattern;
- the command line (each word becomes ``<word N>``), process names (``comm``, ``c`` and 8 hex digits),
  the host name (metadata and the ``host`` column) and user names (the password database's people,
  uid 1000 and up, and $USER / $SUDO_USER) wherever they occur in metadata text.

Kept: sizes, offsets, flags, times, pids, ranks, operations, file system types, block sizes and device
models, kernel release and architecture. The hash is HMAC-SHA-256 (RFC 2104) under ``key``: random per run
unless given (``--key``), and never stored, so the names cannot be tested against guesses; the same key
gives the same names across traces (to compare two of them).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pwd
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from ckpt_trace.formats import TraceWriter, scan
from ckpt_trace.formats.atomic import refuse_input
from ckpt_trace.iolayer.outputs import check_output_file

from .summary import Progress, on_batch

KEPT = (
    "sizes",
    "offsets",
    "flags",
    "times",
    "pids",
    "ranks",
    "operations",
    "file system types and block sizes",
    "device models",
    "kernel release",
    "architecture",
    "file extensions of up to 12 letters or digits",
)
REPLACED = ("path components (rows and metadata)", "command line", "process names (comm)", "host name", "user names")
_EXTENSION = re.compile(r"(\.[A-Za-z0-9]{1,12})$")
_PATH_IN_TEXT = re.compile(r"(?<![\w.~-])/[^\s'\"(),;:=\[\]{}<>]*")


class Anonymizer:
    """Stable replacements under one key (``path``, ``comm``, ``text``); pure apart from its caches."""

    def __init__(self, key: bytes, host: str | None, users: set[str]) -> None:
        self.key = key
        self.names: dict[str, str] = {}
        self.host = host
        self.users = {u for u in users if len(u) >= 2}

    def _hash(self, kind: str, text: str, digits: int) -> str:
        return hmac.new(self.key, f"{kind}\0{text}".encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()[
            :digits
        ]

    def component(self, name: str) -> str:
        if name in ("", ".", ".."):
            return name
        if name not in self.names:
            match = _EXTENSION.search(name)
            ext = match.group(1) if match and match.start() > 0 else ""
            self.names[name] = f"p{self._hash('path', name, 10)}{ext}"
        return self.names[name]

    def path(self, value: str | None) -> str | None:
        return None if value is None else self._path(value)

    def _path(self, value: str) -> str:
        return "/".join(self.component(part) for part in value.split("/"))

    def comm(self, value: str | None) -> str | None:
        return None if value is None else f"c{self._hash('comm', value, 8)}"

    def host_name(self, value: str | None) -> str | None:
        return None if value is None else self._host_name(value)

    def _host_name(self, value: str) -> str:
        return f"host-{self._hash('host', value, 8)}"

    def text(self, value: str) -> str:
        """Free text: host and user names replaced, then every absolute path in it."""
        if self.host:
            value = value.replace(self.host, self._host_name(self.host))
        for user in self.users:
            value = re.sub(rf"(?<![\w-]){re.escape(user)}(?![\w-])", f"user-{self._hash('user', user, 6)}", value)
        return _PATH_IN_TEXT.sub(lambda m: self._path(m.group()), value)

    def anything(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.anything(v) for v in value]
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.anything(v) for k, v in value.items()}
        return value


def _users() -> set[str]:
    names = {name for k in ("USER", "SUDO_USER", "LOGNAME") if (name := os.environ.get(k)) and name != "root"}
    try:
        names |= {entry.pw_name for entry in pwd.getpwall() if entry.pw_uid >= 1000 and entry.pw_uid != 65534}
    except OSError:
        pass
    return set(names)


def _column(batch: pa.RecordBatch, name: str, replace) -> pa.Array:
    """``name`` with each distinct value replaced once (dictionary values where the column is encoded)."""
    column = batch.column(name)
    if pa.types.is_dictionary(column.type):
        values = [replace(v) for v in column.dictionary.to_pylist()]
        return pa.DictionaryArray.from_arrays(column.indices, pa.array(values, pa.string()))
    return pa.array([replace(v) for v in column.to_pylist()], pa.string())


def anonymize_metadata(meta: dict, anon: Anonymizer) -> dict:
    out = {}
    for key, value in meta.items():
        if key == "command" and isinstance(value, list):
            out[key] = [f"<word {i}>" for i in range(len(value))]
        elif key == "host" and isinstance(value, str):
            out[key] = anon.host_name(value)
        elif key == "filesystems" and isinstance(value, dict):
            out[key] = {
                anon.path(mount): {
                    k: (v if k in ("type", "block_size", "device_model", "rotational") else anon.anything(v))
                    for k, v in (info or {}).items()
                }
                if isinstance(info, dict)
                else anon.anything(info)
                for mount, info in value.items()
            }
        elif key in ("kernel", "arch", "creator", "creator_version", "format_version", "backend"):
            out[key] = value
        else:
            out[key] = anon.anything(value)
    return out


def anonymize_trace(
    trace_path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    key: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write an anonymized copy of the trace at ``trace_path`` to ``output`` (module docstring); return
    {"output", "rows", "paths", "kept", "replaced", "key"}. Raises CkptTraceError (an existing output
    without ``overwrite``, the output being the input), TraceFormatError."""
    trace_path, output = Path(trace_path), Path(output)
    check_output_file(output, overwrite, inputs=(trace_path,))
    refuse_input(output, (trace_path,))
    meta, batches = scan(trace_path, on_batch=on_batch(progress, "anonymizing"))
    anon = Anonymizer(key.encode() if key else os.urandom(32), meta.get("host"), _users())
    rows = 0
    writer = TraceWriter(output, overwrite=overwrite)  # the optional columns of the first rows (host)
    try:
        for batch in batches:
            columns = {name: batch.column(name) for name in batch.schema.names}
            for name in ("path", "new_path"):
                columns[name] = _column(batch, name, anon.path)
            columns["comm"] = _column(batch, "comm", anon.comm)
            if "host" in columns:
                columns["host"] = _column(batch, "host", anon.host_name)
            writer.write(pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns)))
            rows += batch.num_rows
        metadata = anonymize_metadata(dict(meta), anon)
        metadata["anonymized"] = {
            "kept": list(KEPT),
            "replaced": list(REPLACED),
            "key": "given" if key else "random, not stored",
        }
        writer.close(metadata)
    except BaseException:
        writer.abort()
        raise
    return {
        "output": str(output),
        "rows": rows,
        "paths": len(anon.names),
        "kept": list(KEPT),
        "replaced": list(REPLACED),
        "key": "given" if key else "random, not stored",
    }
