"""record --pid (a running job, one checkpoint, the job unharmed) and the fixed costs record --json reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import CKPT_TRACE, cli

from ckpt_trace.formats import read_trace
from ckpt_trace.tracer.attach import CheckpointCounter

# A job that saves a 1 MiB checkpoint file about every second (16 writes of 64 KiB, then an empty marker
# file, which is no checkpoint: no byte written), logging each save's file and bytes, until STOP exists or
# 300 saves (a bound, never reached by a passing test). With "fork", each save is made by a new child process
# (descendants started after the attach); with "rename", each file is written under a temporary name and
# renamed once closed (as DCP commits its .metadata).
SAVER = r"""
import json, os, sys, time
out, fork, rename = sys.argv[1], sys.argv[2] == "fork", sys.argv[2] == "rename"

def save(i, path):
    with open(path, "wb") as f:
        for _ in range(16):
            f.write(b"x" * 65536)
    if rename:
        os.rename(path, path[:-len(".tmp")])
    open(os.path.join(out, f"done-{i}"), "w").close()

with open(os.path.join(out, "saves.jsonl"), "a") as log:
    for i in range(300):
        if os.path.exists(os.path.join(out, "STOP")):
            break
        path = os.path.join(out, f"ckpt-{i}.bin" + (".tmp" if rename else ""))
        if fork:
            child = os.fork()
            if child == 0:
                save(i, path)
                os._exit(0)
            assert os.waitpid(child, 0)[1] == 0
        else:
            save(i, path)
        log.write(json.dumps({"path": path, "bytes": 16 * 65536}) + "\n")
        log.flush()
        time.sleep(1)
