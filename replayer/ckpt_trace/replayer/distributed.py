"""Distributed replay: one trace replayed by the processes torchrun launched, on one node or many.

``ckpt-trace replay TRACE --strategy S --target DIR -o OUT`` launched by
``torchrun --nnodes N --nproc-per-node M ...`` (or ``srun`` running torchrun
on each node: ``docs/distributed-replay.md``) finds WORLD_SIZE > 1 in its
environment (``launched``) and runs ``replay_distributed`` instead of
``replay.replay``: the recorded ranks (for a trace without ranks, the
recorded processes) are split across the launched processes, each process
reads and plans only its share, all start their clocks at a barrier, and
global rank 0 writes one results document.

Call order of ``replay_distributed`` (each step in every process):

1. Join: the c10d store of torchrun's ``env://`` rendezvous and a gloo
   process group on it (``torch.distributed``; torch is the ``torch`` extra).
2. Share (``owners``, ``share_of``): every process lists the trace's
   *owners*, the recorded ranks (rows without a rank: their pid), sorted;
   process i of W takes the i-th of W contiguous blocks.
3. Plan (``share_batches``, ``share_plan``): a process plans the reads and
   writes of its owners and every other row (opens, closes, renames, mkdirs:
   few, and all the cross-owner ordering needs), operations numbered by their
   row in the whole trace (``plan.GLOBAL_ROW``), so one seq names one
   operation in every process's plan; then the plan is cut to its owners'
   threads.
4. Exchange (one all_gather): each process's remote waits (operations of
   other processes its operations wait for), the pre-existing files it
   reads, the bytes it will write, the final sizes of the files it writes,
   and which processes see the same target (a probe file each). Then each
   process knows which of its operations others wait for, which
   pre-existing files it creates (the lowest process needing one, per file
   system), and every file's final size (the largest any process expects).
5. Before the clocks: free space for everybody's bytes, conflicts (nothing
   is overwritten), a probe of the queue depth; per strategy and run,
   precreation, then a barrier.
6. The runs, in rounds as a one-process replay runs them (``verdicts``:
   every strategy once a round, the order rotated; 3-20 rounds until every
   pair is told apart or the budget is spent, or ``--repeat N``): global
   rank 0 decides from the job's round times whether another round runs and
   tells the others. Each run: a barrier, every clock starts, each process
   replays its share;
   cross-process ordering goes through the store (``StoreSignals``): an
   operation others wait for sets its key when it completes, a waiting
   operation polls for it, a failure sets a key every waiter sees.
7. Results (all_gather): the job's figures are the sums of the processes'
   bytes and operations, its elapsed time the slowest process's, its
   latency percentiles from the merged histograms; the document lists each
   process's figures and names the slowest. A failure anywhere fails every
   process, and each removes what it created.

Cross-process ordering is the same as a one-process replay's (``plan``'s
module docstring): an operation waits for the open that created its
descriptor's handle, and for the previous operation naming its path, in
whichever process those ran.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckpt_trace import config
from ckpt_trace.errors import CkptTraceError, Interrupted, ReplayError
from ckpt_trace.formats import read_metadata, scan, sha256_file
from ckpt_trace.iolayer import host
from ckpt_trace.stats import LatencyHistogram

from . import strategies
from .engine import Progress
from .lock import TargetLock, job_id
from .optable import WRITE
from .options import ReplayOptions
from .ownership import Claim
from .plan import GLOBAL_ROW, PLAN_COLUMNS, ReplayPlan, build_posix_plan
from .replay import (
    SizeMismatch,
    check_queue_depth,
    data_choice,
    derive_plan,
    drop_page_cache,
    make_executor,
    prepare_target,
    refuse_target_holding,
    size_mismatches,
)
from .results import ReplayResult, results_document
from .runs import add_speedups, add_verdicts, median_run, release, trace_file
from .runstate import merge_timing_samples, timing_figures
from .verdicts import Rounds
from .verify import verify_content

#: How long a process waits for the others (a barrier, a gather, another process's operation) before it
#: gives up: seconds.
TIMEOUT_S = 1800
_PROBE = ".ckpt-trace-probe-"


@dataclass(frozen=True)
class World:
    """The launched processes, as torchrun's environment describes them (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``)."""

    rank: int
    size: int
    local_rank: int
    node: int = 0  # torchrun's GROUP_RANK: which node (agent) this process runs on
    nodes: int = 1  # GROUP_WORLD_SIZE: how many nodes
    local_size: int = 0  # LOCAL_WORLD_SIZE: processes on this node (0: unknown)


