"""Distributed replay: a trace's ranks split over processes launched by torchrun, against a one-process replay."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from conftest import cli
from helpers.traces import CREATE, make_trace

from ckpt_trace.documents import ReplayDoc, conforms
from ckpt_trace.formats import read_trace, write_trace
from ckpt_trace.replayer import build_posix_plan
from ckpt_trace.replayer.distributed import launched, owners, share_batches, share_of, share_plan
from ckpt_trace.replayer.plan import PLAN_COLUMNS
from ckpt_trace.tracer import syscalls as sc

RANKS = 6


def _rank_ops(rank: int, ts: int, ops: list[dict]) -> list[dict]:
    return [{"pid": 100 + rank, "tid": 100 + rank, "rank": rank, "ts_ns": ts + i, **op} for i, op in enumerate(ops)]


def checkpoint_trace(path: Path) -> Path:
    """Six ranks save a checkpoint: rank 0 makes the directory, each rank writes its shard, ranks 2 and 5
    write one shared file (5 opens it after 2 created it), ranks 1 and 4 read a file the trace never
    wrote (to different lengths), and rank 0 writes the metadata through a rename at the end."""
    rows = _rank_ops(0, 0, [{"op": "mkdir", "path": "/ck"}])
    for rank in range(RANKS):
        shard = f"/ck/__{rank}_0.distcp"
        rows += _rank_ops(
            rank,
            1000 + rank * 100,
            [
                {"op": "open", "path": shard, "fd": 3, "flags": CREATE, "ret": 3},
                {"op": "write", "path": shard, "fd": 3, "offset": 0, "size": 4096, "ret": 4096},
                {"op": "write", "path": shard, "fd": 3, "offset": 4096, "size": 4096, "ret": 4096},
                {"op": "write", "path": shard, "fd": 3, "offset": 8192, "size": 1000 + rank, "ret": 1000 + rank},
                {"op": "close", "path": shard, "fd": 3},
            ],
        )
    rows += _rank_ops(
        2,
        3000,
        [
            {"op": "open", "path": "/ck/shared.bin", "fd": 4, "flags": sc.O_WRONLY | sc.O_CREAT, "ret": 4},
            {"op": "write", "path": "/ck/shared.bin", "fd": 4, "offset": 0, "size": 5000, "ret": 5000},
            {"op": "close", "path": "/ck/shared.bin", "fd": 4},
        ],
    )
    rows += _rank_ops(
        5,
        4000,
        [
            {"op": "open", "path": "/ck/shared.bin", "fd": 4, "flags": sc.O_WRONLY, "ret": 4},
            {"op": "write", "path": "/ck/shared.bin", "fd": 4, "offset": 5000, "size": 4000, "ret": 4000},
            {"op": "close", "path": "/ck/shared.bin", "fd": 4},
        ],
    )
    for rank, length in ((1, 3000), (4, 7000)):
        rows += _rank_ops(
            rank,
            5000 + rank * 10,
            [
                {"op": "open", "path": "/data/base.bin", "fd": 5, "flags": sc.O_RDONLY, "ret": 5},
                {"op": "read", "path": "/data/base.bin", "fd": 5, "offset": 0, "size": length, "ret": length},
                {"op": "close", "path": "/data/base.bin", "fd": 5},
            ],
        )
    rows += _rank_ops(
        0,
        9000,
        [
            {"op": "open", "path": "/ck/.metadata.tmp", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": "/ck/.metadata.tmp", "fd": 3, "offset": 0, "size": 300, "ret": 300},
            {"op": "close", "path": "/ck/.metadata.tmp", "fd": 3},
            {"op": "rename", "path": "/ck/.metadata.tmp", "new_path": "/ck/.metadata"},
        ],
    )
    rows.sort(key=lambda row: row["ts_ns"])
    return make_trace(path, rows)


def test_launched_reads_torchruns_environment():
    assert launched({}) is None and launched({"WORLD_SIZE": "1", "RANK": "0"}) is None
    world = launched({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert (world.rank, world.size, world.local_rank) == (3, 4, 1)


def test_shares_split_the_ranks_and_name_operations_as_the_whole_plan_does(tmp_path):
    trace = checkpoint_trace(tmp_path / "t.arrow")
    found = owners(trace)
    assert found.tolist() == list(range(RANKS))
    shares = [share_of(found, i, 4) for i in range(4)]
    assert shares == [{0}, {1, 2}, {3}, {4, 5}]
    whole = build_posix_plan(read_trace(trace).table.select(list(PLAN_COLUMNS)))
    by_seq = {int(s): k for s, k in zip(whole.ops.seq, whole.ops.kind)}
    cut = [share_plan(build_posix_plan(share_batches(trace, share)), share) for share in shares]
    # Every operation is replayed by exactly one process, under the seq the whole plan gives it.
    seqs = sorted(int(s) for c in cut for s in c.plan.ops.seq)
    assert seqs == sorted(by_seq)
    for c in cut:
        assert all(by_seq[int(s)] == k for s, k in zip(c.plan.ops.seq, c.plan.ops.kind))
    # Rank 5 opens shared.bin after rank 2 created, wrote and closed it, in another process: a remote wait on
    # that close (``replayer.plan``: a path's next open waits for another worker's close of its file).
    ops_2 = [op for w in whole.workers if w.rank == 2 for op in w.ops]
    open_2 = next(op.handle for op in ops_2 if op.kind == "open" and op.path == "ck/shared.bin")
    close_2 = next(op.seq for op in ops_2 if op.kind == "close" and op.handle == open_2)
    assert close_2 in cut[3].remote and close_2 not in cut[1].remote
    # Rank 0's mkdir is waited for by every other process's first open.
    assert all(0 in c.remote for c in cut[1:])
    assert cut[1].precreate == {"data/base.bin": 3000} and cut[3].precreate == {"data/base.bin": 7000}
    assert cut[3].written == {"ck/__4_0.distcp": 9196, "ck/__5_0.distcp": 9197, "ck/shared.bin": 9000}


def test_a_trace_without_ranks_is_shared_out_by_process(tmp_path):
    """Rows without a rank (rank -1) are owned by their process: three processes' writes go to three owners,
    and each share's plan replays exactly its processes' threads."""
    rows = []
    for pid in (300, 100, 200):
        rows += [
            {"pid": pid, "tid": pid, "ts_ns": pid * 10 + i, **op}
            for i, op in enumerate(
                [
                    {"op": "open", "path": f"/d/{pid}", "fd": 3, "flags": CREATE, "ret": 3},
                    {"op": "write", "path": f"/d/{pid}", "fd": 3, "offset": 0, "size": pid, "ret": pid},
                    {"op": "close", "path": f"/d/{pid}", "fd": 3},
                ]
            )
        ]
    trace = make_trace(tmp_path / "t.arrow", sorted(rows, key=lambda row: row["ts_ns"]))
    found = owners(trace)
    assert found.tolist() == [-301, -201, -101]  # -1 - pid, sorted
    for index in range(2):
        share = share_of(found, index, 2)
        cut = share_plan(build_posix_plan(share_batches(trace, share)), share)
        assert {w.pid for w in cut.plan.workers} == {-1 - key for key in share}
        assert cut.written == {f"d/{-1 - key}": -1 - key for key in share}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def _torchrun(nodes: int, per_node: int, *args: str) -> list[tuple[int, str]]:
    """(exit code, stderr) of each of ``nodes`` torchrun agents of ``per_node`` processes running
    ``ckpt-trace ARGS``, c10d rendezvous on localhost."""
    port = _free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(per_node),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"localhost:{port}",
        "--rdzv-id",
        "ckpt-trace-test",
        "-m",
        "ckpt_trace.cli",
        *args,
    ]
    agents = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(nodes)
    ]
    logs = [agent.communicate(timeout=600)[1] for agent in agents]
    return [(agent.returncode, log) for agent, log in zip(agents, logs)]


def test_torchrun_two_nodes_replay_what_one_process_replays(tmp_path, torch_installed, io_uring):
    """Two torchrun "nodes" of two processes each (c10d rendezvous on localhost) replay the six ranks:
    the same files with the same sizes and content as one process's replay, per strategy."""
    trace = checkpoint_trace(tmp_path / "t.arrow")
    single = tmp_path / "single"
    cli(
        "replay",
        str(trace),
        "--target",
        str(single),
        "--strategy",
        "all",
        "--verify",
        "-o",
        str(tmp_path / "single.json"),
    )
    target, out = tmp_path / "multi", tmp_path / "multi.json"
    agents = _torchrun(
        2, 2, "replay", str(trace), "--target", str(target), "--strategy", "all", "--verify", "-o", str(out)
    )
    assert [code for code, _ in agents] == [0, 0], "\n".join(log[-3000:] for _, log in agents)

    assert _files(target) == _files(single)
    assert len(_files(target)) == 4 * (RANKS + 3)  # per strategy: the shards, shared, base, .metadata
    doc, one = json.loads(out.read_text()), json.loads((tmp_path / "single.json").read_text())
    assert conforms(doc, ReplayDoc) is None
    assert doc["distributed"]["world_size"] == 4
    processes = doc["distributed"]["processes"]
    assert sorted(p["process"] for p in processes) == [0, 1, 2, 3]
    assert sorted(o for p in processes for o in p["owners"]) == list(range(RANKS))
    for job, alone in zip(doc["results"], one["results"]):
        assert job["strategy"] == alone["strategy"]
        assert (
            job["bytes_written"]
            == alone["bytes_written"]
            == sum(p["results"][doc["results"].index(job)]["bytes_written"] for p in processes)
        )
        assert job["bytes_read"] == alone["bytes_read"] == 7000 + 3000
        assert job["data_ops"] == alone["data_ops"]
        assert job["verified_files"] == alone["verified_files"]  # each file once, whoever checked it
        assert job["elapsed_s"] == max(p["results"][doc["results"].index(job)]["elapsed_s"] for p in processes)
    assert doc["trace_sha256"] == one["trace_sha256"]


