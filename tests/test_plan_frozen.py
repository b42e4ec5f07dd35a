"""The planner's output is frozen: every plan equals, field by field, the plan recorded before planning
became a pipeline of named steps (issue 39).

``tests/data/plan_frozen.json`` holds, per case, a digest of each part of the
plan (the operation table column by column, the workers, what is made before
the clock, sizes, the ranges ``--verify`` checks, waits, queue depths,
preallocations, packing) as the planner of main at fad4be0 built it (operation kinds by name: their
codes are the table's own). Cases:
every golden trace, planned whole, from record batches filled in place, with
a path prefix stripped, without the verify ranges, by shares of owners (as
``replayer.distributed`` plans them, rows numbered by ``plan.GLOBAL_ROW``),
then aggregated (1 and 4 MiB buffers; 512 and 4096 byte blocks) and packed;
and seeded random traces of every row kind the planner knows (descriptors
opened, duplicated, inherited, reused across threads and processes; reads and
writes at known and unknown offsets; io_uring and libaio requests; mappings
and their pages; truncations, fallocate, renames, links, symlinks, unlinks,
rmdir, mkdir; host<->device copies; failed calls).

The timing mode, durability and queue depth do not reach a plan (they are the
executor's), and the uring and gds strategies are the posix plan renamed
(``replay.derive_plan``): the strategy name is part of every digest.

``CKPT_TRACE_FREEZE_PLANS=1 pytest tests/test_plan_frozen.py`` rewrites the
expectations: only ever from a commit whose planner is known right. Re-frozen
once since: the aggregated cases' operation tables when a written piece's
``ts_ns`` became the latest start of the writes into it (``aggregate._ready_ts``;
every other column and case unchanged, checked against the previous plans). Extended once: the column
``op_size`` (issue 34), its digests added with every other digest unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
from helpers.traces import table_of

from ckpt_trace.formats import read_trace
from ckpt_trace.formats.vocabulary import open_flag
from ckpt_trace.replayer.aggregate import build_aggregated_plan
from ckpt_trace.replayer.optable import KINDS
from ckpt_trace.replayer.pack import pack_plan
from ckpt_trace.replayer.plan import GLOBAL_ROW, PLAN_COLUMNS, build_posix_plan

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = sorted((ROOT / "traces" / "golden").glob("v*.arrow"))
EXPECTED = Path(__file__).resolve().parent / "data" / "plan_frozen.json"
_COLUMNS = (
    "kind",
    "seq",
    "ts_ns",
    "worker",
    "handle",
    "source_handle",
    "path",
    "new_path",
    "offset",
    "size",
    "flags",
    "release",
    "pattern_key",
    "pattern_offset",
    "queue",
    "mapped",
    "prot",
    "op_size",
    "dep_ptr",
    "dep_seq",
)


def _sha(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _column_sha(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array.astype(np.int64)).tobytes()).hexdigest()[:16]


def digest(plan) -> dict:
    """Every part of ``plan``, each as a short digest ."""
    t = plan.ops
    checks = plan.checks
    out = {f"ops.{name}": _column_sha(getattr(t, name)) for name in _COLUMNS if name != "kind"}
    out["ops.kind"] = _sha([KINDS[k] for k in t.kind.tolist()])  # by name: the codes are the table's own
    out.update(
        {
            "num_ops": len(t),
            "ops.paths": _sha(list(t.paths)),
            "strategy": plan.strategy,
            "workers": _sha([[w.pid, w.tid, w.rank, w.start, w.stop] for w in plan.workers]),
            "precreate_dirs": _sha(list(plan.precreate_dirs)),
            "precreate_files": _sha([list(f) for f in plan.precreate_files]),
            "skipped_ops": _sha(sorted(dict(plan.skipped_ops).items())),
            "bytes_to_write": plan.bytes_to_write,
            "awaited": _sha(sorted(plan.awaited)),
            "pattern_keys": _sha(sorted(plan.pattern_keys.items())),
            "pack_index": _sha(sorted((k, sorted(dict(v).items())) for k, v in plan.pack_index.items())),
            "metadata_ops_saved": plan.metadata_ops_saved,
            "checks.expected_sizes": _sha(sorted(checks.expected_sizes.items())),
            "checks.verify_ranges": _sha(sorted((k, [list(r) for r in v]) for k, v in checks.verify_ranges.items())),
            "checks.unverifiable": _sha(list(checks.unverifiable)),
            "checks.pack_verify": _sha([[a, b, c, [list(r) for r in d]] for a, b, c, d in checks.pack_verify]),
            "checks.ranges_planned": checks.ranges_planned,
            "files.handle_files": _sha(sorted(plan.files.handle_files.items())),
            "files.file_paths": _sha(sorted(plan.files.file_paths.items())),
            "queue_depths": _sha(sorted(plan.queue_depths.items())),
            "preallocate": _sha(sorted(plan.preallocate.items())),
        }
    )
    return out


# -- seeded random traces of every row kind -------------------------------------------------------------------

_FILES = ["/ck/s/a", "/ck/s/b", "/ck/c", "/ck/d/e"]
_DIRS = ["/ck/s", "/ck/d", "/ck/t"]


def _flag(*names: str) -> int:
    out = 0
    for name in names:
        out |= open_flag(name, "x86_64")
    return out


_CREATE = _flag("O_WRONLY", "O_CREAT", "O_TRUNC")
_KINDS = [
    "open",
    "open",
    "write",
    "write",
    "write",
    "read",
    "read",
    "close",
    "dup",
    "ftruncate",
    "fallocate",
    "rename",
    "unlink",
    "fsync",
    "fdatasync",
    "lseek",
    "fcntl",
    "sync_file_range",
    "mkdir",
    "rmdir",
    "link",
    "symlink",
    "mmap",
    "page",
    "msync",
    "munmap",
    "uring",
    "libaio",
    "ring",
    "copy",
    "failed",
    "renamedir",
]


def random_trace(seed: int, rows: int) -> pa.Table:  # noqa: PLR0915  (one branch per row kind: a table in code)
    """A trace of ``rows`` seeded random calls from 2 processes of 3 threads each (ranks 0 and 1)."""
    rng = random.Random(seed)
    calls: list[dict] = []
    maps: dict[int, list[tuple[int, int]]] = {1: [], 2: []}

    def add(tid, op, **values):
        pid = 1 if tid < 4 else 2
        ts_ns = len(calls) * 10 + rng.choice([0, 0, 0, 5])
        rank = pid - 1 if rng.random() < 0.9 else -1
        calls.append({"ts_ns": ts_ns, "pid": pid, "tid": tid, "rank": rank, "op": op, **values})

    for _ in range(rows):
        tid = rng.choice([1, 2, 3, 4, 5, 6])
        pid = 1 if tid < 4 else 2
        fd = rng.randint(3, 6)
        path = rng.choice(_FILES)
        kind = rng.choice(_KINDS)
        known = rng.random() < 0.8
        offset, size = rng.randint(0, 1 << 16), rng.choice([0, 1, 512, 4096, 5000, 1 << 20, rng.randint(1, 9000)])
        if kind == "open" and rng.random() < 0.2:  # a file the trace reads but never writes
            add(tid, "open", path="/ck/in", fd=fd, ret=fd, flags=0)
        elif kind == "open":
            add(
                tid,
                "open",
                path=path,
                fd=fd,
                ret=fd,
                flags=rng.choice([_CREATE, 0, _flag("O_RDWR"), _flag("O_WRONLY", "O_CREAT"), _flag("O_DIRECTORY")]),
            )
        elif kind in ("write", "read"):
            add(tid, kind, path=path, fd=fd, offset=offset if known else None, size=size, ret=size)
        elif kind in ("uring", "libaio"):
            add(
                tid,
                rng.choice(["read", "write"]),
                path=path,
                fd=fd,
                offset=offset,
                size=size,
                ret=size,
                interface="io_uring" if kind == "uring" else "libaio",
                queue_id=rng.randint(1, 3),
                in_flight=rng.randint(1, 8),
            )
        elif kind == "ring":
            add(tid, rng.choice(["io_uring_enter", "io_submit"]), fd=fd, ret=1)
        elif kind in ("close", "fsync", "fdatasync"):
            add(tid, kind, path=path, fd=fd)
        elif kind == "dup":
            add(tid, "dup", path=path, fd=fd, ret=fd + rng.randint(4, 6))
        elif kind == "ftruncate":
            add(tid, "ftruncate", path=path, fd=fd, size=offset)
        elif kind == "fallocate":
            add(tid, "fallocate", path=path, fd=fd, offset=offset, size=size or 1, flags=rng.choice([0, 1]))
        elif kind == "lseek":
            add(tid, "lseek", path=path, fd=fd, offset=offset, ret=offset)
        elif kind == "fcntl":
            add(tid, "fcntl", path=path, fd=fd, flags=1)
        elif kind == "sync_file_range":
            add(tid, "sync_file_range", path=path, fd=fd, offset=offset, size=size, flags=2)
        elif kind == "rename":
            add(tid, "rename", path=path, new_path=rng.choice(_FILES), flags=rng.choice([0, 0, 1]))
        elif kind == "renamedir":
            add(tid, "rename", path=rng.choice(_DIRS), new_path=rng.choice(_DIRS))
        elif kind == "unlink":
            add(tid, "unlink", path=path)
        elif kind == "rmdir":
            add(tid, "unlink", path=rng.choice(_DIRS), flags=0x200)
        elif kind == "mkdir":
            add(tid, "mkdir", path=rng.choice(_DIRS))
        elif kind == "link":
            add(tid, "link", path=path, new_path=rng.choice(_FILES) + "l")
        elif kind == "symlink":
            add(tid, "symlink", path="../" + path, new_path=rng.choice(_FILES) + "s")
        elif kind == "mmap":
            address = rng.choice([1 << 20, 2 << 20, 3 << 20])
            maps[pid].append((address, 1 << 16))
            add(
                tid,
                "mmap",
                path=path,
                fd=fd,
                offset=rng.choice([0, 4096]),
                size=1 << 16,
                address=address,
                interface="mmap",
                prot=3,
                flags=1,
                ret=address,
            )
        elif kind in ("page", "msync", "munmap"):
            base = rng.choice(maps[pid]) if maps[pid] and rng.random() < 0.9 else (9 << 20, 4096)
            address = base[0] + rng.randint(0, 15) * 4096
            if kind == "page":
                add(tid, rng.choice(["read", "write"]), address=address, size=4096, ret=4096, interface="mmap")
            elif kind == "msync":
                add(tid, "msync", address=address, size=4096, flags=4, interface="mmap")
            else:
                add(tid, "munmap", address=base[0], size=base[1], interface="mmap")
        elif kind == "copy":
            add(
                tid,
                rng.choice(["copy_h2d", "copy_d2h"]),
                size=size,
                interface="cuda",
                memory_kind=rng.choice(["pinned", "pageable"]),
            )
        elif kind == "failed":
            add(
                tid,
                rng.choice(["write", "open", "read"]),
                path=path,
                fd=fd,
                offset=offset,
                size=size,
                ret=-28,
                flags=_CREATE,
            )
    return table_of(calls)


# -- cases ----------------------------------------------------------------------------------------------------


def _common_dir(table: pa.Table) -> str | None:
    paths = [p for p in table.column("path").to_pylist() if p and p.startswith("/")]
    if not paths:
        return None
    prefix = os.path.commonpath(paths)
    return prefix.rsplit("/", 1)[0] if "/" in prefix.strip("/") else prefix


def _share_batches(table: pa.Table, share: set[int], batch_rows: int) -> list[pa.RecordBatch]:
    """The rows a process of a distributed replay plans (``distributed.share_batches``): every row that is
    not a read or a write, and the reads and writes of ``share``'s owners, numbered by ``GLOBAL_ROW``."""
    t = table.select(list(PLAN_COLUMNS))
    op = t.column("op").cast(pa.string()).to_pylist()
    rank = t.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    pid = t.column("pid").to_numpy(zero_copy_only=False).astype(np.int64)
    owner = np.where(rank >= 0, rank, -1 - pid)
    keep = np.array([o not in ("read", "write") for o in op], bool) | np.isin(owner, sorted(share))
    rows = np.flatnonzero(keep)
    cut = t.filter(pa.array(keep)).append_column(GLOBAL_ROW, pa.array(rows, pa.int64()))
    return cut.to_batches(max_chunksize=batch_rows)


