"""``export``: a trace as Chrome trace-event JSON (Perfetto) or as Parquet partitioned by rank.

Perfetto: the Trace Event Format (Chrome, "JSON Array/Object Format"):
``ts``/``dur`` in microseconds; each process and thread is named with "M"
metadata events; each operation is an async pair ("b"/"e") with its own id,
so operations that overlap in time on one track still render (complete "X"
events on a track must nest, which concurrent I/O does not). ``args`` carry
syscall, path, offset, size and return value. ui.perfetto.dev opens the file.

Parquet: one Hive-style directory per rank (``rank=0/...``) readable by
Spark, Dask, DuckDB and pyarrow.dataset; the trace's metadata is kept in
``_ckpt_trace.json`` beside the partitions.

Both check their output before reading the trace, and never remove what
they did not write.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pyarrow.dataset as ds

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import Trace, write_bytes_atomic
from ckpt_trace.iolayer.outputs import check_output_dir, check_output_file

FORMATS = ("perfetto", "parquet")
METADATA_FILE = "_ckpt_trace.json"
_ARG_COLUMNS = ("syscall", "path", "new_path", "offset", "size", "ret", "fd", "flags", "rank")


def _metadata_events(table) -> list[dict]:
    events = []
    seen_pids, seen_tids = set(), set()
    for pid, tid, comm, rank in zip(*(table[c].to_pylist() for c in ("pid", "tid", "comm", "rank"))):
        if pid not in seen_pids:
            seen_pids.add(pid)
            label = f"{comm or 'process'} (rank {rank})" if rank >= 0 else (comm or "process")
            events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
        if (pid, tid) not in seen_tids:
            seen_tids.add((pid, tid))
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"{comm or ''} {tid}"}})
    return events


def _write_perfetto(trace: Trace, handle) -> int:
    table = trace.table
    columns = {c: table[c].to_pylist() for c in ("ts_ns", "dur_ns", "pid", "tid", "op") + _ARG_COLUMNS}
    handle.write('{"displayTimeUnit": "ns", "otherData": ')
    handle.write(json.dumps({"ckpt_trace": dict(trace.metadata)}))
    handle.write(', "traceEvents": [\n')
    events = _metadata_events(table)
    for index, event in enumerate(events):
        handle.write(("," if index else "") + json.dumps(event) + "\n")
    count = len(events)
    for row in range(table.num_rows):
        args = {c: columns[c][row] for c in _ARG_COLUMNS if columns[c][row] is not None}
        base = {"cat": "io", "name": columns["op"][row], "id": row, "pid": columns["pid"][row],
                "tid": columns["tid"][row]}
        begin = {**base, "ph": "b", "ts": columns["ts_ns"][row] / 1000, "args": args}
        end = {**base, "ph": "e", "ts": (columns["ts_ns"][row] + columns["dur_ns"][row]) / 1000}
        handle.write("," + json.dumps(begin) + "\n," + json.dumps(end) + "\n")
        count += 2
    handle.write("]}\n")
    return count


def export_perfetto(trace: Trace, output: Path, *, overwrite: bool = False) -> int:
    """Write ``trace`` as Chrome trace-event JSON to ``output`` atomically; return the number of events.

    Raises CkptTraceError when ``output`` exists and ``overwrite`` is false, or on a write failure
    (the temporary file is removed; ``output`` is untouched).
    """
    output = check_output_file(output, overwrite)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as handle:
            count = _write_perfetto(trace, handle)
        os.replace(tmp, output)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise CkptTraceError(f"cannot write {output}: {err.strerror}") from None
        raise
    return count


def export_parquet(trace: Trace, output: Path, *, overwrite: bool = False) -> int:
    """Write ``trace`` as Parquet partitioned by rank under the directory ``output``; return the row count.

    A new directory is built beside ``output`` and renamed into place. With
    ``overwrite`` an existing directory is allowed: the partitions are
    written into it under names of this export (``part-{uuid}-N.parquet``)
    and nothing in it is removed, but a directory holding an earlier export
    is refused (its partitions would add to this one's rows). On failure,
    only the files this export wrote are removed. Raises CkptTraceError.
    """
    output = Path(output)
    if output.exists():
        check_output_dir(output, overwrite)
        earlier = [p.name for p in output.iterdir() if p.name == METADATA_FILE or p.name.startswith("rank=")]
        if earlier:
            raise CkptTraceError(f"{output} holds an earlier export ({earlier[0]}); its partitions would mix with "
                                 "this one's: choose a new directory")
        return _write_partitions(trace, output, output, cleanup_root=False)
    check_output_dir(output.parent if str(output.parent) else Path("."), True, create=False)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    count = _write_partitions(trace, tmp, output, cleanup_root=True)
    try:
        os.replace(tmp, output)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CkptTraceError(f"cannot write {output}: {err.strerror}") from None
    return count


def _write_partitions(trace: Trace, directory: Path, output: Path, cleanup_root: bool) -> int:
    written: list[str] = []
    try:
        ds.write_dataset(trace.table, directory, format="parquet", partitioning=["rank"], partitioning_flavor="hive",
                         basename_template=f"part-{uuid.uuid4().hex}-{{i}}.parquet",
                         existing_data_behavior="overwrite_or_ignore",
                         file_visitor=lambda written_file: written.append(written_file.path))
        write_bytes_atomic(directory / METADATA_FILE, json.dumps(dict(trace.metadata), indent=1,
                                                                 sort_keys=True).encode())
    except BaseException as err:
        if cleanup_root:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            for path in written:
                Path(path).unlink(missing_ok=True)
            for path in {Path(p).parent for p in written}:
                try:
                    path.rmdir()
                except OSError:
                    pass
        if isinstance(err, OSError):
            raise CkptTraceError(f"cannot write {output}: {err.strerror or err}") from None
        raise
    return trace.num_rows
