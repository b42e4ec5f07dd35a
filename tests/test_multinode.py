"""A job on two nodes, simulated on one machine: two torchrun agents, each recorded by its own `record --host`,
merged into one trace of the job, then replayed by two torchrun agents as by one process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from conftest import CKPT_TRACE, cli, record

from ckpt_trace.formats import read_metadata, scan

MODEL = "gpt2-tiny"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}


def _torchrun(node_rank: int, port: int, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "ckpt-trace-multinode",
        "-m",
        "ckpt_trace.cli",
        *args,
    ]


def _start_nodes(command_of: Callable[[int], list[str]]) -> list[subprocess.Popen]:
    """Two nodes started at once: ``command_of(i)`` for node i, in the job's environment (``_env``), output
    piped."""
    return [
        subprocess.Popen(command_of(i), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]


def _finish_nodes(agents: list[subprocess.Popen], timeout_s: float = 900) -> list[str]:
    """Each node's stderr once every node has ended. A node that fails stops the others (SIGTERM): they
    would otherwise wait for it at the rendezvous or a collective until torchrun's own timeout."""
    import threading

    logs: list[str] = ["", ""]

    def drain(i: int) -> None:
        try:
            logs[i] = agents[i].communicate(timeout=timeout_s)[1]
        except subprocess.TimeoutExpired:
            agents[i].kill()
            logs[i] = f"(killed after {timeout_s} s)\n" + agents[i].communicate()[1]
        if agents[i].returncode != 0:
            for other in agents:
                if other.poll() is None:
                    other.terminate()

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(agents))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return logs


def _rows_per_rank(trace: Path, root: Path) -> dict[int, Counter]:
    """rank -> Counter of (op, file relative to ``root``, offset, size) of its reads and writes."""
    _, batches = scan(trace, ["rank", "op", "path", "offset", "size"])
    table = pa.Table.from_batches(list(batches)).to_pylist()
    out: dict[int, Counter] = {}
    for row in table:
        if row["op"] in ("write", "read") and row["path"] and row["path"].startswith(str(root) + "/"):
            out.setdefault(row["rank"], Counter())[
                (row["op"], row["path"][len(str(root)) + 1 :], row["offset"], row["size"])
            ] += 1
    return out


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_nodes_recorded_merged_and_replayed_as_one_node(tmp_path, torch_installed, bcc_backend):
    # one node: the 4-rank save, recorded
    single = tmp_path / "single" / "ck"
    record(
        None,
        tmp_path / "single.arrow",
        f"{single}/",
        *CKPT_TRACE,
        "workload",
        "dcp",
        "--ranks",
        "4",
        "--model",
        MODEL,
        "--out",
        str(single),
    )
    # two nodes: two torchrun agents of two ranks each, each agent recorded by its own record --host
    multi = tmp_path / "multi_" / "ck"  # as long a path as single's: DCP's .metadata holds it
    port = _free_port()
    agents = _start_nodes(
        lambda i: [
            *CKPT_TRACE,
            "record",
            "--host",
            f"node{i}",
            "--path-filter",
            f"{multi}/",
            "-o",
            str(tmp_path / f"node{i}.arrow"),
            "--",
            *_torchrun(i, port, "workload", "dcp", "--model", MODEL, "--out", str(multi), "--force"),
        ]
    )
    logs = _finish_nodes(agents)
    assert [a.returncode for a in agents] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert _files(multi) == _files(single)

    node_meta = [read_metadata(tmp_path / f"node{i}.arrow") for i in range(2)]
    assert [m["host"] for m in node_meta] == ["node0", "node1"]
    assert all(m["job"]["id"] == "ckpt-trace-multinode" for m in node_meta)
    job = tmp_path / "job.arrow"
    merged = json.loads(
        cli("merge", str(tmp_path / "node0.arrow"), str(tmp_path / "node1.arrow"), "-o", str(job), "--json").stdout
    )
    assert merged["ranks"] == [0, 1, 2, 3] and sorted(merged["hosts"]) == ["node0", "node1"]
    assert [len(h["ranks"]) for h in merged["hosts"].values()] == [2, 2]
    # per rank: the same files, offsets and sizes as the one-node recording
    assert _rows_per_rank(job, multi) == _rows_per_rank(tmp_path / "single.arrow", single)
    summary = json.loads(cli("summary", str(job), "--json").stdout)
    assert sorted(summary["hosts"]) == ["node0", "node1"] and summary["ranks"] == [0, 1, 2, 3]
    assert summary["slowest_rank"]["rank"] in range(4) and summary["slowest_save"]["save_time_ns"] > 0
    assert summary["slowest_rank"]["host"] in ("node0", "node1")

    # replay: two torchrun nodes, each recorded host's ranks on one node, against a one-process replay
    cli("replay", str(job), "--target", str(tmp_path / "r1"), "--strip-prefix", str(multi))
    port = _free_port()
    replays = _start_nodes(
        lambda i: _torchrun(
            i,
            port,
            "replay",
            str(job),
            "--target",
            str(tmp_path / "r2"),
            "--strip-prefix",
            str(multi),
            "-o",
            str(tmp_path / "r2.json"),
        )
    )
    logs = _finish_nodes(replays)
    assert [r.returncode for r in replays] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert _files(tmp_path / "r2") == _files(tmp_path / "r1") and len(_files(tmp_path / "r1")) >= 5
    doc = json.loads((tmp_path / "r2.json").read_text())
    assert doc["options"]["placement"] == "host"
    hosts = {h: set(e["ranks"]) for h, e in merged["hosts"].items()}
    for process in doc["distributed"]["processes"]:  # each process's ranks come from one recorded host
        ranks = set(process["owners"]) & {0, 1, 2, 3}
        assert any(ranks <= held for held in hosts.values()), (process["owners"], hosts)
    nodes = {}
    for process in doc["distributed"]["processes"]:
        nodes.setdefault(process["node"], set()).update(o for o in process["owners"] if o >= 0)
    assert sorted(map(sorted, nodes.values())) == sorted(map(sorted, hosts.values()))
    per_host = doc["distributed"]["recorded_hosts"]  # each recorded host: its processes, one node, its time
    assert sorted(per_host) == ["node0", "node1"] and all(len(e["nodes"]) == 1 for e in per_host.values())
    assert all(e["elapsed_s"]["posix"] > 0 for e in per_host.values())


def test_placement_keeps_each_recorded_hosts_ranks_on_one_node():
    import numpy as np

    from ckpt_trace.replayer.distributed import World, placed_share

    owners = np.array([-101, 0, 1, 2, 3, 4, 5, 6, 7], np.int64)  # -101: a launcher process (pid 100) on host a
    hosts = {-101: "a", 0: "a", 1: "a", 2: "b", 3: "b", 4: "a", 5: "a", 6: "b", 7: "b"}  # a job's own placement

    def shares(placement, nodes=2, per_node=2):
        return [
            sorted(
                placed_share(
                    owners,
                    hosts,
                    World(
                        rank=n * per_node + lr,
                        size=nodes * per_node,
                        local_rank=lr,
                        node=n,
                        nodes=nodes,
                        local_size=per_node,
                    ),
                    placement,
                )
            )
            for n in range(nodes)
            for lr in range(per_node)
        ]

    assert shares("host") == [[-101, 0], [1, 4, 5], [2, 3], [6, 7]]
    assert shares("spread") == [[-101, 0], [1, 2], [3, 4], [5, 6, 7]]
    # more nodes than recorded hosts: spread
    assert shares("host", nodes=4, per_node=1) == shares("spread", nodes=4, per_node=1)
