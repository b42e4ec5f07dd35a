"""Nothing lost, nothing silently wrong: every command that writes protects what it did not create.

One test per case of issue 12, each failing before the fix: replays that
emptied targets or overwrote the trace, exports that deleted unrelated files,
recordings lost to an unwritable output, outputs overwritten without --force,
limits found inside workers, Ctrl-C tracebacks, results tied to the wrong
trace, a recorded command that could not start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CKPT_TRACE, DCP, ODD, cli, mounted_tmpfs, one_line, record
from helpers.traces import synthetic

from ckpt_trace.formats import read_trace

# -- replay: ownership -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_repeat_with_force_removes_only_the_previous_runs_files(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    mine = target / "notes.txt"
    mine.write_text("keep")
    (target / "sub").mkdir()
    (target / "sub" / "data.bin").write_bytes(b"x" * 10)
    trace = synthetic(tmp_path / "t.arrow", {"/ck/a.bin": 5000, "/ck/b.bin": 300})
    cli("replay", str(trace), "--target", str(target), "--force", "--repeat", "3")
    assert mine.read_text() == "keep" and (target / "sub" / "data.bin").read_bytes() == b"x" * 10
    assert (target / "ck" / "a.bin").stat().st_size == 5000 and (target / "ck" / "b.bin").stat().st_size == 300


@pytest.mark.slow
def test_a_target_holding_the_trace_is_refused(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    trace = synthetic(target / "t.arrow", {"/x/a.bin": 10})
    before = trace.read_bytes()
    proc = cli("replay", str(trace), "--target", str(target), "--force", "--repeat", "2", check=False)
    assert proc.returncode == 2 and "contains the trace being replayed" in one_line(proc)
    assert trace.read_bytes() == before and sorted(p.name for p in target.iterdir()) == ["t.arrow"]


@pytest.mark.slow
def test_a_replay_path_onto_an_existing_file_or_its_own_output_is_refused(tmp_path):
    target = tmp_path / "t"
    (target / "data").mkdir(parents=True)
    theirs = target / "data" / "ckpt.bin"
    theirs.write_bytes(b"someone else's")
    trace = synthetic(tmp_path / "t.arrow", {"/job/data/ckpt.bin": 100})
    proc = cli("replay", str(trace), "--target", str(target), "--force", "--strip-prefix", "/job", check=False)
    assert proc.returncode == 2 and "already exists and the replay would overwrite it" in one_line(proc)
    assert theirs.read_bytes() == b"someone else's"
    results = synthetic(tmp_path / "r.arrow", {"/out/results.json": 100})
    (tmp_path / "u" / "out").mkdir(parents=True)
    proc = cli(
        "replay",
        str(results),
        "--target",
        str(tmp_path / "u"),
        "--force",
        "-o",
        str(tmp_path / "u" / "out" / "results.json"),
        check=False,
    )
    assert proc.returncode == 2 and "an input or output of this command" in one_line(proc)
    assert list((tmp_path / "u" / "out").iterdir()) == []


def test_a_failed_replay_removes_what_it_created_and_says_so(tmp_path, small_tmpfs):
    trace = synthetic(tmp_path / "t.arrow", {"/ck/a.bin": 700_000, "/ck/b.bin": 700_000})
    mine = small_tmpfs / "mine.txt"
    mine.write_text("keep")
    os.environ["CKPT_TRACE_REPLAY_FREE_SPACE_MARGIN_BYTES"] = "0"
    try:
        proc = cli("replay", str(trace), "--target", str(small_tmpfs), "--force", check=False)
    finally:
        del os.environ["CKPT_TRACE_REPLAY_FREE_SPACE_MARGIN_BYTES"]
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc)
    assert "MiB free" in line or ("full" in line and "were removed" in line)
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["mine.txt"] and mine.read_text() == "keep"


# -- outputs checked before the work ---------------------------------------------------------------------


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs (root): even root cannot create files there."""
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m", "a read-only tmpfs") as mount:
        yield mount