def test_torchrun_replay_refusing_to_overwrite_loses_nothing(tmp_path, torch_installed):
    """One process finds a file it would create already there: every process fails with one line naming
    it, and the file, and everything else in the target, stays as it was."""
    trace = checkpoint_trace(tmp_path / "t.arrow")
    target = tmp_path / "target"
    (target / "ck").mkdir(parents=True)
    theirs = target / "ck" / "__3_0.distcp"
    theirs.write_bytes(b"not the replay's")
    agents = _torchrun(1, 2, "replay", str(trace), "--target", str(target), "--force")
    assert all(code != 0 for code, _ in agents)
    assert "__3_0.distcp already exists" in agents[0][1] and "Traceback" not in agents[0][1].split("ckpt-trace:")[0]
    assert theirs.read_bytes() == b"not the replay's"
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == ["ck", "ck/__3_0.distcp"]


def test_torchrun_replay_runs_rounds_as_one_process_does(tmp_path, torch_installed, io_uring):
    """Two processes replay every strategy in rounds by the one-process rule (conftest: 1-3 rounds; three
    rounds never tell strategies apart, so all three run): every process runs the same rounds, each round's
    job time is its slowest process's, and each result carries the spread and paired speed-ups of them."""
    trace = checkpoint_trace(tmp_path / "t.arrow")
    out = tmp_path / "multi.json"
    agents = _torchrun(
        1, 2, "replay", str(trace), "--target", str(tmp_path / "multi"), "--strategy", "all", "-o", str(out)
    )
    assert [code for code, _ in agents] == [0], "\n".join(log[-3000:] for _, log in agents)
    doc = json.loads(out.read_text())
    assert conforms(doc, ReplayDoc) is None
    assert doc["options"]["rounds"] == 3 and doc["options"]["repeat"] is None
    assert "rounds until every pair" in doc["options"]["rounds_rule"]
    processes = doc["distributed"]["processes"]
    names = [r["strategy"] for r in doc["results"]]
    assert len(names) == 4
    for i, job in enumerate(doc["results"]):
        rounds = [p["results"][i]["runs_elapsed_s"] for p in processes]
        assert [len(r) for r in rounds] == [3, 3]  # the same rounds in every process
        assert job["runs_elapsed_s"] == [max(times) for times in zip(*rounds)]  # a round's job time: the slowest
        spread = job["elapsed_spread_s"]
        assert spread["runs"] == 3 and spread["min"] == min(job["runs_elapsed_s"])
        assert sorted(job["versus"]) == sorted(set(names) - {job["strategy"]})
        for entry in job["versus"].values():
            assert entry["n"] == 3 and entry["verdict"] == "within noise"
        assert job["speedup"]["n"] == 3


