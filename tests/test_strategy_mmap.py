"""The ``mmap`` strategy (``replayer/strategies/mmap.py``), added as one module: named on the command line, it
replays real traces with --verify and leaves exactly the files a posix replay leaves, every byte through
mappings; strace shows it makes no write system call into the target."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli

from ckpt_trace.replayer import strategies

GOLDEN = Path(__file__).resolve().parent.parent / "traces" / "golden"
TRACES = ("v2-dcp-gpt2-tiny-2ranks-bcc.arrow", "v1-odd-pattern-strace.arrow")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_mmap_is_in_the_table_and_only_when_named():
    spec = strategies.get("mmap")
    assert "mmap" in strategies.choices() and "mmap" not in strategies.in_all()
    assert spec.named_path == "mapped" and not spec.direct_io and not spec.uses_queue_depth


@pytest.mark.slow
@pytest.mark.parametrize("name", TRACES)
def test_mmap_replay_verifies_and_equals_posix(tmp_path, name):
    trace = GOLDEN / name
    docs = {}
    for strategy in ("posix", "mmap"):
        out = tmp_path / f"{strategy}.json"
        cli(
            "replay",
            str(trace),
            "--target",
            str(tmp_path / strategy),
            "--strategy",
            strategy,
            "--verify",
            "--repeat",
            "1",
            "--strict",
            "-o",
            str(out),
        )
        docs[strategy] = json.loads(out.read_text())["results"][0]
    posix, mapped = _files(tmp_path / "posix"), _files(tmp_path / "mmap")
    assert posix and mapped.keys() == posix.keys()
    for rel, data in posix.items():
        assert len(mapped[rel]) == len(data), rel
        assert mapped[rel] == data, rel
    mine = docs["mmap"]
    assert mine["verified_files"] == docs["posix"]["verified_files"] > 0
    assert mine["bytes_written"] == docs["posix"]["bytes_written"] > 0
    assert mine["bytes_read"] == docs["posix"]["bytes_read"]
    moved = mine["bytes_written"] + mine["bytes_read"]
    assert mine["data_paths"]["mapped"]["bytes"] == moved  # every byte through a mapping, none by a syscall
    assert mine["named_path_bytes_share"] == 1.0


@pytest.mark.slow
@pytest.mark.strace
def test_mmap_replay_makes_no_write_system_call_into_the_target(tmp_path):
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    target, log = tmp_path / "t", tmp_path / "strace.log"
    proc = subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-y",
            "-o",
            str(log),
            "-e",
            "trace=write,pwrite64,writev,pwritev,pwritev2,ftruncate,mmap",
            sys.executable,
            "-m",
            "ckpt_trace.cli",
            "replay",
            str(GOLDEN / TRACES[0]),
            "--target",
            str(target),
            "--strategy",
            "mmap",
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    text = log.read_text()
    into_target = [line for line in text.splitlines() if f"<{target}/" in line]
    writes = [line for line in into_target if re.search(r"\b(p?writev?2?|pwrite64)\(", line)]
    assert _files(target)
    assert not [line for line in writes if not re.search(r"\.ckpt-trace[^/>]*lock", line)], writes[:3]
    assert any("ftruncate(" in line for line in into_target)
    assert any("MAP_SHARED" in line and "PROT_WRITE" in line for line in into_target)