"""


def _job(out: Path, shape: str) -> subprocess.Popen:
    """The saving job: the saver itself ("plain"), or a shell whose child is the saver, which forks a process
    per save ("tree": a descendant running at the attach, and descendants started after it)."""
    saver = [sys.executable, "-c", SAVER, str(out), {"tree": "fork"}.get(shape, shape)]
    if shape == "tree":
        return subprocess.Popen(["sh", "-c", '"$@"; exit $?', "sh", *saver])
    return subprocess.Popen(saver)


def _wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _saves(out: Path) -> list[dict]:
    text = (out / "saves.jsonl").read_text() if (out / "saves.jsonl").exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("shape", ["plain", "tree", "rename"])
def test_attach_records_exactly_one_checkpoint_and_the_job_runs_on(backend, shape, tmp_path):
    out = tmp_path / "job"
    out.mkdir()
    job = _job(out, shape)
    try:
        _wait_for(lambda: len(_saves(out)) >= 1, "the job's first save")
        trace = tmp_path / "one.arrow"
        proc = cli(
            "record",
            "--backend",
            backend,
            "--pid",
            str(job.pid),
            "--until-checkpoints",
            "1",
            "--json",
            "-o",
            str(trace),
        )
        summary = json.loads(proc.stdout)
        assert job.poll() is None, "the job must still run after the recorder detached"
        saves_at_detach = len(_saves(out))
        _wait_for(lambda: len(_saves(out)) > saves_at_detach, "a save after the detach")  # the job runs on
    finally:
        (out / "STOP").touch()
        code = job.wait(timeout=120)
    assert code == 0
    attached = summary["attached"]
    assert attached["pid"] == job.pid and attached["stopped_by"] == "checkpoints"
    assert len(attached["checkpoint_files"]) == 1
    (path,) = attached["checkpoint_files"]
    rows = read_trace(trace).table.to_pylist()
    written = Counter()
    for row in rows:
        if row["op"] == "write":
            written[row["path"]] += row["ret"]
    # exactly one checkpoint file opened in the trace (a save under way at the attach may leave its tail:
    # writes, close, rename through a descriptor opened before, never an open)
    opened = {row["path"] for row in rows if row["op"] == "open" and Path(row["path"]).name.startswith("ckpt-")}
    assert opened == {path}
    logged = {save["path"]: save["bytes"] for save in _saves(out)}
    assert written[path] == logged[path]  # every byte the job says it wrote to that file
    index = lambda name: int(Path(name).name.split("-")[1].split(".")[0])  # noqa: E731 - ckpt-N.bin[.tmp]
    assert all(index(other) < index(path) for other in written if other != path)  # nothing of a later save
    ops = [row["op"] for row in rows if row["path"] == path]
    assert ops[0] == "open" and ops.count("write") == 16
    if shape == "rename":  # the commit after the counted close is kept, nothing else after it
        assert ops[-2:] == ["close", "rename"]
        assert [row["new_path"] for row in rows if row["op"] == "rename"] == [path[: -len(".tmp")]]
    else:
        assert ops[-1] == "close"
    offsets = [row["offset"] for row in rows if row["path"] == path and row["op"] == "write"]
    assert offsets == [i * 65536 for i in range(16)]
    assert summary["start_s"] is not None and summary["start_s"] > 0 and summary["finish_s"] >= 0
    assert read_trace(trace).metadata["attached"]["checkpoint_files"] == [path]


def test_attach_for_a_duration_detaches_and_the_job_is_unharmed(strace_backend, tmp_path):
    out = tmp_path / "job"
    out.mkdir()
    job = _job(out, "plain")
    try:
        _wait_for(lambda: len(_saves(out)) >= 1, "the job's first save")
        trace = tmp_path / "window.arrow"
        proc = cli(
            "record", "--backend", "strace", "--pid", str(job.pid), "--duration", "2.5", "--json", "-o", str(trace)
        )
        summary = json.loads(proc.stdout)
        assert job.poll() is None
        with open(f"/proc/{job.pid}/status") as status:  # strace detached: nothing traces the job now
            assert [line.split()[1] for line in status if line.startswith("TracerPid:")] == ["0"]
    finally:
        (out / "STOP").touch()
        code = job.wait(timeout=120)
    assert code == 0 and summary["attached"]["stopped_by"] == "duration"
    rows = read_trace(trace).table.to_pylist()
    closed = {row["path"] for row in rows if row["op"] == "close" and "ckpt-" in (row["path"] or "")}
    assert 1 <= len(closed) <= 4  # a 2.5 s window of a save per second


@pytest.mark.slow
def test_a_missing_pid_and_wrong_options_fail_in_one_line(tmp_path):
    proc = cli("record", "--backend", "strace", "--pid", "999999999", "-o", str(tmp_path / "t.arrow"), check=False)
    assert proc.returncode != 0 and "--pid 999999999: no such running process" in proc.stderr
    proc = cli(
        "record",
        "--backend",
        "strace",
        "--pid",
        str(os.getpid()),
        "--duration",
        "0",
        "-o",
        str(tmp_path / "t.arrow"),
        check=False,
    )
    assert proc.returncode != 0 and "--duration 0.0: must be a positive" in proc.stderr
    proc = cli(
        "record", "--backend", "strace", "--duration", "1", "-o", str(tmp_path / "t.arrow"), "--", "true", check=False
    )
    assert proc.returncode != 0 and "go with --pid or --cgroup" in proc.stderr
    assert not (tmp_path / "t.arrow").exists()


def _key(fd: int, tgid: int = 7) -> int:
    return CheckpointCounter.key(tgid, fd)


def test_the_checkpoint_rule_counts_written_and_closed_files_only():
    counter = CheckpointCounter(("/ckpt/",), wanted=2)
    none = np.empty(0, np.int64)
    # batch 1: a.bin opened and written; an empty marker opened and closed (no byte: no checkpoint); a file
    # outside the filters written and closed; fd 9 closed without an open seen (opened before the attach)
    counter.observe(
        [(10, _key(3), "/ckpt/a.bin"), (11, _key(4), "/ckpt/marker"), (12, _key(5), "/tmp/x")],
        [(13, _key(4)), (14, _key(5)), (15, _key(9))],
        np.array([_key(3), _key(5), _key(9)], np.int64),
        np.array([12, 13, 14], np.int64),
    )
    assert counter.files == [] and not counter.done
    # batch 2: a.bin closed (its write was in batch 1); fd 3 reused for b.bin, written and closed
    counter.observe(
        [(30, _key(3), "/ckpt/b.bin")],
        [(20, _key(3)), (40, _key(3))],
        np.array([_key(3)], np.int64),
        np.array([35], np.int64),
    )
    assert counter.files == [("/ckpt/a.bin", 20), ("/ckpt/b.bin", 40)] and counter.cut_ns == 40
    # a write before an open of the same number does not make the new file written
    later = CheckpointCounter(())
    later.observe([(50, _key(6), "/d/c.bin")], [(60, _key(6))], np.array([_key(6)], np.int64), np.array([45], np.int64))
    assert later.files == [] and later.observe([], [], none, none) is None


def test_record_json_reports_the_fixed_costs(strace_backend, tmp_path):
    started = time.monotonic()
    proc = cli("record", "--backend", "strace", "--json", "-o", str(tmp_path / "t.arrow"), "--", "true")
    whole_s = time.monotonic() - started
    summary = json.loads(proc.stdout)
    assert 0 < summary["start_s"] < whole_s and 0 <= summary["finish_s"] < whole_s
    assert summary["start_s"] + summary["finish_s"] < whole_s


def test_the_kernel_view_is_cached_per_btf_and_a_tampered_cache_is_ignored(tmp_path, monkeypatch):
    from ckpt_trace import config
    from ckpt_trace.tracer import costs

    btf = tmp_path / "vmlinux"
    btf.write_bytes(b"not really BTF, but bytes to digest")
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def compute():
        calls.append(1)
        return {"__OFF_A__": "24", "__URING__": "1"}, None, "no mapped pages"

    assert costs.cached_view(btf, compute) == ({"__OFF_A__": "24", "__URING__": "1"}, None, "no mapped pages")
    assert costs.cached_view(btf, compute)[0]["__OFF_A__"] == "24" and len(calls) == 1  # from the cache
    (entry,) = (tmp_path / "cache").iterdir()
    assert entry.stat().st_mode & 0o077 == 0
    data = json.loads(entry.read_text())
    data["macros"]["__OFF_A__"] = "24; evil()"
    entry.write_text(json.dumps(data))
    assert costs.load_view(btf) is None  # only integers ever reach the BPF program
    assert costs.cached_view(btf, compute)[0]["__OFF_A__"] == "24" and len(calls) == 2
    btf.write_bytes(b"another kernel")
    costs.cached_view(btf, compute)
    assert len(calls) == 3 and len(list((tmp_path / "cache").iterdir())) == 2


def test_invocation_time_is_before_now():
    from ckpt_trace.tracer import costs

    assert 0 <= costs.since_invocation_s(time.monotonic()) < time.monotonic()
    assert os.path.exists("/proc/self/stat")


DCP_LOOP = r'''
"""A 2-rank DCP job saving gpt2-tiny every second into OUT/step-N while OUT/GO exists, until OUT/STOP (or 200
saves); without GO it waits between two saves (rank 0 touches OUT/IDLE), so a test may attach between saves."""
import json, os, sys, time


def rank_main(rank, world, out):
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import init_device_mesh
    from ckpt_trace.workloads import engines
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        state = engines._dcp_state(torch, mesh, engines.model_config("gpt2-tiny"), rank, world, False, empty=False)
        i = 0
        while i < 200:
            flags = torch.tensor([int(os.path.exists(os.path.join(out, name))) for name in ("STOP", "GO")])
            dist.all_reduce(flags)  # every rank stops, saves or waits after the same save
            if flags[0].item():
                break
            if flags[1].item() < world:
                if rank == 0:
                    open(os.path.join(out, "IDLE"), "w").close()
                time.sleep(0.05)
                continue
            dcp.save(state, checkpoint_id=os.path.join(out, f"step-{i}"))
            dist.barrier()
            if rank == 0:
                with open(os.path.join(out, "saves.jsonl"), "a") as log:
                    log.write(json.dumps({"step": i}) + "\n")
            i += 1
            time.sleep(1)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    from ckpt_trace.workloads import engines
    engines.spawn_ranks(rank_main, 2, (sys.argv[1],))
'''


def _until_attached(recorder: subprocess.Popen, timeout_s: float = 300.0) -> list[str]:
    """The recorder's stderr lines up to its "attached to ... recording" line (the probes live)."""
    import select

    assert recorder.stderr is not None
    lines, deadline = [], time.monotonic() + timeout_s
    while not (lines and "attached to" in lines[-1]):
        ready, _, _ = select.select([recorder.stderr], [], [], max(0.0, deadline - time.monotonic()))
        line = recorder.stderr.readline() if ready else ""
        if not line:
            raise AssertionError(f"the recorder did not attach: {''.join(lines)}")
        lines.append(line)
    return lines


