"""Traces of several nodes: host, boot and clock anchors in every trace; merge into one trace of the job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import cli
from helpers import format_rows

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
    cli(
        "record",
        "--backend",
        backend,
        "--host",
        "node7",
        "-o",
        str(trace),
        "--path-filter",
        str(tmp_path / "out"),
        "--",
        sys.executable,
        "-c",
        _STAMPS,
        str(tmp_path / "out"),
    )
    loaded = read_trace(trace)
    meta = loaded.metadata
    assert meta["host"] == "node7"
    assert meta["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
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
        "launcher": "torchelastic",
        "variable": "TORCHELASTIC_RUN_ID",
        "id": "r1",
    }
    assert clock.job_of({}, ["torchrun", "--nnodes", "2", "--rdzv-id", "job5", "x.py"])["id"] == "job5"
    assert clock.job_of({}, ["python", "-m", "torch.distributed.run", "--rdzv_id=j6", "x.py"])["id"] == "j6"
    assert clock.job_of({}, ["python", "--rdzv-id", "x"]) is None


# --- merge: traces whose clocks disagree by a known offset -------------------------------------------------

T0 = 1_700_000_000_000_000_000  # CLOCK_REALTIME ns at the first anchor of both synthetic nodes
MS = 1_000_000


def _node_trace(
    path,
    host,
    boot,
    clock_at_t0,
    first_row_ns,
    rank,
    pid,
    *,
    lost=0,
    rows=5,
    spacing=2 * MS,
    dur=1000,
    ts=None,
    paths=None,
):
    """A trace of one node: ``rows`` writes by ``rank`` every ``spacing`` ns from realtime T0 +
    ``first_row_ns``, on a monotonic clock that reads ``clock_at_t0`` at T0 (another boot, another origin)."""
    from ckpt_trace.formats import table_from_columns, write_trace

    n = rows if ts is None else len(ts)
    columns = format_rows.rows(
        n,
        ts_ns=[i * spacing for i in range(n)] if ts is None else list(ts),
        dur_ns=dur,
        pid=pid,
        tid=pid,
        comm="python",
        rank=rank,
        fd=5,
        path=paths or f"/ck/__{rank}_0.distcp",
    )
    anchors = [
        {"realtime_ns": T0, "clock_ns": clock_at_t0, "uncertainty_ns": 100},
        {"realtime_ns": T0 + 10_000 * MS, "clock_ns": clock_at_t0 + 10_000 * MS, "uncertainty_ns": 100},
    ]
    meta = {
        "creator": "ckpt-trace",
        "creator_version": "test",
        "host": host,
        "kernel": "6.8",
        "arch": "x86_64",
        "command": ["torchrun"],
        "backend": "bcc",
        "start_wall_time_ns": T0,
        "filesystems": {},
        "lost_events": lost,
        "boot_id": boot,
        "unseen": {"mapped_pages": {"reason": "r", "count": 1}},
        "clock": {"name": "CLOCK_MONOTONIC", "origin_ns": clock_at_t0 + first_row_ns, "anchors": anchors},
    }
    write_trace(path, table_from_columns(columns), meta)
    return path


def _merged(path):
    import pyarrow as pa

    from ckpt_trace.formats import scan

    meta, batches = scan(path, ["ts_ns", "host", "rank", "pid", "offset", "size"])
    return meta, pa.Table.from_batches(list(batches)).to_pylist()


@pytest.mark.slow
def test_merge_aligns_clocks_that_disagree_by_a_known_offset(tmp_path):
    # node a's monotonic clock reads 1e12 at T0, node b's 5e12 (another boot): 4,000 s apart. b's first row
    # is 1 ms after a's in real time, so the rows interleave a, b, a, b...
    a = _node_trace(tmp_path / "a.arrow", "a", "boot-a", 10**12, 0, rank=0, pid=100, lost=3)
    b = _node_trace(tmp_path / "b.arrow", "b", "boot-b", 5 * 10**12, MS, rank=1, pid=100, lost=4)
    out = tmp_path / "job.arrow"
    proc = cli("merge", str(a), str(b), "-o", str(out), "--json")
    import json

    data = json.loads(proc.stdout)
    assert data["rows"] == 10 and data["ranks"] == [0, 1]
    meta, rows = _merged(out)
    assert [r["host"] for r in rows] == ["a", "b"] * 5
    assert [r["ts_ns"] for r in rows] == [i * MS for i in range(10)]
    assert meta["start_wall_time_ns"] == T0
    assert [(r["offset"], r["size"]) for r in rows if r["host"] == "b"] == [(i * 4096, 4096) for i in range(5)]
    # pid 100 on both nodes: b's processes are moved above pid_max, so a replay keeps them apart
    assert {r["pid"] for r in rows if r["host"] == "a"} == {100}
    assert {r["pid"] for r in rows if r["host"] == "b"} == {100 + (1 << 22)}
    merged = meta["merged"]
    assert merged["alignment_error_ns"] == 200  # two anchors' read uncertainty, no drift
    assert merged["hosts"]["a"]["lost_events"] == 3 and merged["hosts"]["b"]["lost_events"] == 4
    assert meta["lost_events"] == 7 and meta["unseen"]["mapped_pages"]["count"] == 2
    assert merged["hosts"]["b"]["ranks"] == [1]

    # b's realtime clock known to run 1.5 ms fast: its rows move 1.5 ms earlier, b first
    out2 = tmp_path / "job2.arrow"
    cli("merge", str(a), str(b), "-o", str(out2), "--clock-offset", f"b={-3 * MS // 2}")
    meta2, rows2 = _merged(out2)
    assert [r["host"] for r in rows2] == ["b", "a"] * 5
    assert [r["ts_ns"] for r in rows2] == [v for i in range(5) for v in (2 * i * MS, 2 * i * MS + MS // 2)]
    assert meta2["start_wall_time_ns"] == T0 - MS // 2


def test_merge_streams_many_batches_in_time_order(tmp_path):
    """Batches smaller than the traces: the watermark merge still yields one global order."""
    from ckpt_trace.analysis.merge import merge_traces

    a = _node_trace(tmp_path / "a.arrow", "a", "boot-a", 10**12, 0, rank=0, pid=1, rows=200, spacing=3 * MS)
    b = _node_trace(tmp_path / "b.arrow", "b", "boot-b", 7 * 10**12, MS, rank=1, pid=2, rows=300, spacing=2 * MS)
    merge_traces([a, b], tmp_path / "j.arrow", batch_rows=7)
    _, rows = _merged(tmp_path / "j.arrow")
    expected = sorted([(i * 3 * MS, "a") for i in range(200)] + [(MS + i * 2 * MS, "b") for i in range(300)])
    assert [(r["ts_ns"], r["host"]) for r in rows] == expected


def test_rows_of_one_time_keep_the_order_of_the_inputs_then_their_rows_at_any_batch_size(tmp_path):
    """Many rows of one time, across inputs and across batch boundaries: the merge equals a stable sort of
    the inputs' rows (in the order the traces are named) by time, whatever the batch and step sizes; text
    columns of different dictionaries (and a null) keep their values."""
    from ckpt_trace.analysis.merge import merge_traces, merged_rows, plan_merge

    times = {"a": [0, 1, 1, 1, 1, 2, 2, 5, 5, 5, 5, 5, 5, 9], "b": [1, 1, 2, 5, 5, 5, 9, 9], "c": [5] * 7 + [6]}
    traces = []
    for rank, (host, ts) in enumerate(times.items()):
        paths = [f"/ck/{host}/{i % 3}" for i in range(len(ts))]
        if host == "c":
            paths[2] = None
        traces.append(
            _node_trace(
                tmp_path / f"{host}.arrow",
                host,
                f"boot-{host}",
                10**12,
                0,
                rank=rank,
                pid=10 + rank,
                ts=[t * MS for t in ts],
                paths=paths,
            )
        )
    expected = sorted(
        (
            (t * MS, host, i * 4096, None if (host, i) == ("c", 2) else f"/ck/{host}/{i % 3}")
            for host, ts in times.items()
            for i, t in enumerate(ts)
        ),
        key=lambda row: row[0],
    )
    plan = plan_merge(traces)
    for batch_rows in (1, 2, 3, 5, 100):
        for step_rows in (1, 4, 1000):
            got = [
                (r["ts_ns"], r["host"], r["offset"], r["path"])
                for batch in merged_rows(plan, batch_rows=batch_rows, step_rows=step_rows)
                for r in batch.to_pylist()
            ]
            assert got == expected, (batch_rows, step_rows)
    merge_traces(traces, tmp_path / "j.arrow", batch_rows=2)
    meta, rows = _merged(tmp_path / "j.arrow")
    assert [(r["ts_ns"], r["host"], r["offset"]) for r in rows] == [row[:3] for row in expected]
    assert meta["merged"]["rows"] == len(expected) and meta["elapsed_ns"] == 9 * MS


@pytest.mark.slow
def test_a_rank_in_two_traces_is_refused_naming_both(tmp_path):
    a = _node_trace(tmp_path / "a.arrow", "a", "boot-a", 10**12, 0, rank=3, pid=1)
    b = _node_trace(tmp_path / "b.arrow", "b", "boot-b", 10**12, 0, rank=3, pid=2)
    proc = cli("merge", str(a), str(b), "-o", str(tmp_path / "j.arrow"), check=False)
    assert proc.returncode != 0 and not (tmp_path / "j.arrow").exists()
    assert "rank 3" in proc.stderr and str(a) in proc.stderr and str(b) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_summary_and_report_of_a_merged_trace_show_hosts_and_the_slowest_rank(tmp_path):
    import json

    a = _node_trace(tmp_path / "a.arrow", "a", "boot-a", 10**12, 0, rank=0, pid=1, dur=1000)
    b = _node_trace(tmp_path / "b.arrow", "b", "boot-b", 3 * 10**12, MS, rank=1, pid=2, dur=5000, rows=3)
    cli("merge", str(a), str(b), "-o", str(tmp_path / "j.arrow"))
    data = json.loads(cli("summary", str(tmp_path / "j.arrow"), "--json").stdout)
    assert sorted(data["hosts"]) == ["a", "b"]
    assert data["hosts"]["a"]["ranks"] == [0] and data["hosts"]["b"]["ranks"] == [1]
    assert data["hosts"]["b"]["bytes_written"] == 3 * 4096
    # rank 1: 3 writes of 5 us, 2 ms apart; rank 0: 5 writes of 1 us
    assert data["slowest_rank"] == {"rank": 1, "host": "b", "io_time_ns": 15000, "save_time_ns": 4 * MS + 5000}
    assert data["slowest_save"] == {"rank": 0, "host": "a", "save_time_ns": 8 * MS + 1000, "io_time_ns": 5000}
    assert data["rank_times"]["0"]["first_write_ns"] == 0 and data["rank_times"]["1"]["first_write_ns"] == MS
    text = cli("summary", str(tmp_path / "j.arrow")).stdout
    assert "Hosts" in text and "slowest rank" in text
    report = json.loads(cli("report", str(tmp_path / "j.arrow"), "-o", str(tmp_path / "r.html"), "--json").stdout)
    page = (tmp_path / "r.html").read_text()
    assert "<h3>Hosts</h3>" in page and "first to last checkpoint write" in page and report["slowest"]


def test_rows_made_ahead_on_a_thread_hand_over_the_producers_error_and_stop_with_the_consumer():
    import threading

    from ckpt_trace.analysis.merge import _ahead
    from ckpt_trace.errors import CkptTraceError

    def failing():
        yield from range(5)
        raise CkptTraceError("input changed")

    got = _ahead(failing(), depth=2)
    assert [next(got) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(CkptTraceError, match="input changed"):
        next(got)
    before = threading.active_count()
    endless = _ahead(iter(range(10**9)), depth=2)
    assert [next(endless) for _ in range(3)] == [0, 1, 2]
    endless.close()  # the consumer stops: so does the producer's thread
    assert threading.active_count() == before and not any(
        t.name == "ckpt-trace-merge-rows" for t in threading.enumerate()
    )
