"""The kernel's writeback thresholds, recorded (``tracer.writeback``: the trace's ``writeback`` metadata) and set
for a replay (``replay --writeback recorded``, ``replayer.writeback``): checked against the kernel's own
/proc/vmstat and /proc/sys/vm."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import cli, one_line, record
from helpers.traces import META, trace_of

from ckpt_trace.errors import CkptTraceError, ReplayError
from ckpt_trace.formats import read_metadata, read_trace
from ckpt_trace.replayer import build_plan, replay
from ckpt_trace.tracer import writeback

SETTINGS = Path("/proc/sys/vm")
ROWS = [
    {"op": "open", "path": "/ck/a", "fd": 3, "flags": 0o101, "ret": 3},
    {"op": "write", "path": "/ck/a", "fd": 3, "offset": 0, "size": 1 << 20, "ret": 1 << 20},
    {"op": "fsync", "path": "/ck/a", "fd": 3},
    {"op": "close", "path": "/ck/a", "fd": 3},
]
RECORDED = {"dirty_background_bytes": 123_456_512, "dirty_bytes": 234_567_680}


@pytest.mark.slow
def test_record_says_the_kernels_thresholds_while_the_command_ran(tmp_path, strace_backend):
    before = writeback.thresholds()
    assert before is not None, "this kernel's /proc/vmstat gives no dirty thresholds"
    trace = tmp_path / "t.arrow"
    record(strace_backend, trace, tmp_path, "sleep", "0.6")
    after = writeback.thresholds()
    assert after is not None
    found = read_metadata(trace)["writeback"]
    assert found["source"] == "/proc/vmstat" and found["samples"] >= 3  # start, every 0.25 s, end
    for key in ("dirty_background_bytes", "dirty_bytes"):
        low, high = found[key]["min"], found[key]["max"]
        assert 0 < low <= high
        seen = (before[key], after[key])  # the kernel's own figures just before and after the recording
        assert min(seen) / 2 <= low and high <= max(seen) * 2, (found[key], seen)
    assert found["settings"] == writeback.settings()


def _trace_with(path: Path, thresholds: dict | None) -> Path:
    meta = dict(META)
    if thresholds is not None:
        meta["writeback"] = {
            "source": "/proc/vmstat",
            "samples": 2,
            "interval_s": writeback.SAMPLE_S,
            **{key: {"min": value, "max": value * 2} for key, value in thresholds.items()},
            "settings": {},
        }
    return trace_of(path, ROWS, meta)


def _sysctl(name: str) -> int:
    return int((SETTINGS / name).read_text())


@pytest.mark.root
def test_a_replay_runs_under_the_recorded_thresholds_and_puts_the_settings_back(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("setting /proc/sys/vm needs root")
    trace = _trace_with(tmp_path / "t.arrow", RECORDED)
    before = writeback.settings()
    fifo = tmp_path / "pause.fifo"
    os.mkfifo(fifo)
    ops = build_plan(read_trace(trace).table, "posix").ops
    fsync_row = next(r for r in range(len(ops.kind)) if ops.op(r).kind == "fsync")
    monkeypatch.setenv("CKPT_TRACE_TEST_PAUSE", f"{fsync_row}:{fifo}")
    outcome: list = []

    def go() -> None:
        try:
            outcome.append(replay(trace, target=tmp_path / "target", strategy="posix", writeback="recorded"))
        except CkptTraceError as err:
            outcome.append(err)

    worker = threading.Thread(target=go)
    worker.start()
    deadline = time.monotonic() + 60
    while True:  # the replay holds the FIFO open for reading once it stands before the fsync
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as err:
            if err.errno != errno.ENXIO or not worker.is_alive() or time.monotonic() > deadline:
                raise AssertionError(f"the replay never reached its pause: {outcome}") from err
            time.sleep(0.002)
    during = {name: _sysctl(name) for name in RECORDED}
    os.close(fd)
    worker.join(60)
    assert during == RECORDED  # the least recorded values, while the run ran
    assert writeback.settings() == before  # and what was set before, afterwards
    report = outcome[0]
    assert not isinstance(report, BaseException), report
    assert report.options["writeback"] == "recorded" and report.options["writeback_bytes"] == RECORDED
    assert any(
        note.startswith("writeback as recorded: background writeback from 123 MB") for note in report.results[0].notes
    )
    report.release()


@pytest.mark.slow
def test_a_trace_without_thresholds_is_refused_in_one_line(tmp_path):
    trace = _trace_with(tmp_path / "t.arrow", None)
    if os.geteuid() == 0:
        with pytest.raises(ReplayError, match="does not say its writeback thresholds"):
            replay(trace, target=tmp_path / "target", strategy="posix", writeback="recorded")
        assert not (tmp_path / "target").exists()  # refused before anything was made
    proc = cli(
        "replay",
        str(trace),
        "--strategy",
        "posix",
        "--target",
        str(tmp_path / "t2"),
        "--writeback",
        "recorded",
        check=False,
    )
    assert proc.returncode != 0
    line = one_line(proc)
    assert "writeback" in line and ("thresholds" in line or "root" in line)


@pytest.mark.slow
def test_summary_shows_the_least_recorded_thresholds(tmp_path):
    trace = _trace_with(tmp_path / "t.arrow", RECORDED)
    document = json.loads(cli("summary", str(trace), "--json").stdout)
    assert document["writeback"]["dirty_background_bytes"]["min"] == RECORDED["dirty_background_bytes"]
    text = cli("summary", str(trace)).stdout
    assert "dirty-page thresholds (least)" in text and "background 117.7 MiB, throttle 223.7 MiB" in text
    assert "dirty-page thresholds" not in cli("summary", str(_trace_with(tmp_path / "u.arrow", None))).stdout