@pytest.mark.slow
def test_record_to_a_read_only_directory_fails_before_the_command_runs(read_only_dir, tmp_path):
    marker = tmp_path / "ran"
    proc = cli("record", "-o", str(read_only_dir / "t.arrow"), "--", "touch", str(marker), check=False)
    assert proc.returncode == 2 and "cannot write in" in one_line(proc)
    assert not marker.exists()


@pytest.mark.slow
def test_record_onto_a_directory_and_replay_results_to_an_unwritable_place_fail_first(read_only_dir, tmp_path):
    existing = tmp_path / "dir"
    existing.mkdir()
    proc = cli("record", "--force", "-o", str(existing), "--", "true", check=False)
    assert proc.returncode == 2 and "is a directory" in one_line(proc)
    proc = cli("replay", str(ODD), "--target", str(tmp_path / "t"), "-o", str(read_only_dir / "r.json"), check=False)
    assert proc.returncode == 2 and "cannot write in" in one_line(proc)
    assert not (tmp_path / "t").exists()  # nothing ran


@pytest.mark.slow
def test_existing_results_and_junit_files_are_kept_without_force(tmp_path):
    results = tmp_path / "r.json"
    results.write_text("earlier")
    proc = cli("replay", str(ODD), "--target", str(tmp_path / "t"), "-o", str(results), check=False)
    assert proc.returncode == 2 and "already exists" in one_line(proc) and results.read_text() == "earlier"
    junit = tmp_path / "j.xml"
    junit.write_text("earlier")
    baseline = tmp_path / "b.json"
    baseline.write_text(
        json.dumps({"format": "ckpt-trace-baseline", "version": 1, "environment": {}, "options": {}, "traces": []})
    )
    proc = cli(
        "check",
        str(ODD),
        "--baseline",
        str(baseline),
        "--target",
        str(tmp_path / "c"),
        "--junit",
        str(junit),
        check=False,
    )
    assert proc.returncode == 2 and "already exists" in one_line(proc) and junit.read_text() == "earlier"


# -- limits probed before the clock ------------------------------------------------------------------------


@pytest.mark.slow
def test_queue_depths_the_kernel_refuses_are_one_line_naming_the_flag(tmp_path, io_uring):
    proc = cli(
        "replay", str(ODD), "--target", str(tmp_path / "t"), "--strategy", "all", "--queue-depth", "65536", check=False
    )
    assert proc.returncode == 2 and one_line(proc).startswith("ckpt-trace: error: --queue-depth 65536:")
    assert not (tmp_path / "t").exists()
    proc = cli(
        "bench", "--target", str(tmp_path / "b"), "--queue-depths", "100000000", "-o", str(tmp_path / "o"), check=False
    )
    assert proc.returncode == 2 and "--queue-depths 100000000: queue depth 100000000 exceeds" in one_line(proc)
    proc = cli(
        "baseline",
        str(ODD),
        "--target",
        str(tmp_path / "c"),
        "-o",
        str(tmp_path / "b.json"),
        "--queue-depth",
        "65536",
        check=False,
    )
    assert proc.returncode == 2 and "--queue-depth 65536" in one_line(proc)


@pytest.mark.slow
def test_a_failing_worker_fails_the_replay_with_one_line(tmp_path, io_uring, monkeypatch):
    """A worker that cannot set up (here: its ring) fails the command, never a result with missing figures."""
    from ckpt_trace.errors import ReplayError
    from ckpt_trace.replayer import engine, replay

    def refuse(*args, **kwargs):
        raise MemoryError("no memory for the worker's buffers")

    monkeypatch.setattr(engine, "Ring", refuse)  # the engine makes each worker's rings (WorkerIO.ring)
    with pytest.raises(ReplayError, match="replay worker failed"):
        replay(ODD, target=tmp_path / "t", strategy="uring-buffered")
    assert not (tmp_path / "t").exists()


# -- interrupts --------------------------------------------------------------------------------------------