def launched(env: Mapping[str, str] | None = None) -> World | None:
    """The ``World`` when this process is one of several launched together (WORLD_SIZE > 1), else None.
    Raises ReplayError when WORLD_SIZE or RANK is malformed."""
    env = os.environ if env is None else env
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        if size <= 1:
            return None
        return World(
            rank=int(env["RANK"]),
            size=size,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            node=int(env.get("GROUP_RANK", "0")),
            nodes=int(env.get("GROUP_WORLD_SIZE", "1")),
            local_size=int(env.get("LOCAL_WORLD_SIZE", "0")),
        )
    except (KeyError, ValueError):
        raise ReplayError("WORLD_SIZE > 1 but RANK is missing or malformed: launch with torchrun") from None


PLACEMENTS = ("host", "spread")


def owner_hosts(trace: str | os.PathLike) -> dict[int, str]:
    """owner (``owner_keys``) -> the host its rows were recorded on, from a merged trace's ``host`` column
    (empty for a trace of one node: no such column)."""
    if "merged" not in read_metadata(trace):
        return {}
    _, batches = scan(trace, ["rank", "pid", "host"])
    out: dict[int, str] = {}
    for batch in batches:
        keys = owner_keys(
            batch.column("rank").to_numpy(zero_copy_only=False), batch.column("pid").to_numpy(zero_copy_only=False)
        )
        hosts = batch.column("host").cast(pa.string()).to_numpy(zero_copy_only=False)
        first = np.unique(keys, return_index=True)
        for key, row in zip(first[0].tolist(), first[1].tolist()):
            out.setdefault(key, hosts[row])
    return out


