"""I/O paths engines take beyond plain read/write, captured on both backends and checked against references
the project does not produce: strace's own log of the same run and the program's own log of what it did.

- libaio batches: two threads sharing one AIO context, each io_submit carrying 1-4 O_DIRECT iocbs
  (``ckpt_trace.workloads.aio_threads``).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import cli

from ckpt_trace.formats import read_trace

_IOCB = re.compile(r"aio_fildes=\d+<([^>]+)>.*?aio_nbytes=(\d+), aio_offset=(\d+)\}")


def _strace_iocbs(log: Path) -> Counter:
    """(path, offset, bytes) of every iocb strace printed in an io_submit line of its own log (-y)."""
    found = Counter()
    for line in log.read_text(errors="replace").splitlines():
        if " io_submit(" in line:
            for path, size, offset in _IOCB.findall(line):
                found[(path, int(offset), int(size))] += 1
    return found


@pytest.mark.parametrize("attempt", range(3))
@pytest.mark.parametrize("backend_name", ["bcc", "strace"])
def test_every_iocb_of_every_batch_of_two_threads_is_in_the_trace(request, tmp_path, backend_name, attempt):
    request.getfixturevalue(f"{backend_name}_backend")
    out, log, trace = tmp_path / "out", tmp_path / "own.json", tmp_path / "t.arrow"
    command = [sys.executable, "-m", "ckpt_trace.workloads.aio_threads", str(out), str(log)]
    strace_log = tmp_path / "strace.log"
    if backend_name == "bcc" and shutil.which("strace"):
        # strace's own log of the very run bcc records (strace is traced too; it only watches io_submit)
        command = ["strace", "-f", "-qq", "-y", "-s", "8", "-e", "trace=io_submit", "-o", str(strace_log), "--",
                   *command]
    cli("record", "--backend", backend_name, "-o", str(trace), "--path-filter", f"{out}/", "--", *command)
    own = Counter((path, offset, size) for path, _, offset, size in json.loads(log.read_text()))
    assert sum(own.values()) == 384 and max(own.values()) == 1
    data = read_trace(trace)
    rows = [r for r in data.table.to_pylist() if r["interface"] == "libaio" and r["op"] == "write"]
    got = Counter((r["path"], r["offset"], r["size"]) for r in rows)
    assert got == own
    assert all(r["ret"] == 4096 and r["syscall"] == "aio:PWRITE" for r in rows)
    assert data.metadata["lost_events"] == 0 and data.metadata["unreaped_requests"] == 0
    submits = [r for r in data.table.to_pylist() if r["op"] == "io_submit"]
    assert sum(r["size"] for r in submits) == 384 and {r["size"] for r in submits} == {1, 2, 3, 4}
    assert len({r["tid"] for r in rows}) == 2, "both threads submit"
    assert {r["queue_id"] for r in rows + submits} == {0}, "queue_id numbers queues from 0 (formats/README.md)"
    if strace_log.exists():
        assert _strace_iocbs(strace_log) == got


def test_an_iocb_the_tracer_cannot_read_is_counted_as_lost(bcc_backend, tmp_path, monkeypatch):
    out, log, trace = tmp_path / "out", tmp_path / "own.json", tmp_path / "t.arrow"
    monkeypatch.setenv("CKPT_TRACE_BPF_MAX_IOCBS", "2")  # batches of 3 and 4 are longer than the tracer reads
    cli("record", "--backend", "bcc", "-o", str(trace), "--path-filter", f"{out}/", "--", sys.executable, "-m",
        "ckpt_trace.workloads.aio_threads", str(out), str(log), "48")
    data = read_trace(trace)
    submits = [r for r in data.table.to_pylist() if r["op"] == "io_submit"]
    beyond = sum(max(0, r["ret"] - 2) for r in submits)
    assert beyond > 0
    reasons = data.metadata["lost_reasons"]
    assert reasons["iocbs_unread"] == beyond
    assert data.metadata["lost_events"] == sum(reasons.values())
    rows = [r for r in data.table.to_pylist() if r["interface"] == "libaio" and r["op"] == "write"]
    assert len(rows) == 96 - beyond
