"""Trace files survive their writer dying and reject every kind of damage with one line.

- A writer killed (SIGKILL) or failing (ENOSPC) during the final write leaves
  the previous file, or none, under the final name: never a partial one.
- Valid traces mutated (bytes flipped, truncated, a column retyped, metadata
  dropped or corrupted) give every reading command a one-line error, never a
  traceback (hypothesis generates the mutations).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from helpers.traces import META
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import METADATA_KEY, SCHEMA, read_trace, write_trace

GOLDEN = Path(__file__).resolve().parent.parent / "traces" / "golden"
ODD = GOLDEN / "v1-odd-pattern-strace.arrow"
DCP = GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow"

BIG_WRITER = r"""
import sys
import numpy as np, pyarrow as pa
from ckpt_trace.formats.schema import SCHEMA_V1
from ckpt_trace.formats import write_trace
n = int(sys.argv[2])
rng = np.random.default_rng(0)
columns = {"ts_ns": np.arange(n, dtype=np.int64), "dur_ns": rng.integers(0, 10000, n), "pid": np.full(n, 7, np.int32),
           "tid": np.full(n, 7, np.int32), "comm": pa.array(["python"] * n), "rank": np.zeros(n, np.int32),
           "syscall": pa.array(["pwrite64"] * n), "op": pa.array(["write"] * n), "fd": np.full(n, 3, np.int32),
           "path": pa.array(["/x/a"] * n), "new_path": pa.nulls(n, pa.string()), "offset": rng.integers(0, 1 << 40, n),
           "offset_source": pa.array(["explicit"] * n), "size": rng.integers(0, 1 << 20, n),
           "ret": rng.integers(0, 1 << 20, n), "flags": pa.nulls(n, pa.int64()), "iov_count": pa.nulls(n, pa.int32())}
table = pa.table({k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in columns.items()}).cast(SCHEMA_V1)
meta = {"creator": "t", "creator_version": "0", "host": "h", "kernel": "k", "command": ["x"], "backend": "strace",
        "start_wall_time_ns": 0, "filesystems": {}, "lost_events": 0, "arch": "x86_64"}