@pytest.mark.slow
def test_attach_to_a_two_rank_dcp_job_records_one_save(backend, torch_installed, tmp_path):
    """The issue's case: a running 2-rank DCP job; one save is 3 checkpoint files (a .distcp per rank, then
    .metadata written as .metadata.tmp and renamed), so --until-checkpoints 3 records exactly one save.

    The recorder attaches between two saves (the job waits while OUT/GO is missing; the recorder says when
    its probes are live, then GO comes back): attached during a save, the other rank's file and the
    .metadata of the save under way are opened after the attach and count (``tracer.attach``'s rule), and
    the three files span two saves, the flake this test once had at load 14."""
    out = tmp_path / "job"
    out.mkdir()
    (out / "GO").touch()
    script = tmp_path / "dcp_loop.py"
    script.write_text(DCP_LOOP)
    job = subprocess.Popen([sys.executable, str(script), str(out)])
    recorder = None
    try:
        _wait_for(lambda: len(_saves(out)) >= 1, "the job's first save", timeout_s=300)
        (out / "GO").unlink()
        _wait_for(lambda: (out / "IDLE").exists(), "the job to wait between two saves", timeout_s=300)
        trace = tmp_path / "dcp.arrow"
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
        recorder = subprocess.Popen(
            [*CKPT_TRACE, "record", "--backend", backend, "--pid", str(job.pid), "--until-checkpoints", "3"]
            + ["--path-filter", f"{out}/", "--json", "-o", str(trace)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        _until_attached(recorder)
        (out / "GO").touch()
        stdout, stderr = recorder.communicate(timeout=300)
        assert recorder.returncode == 0, stderr
        summary = json.loads(stdout)
        assert job.poll() is None
    finally:
        if recorder is not None and recorder.poll() is None:
            recorder.kill()
            recorder.communicate()
        (out / "STOP").touch()
        code = job.wait(timeout=300)
    assert code == 0
    files = summary["attached"]["checkpoint_files"]
    (step,) = {Path(path).parent for path in files}
    assert sorted(Path(path).name for path in files) == [".metadata.tmp", "__0_0.distcp", "__1_0.distcp"]
    rows = read_trace(trace).table.to_pylist()
    # one save: every checkpoint file opened is one of its files (a save under way at the attach may leave a
    # tail, never an open), and nothing of a later save; the job's own control files in OUT (IDLE, which rank 0
    # opens every 50 ms while it waits for GO, and saves.jsonl) are no checkpoint's
    opened = {Path(row["path"]) for row in rows if row["op"] == "open"}
    assert {path.parent for path in opened if path.parent != out} == {step}
    assert {path.name for path in opened if path.parent == out} <= {"IDLE", "saves.jsonl"}
    number = lambda name: int(name.split("-")[1])  # noqa: E731 - step-N
    assert all(
        number(Path(row["path"]).relative_to(out).parts[0]) <= number(step.name)
        for row in rows
        if row["path"] and Path(row["path"]) != out and Path(row["path"]).parent != out  # OUT's own: no step
    )
    written = Counter()
    for row in rows:
        if row["op"] == "write":
            written[row["path"]] += row["ret"]
    for name in ("__0_0.distcp", "__1_0.distcp"):
        assert written[str(step / name)] == (step / name).stat().st_size
    assert written[str(step / ".metadata.tmp")] == (step / ".metadata").stat().st_size
    assert [(row["path"], row["new_path"]) for row in rows if row["op"] == "rename"] == [
        (str(step / ".metadata.tmp"), str(step / ".metadata"))
    ]


@pytest.fixture
def cgroup_dir():
    """A fresh cgroup v2 directory (removed afterwards, once empty); skips (fails under CI) without a cgroup2
    mount we may write to."""
    from conftest import _missing

    from ckpt_trace.tracer.attach import _cgroup2_mounts

    mounts = [point for point, _ in _cgroup2_mounts() if os.access(point, os.W_OK)]
    if not mounts:
        _missing("no writable cgroup2 mount (root and cgroup v2 needed)", required_in_ci=True)
    path = Path(mounts[0]) / f"ckpt-trace-test-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    try:
        yield path
    finally:
        _wait_for(lambda: not (path / "cgroup.procs").read_text().split(), "the test cgroup to empty")
        path.rmdir()


def _job_in_cgroup(out: Path, cgroup: Path) -> subprocess.Popen:
    """The saver forking a process per save (a descendant at the attach and after it), started inside
    ``cgroup`` (the shell moves itself in, then becomes the saver)."""
    script = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
    return subprocess.Popen(["sh", "-c", script, str(cgroup), sys.executable, "-c", SAVER, str(out), "fork"])


@pytest.mark.slow
def test_attach_to_a_cgroup_records_its_processes_and_no_other(backend, cgroup_dir, tmp_path):
    """``--cgroup``: the trace holds the cgroup's saves, byte for byte as the job logs them, and nothing of a
    process outside it that saves the same way at the same time; the job runs on."""
    out, outside = tmp_path / "job", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    job = _job_in_cgroup(out, cgroup_dir)
    other = _job(outside, "plain")
    try:
        _wait_for(lambda: len(_saves(out)) >= 1 and len(_saves(outside)) >= 1, "both jobs' first saves")
        assert job.pid in [int(pid) for pid in (cgroup_dir / "cgroup.procs").read_text().split()]
        trace = tmp_path / "cgroup.arrow"
        proc = cli(
            "record",
            "--backend",
            backend,
            "--cgroup",
            str(cgroup_dir),
            "--until-checkpoints",
            "2",
            "--json",
            "-o",
            str(trace),
        )
        summary = json.loads(proc.stdout)
        assert job.poll() is None and other.poll() is None
        saves_at_detach = len(_saves(out))
        _wait_for(lambda: len(_saves(out)) > saves_at_detach, "a save after the detach")
    finally:
        (out / "STOP").touch()
        (outside / "STOP").touch()
        codes = job.wait(timeout=120), other.wait(timeout=120)
    assert codes == (0, 0)
    attached = summary["attached"]
    assert attached["cgroup"] == str(cgroup_dir) and attached["stopped_by"] == "checkpoints"
    assert attached["pid"] == job.pid and other.pid not in attached["processes"]
    counted = attached["checkpoint_files"]
    assert len(counted) == 2 and all(Path(path).parent == out for path in counted)
    rows = read_trace(trace).table.to_pylist()
    assert not [row for row in rows if str(outside) in (row["path"] or "")]  # outside the cgroup: not traced
    assert other.pid not in {row["pid"] for row in rows}
    written = Counter()
    for row in rows:
        if row["op"] == "write":
            written[row["path"]] += row["ret"]
    logged = {save["path"]: save["bytes"] for save in _saves(out)}
    opened = {row["path"] for row in rows if row["op"] == "open" and Path(row["path"]).name.startswith("ckpt-")}
    assert opened == set(counted)  # the saves begun after the attach, each whole
    for path in counted:
        assert written[path] == logged[path]
        assert [row["offset"] for row in rows if row["path"] == path and row["op"] == "write"] == [
            i * 65536 for i in range(16)
        ]
    # each save is a process forked after the attach: the kernel's cgroup test saw them from their first call
    savers = {row["pid"] for row in rows if row["path"] in counted}
    assert len(savers) == 2 and job.pid not in savers


@pytest.mark.slow
def test_a_missing_or_v1_or_empty_cgroup_fails_in_one_line(cgroup_dir, tmp_path):
    trace = tmp_path / "t.arrow"
    proc = cli("record", "--backend", "strace", "--cgroup", str(tmp_path / "nope"), "-o", str(trace), check=False)
    assert proc.returncode != 0 and f"--cgroup {tmp_path / 'nope'}: no such cgroup directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = cli("record", "--backend", "strace", "--cgroup", str(tmp_path), "-o", str(trace), check=False)
    assert proc.returncode != 0 and "not a cgroup, only cgroup v2 is traced" in proc.stderr
    proc = cli("record", "--backend", "strace", "--cgroup", str(cgroup_dir), "-o", str(trace), check=False)
    assert proc.returncode != 0 and "no process in that cgroup" in proc.stderr
    v1 = [
        line.split(" ")[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if " - cgroup " in line  # a cgroup v1 hierarchy
    ]
    if v1:
        proc = cli("record", "--backend", "strace", "--cgroup", v1[0], "-o", str(trace), check=False)
        assert proc.returncode != 0 and "a cgroup v1 directory, only cgroup v2 is traced" in proc.stderr
    proc = cli(
        "record", "--backend", "strace", "--pid", "1", "--cgroup", str(cgroup_dir), "-o", str(trace), check=False
    )
    assert proc.returncode != 0 and "give one of the two" in proc.stderr
    assert not trace.exists()


@pytest.mark.slow
def test_bcc_traces_a_process_that_joins_the_cgroup_after_the_attach(bcc_backend, cgroup_dir, tmp_path):
    """bcc tells a cgroup's processes in the kernel (``traced_cgroup``): a saver moved into the cgroup once the
    probes are live is traced from then on, though no process of the cgroup forked it."""
    out = tmp_path / "job"
    out.mkdir()
    member = subprocess.Popen(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec sleep 300', str(cgroup_dir)])
    saver = _job(out, "plain")  # outside the cgroup for now
    recorder = None
    try:
        _wait_for(lambda: str(member.pid) in (cgroup_dir / "cgroup.procs").read_text().split(), "the member")
        _wait_for(lambda: len(_saves(out)) >= 1, "the saver's first save")
        trace = tmp_path / "joined.arrow"
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
        recorder = subprocess.Popen(
            [*CKPT_TRACE, "record", "--backend", "bcc", "--cgroup", str(cgroup_dir), "--until-checkpoints", "2"]
            + ["--json", "-o", str(trace)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        _until_attached(recorder)
        saves_before_move = len(_saves(out))
        (cgroup_dir / "cgroup.procs").write_text(str(saver.pid))
        stdout, stderr = recorder.communicate(timeout=300)
        assert recorder.returncode == 0, stderr
        summary = json.loads(stdout)
        assert saver.poll() is None and member.poll() is None  # both run on
    finally:
        if recorder is not None and recorder.poll() is None:
            recorder.kill()
            recorder.communicate()
        (out / "STOP").touch()
        code = saver.wait(timeout=120)
        member.kill()
        member.wait()
    assert code == 0 and summary["attached"]["stopped_by"] == "checkpoints"
    counted = summary["attached"]["checkpoint_files"]
    rows = read_trace(trace).table.to_pylist()
    assert {row["pid"] for row in rows if row["path"] in counted} == {saver.pid}
    index = lambda name: int(Path(name).name.split("-")[1].split(".")[0])  # noqa: E731 - ckpt-N.bin
    assert len(counted) == 2 and min(index(path) for path in counted) >= saves_before_move
    logged = {save["path"]: save["bytes"] for save in _saves(out)}
    for path in counted:
        assert sum(row["ret"] for row in rows if row["path"] == path and row["op"] == "write") == logged[path]