def test_torchrun_replays_recorded_ratio_data_as_one_process_does(tmp_path, torch_installed):
    """``--data recorded-ratio`` under torchrun: every process generates the same compressible data (each sets
    and calibrates it itself), so the job's files hold the bytes one process's replay writes, byte for byte,
    with each 4 KiB block's tail zeros from the same point on."""
    plain = read_trace(checkpoint_trace(tmp_path / "plain.arrow"))
    meta = {key: value for key, value in plain.metadata.items() if key != "format_version"}
    meta["data_compressibility"] = {"method": "zstd level 1 (Arrow's codec) of each sampled piece alone", "ratio": 0.25}
    trace = write_trace(tmp_path / "t.arrow", plain.table, meta)
    args = ("--data", "recorded-ratio", "--verify")
    cli("replay", str(trace), "--target", str(tmp_path / "single"), *args, "-o", str(tmp_path / "single.json"))
    out = tmp_path / "multi.json"
    agents = _torchrun(1, 2, "replay", str(trace), "--target", str(tmp_path / "multi"), *args, "-o", str(out))
    assert [code for code, _ in agents] == [0], "\n".join(log[-3000:] for _, log in agents)
    doc, one = json.loads(out.read_text()), json.loads((tmp_path / "single.json").read_text())
    assert doc["options"]["data_mode"] == one["options"]["data_mode"] == "recorded-ratio"
    assert doc["options"]["data_ratio"] == one["options"]["data_ratio"]
    unique = doc["options"]["data_ratio"]["unique_bytes_per_block"]
    assert 900 < unique < 1100  # a quarter of 4096, give or take zstd's costs
    single, multi = tmp_path / "single", tmp_path / "multi"
    written = sorted(str(p.relative_to(single)) for p in single.rglob("*.distcp"))
    assert len(written) == RANKS
    for rel in written:
        data = (multi / rel).read_bytes()
        assert data == (single / rel).read_bytes()
        assert data[unique:4096] == bytes(4096 - unique) and data[unique - 8 : unique].count(0) < 8


def test_torchrun_original_timing_gives_the_jobs_accuracy_over_every_rank(tmp_path, torch_installed):
    """Under --timing original each process paces its own ranks; the job's result gives the accuracy over
    all of them: every rank that had operations, each with the operations its process paced."""
    trace = checkpoint_trace(tmp_path / "t.arrow")
    out = tmp_path / "multi.json"
    args = ("replay", str(trace), "--target", str(tmp_path / "multi"), "--timing", "original", "-o", str(out))
    agents = _torchrun(1, 2, *args)
    assert [code for code, _ in agents] == [0], "\n".join(log[-3000:] for _, log in agents)
    doc = json.loads(out.read_text())
    job = doc["results"][0]["timing"]
    assert job is not None and job["start_error_share_p50"] is not None and job["busy_share"] is not None
    per_process: dict[str, int] = {}
    for process in doc["distributed"]["processes"]:
        for rank, figures in (process["results"][0]["timing"] or {"ranks": {}})["ranks"].items():
            per_process[rank] = per_process.get(rank, 0) + figures["ops"]
    assert {str(rank) for rank in range(RANKS)} <= set(job["ranks"])
    assert {rank: figures["ops"] for rank, figures in job["ranks"].items()} == per_process