def _interrupt(args: list[str], ready, cwd=None) -> subprocess.CompletedProcess:
    """Start ``ckpt-trace ARGS`` in its own process group, wait until ``ready()``, send SIGINT to the group."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt_trace.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=cwd,
    )
    deadline = time.monotonic() + 120
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def test_ctrl_c_in_a_replay_removes_its_files_and_says_so(tmp_path):
    trace = synthetic(tmp_path / "t.arrow", {"/ck/a.bin": 10, "/ck/b.bin": 10}, gap_ns=10_000_000_000)
    target = tmp_path / "t"
    done = _interrupt(
        ["replay", str(trace), "--target", str(target), "--timing", "original"],
        lambda: (target / "ck" / "a.bin").exists(),
    )
    assert done.returncode == 130
    assert done.stderr.strip().splitlines() == [
        f"ckpt-trace: interrupted; the replay's files under {target} were removed"
    ]
    assert not target.exists()


def test_ctrl_c_in_a_workload_is_one_line_without_rank_tracebacks(tmp_path, torch_installed):
    out = tmp_path / "w"
    done = _interrupt(
        ["workload", "dcp", "--out", str(out), "--ranks", "2", "--model", "gpt2-small"],
        lambda: out.exists() and any(out.iterdir()),
    )
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"ckpt-trace: interrupted; a partial checkpoint may remain in {out}"


# -- results tied to their trace -----------------------------------------------------------------------------


@pytest.mark.slow
def test_report_and_emit_refuse_results_of_another_trace(tmp_path):
    results = tmp_path / "odd.json"
    cli("replay", str(ODD), "--target", str(tmp_path / "t"), "-o", str(results))
    data = json.loads(results.read_text())
    assert data["trace_sha256"] and data["creator_version"] and data["environment"]["filesystem"]
    for args in (
        ["report", str(DCP), str(results), "-o", str(tmp_path / "r.html")],
        ["emit", str(DCP), "--from-results", str(results), "-o", str(tmp_path / "w.py")],
    ):
        proc = cli(*args, check=False)
        assert proc.returncode == 2 and "holds results of another trace" in one_line(proc)
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "w.py").exists()
    del data["trace_sha256"]
    results.write_text(json.dumps(data))
    proc = cli("emit", str(ODD), "--from-results", str(results), "-o", str(tmp_path / "w.py"), check=False)
    assert proc.returncode == 2 and "does not say which trace it replayed" in one_line(proc)


# -- regression checks that can say "too noisy" -------------------------------------------------------------


def test_verdicts():
    from ckpt_trace.check.baseline import verdict

    assert verdict(0.30, 0.10, 0.05) == "regressed"
    assert verdict(0.30, 0.10, 0.40) == "noisy"  # a change the runs' spread explains
    assert verdict(0.02, 0.10, 0.40) == "noisy"  # cannot resolve the tolerance at all
    assert verdict(0.05, 0.10, 0.05) == "ok" and verdict(-0.5, 0.10, 0.05) == "ok"


@pytest.mark.slow
def test_a_noisy_figure_is_reported_as_such_not_as_pass_or_fail(tmp_path, io_uring, monkeypatch):
    monkeypatch.setenv("CKPT_TRACE_CHECK_MIN_SECONDS", "0.1")
    baseline = tmp_path / "b.json"
    cli(
        "baseline",
        str(DCP),
        "--target",
        str(tmp_path / "b"),
        "-o",
        str(baseline),
        "--strategy",
        "posix",
        "--min-seconds",
        "0.1",
    )
    data = json.loads(baseline.read_text())
    figures = data["traces"][0]["results"]["posix"]
    figures["throughput_noise"] = figures["p99_noise"] = 0.5  # runs varied by half: no 10 % change can be seen
    figures["throughput_bytes_per_s"] *= 1.3
    baseline.write_text(json.dumps(data))
    proc = cli(
        "check",
        str(DCP),
        "--baseline",
        str(baseline),
        "--target",
        str(tmp_path / "c"),
        "--json",
        "--junit",
        str(tmp_path / "j.xml"),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    statuses = {c["metric"]: c["status"] for c in json.loads(proc.stdout)["comparisons"]}
    assert statuses == {"throughput_bytes_per_s": "noisy", "p99_latency_ns": "noisy"}
    assert "too noisy to judge" in proc.stderr
    assert "<skipped" in (tmp_path / "j.xml").read_text()


# -- recording a failing command ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_command_that_cannot_start_is_exit_127_and_no_trace(tmp_path):
    for command in ("/no/such/cmd", "no-such-command-ckpt-trace"):
        proc = cli("record", "-o", str(tmp_path / "t.arrow"), "--", command, check=False)
        assert proc.returncode == 127 and "cannot run" in one_line(proc)
    assert list(tmp_path.iterdir()) == []


def test_a_failing_or_killed_command_still_gets_its_trace(tmp_path, strace_backend):
    proc = cli(
        "record",
        "--backend",
        strace_backend,
        "-o",
        str(tmp_path / "f.arrow"),
        "--",
        "sh",
        "-c",
        f"echo x > {tmp_path}/f; exit 3",
        check=False,
    )
    assert proc.returncode == 3 and "the command exited with status 3" in proc.stderr
    assert [r["op"] for r in read_trace(tmp_path / "f.arrow").table.to_pylist() if r["path"] == f"{tmp_path}/f"]
    proc = cli(
        "record",
        "--backend",
        strace_backend,
        "-o",
        str(tmp_path / "k.arrow"),
        "--json",
        "--",
        "sh",
        "-c",
        f"echo x > {tmp_path}/g; kill -9 $$",
        check=False,
    )
    assert proc.returncode == 137 and "was killed by SIGKILL" in proc.stderr
    assert json.loads(proc.stdout)["exit_signal"] == 9 and (tmp_path / "k.arrow").exists()


def test_path_filters_under_dev_and_relative_ones_match(tmp_path, backend):
    shm = Path("/dev/shm") / f"ckpt-trace-test-{os.getpid()}"
    try:
        proc = record(backend, tmp_path / "s.arrow", f"{shm}/", "sh", "-c", f"mkdir -p {shm}; echo x > {shm}/ckpt")
        assert "no operation matched" not in proc.stderr
        rows = read_trace(tmp_path / "s.arrow").table.to_pylist()
        assert ("write", f"{shm}/ckpt") in {(r["op"], r["path"]) for r in rows}
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    work = tmp_path / "work"
    work.mkdir()
    cli(
        "record",
        "--backend",
        backend,
        "-o",
        str(tmp_path / "r.arrow"),
        "--path-filter",
        "out/",
        "--",
        "sh",
        "-c",
        "mkdir -p out; echo x > out/f; echo y > other",
        cwd=work,
    )
    paths = {r["path"] for r in read_trace(tmp_path / "r.arrow").table.to_pylist() if r["op"] == "write"}
    assert paths == {f"{work}/out/f"}
    proc = record(backend, tmp_path / "n.arrow", "/nothing/here/", "sh", "-c", f"echo x > {tmp_path}/z")
    assert "no operation matched --path-filter /nothing/here/" in proc.stderr
    assert not re.search(r"(?<![\d,])0 were left out", proc.stderr)  # bcc leaves them out in the kernel, uncounted


def test_a_recording_whose_rows_were_all_left_out_never_says_none_were():
    from ckpt_trace.cli import no_match_line

    assert no_match_line(["/x/"], "strace", 31) == "no operation matched --path-filter /x/ (31 were left out)"
    assert "without counting them" in no_match_line(["/x/"], "bcc", 0)
    assert "at least 4 were left out" in no_match_line(["/x/"], "bcc", 4)
    assert "no file operation the tracer saw" in no_match_line(["/x/", "/y/"], "strace", 0)
    for backend in ("bcc", "strace"):
        assert "0 were left out" not in no_match_line(["/x/"], backend, 0)


def test_ctrl_c_while_recording_a_workload_keeps_its_trace_and_prints_no_rank_tracebacks(
    tmp_path, torch_installed, strace_backend
):
    out, trace = tmp_path / "w", tmp_path / "t.arrow"
    done = _interrupt(
        [
            "record",
            "--backend",
            strace_backend,
            "-o",
            str(trace),
            "--path-filter",
            f"{out}/",
            "--",
            *CKPT_TRACE,
            "workload",
            "dcp",
            "--out",
            str(out),
            "--ranks",
            "2",
            "--model",
            "gpt2-small",
        ],
        lambda: out.exists() and any(out.iterdir()),
    )
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    assert "the command exited with status 130; its trace is written" in done.stderr
    assert read_trace(trace).metadata["exit_code"] == 130
