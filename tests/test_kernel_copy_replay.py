"""The POSIX replay makes an in-kernel copy by the call the trace recorded: sendfile(2), copy_file_range(2),
and splice(2) through a pipe, each copy one call of that kind moving the recorded bytes, as strace's own log
of the replay shows (``strace -f -e trace=sendfile,copy_file_range,splice``); the copies are 1 MiB and hold
the bytes of the replayed source. The other strategies read and write, and say so in their notes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from conftest import CKPT_TRACE, cli, record

from ckpt_trace.formats import read_trace

MIB = 1 << 20
COPIES = ("sendfile", "copy_file_range", "splice")
_CALL = re.compile(r"^\d+\s+(sendfile|copy_file_range|splice)\((.*)\)\s+=\s+(-?\d+)")


def _recorded_calls(trace) -> list[tuple[str, int]]:
    """(call, bytes) of each in-kernel copy call in the trace, in recorded order: one row per splice, the
    read row of a sendfile's or copy_file_range's pair."""
    rows = read_trace(trace).table.select(["ts_ns", "op", "interface", "ret"]).to_pylist()
    return [
        (row["interface"], row["ret"])
        for row in sorted(rows, key=lambda r: r["ts_ns"])
        if row["interface"] in COPIES and (row["interface"] == "splice" or row["op"] == "read")
    ]


def _replayed_calls(log) -> list[tuple[str, int, int]]:
    """(call, bytes asked, bytes moved) of each copy call strace logged (``-e trace=...``)."""
    calls = []
    for line in log.read_text().splitlines():
        m = _CALL.match(line)
        if m:
            name, args, ret = m.group(1), m.group(2).split(", "), int(m.group(3))
            count = int(args[3] if name == "sendfile" else args[4])  # (out, in, offset, count); (.., len, flags)
            calls.append((name, count, ret))
    return calls


@pytest.mark.slow
@pytest.mark.strace
@pytest.mark.parametrize("recorder", ["strace", "bcc"])
def test_posix_replay_makes_each_copy_by_its_recorded_call(recorder, request, tmp_path):
    request.getfixturevalue(f"{recorder}_backend")
    out = tmp_path / "out"
    out.mkdir()
    trace = tmp_path / "t.arrow"
    record(
        recorder, trace, out, sys.executable, "-m", "ckpt_trace.workloads.copies", str(out), str(tmp_path / "log.json")
    )
    recorded = _recorded_calls(trace)
    assert {name for name, _ in recorded} == set(COPIES), recorded
    for name in COPIES:  # 1 MiB moved by each kind (splice: into the pipe and out of it)
        assert sum(n for c, n in recorded if c == name) == MIB * (2 if name == "splice" else 1), recorded

    target, log = tmp_path / "r", tmp_path / "replay.log"
    proc = subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-o",
            str(log),
            "-e",
            "trace=sendfile,copy_file_range,splice",
            *CKPT_TRACE,
            "replay",
            str(trace),
            "--strategy",
            "posix",
            "--verify",
            "--json",
            "--target",
            str(target),
            "--strip-prefix",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    replayed = _replayed_calls(log)
    # Each recorded copy call is one call of that kind in the replay, asking and moving the recorded bytes.
    assert [(name, n, n) for name, n in recorded] == replayed, (recorded, replayed)
    source = (target / "source.bin").read_bytes()
    assert len(source) == MIB
    for name in COPIES:
        assert (target / f"{name}.bin").read_bytes() == source, name
    result = json.loads(proc.stdout)
    notes = json.dumps(result)
    assert f"{len(recorded)} calls made as recorded, 0 rows replayed as a read or write" in notes, notes


@pytest.mark.strace
def test_other_strategies_replay_copies_as_reads_and_writes_and_say_so(strace_backend, io_uring, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    trace = tmp_path / "t.arrow"
    record(
        "strace", trace, out, sys.executable, "-m", "ckpt_trace.workloads.copies", str(out), str(tmp_path / "log.json")
    )
    proc = cli(
        "replay",
        str(trace),
        "--strategy",
        "uring-buffered",
        "--verify",
        "--json",
        "--target",
        str(tmp_path / "r"),
        "--strip-prefix",
        str(out),
    )
    assert "replayed as reads and writes: strategy uring-buffered" in proc.stdout
    for name in COPIES:
        assert (tmp_path / "r" / f"{name}.bin").stat().st_size == MIB


pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
