"""Executors are the one engine composed with a data path (issue 39): no strategy subclasses the engine or
reaches into its private names, and a data path sees the call order ``replayer.datapath`` documents."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
from helpers.traces import CREATE, make_trace

from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import build_plan, strategies
from ckpt_trace.replayer.data import Pregenerated
from ckpt_trace.replayer.datapath import Submitted, WorkerIO
from ckpt_trace.replayer.engine import Executor
from ckpt_trace.replayer.optable import PlanOp
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.plan import ReplayPlan
from ckpt_trace.replayer.posix import PosixPath, posix_executor

REPLAYER = Path(__file__).resolve().parent.parent / "replayer" / "ckpt_trace" / "replayer"
DATA_PATH_MODULES = [
    REPLAYER / "posix.py",
    REPLAYER / "uring.py",
    REPLAYER / "gds.py",
    *sorted((REPLAYER / "strategies").glob("*.py")),
]


def test_no_data_path_subclasses_the_engine_or_imports_its_private_names():
    for module in DATA_PATH_MODULES:
        tree = ast.parse(module.read_text(), str(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):  # the engine's, or any other module's
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"{module.name} imports {private} from {node.module}"
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base) for base in node.bases]
                assert not any(base.endswith("Executor") for base in bases), f"{module.name}: {node.name}{bases}"


def test_every_strategy_here_makes_the_engine_with_its_own_data_path(tmp_path):
    root = TargetRoot(tmp_path)
    made = {}
    for name, spec in strategies.table().items():
        try:
            executor = spec.executor(root, 4)
        except Exception:  # noqa: BLE001 - a strategy this machine cannot run (gds without a GPU)
            continue
        assert type(executor) is Executor, name
        made[name] = executor.strategy
    assert made["posix"] == "posix" and made["mmap"] == "mmap"
    assert all(made_name == name for name, made_name in made.items())


class _Recording(PosixPath):
    """posix's data path, logging each call the engine makes (from several threads: a list's append is
    atomic)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def batchable(self, plan: ReplayPlan, rows: slice) -> np.ndarray:
        self.calls.append("batchable")
        return super().batchable(plan, rows)

    def prepare(self, plan: ReplayPlan, data: Pregenerated | None = None) -> None:
        self.calls.append("prepare")

    def open_flags(self, flags: int) -> int:
        self.calls.append("open_flags")
        return flags

    def opened(self, handle: int, path: str, flags: int) -> None:
        self.calls.append(f"opened {path}")

    def released(self, handle: int) -> None:
        self.calls.append("released")

    def submit(self, io: WorkerIO, requests: np.ndarray, rows: np.ndarray, queue: int) -> Submitted:
        self.calls.append(f"submit {len(np.unique(rows))}")
        return super().submit(io, requests, rows, queue)

    def transfer(self, io: WorkerIO, op: PlanOp, row: int) -> int:
        self.calls.append(f"transfer {op.kind}")
        return super().transfer(io, op, row)

    def finish(self) -> list[str]:
        self.calls.append("finish")
        return ["recorded"]


def test_a_data_path_sees_the_documented_call_order_and_moves_what_posix_moves(tmp_path):
    size = 1 << 16
    rows = [
        {"op": "open", "path": "/ck/a", "fd": 3, "ret": 3, "flags": CREATE},
        *({"op": "write", "path": "/ck/a", "fd": 3, "offset": i * size, "size": size, "ret": size} for i in range(3)),
        {"op": "write", "path": "/ck/a", "fd": 3, "size": size, "ret": size},  # at the position: 0 (pwrite kept it)
        {"op": "close", "path": "/ck/a", "fd": 3},
    ]
    plan = build_plan(read_trace(make_trace(tmp_path / "t.arrow", rows)).table, "posix", "/ck")
    results, contents = {}, {}
    for name in ("posix", "recording"):
        (tmp_path / name).mkdir()
        root = TargetRoot(tmp_path / name)
        path = _Recording() if name == "recording" else None
        executor = Executor(root, 1 << 20, path) if path is not None else posix_executor(root, 1 << 20)
        executor.prepare(plan)
        results[name] = executor.run(plan)
        contents[name] = (tmp_path / name / "a").read_bytes()
        root.close()
        if path is not None:
            calls = path.calls
            assert calls[: calls.index("prepare")] == ["batchable"] * len(plan.workers)
            assert calls[calls.index("prepare") :] == [
                "prepare",
                "open_flags",
                "opened a",
                "submit 3",  # the three writes at known offsets: one run
                "transfer write",  # the one at the file position, alone
                "released",
                "finish",
            ]
    assert contents["posix"] == contents["recording"] and len(contents["posix"]) == 3 * size
    mine, posix = results["recording"], results["posix"]
    assert mine.notes == [*posix.notes, "recorded"]  # finish's notes end the result's
    assert (mine.bytes_written, mine.data_ops, mine.data_paths) == (
        posix.bytes_written,
        posix.data_ops,
        posix.data_paths,
    )
    assert mine.bytes_written == 4 * size and os.path.getsize(tmp_path / "recording" / "a") == 3 * size
