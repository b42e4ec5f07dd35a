"""Traces of several nodes: host, boot and clock anchors in every trace; merge into one trace of the job."""

from __future__ import annotations

import sys

from conftest import cli

from ckpt_trace.formats import read_trace
from ckpt_trace.tracer import clock

_STAMPS = """
import os, sys, time
for name in ("a", "b", "c"):
    before = time.time_ns()
    with open(os.path.join(sys.argv[1], name), "w") as handle:
        handle.write(str(before))
    after = time.time_ns()
    with open(os.path.join(sys.argv[1], name + ".after"), "w") as handle:
        handle.write(str(after))
"""


def test_a_trace_carries_its_host_boot_clock_anchors_and_job(backend, tmp_path, monkeypatch):
    """Each write's row, put on CLOCK_REALTIME through the trace's anchors, falls between the realtime the
    program read before the write and the one it read after (whatever clock the backend has)."""
    (tmp_path / "out").mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    trace = tmp_path / "t.arrow"
    cli("record", "--backend", backend, "--host", "node7", "-o", str(trace), "--path-filter", str(tmp_path / "out"),
        "--", sys.executable, "-c", _STAMPS, str(tmp_path / "out"))
    loaded = read_trace(trace)
    meta = loaded.metadata
    assert meta["host"] == "node7"
    assert meta["boot_id"] == open("/proc/sys/kernel/random/boot_id").read().strip()
    assert meta["job"] == {"launcher": "slurm", "variable": "SLURM_JOB_ID", "id": "4242"}
    assert meta["clock"]["name"] == ("CLOCK_REALTIME" if backend == "strace" else "CLOCK_MONOTONIC")
    start, end = meta["clock"]["anchors"]
    assert start["realtime_ns"] <= end["realtime_ns"] and start["clock_ns"] <= end["clock_ns"]
    rows = [r for r in loaded.table.to_pylist() if r["op"] == "write"]
    assert len(rows) == 6
    for row in rows:
        if row["path"].endswith(".after"):
            continue
        before = int((tmp_path / "out" / row["path"].rsplit("/", 1)[1]).read_text())
        after = int((tmp_path / "out" / (row["path"].rsplit("/", 1)[1] + ".after")).read_text())
        at = clock.to_realtime(meta["clock"], row["ts_ns"])
        slack = clock.alignment_error_ns(meta["clock"]) + 1_000_000  # strace's -ttt stamps are microseconds
        assert before - slack <= at <= after + slack, (before, at, after)


def test_the_job_id_comes_from_the_environment_or_torchruns_rendezvous_id():
    assert clock.job_of({"TORCHELASTIC_RUN_ID": "r1", "SLURM_JOB_ID": "9"}) == {
        "launcher": "torchelastic", "variable": "TORCHELASTIC_RUN_ID", "id": "r1"}
    assert clock.job_of({}, ["torchrun", "--nnodes", "2", "--rdzv-id", "job5", "x.py"])["id"] == "job5"
    assert clock.job_of({}, ["python", "-m", "torch.distributed.run", "--rdzv_id=j6", "x.py"])["id"] == "j6"
    assert clock.job_of({}, ["python", "--rdzv-id", "x"]) is None