def placed_share(all_owners: np.ndarray, hosts: Mapping[int, str], world: World, placement: str) -> frozenset[int]:
    """This process's owners. ``spread``: ``share_of`` over every process. ``host`` (the default): each
    recorded host's owners stay together on one node: the hosts (in order of their lowest owner) are cut
    into ``world.nodes`` contiguous blocks, one per node, and a node's owners into contiguous blocks over its
    processes; where the trace has fewer hosts than the job has nodes (or no host column, or torchrun did
    not say how many processes each node runs), ``spread``. Raises ReplayError for an unknown placement."""
    if placement not in PLACEMENTS:
        raise ReplayError(f"unknown placement {placement!r} (choose from {', '.join(PLACEMENTS)})")
    names: list[str] = []
    for key in all_owners.tolist():
        name = hosts.get(key)
        if name is not None and name not in names:
            names.append(name)
    if placement == "spread" or len(names) < world.nodes or world.nodes <= 1 or world.local_size <= 0:
        return share_of(all_owners, world.rank, world.size)
    mine = set(names[world.node * len(names) // world.nodes : (world.node + 1) * len(names) // world.nodes])
    node_owners = np.array([key for key in all_owners.tolist() if hosts.get(key, names[0]) in mine], np.int64)
    return share_of(node_owners, world.local_rank, world.local_size)


# -- shares ------------------------------------------------------------------------------------------------------


def owner_keys(rank: np.ndarray, pid: np.ndarray) -> np.ndarray:
    """Each row's owner: its rank, or -1 - pid for a row without a rank (rank -1)."""
    rank, pid = np.asarray(rank, np.int64), np.asarray(pid, np.int64)
    return np.where(rank >= 0, rank, -1 - pid)


def owners(trace: str | os.PathLike) -> np.ndarray:
    """The sorted owners of a trace (``owner_keys``), in one pass over its rank and pid columns."""
    _, batches = scan(trace, ["rank", "pid"])
    found = np.zeros(0, np.int64)
    for batch in batches:
        keys = owner_keys(
            batch.column("rank").to_numpy(zero_copy_only=False), batch.column("pid").to_numpy(zero_copy_only=False)
        )
        found = np.union1d(found, np.unique(keys))
    return found


def share_of(all_owners: np.ndarray, index: int, count: int) -> frozenset[int]:
    """Process ``index`` of ``count``'s owners: the index-th of ``count`` contiguous, near-equal blocks
    of the sorted ``all_owners`` (empty when there are fewer owners than processes)."""
    n = len(all_owners)
    return frozenset(all_owners[index * n // count : (index + 1) * n // count].tolist())


def share_batches(trace: str | os.PathLike, share: frozenset[int]) -> Iterator[pa.RecordBatch]:
    """The planner's columns of the rows a process plans: every row that is not a read or a write, and
    the reads and writes of ``share``'s owners; with ``plan.GLOBAL_ROW``, each row's index in the trace."""
    _, batches = scan(trace, PLAN_COLUMNS)
    data_ops = pa.array(["read", "write"])
    wanted = np.fromiter(share, np.int64, len(share))
    start = 0
    for batch in batches:
        n = batch.num_rows
        data = pc.is_in(batch.column("op"), value_set=data_ops).to_numpy(zero_copy_only=False)
        mine = np.isin(
            owner_keys(
                batch.column("rank").to_numpy(zero_copy_only=False), batch.column("pid").to_numpy(zero_copy_only=False)
            ),
            wanted,
        )
        keep = mine | ~data
        rows = np.flatnonzero(keep)
        yield batch.filter(pa.array(keep)).append_column(GLOBAL_ROW, pa.array(rows + start, pa.int64()))
        start += n


@dataclass(frozen=True)
class Share:
    """One process's share of a plan (``share_plan``): the plan cut to the share's threads, and what the
    exchange needs from it."""

    plan: ReplayPlan
    remote: frozenset[int]  # seqs of other processes' operations this share's operations wait for
    precreate: Mapping[str, int]  # pre-existing files this share's operations use -> bytes they read
    written: Mapping[str, int]  # final path -> final size, of the files this share writes
    unverifiable: frozenset[str]


def _owner_of(worker) -> int:
    """A worker's owner, as ``owner_keys`` gives a row's."""
    return worker.rank if worker.rank >= 0 else -1 - worker.pid


def share_plan(plan: ReplayPlan, share: frozenset[int]) -> Share:
    """``plan`` (of ``share_batches``' rows) cut to the threads of ``share``'s owners. Pure.

    Its ``awaited`` are every seq its operations wait for (``remote`` the
    ones of other processes); ``checks`` keep the files it writes."""
    keep = np.array([_owner_of(w) in share for w in plan.workers], bool)
    t = plan.ops
    rows = np.flatnonzero(keep[t.worker]) if len(t) else np.zeros(0, np.int64)
    new_index = (np.cumsum(keep) - 1).astype(np.int32)
    table = t.take(rows, worker=new_index[t.worker[rows]])
    kept = tuple(w for w, k in zip(plan.workers, keep) if k)
    mine = set(table.seq.tolist())
    deps = set(table.dep_seq.tolist())
    names = {table.paths[i] for i in np.unique(np.concatenate([table.path, table.new_path])).tolist() if i >= 0}
    writes = np.unique(table.handle[(table.kind == WRITE) & (table.handle >= 0)]).tolist()
    written_paths = {
        path for h in writes if (path := plan.files.file_paths.get(plan.files.handle_files.get(h, -1))) is not None
    }
    expected = plan.checks.expected_sizes
    written = {path: expected[path] for path in written_paths if path in expected}
    precreate = {path: size for path, size in plan.precreate_files if path in names}
    checks = dataclasses.replace(
        plan.checks,
        expected_sizes=dict(written),
        verify_ranges={path: ranges for path, ranges in plan.checks.verify_ranges.items() if path in written_paths},
        unverifiable=tuple(p for p in plan.checks.unverifiable if p in written_paths),
    )
    sizes = np.maximum(table.size[table.kind == WRITE], 0)
    cut = dataclasses.replace(plan, workers=kept).with_ops(
        table,
        awaited=frozenset(deps),
        checks=checks,
        precreate_files=tuple((path, size) for path, size in plan.precreate_files if path in precreate),
        bytes_to_write=int(sizes.sum()) + sum(size for path, size in plan.precreate_files if path in precreate),
    )
    return Share(
        plan=cut,
        remote=frozenset(deps - mine),
        precreate=precreate,
        written=written,
        unverifiable=frozenset(plan.checks.unverifiable),
    )


# -- cross-process signals ----------------------------------------------------------------------------------------


class StoreSignals:
    """``posix.Signals`` through a c10d store: key ``<prefix>/<seq>`` is set when operation seq completes,
    ``<prefix>/failed`` (the message) when a process's run failed. Waiting polls (``Store.check``), from
    20 us up to 5 ms apart, so a thread waiting never holds the store's connection from another thread
    that must signal."""

    def __init__(
        self, store, prefix: str, remote: frozenset[int], exported: frozenset[int], timeout_s: float = TIMEOUT_S
    ) -> None:
        self.store, self.prefix = store, prefix
        self.remote, self.exported = remote, exported
        self.timeout_s = timeout_s
        self._lock = threading.Lock()

    def _check(self, key: str) -> bool:
        with self._lock:
            return bool(self.store.check([f"{self.prefix}/{key}"]))

    def wait(self, seq: int, stopped: threading.Event) -> bool:
        delay_s, deadline = 20e-6, time.monotonic() + self.timeout_s
        while not self._check(str(seq)):
            if self._check("failed") or stopped.is_set():
                return False
            if time.monotonic() > deadline:
                self.fail(f"waited {self.timeout_s:.0f} s for operation {seq} of another process")
                return False
            stopped.wait(delay_s)
            delay_s = min(delay_s * 2, 5e-3)
        return True

    def done(self, seq: int) -> None:
        with self._lock:
            self.store.set(f"{self.prefix}/{seq}", "1")

    def fail(self, message: str) -> None:
        with self._lock:
            self.store.set(f"{self.prefix}/failed", message)

    def failure(self) -> str:
        with self._lock:
            if self.store.check([f"{self.prefix}/failed"]):
                return "another process failed: " + self.store.get(f"{self.prefix}/failed").decode()
        return "the run stopped"


# -- the job ------------------------------------------------------------------------------------------------------


class _Group:
    """The gloo process group and the store (torch.distributed), with errors as ReplayError."""

    def __init__(self, world: World) -> None:
        try:
            import torch.distributed as dist
        except ImportError:
            raise ReplayError(
                "a replay launched by torchrun (WORLD_SIZE > 1) needs torch: pip install 'ckpt-trace[torch]'"
            ) from None
        self.dist, self.world = dist, world
        try:
            store, rank, size = next(dist.rendezvous("env://", timeout=timedelta(seconds=TIMEOUT_S)))
            dist.init_process_group(
                "gloo", store=store, rank=rank, world_size=size, timeout=timedelta(seconds=TIMEOUT_S)
            )
        except (RuntimeError, ValueError) as err:
            raise ReplayError(f"cannot join the torchrun job: {str(err).splitlines()[0]}") from None
        self.store = dist.PrefixStore("ckpt-trace", store)

    def gather(self, value) -> list:
        out = [None] * self.world.size
        try:
            self.dist.all_gather_object(out, value)
        except RuntimeError as err:  # gloo: a peer died or timed out
            raise ReplayError(f"lost the other processes of the job: {str(err).splitlines()[0]}") from None
        return out

    def broadcast(self, value):
        """Global rank 0's ``value``, in every process (``value`` is ignored elsewhere)."""
        box = [value]
        try:
            self.dist.broadcast_object_list(box, src=0)
        except RuntimeError as err:
            raise ReplayError(f"lost the other processes of the job: {str(err).splitlines()[0]}") from None
        return box[0]

    def barrier(self) -> None:
        try:
            self.dist.barrier()
        except RuntimeError as err:
            raise ReplayError(f"lost the other processes of the job: {str(err).splitlines()[0]}") from None

    def agree(self, error: BaseException | None) -> None:
        """Raise in every process when any process failed (its message, naming the process)."""
        found = self.gather(None if error is None else (type(error).__name__, str(error)))
        for index, problem in enumerate(found):
            if problem is not None:
                kind, message = problem
                if index == self.world.rank:
                    raise Interrupted(message) if kind == "Interrupted" else ReplayError(message)
                raise ReplayError(f"process {index} of {self.world.size}: {message}")

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


def _probe_groups(group: _Group, target: Path) -> list[int]:
    """For each process, the lowest process that sees the same target file system (a probe file each,
    made and removed here): processes on one shared file system form one group, node-local targets one
    group per node."""
    probe = target / f"{_PROBE}{group.world.rank}"
    made = False
    try:
        probe.touch(exist_ok=False)
        made = True
        group.barrier()
        seen = sorted(int(p.name[len(_PROBE) :]) for p in target.glob(f"{_PROBE}*") if p.name[len(_PROBE) :].isdigit())
        group.barrier()
    finally:
        if made:
            probe.unlink(missing_ok=True)
    return group.gather(seen[0] if seen else group.world.rank)


@dataclass
class DistributedReport:
    """What a distributed replay produced (every process holds one; global rank 0 writes its document)."""

    trace: Path
    target: Path
    world: World
    results: tuple[ReplayResult, ...]  # the job's, per strategy
    processes: list[dict]
    size_mismatches: tuple[SizeMismatch, ...]
    options: dict
    trace_sha256: str
    environment: dict
    claims: tuple = ()

    def to_json(self) -> dict:
        """``replay``'s results document (``documents.ReplayDoc``), the job's figures as its results, plus
        ``distributed``: the world size, each process's host, owners and results, and the slowest process
        per strategy."""
        slowest = {}
        hosts: dict[str, dict] = {}  # per recorded host (a merged trace): its processes and their slowest time
        for i, result in enumerate(self.results):
            times = [p["results"][i]["elapsed_s"] for p in self.processes]
            slowest[result.strategy] = int(np.argmax(times)) if times else 0
            for process in self.processes:
                for name in process.get("recorded_hosts", []):
                    entry = hosts.setdefault(name, {"processes": [], "nodes": [], "elapsed_s": {}})
                    if process["process"] not in entry["processes"]:
                        entry["processes"].append(process["process"])
                    if process.get("node") not in entry["nodes"]:
                        entry["nodes"].append(process.get("node"))
                    entry["elapsed_s"][result.strategy] = max(
                        entry["elapsed_s"].get(result.strategy, 0.0), process["results"][i]["elapsed_s"]
                    )
        return {
            **results_document(self),
            "distributed": {
                "world_size": self.world.size,
                "processes": self.processes,
                "slowest_process": slowest,
                "recorded_hosts": hosts,
            },
        }


def _job_result(strategy: str, per_process: list[ReplayResult]) -> ReplayResult:
    """The job's figures from its processes' (sums; the slowest elapsed time; merged latencies; ``--timing
    original``'s accuracy from every process's paced operations, each rank's where it ran)."""
    histogram = LatencyHistogram()
    for result in per_process:
        if result.latency_histogram:
            histogram.merge(result.latency_histogram)
    notes = sorted({note for result in per_process for note in result.notes})
    skipped: dict[str, int] = {}
    for result in per_process:
        for key, count in result.skipped_ops.items():
            skipped[key] = skipped.get(key, 0) + count
    return ReplayResult(
        strategy=strategy,
        elapsed_s=max(r.elapsed_s for r in per_process),
        bytes_written=sum(r.bytes_written for r in per_process),
        bytes_read=sum(r.bytes_read for r in per_process),
        data_ops=sum(r.data_ops for r in per_process),
        metadata_ops=sum(r.metadata_ops for r in per_process),
        latency_ns=histogram.percentiles_ns(),
        cpu_user_s=sum(r.cpu_user_s for r in per_process),
        cpu_sys_s=sum(r.cpu_sys_s for r in per_process),
        skipped_ops=skipped,
        unaligned_ops=sum(r.unaligned_ops for r in per_process),
        notes=notes,
        metadata_ops_saved=sum(r.metadata_ops_saved for r in per_process),
        preallocated_files=sum(r.preallocated_files for r in per_process),
        data_paths={
            name: {key: sum(r.data_paths.get(name, {}).get(key, 0) for r in per_process) for key in ("ops", "bytes")}
            for name in dict.fromkeys(n for r in per_process for n in r.data_paths)
        },
        timing=timing_figures(merge_timing_samples([r.timing_samples for r in per_process])),
    )


def replay_distributed(
    trace_path: str | os.PathLike,
    *,
    world: World,
    target: str | os.PathLike,
    strategy: str = "posix",
    options: ReplayOptions | None = None,
    progress: Progress | None = None,
    protect: tuple[str | os.PathLike, ...] = (),
    placement: str = "host",
    **values,
) -> DistributedReport:
    """``replay.replay`` run by one of ``world``'s processes (see the module docstring); every process
    of the job calls it with the same arguments. ``options`` (``ReplayOptions``, with keywords named as
    its fields overriding them) mean what they mean there; ``fio`` and ``pack_files`` are not available
    here, ``cache`` is ``recorded``. ``placement`` (``placed_share``): ``host`` keeps each recorded
    host's ranks on one node (a merged trace), ``spread`` cuts the ranks into blocks over every process.

    Raises TraceFormatError for a bad trace; ReplayError for the errors
    ``replay`` raises (in this process or any other: every process raises),
    when torch is missing or the job cannot be joined; Interrupted on Ctrl-C.
    """
    opts = ReplayOptions.of(options, **values)
    opts.check(strategy)  # a single process's replay only
    if opts.writeback != "system":  # the sysctls are the node's, shared by its processes: not set from several
        raise ReplayError("{option} recorded is not available in a distributed replay", option="writeback")
    trace = trace_file(trace_path)
    # pattern.compressible is per process: every process sets it (each calibrates the same unique bytes)
    data_context, data_options = data_choice(opts, trace.metadata)
    target = Path(target)
    refuse_target_holding(target, trace.path)
    job = _DistributedJob(world, trace, target, strategy, opts, _Group(world))
    try:
        job.plan_share(placement)
        job.exchange()
        job.claim(protect)
        with data_context:
            results, per_process = job.run(progress)
        mismatches = _size_mismatches(job.group, job.plans, job.claims, job.sizes, job.leaders)
        add_speedups(results)
    except (ReplayError, Interrupted, KeyboardInterrupt) as err:
        release(job.owned, target, job.made_target, job.lock)  # nothing before the conflicts were refused everywhere
        job.group.close()
        if isinstance(err, KeyboardInterrupt):
            raise Interrupted(f"interrupted; the replay's files under {target} were removed") from None
        raise
    return job.report(results, per_process, mismatches, placement, data_options)


class _DistributedJob:
    """One process's part of a distributed replay, step by step (the module docstring's call order): what
    each step learns is kept for the next. ``owned``: the claims whose files are this replay's to remove on
    failure (set once conflicts were refused everywhere)."""

    def __init__(self, world: World, trace, target: Path, strategy: str, opts: ReplayOptions, group: _Group) -> None:
        self.world, self.trace, self.target, self.strategy, self.opts, self.group = (
            world,
            trace,
            target,
            strategy,
            opts,
            group,
        )
        self.claims: list[Claim] = []
        self.owned: list[Claim] = []
        self.made_target = False
        self.lock: TargetLock | None = None
        self.plans: list[ReplayPlan] = []
        self.sizes: dict[str, int] = {}
        self.leaders: list[int] = []
        self.rounds, self.rounds_rule = 0, ""  # set by run

    def plan_share(self, placement: str) -> None:
        """Steps 2-3: this process's share of the owners and its plan; the target prepared and locked; every
        process agrees it got this far."""
        error: BaseException | None = None
        try:
            self.hosts_of = owner_hosts(self.trace.path)
            self.share = placed_share(
                owners(self.trace.path), self.hosts_of if placement == "host" else {}, self.world, placement
            )
            self.base = build_posix_plan(
                share_batches(self.trace.path, self.share),
                self.opts.strip_prefix,
                arch=self.trace.metadata["arch"],
                verify_ranges=self.opts.verify,
            )
            self.mine = share_plan(self.base, self.share)
            self.names = list(strategies.expand(self.strategy))
            check_queue_depth(self.opts.queue_depth, self.names)
            self.made_target = not self.target.exists()
            prepare_target(self.target, self.opts.force)
            self.lock = TargetLock.acquire(self.target, job_id())  # the job's processes share it (replayer.lock)
        except (CkptTraceError, KeyboardInterrupt) as err:
            error = Interrupted("interrupted") if isinstance(err, KeyboardInterrupt) else err
        self.group.agree(error)

    def exchange(self) -> None:
        """Step 4: one all_gather of every process's needs; then this share's plan per strategy."""
        mine = self.mine
        self.leaders = _probe_groups(self.group, self.target)
        infos = self.group.gather(
            {
                "remote": sorted(mine.remote),
                "precreate": dict(mine.precreate),
                "written": mine.written,
                "unverifiable": sorted(mine.unverifiable),
                "bytes": mine.plan.bytes_to_write,
                "host": platform.node(),
                "owners": sorted(self.share),
            }
        )
        self.infos = infos
        self.exported = frozenset(seq for info in infos for seq in info["remote"]) & frozenset(
            mine.plan.ops.seq.tolist()
        )
        self.sizes = _job_sizes(self.base, infos)
        plan = _finish_share(mine, self.base, infos, self.leaders, self.world.rank, self.exported, self.sizes)
        self.plans = [
            derive_plan(plan, name, buffer_bytes=self.opts.buffer_bytes, block_bytes=host.block_bytes(self.target))
            for name in self.names
        ]

    def claim(self, protect: tuple[str | os.PathLike, ...]) -> None:
        """Step 5: the claims refuse conflicts and the target must hold everybody's bytes, in every process."""
        every = self.strategy == strategies.ALL
        self.claims = [
            Claim(self.target / p.strategy if every else self.target, p, fresh=every, adopt=True) for p in self.plans
        ]
        error: BaseException | None = None
        try:
            for claim in self.claims:
                claim.refuse_conflicts((self.trace.path, *protect))
            needed = sum(info["bytes"] for info in self.infos) * len(self.plans) + config.REPLAY_FREE_SPACE_MARGIN_BYTES
            host.require_free(self.target, needed, "the replay")
        except CkptTraceError as err:
            error = err
        self.group.agree(error)
        self.owned = self.claims  # from here on, what the claims name is this replay's to remove on failure

    def run(self, progress: Progress | None) -> tuple[list[ReplayResult], list[ReplayResult]]:
        """Steps 6-7: the strategies' runs in rounds, as a one-process replay runs them (``verdicts.Rounds``:
        each round runs every strategy once, the order rotated by one each round; by default 3-20 rounds until
        every pair of strategies is told apart or the time budget is spent, ``--repeat N`` exactly N), verified
        where asked; (the job's results, this process's). Each round's time of a strategy is the job's (its
        slowest process's); global rank 0 decides from them whether another round runs and tells the others,
        so every process runs the same rounds."""
        opts = self.opts
        count = Rounds(opts.repeat, opts.min_seconds, opts.max_runs or config.REPLAY_MAX_RUNS)
        runs: list[list[tuple[ReplayResult, ReplayResult]]] = [[] for _ in self.plans]
        while self._another_round(count, runs):
            first = len(runs[0]) % len(self.plans)
            for index in [*range(first, len(self.plans)), *range(first)]:
                plan, claim = self.plans[index], self.claims[index]
                runs[index].append(
                    _run_once(
                        self.group, plan, claim, self.exported, self.mine.remote, len(runs[index]), opts, progress
                    )
                )
        results, per_process = [], []
        for plan, claim, mine_runs in zip(self.plans, self.claims, runs):
            job, mine = _median_of(mine_runs)
            if opts.verify:
                self._verify(plan, claim, job, mine)
            results.append(job)
            per_process.append(mine)
        add_verdicts(results, _round_times(self.plans, runs))
        self.rounds, self.rounds_rule = len(runs[0]), count.describe()
        return results, per_process

    def _another_round(self, count: Rounds, runs: list[list[tuple[ReplayResult, ReplayResult]]]) -> bool:
        """Whether the job runs another round: global rank 0's decision (``Rounds.more`` of the job's round
        times), the same in every process."""
        decision = count.more(_round_times(self.plans, runs)) if self.world.rank == 0 else None
        return bool(self.group.broadcast(decision))

    def _verify(self, plan: ReplayPlan, claim: Claim, job: ReplayResult, mine: ReplayResult) -> None:
        found = verify_content(claim.root(), plan)
        self.group.agree(
            ReplayError(
                f"verification failed for {plan.strategy}: {len(found)} file(s) differ from "
                f"the pattern, first {found[0].path} at byte {found[0].offset}"
            )
            if found
            else None
        )
        mine.verified_files = len(plan.checks.verify_ranges)
        checked = self.group.gather(sorted(plan.checks.verify_ranges))  # a file two processes wrote counts once
        job.verified_files = len({path for paths in checked for path in paths})

    def report(
        self,
        results: list[ReplayResult],
        per_process: list[ReplayResult],
        mismatches: list[SizeMismatch],
        placement: str,
        data_options: dict,
    ) -> DistributedReport:
        """The job's document, from every process's figures (one gather), and the lock released;
        ``data_options``: the options about the data (``replay.data_choice``)."""
        world, opts = self.world, self.opts
        docs = self.group.gather(
            {
                "process": world.rank,
                "host": platform.node(),
                "node": world.node,
                "owners": sorted(self.share),
                "recorded_hosts": sorted({self.hosts_of[o] for o in self.share if o in self.hosts_of}),
                "results": [r.to_json() for r in per_process],
            }
        )
        self.group.close()
        if self.lock is not None:
            self.lock.release()
        options = {
            "queue_depth": opts.queue_depth,
            "buffer_bytes": opts.buffer_bytes,
            "pack_files": False,
            "repeat": opts.repeat,
            "rounds": self.rounds,
            "rounds_rule": self.rounds_rule,
            "min_seconds": opts.min_seconds,
            "durable": opts.durable,
            "drop_caches": opts.drop_caches,
            "timing": opts.timing,
            "gpu_copies": opts.gpu_copies,
            "read_memory": opts.read_memory,
            "world_size": world.size,
            "placement": placement,
            **data_options,
        }
        return DistributedReport(
            self.trace.path,
            self.target,
            world,
            tuple(results),
            docs,
            tuple(mismatches),
            options,
            trace_sha256=sha256_file(self.trace.path),
            environment=host.environment(self.target),
            claims=tuple(self.claims),
        )


def _job_sizes(base: ReplayPlan, infos: list[dict]) -> dict[str, int]:
    """Every file's size when the recording ended, for the whole job: the largest any process expects
    (``base``'s, planned from every row but the other processes' reads and writes, and each process's
    files written and pre-existing files read), less files some process wrote at unknown offsets."""
    sizes = dict(base.checks.expected_sizes)
    for info in infos:
        for path, size in [*info["written"].items(), *info["precreate"].items()]:
            sizes[path] = max(sizes.get(path, 0), size)
    for path in {p for info in infos for p in info["unverifiable"]}:
        sizes.pop(path, None)
    return sizes


def _finish_share(
    mine: Share,
    base: ReplayPlan,
    infos: list[dict],
    leaders: list[int],
    rank: int,
    exported: frozenset[int],
    sizes: Mapping[str, int],
) -> ReplayPlan:
    """The share's plan once every process's needs are known: it waits for its remote operations and
    signals ``exported``, those others wait for (``awaited``), precreates the pre-existing files it is the
    lowest process of its file system to need (as large as any process reads them), and expects every
    file it writes at its size for the job (``sizes``, ``_job_sizes``)."""
    plan = mine.plan
    precreate = {
        path
        for path in mine.precreate
        if min(i for i, info in enumerate(infos) if path in info["precreate"] and leaders[i] == leaders[rank]) == rank
    }
    expected = {path: sizes[path] for path in plan.checks.expected_sizes if path in sizes}
    checks = dataclasses.replace(
        plan.checks,
        expected_sizes=expected,
        verify_ranges={
            **plan.checks.verify_ranges,
            **{p: base.checks.verify_ranges[p] for p in precreate if p in base.checks.verify_ranges},
        },
    )
    extent = {path: max(info["precreate"].get(path, 0) for info in infos) for path in precreate}
    dropped = sum(size for path, size in plan.precreate_files if path not in precreate)
    return dataclasses.replace(
        plan,
        awaited=plan.awaited | exported,
        checks=checks,
        precreate_files=tuple((p, extent[p]) for p, _ in plan.precreate_files if p in precreate),
        bytes_to_write=plan.bytes_to_write - dropped,
    )


def _round_times(
    plans: list[ReplayPlan], runs: list[list[tuple[ReplayResult, ReplayResult]]]
) -> dict[str, list[float]]:
    """Each strategy's job elapsed seconds (its slowest process's), round by round."""
    return {plan.strategy: [job.elapsed_s for job, _ in mine] for plan, mine in zip(plans, runs)}


def _median_of(runs: list[tuple[ReplayResult, ReplayResult]]) -> tuple[ReplayResult, ReplayResult]:
    """(the job's median run, with every run's time: ``runs.median_run``; this process's figures of that run,
    with this process's time of every run)."""
    median = median_run([job for job, _ in runs])
    mine = next(m for job, m in runs if job is median)
    mine.runs_elapsed_s = [m.elapsed_s for _, m in runs]
    mine.runs_p99_latency_ns = [m.latency_ns["p99"] for _, m in runs]
    mine.latency_histogram = None
    return median, mine


def _run_once(
    group: _Group,
    plan: ReplayPlan,
    claim: Claim,
    exported: frozenset[int],
    remote: frozenset[int],
    number: int,
    opts: ReplayOptions,
    progress,
) -> tuple[ReplayResult, ReplayResult]:
    """Run ``number`` (from 0) of one strategy in every process: the previous run's files released, the
    target prepared, the clocks started together; (the job's figures, this process's)."""
    error: BaseException | None = None
    mine = None
    try:
        if number:
            claim.release(keep_directory=True)
        group.barrier()  # every release is done before anyone precreates
        root = claim.root()
        executor = make_executor(plan.strategy, root, opts.queue_depth)
        executor.gpu_copies = opts.gpu_copies
        executor.read_memory = opts.read_memory
        executor.prepare(plan)
        if opts.drop_caches and group.world.local_rank == 0:
            drop_page_cache()
    except (CkptTraceError, KeyboardInterrupt) as err:
        error = Interrupted("interrupted") if isinstance(err, KeyboardInterrupt) else err
    group.agree(error)
    signals = StoreSignals(group.store, f"{plan.strategy}/{number}", remote, exported)
    for seq in exported - set(plan.ops.seq.tolist()):
        signals.done(seq)  # nothing here to wait for: never make another process wait for nothing
    group.barrier()  # the clocks start together
    try:
        mine = executor.run(plan, timing=opts.timing, progress=progress, durable=opts.durable, signals=signals)
    except (ReplayError, KeyboardInterrupt) as err:
        signals.fail(str(err) or "interrupted")
        error = Interrupted("interrupted") if isinstance(err, KeyboardInterrupt) else err
    group.agree(error)
    assert mine is not None  # executor.run returned: had it failed here, agree raised in every process
    job = _job_result(plan.strategy, group.gather(mine))
    mine.timing_samples = {}  # in the job's figures now
    return job, mine


def _size_mismatches(
    group: _Group, plans: list[ReplayPlan], claims: list[Claim], sizes: Mapping[str, int], leaders: list[int]
) -> list[SizeMismatch]:
    """``replay.size_mismatches`` for the whole job, after every process finished: each file system's lowest
    process checks every file against its size for the job (``sizes``, ``_job_sizes``)."""
    group.barrier()
    found = []
    if leaders[group.world.rank] == group.world.rank:
        for plan, claim in zip(plans, claims):
            whole = dataclasses.replace(plan, checks=dataclasses.replace(plan.checks, expected_sizes=sizes))
            found.extend(size_mismatches(claim.root(), whole))
    return [m for part in group.gather(found) for m in part]