def _owners(table: pa.Table) -> list[int]:
    rank = table.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    pid = table.column("pid").to_numpy(zero_copy_only=False).astype(np.int64)
    return sorted(set(np.where(rank >= 0, rank, -1 - pid).tolist()))


def _derived(name: str, base, out: dict) -> None:
    """The strategies' plans of ``base``: renamed ones, aggregated (buffer and block sizes), packed."""
    out[f"{name}/posix"] = digest(base)
    out[f"{name}/uring-direct"] = digest(dataclasses.replace(base, strategy="uring-direct"))
    for buffer_bytes, block_bytes in ((1 << 20, 512), (1 << 20, 4096), (4 << 20, 4096)):
        aggregated = build_aggregated_plan(
            dataclasses.replace(base, strategy="aggregated"), buffer_bytes=buffer_bytes, block_bytes=block_bytes
        )
        out[f"{name}/aggregated-{buffer_bytes >> 20}M-{block_bytes}"] = digest(aggregated)
        if block_bytes == 4096:
            packed = pack_plan(aggregated, block_bytes=block_bytes, buffer_bytes=buffer_bytes)
            out[f"{name}/aggregated-{buffer_bytes >> 20}M-{block_bytes}-packed"] = digest(packed)


def _cases_of(name: str, table: pa.Table, arch: str) -> dict:
    out: dict = {}
    _derived(name, build_posix_plan(table, arch=arch), out)
    batches = table.select(list(PLAN_COLUMNS)).to_batches(max_chunksize=97)
    out[f"{name}/batches-in-place"] = digest(build_posix_plan(batches, arch=arch, num_rows=table.num_rows))
    out[f"{name}/batches"] = digest(build_posix_plan(iter(batches), arch=arch))
    out[f"{name}/no-verify-ranges"] = digest(build_posix_plan(table, arch=arch, verify_ranges=False))
    prefix = _common_dir(table)
    if prefix:
        _derived(f"{name}/strip", build_posix_plan(table, prefix, arch=arch), out)
    owners = _owners(table)
    for count in (2, 3):
        for index in range(count):
            share = set(owners[index * len(owners) // count : (index + 1) * len(owners) // count])
            plan = build_posix_plan(_share_batches(table, share, 61), prefix, arch=arch)
            _derived(f"{name}/share-{index}-of-{count}", plan, out)
    return out


def all_cases() -> dict:
    out: dict = {}
    for path in GOLDEN:
        trace = read_trace(path)
        out.update(_cases_of(path.stem, trace.table, trace.metadata["arch"]))
    for seed, rows in ((1, 60), (2, 200), (3, 400), (4, 400), (5, 1500)):
        out.update(_cases_of(f"random-{seed}-{rows}", random_trace(seed, rows), "x86_64"))
    return out


def _parts(plan_digest: dict) -> list:
    """A case's stored form: [operations, their table's digest, of the checks, of the rest]."""
    groups = {"ops": {}, "checks": {}, "rest": {}}
    for key, value in plan_digest.items():
        groups["ops" if key.startswith("ops.") else "checks" if key.startswith("checks.") else "rest"][key] = value
    return [plan_digest["num_ops"], *(_sha(groups[name])[:12] for name in ("ops", "checks", "rest"))]


def test_plans_equal_the_frozen_plans():
    cases = {name: _parts(value) for name, value in all_cases().items()}
    if os.environ.get("CKPT_TRACE_FREEZE_PLANS") == "1":
        EXPECTED.write_text(
            "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(cases.items())) + "\n}\n"
        )
    expected = json.loads(EXPECTED.read_text())
    assert sorted(cases) == sorted(expected)
    differ = {
        name: [part for part, a, b in zip(("num_ops", "ops", "checks", "rest"), cases[name], expected[name]) if a != b]
        for name in cases
        if cases[name] != expected[name]
    }
    assert not differ, f"plans differ from the frozen ones (case: parts): {differ}"


def test_random_traces_exercise_every_planner_path():
    """The random traces reach what the frozen digests are meant to hold (not vacuous): walked reads and
    writes, requests, mappings, copies, waits, truncations, unverifiable files, implicit opens."""
    plan = build_posix_plan(random_trace(5, 1500))
    kinds = plan.counts()
    assert {
        "open",
        "close",
        "read",
        "write",
        "dup",
        "rename",
        "link",
        "symlink",
        "mmap",
        "munmap",
        "msync",
        "copy",
        "mkdir",
        "unlink",
        "ftruncate",
        "fallocate",
    } <= set(kinds)
    assert plan.queue_depths and plan.awaited and plan.checks.unverifiable and plan.checks.verify_ranges
    assert plan.ops.mapped.any() and plan.skipped_ops["implicit_opens"] and plan.skipped_ops["failed"]
    assert plan.precreate_files and plan.precreate_dirs