print("writing", flush=True)
write_trace(sys.argv[1], table, meta, overwrite=True)
print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("previous", [True, False], ids=["over-a-previous-trace", "new"])
def test_a_writer_killed_during_the_final_write_leaves_the_previous_file_or_none(tmp_path, previous):
    final = tmp_path / "t.arrow"
    if previous:
        final.write_bytes(ODD.read_bytes())
    proc = subprocess.Popen(
        [sys.executable, "-c", BIG_WRITER, str(final), "6000000"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "writing"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the temporary file has a random name beside the trace
        temporary = next(iter(tmp_path.glob(".t.arrow.*.tmp")), tmp_path / ".none")
        if temporary.exists() and temporary.stat().st_size > 8 << 20:
            break
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and temporary.exists(), "the kill must land inside the final write"
    if previous:
        assert final.read_bytes() == ODD.read_bytes() and read_trace(final).num_rows > 0
    else:
        assert not final.exists()


def test_a_full_disk_during_the_final_write_leaves_the_previous_file(small_tmpfs):
    final = small_tmpfs / "t.arrow"
    final.write_bytes(ODD.read_bytes())
    import numpy as np

    table = pa.concat_tables([read_trace(DCP).table] * 200)
    noise = np.random.default_rng(0).integers(0, 1 << 62, table.num_rows)  # incompressible: > 1 MiB on disk
    big = table.set_column(table.schema.get_field_index("offset"), "offset", pa.array(noise))
    with pytest.raises(CkptTraceError, match="No space left on device"):
        write_trace(final, big, META, overwrite=True)
    assert final.read_bytes() == ODD.read_bytes()
    assert [p.name for p in small_tmpfs.iterdir()] == ["t.arrow"]  # the temporary file is gone


# -- mutated traces ------------------------------------------------------------------------------------------

READING_COMMANDS = (
    ["summary", "{t}"],
    ["summary", "{t}", "--json"],
    ["diff", "{t}", str(ODD), "--json"],
    ["replay", "{t}", "--dry-run", "--target", "{d}/target"],
    ["export", "{t}", "--format", "perfetto", "-o", "{d}/e.json"],
    ["export", "{t}", "--format", "parquet", "-o", "{d}/pq"],
    ["report", "{t}", "-o", "{d}/r.html"],
    ["emit", "{t}", "-o", "{d}/w.py"],
)


def run_in_process(args: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``ckpt-trace ARGS`` run in this process; an uncaught exception fails the test."""
    from ckpt_trace.cli import main

    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
        except SystemExit as done:
            code = done.code
    return code, err.getvalue()


def assert_every_reader_copes(trace: Path, workdir: Path) -> None:
    for template in READING_COMMANDS:
        workdir.mkdir(exist_ok=True)
        for leftover in workdir.iterdir():
            if leftover.is_file():
                leftover.unlink()
        args = [part.format(t=trace, d=workdir) for part in template]
        code, stderr = run_in_process(args)
        lines = stderr.strip().splitlines()
        assert "Traceback" not in stderr, (args, stderr)
        if code != 0:
            assert code == 2 and len(lines) == 1 and lines[0].startswith("ckpt-trace: error:"), (args, code, stderr)


def rewrite(source: Path, target: Path, table: pa.Table | None = None, metadata: bytes | None = ...) -> None:
    """Write ``table`` (default: the source's) as an Arrow file with the given schema metadata value."""
    original = ipc.open_file(source).read_all()
    table = original if table is None else table
    raw = (original.schema.metadata or {}).get(METADATA_KEY) if metadata is ... else metadata
    table = table.replace_schema_metadata({METADATA_KEY: raw} if raw is not None else None)
    with ipc.new_file(str(target), table.schema) as writer:
        writer.write_table(table)


GOLDENS = st.sampled_from([ODD, DCP])
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(
    golden=GOLDENS,
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)), min_size=1, max_size=8),
)
def test_flipped_bytes(tmp_path, golden, flips):
    data = bytearray(golden.read_bytes())
    for where, bit in flips:
        data[int(where * len(data))] ^= 1 << bit
    trace = tmp_path / "m.arrow"
    trace.write_bytes(bytes(data))
    assert_every_reader_copes(trace, tmp_path / "w")


@SETTINGS
@given(golden=GOLDENS, keep=st.floats(0, 1, exclude_max=True))
def test_truncated_files(tmp_path, golden, keep):
    data = golden.read_bytes()
    trace = tmp_path / "m.arrow"
    trace.write_bytes(data[: int(keep * len(data))])
    assert_every_reader_copes(trace, tmp_path / "w")


RETYPES = {
    "ts_ns": pa.float64(),
    "pid": pa.int64(),
    "op": pa.large_string(),
    "offset": pa.string(),
    "size": pa.int32(),
    "path": pa.binary(),
    "ret": pa.float32(),
}


@SETTINGS
@given(golden=GOLDENS, column=st.sampled_from(sorted(RETYPES)))
def test_retyped_columns(tmp_path, golden, column):
    table = ipc.open_file(golden).read_all()
    index = table.schema.get_field_index(column)
    table = table.set_column(index, pa.field(column, RETYPES[column]), table[column].cast(RETYPES[column]))
    trace = tmp_path / "m.arrow"
    rewrite(golden, trace, table)
    with pytest.raises(CkptTraceError, match=f"column '{column}' has type"):
        read_trace(trace)
    assert_every_reader_copes(trace, tmp_path / "w")


@SETTINGS
@given(
    golden=GOLDENS,
    damage=st.sampled_from(["drop-key", "not-json", "not-object", "drop-metadata", "future-version", "drop-column"]),
    key=st.sampled_from(["format_version", "command", "backend", "lost_events", "filesystems"]),
)
def test_damaged_metadata_and_missing_columns(tmp_path, golden, damage, key):
    original = ipc.open_file(golden).read_all()
    meta = json.loads(original.schema.metadata[METADATA_KEY])
    table, raw = None, ...
    if damage == "drop-key":
        meta.pop(key)
        raw = json.dumps(meta).encode()
    elif damage == "not-json":
        raw = b"{not json"
    elif damage == "not-object":
        raw = b"[1, 2]"
    elif damage == "drop-metadata":
        raw = None
    elif damage == "future-version":
        raw = json.dumps({**meta, "format_version": 99}).encode()
    else:
        table = original.drop_columns([SCHEMA.names[len(key) % len(SCHEMA.names)]])
    trace = tmp_path / "m.arrow"
    rewrite(golden, trace, table, raw)
    with pytest.raises(CkptTraceError):
        read_trace(trace)
    assert_every_reader_copes(trace, tmp_path / "w")
