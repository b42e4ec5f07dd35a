"""A trace says its architecture; open flags are converted to the host's in one place (the planner).

On arm64 O_DIRECT and O_DIRECTORY have each other's x86-64 values, so a trace
replayed without conversion opens a directory where the program opened a file
with O_DIRECT, and the reverse.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.traces import META, trace_of
from hypothesis import given
from hypothesis import strategies as st

from ckpt_trace.formats import read_trace
from ckpt_trace.formats import vocabulary as v
from ckpt_trace.replayer import build_posix_plan, replay
from ckpt_trace.replayer import plan as plan_module


def synthetic(path: Path, arch: str) -> Path:
    """What a checkpoint writer does on ``arch``: open a directory, create a file with O_DIRECT, write 8 KiB."""
    flag = v.OPEN_FLAGS[arch]
    rows = [
        {
            "op": "open",
            "syscall": "openat",
            "path": "/ck",
            "fd": 3,
            "ret": 3,
            "flags": flag["O_DIRECTORY"] | flag["O_CLOEXEC"],
        },
        {
            "op": "open",
            "syscall": "openat",
            "path": "/ck/shard.bin",
            "fd": 4,
            "ret": 4,
            "flags": v.open_flag("O_WRONLY", arch) | flag["O_CREAT"] | flag["O_TRUNC"] | flag["O_DIRECT"],
        },
        {"op": "write", "path": "/ck/shard.bin", "fd": 4, "offset": 0, "size": 8192, "ret": 8192},
        {"op": "fsync", "path": "/ck/shard.bin", "fd": 4},
        {"op": "close", "path": "/ck/shard.bin", "fd": 4},
        {"op": "close", "path": "/ck", "fd": 3},
    ]
    return trace_of(path, rows, {**META, "arch": arch}, rank=0)


def _opens(plan):
    return {op.path: op.flags for worker in plan.workers for op in worker.ops if op.kind == "open"}


def test_the_trace_records_its_architecture(tmp_path):
    assert read_trace(synthetic(tmp_path / "a.arrow", v.AARCH64)).metadata["arch"] == v.AARCH64
    legacy = Path(__file__).resolve().parent.parent / "traces" / "golden" / "v1-odd-pattern-strace.arrow"
    assert read_trace(legacy).metadata["arch"] == v.X86_64  # before the key, every trace was x86-64


@pytest.mark.slow
def test_an_arm64_trace_replays_with_o_direct_here(tmp_path):
    trace = read_trace(synthetic(tmp_path / "arm.arrow", v.AARCH64))
    plan = build_posix_plan(trace.table, arch=trace.metadata["arch"])
    opens = _opens(plan)
    assert opens["ck/shard.bin"] & os.O_DIRECT and not opens["ck/shard.bin"] & os.O_DIRECTORY
    assert opens["ck"] & os.O_DIRECTORY and not opens["ck"] & os.O_DIRECT
    # Read as if it were this machine's, the same numbers would open the file as a directory.
    wrong = _opens(build_posix_plan(trace.table, arch=v.host_arch()))
    assert wrong["ck/shard.bin"] & os.O_DIRECTORY if v.host_arch() == v.X86_64 else True
    report = replay(trace.path, target=tmp_path / "t")
    assert report.size_mismatches == () and (tmp_path / "t" / "ck" / "shard.bin").stat().st_size == 8192
    assert report.results[0].bytes_written == 8192


def test_an_x86_64_trace_plans_arm64_flags_on_arm64(tmp_path, monkeypatch):
    """The reverse direction, with the planner's host architecture set to arm64."""
    trace = read_trace(synthetic(tmp_path / "x86.arrow", v.X86_64))
    monkeypatch.setattr(plan_module, "HOST_ARCH", v.AARCH64)
    monkeypatch.setattr(plan_module, "os", _ArmOs())
    opens = _opens(build_posix_plan(trace.table, arch=v.X86_64))
    arm = v.OPEN_FLAGS[v.AARCH64]
    assert opens["ck/shard.bin"] & arm["O_DIRECT"] and not opens["ck/shard.bin"] & arm["O_DIRECTORY"]
    assert opens["ck"] & arm["O_DIRECTORY"] and not opens["ck"] & arm["O_DIRECT"]


class _ArmOs:
    """``os`` as the planner sees it on arm64: the flag constants of arm64."""

    def __getattr__(self, name):
        if name in v.OPEN_FLAGS[v.AARCH64]:
            return v.OPEN_FLAGS[v.AARCH64][name]
        return getattr(os, name)


NAMES = sorted(set(v.OPEN_FLAGS[v.X86_64]) - {"O_WRONLY", "O_RDWR"})


@given(
    st.sampled_from([0, 1, 2]), st.sets(st.sampled_from(NAMES)), st.sampled_from(v.ARCHES), st.sampled_from(v.ARCHES)
)
def test_translation_keeps_every_named_flag(mode, names, source, target):
    flags = mode | sum(v.OPEN_FLAGS[source][name] for name in names)
    moved = v.translate_open_flags(flags, source, target)
    assert set(v.open_flag_names(moved, target)) == set(v.open_flag_names(flags, source))
    assert v.translate_open_flags(moved, target, source) == flags


def test_unknown_architecture_is_one_line(tmp_path):
    import pytest

    from ckpt_trace.errors import ReplayError

    trace = read_trace(synthetic(tmp_path / "a.arrow", v.X86_64))
    with pytest.raises(ReplayError, match="recorded on riscv64"):
        build_posix_plan(trace.table, arch="riscv64")
