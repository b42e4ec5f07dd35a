"""--timing original splits nothing that was one operation: a write larger than the 64 MiB buffer limit is
issued as one call (strace's log of the replay is the reference) or one io_uring request; asap still cuts it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ckpt_trace.iolayer import pattern
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.replayer import replay

BIG = 80 << 20  # over config.REPLAY_MAX_IO_BYTES (64 MiB)
ROOT = Path(__file__).resolve().parent.parent


def big_write_trace(tmp_path: Path) -> Path:
    from helpers.traces import CREATE, make_trace

    ops = [
        {"op": "open", "path": "/ck/big.bin", "fd": 3, "flags": CREATE, "ret": 3, "ts_ns": 0},
        {"op": "write", "path": "/ck/big.bin", "fd": 3, "offset": 0, "size": BIG, "ret": BIG, "ts_ns": 1_000_000},
        {"op": "close", "path": "/ck/big.bin", "fd": 3, "ts_ns": 400_000_000},
    ]
    return make_trace(tmp_path / "big.arrow", ops)


def _pwrites_under_strace(trace: Path, target: Path, timing: str, log: Path) -> list[int]:
    """Sizes of the pwrite64 calls (to the replayed file's descriptor or any) a posix replay made, from strace."""
    code = textwrap.dedent(f"""
        from ckpt_trace.replayer import replay
        replay({str(trace)!r}, target={str(target)!r}, timing={timing!r}, verify=True)
    """)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("", "formats", "iolayer", "tracer", "replayer"))
    )
    subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=pwrite64",
            "-e",
            "abbrev=all",
            "-s",
            "0",
            "-o",
            str(log),
            sys.executable,
            "-c",
            code,
        ],
        check=True,
        env=env,
        timeout=300,
    )
    calls = re.findall(r"pwrite64\(\d+, \"\"\.\.\., (\d+), \d+\)\s+= (\d+)", log.read_text())
    return [int(asked) for asked, _ in calls if int(asked) >= 1 << 20]  # the data writes, not the results' files


@pytest.mark.strace
@pytest.mark.slow
@pytest.mark.parametrize("timing,expected", [("original", [BIG]), ("asap", [64 << 20, BIG - (64 << 20)])])
def test_a_large_write_is_one_call_under_original_timing(strace_backend, tmp_path, timing, expected):
    trace = big_write_trace(tmp_path)
    sizes = _pwrites_under_strace(trace, tmp_path / "t", timing, tmp_path / "strace.log")
    assert sizes == expected
    data = (tmp_path / "t" / "ck" / "big.bin").read_bytes()
    assert len(data) == BIG and data[-4096:] == pattern.data_bytes(BIG - 4096, 4096, pattern.file_key("ck/big.bin"))


@pytest.mark.slow
@pytest.mark.parametrize("timing,expected", [("original", [BIG]), ("asap", [64 << 20, BIG - (64 << 20)])])
def test_a_large_write_is_one_io_uring_request_under_original_timing(io_uring, tmp_path, monkeypatch, timing, expected):
    issued: list[np.ndarray] = []
    run = rings.Ring.run

    def recording(self, requests, **kwargs):
        issued.append(requests["len"][requests["opcode"] == rings.OP_WRITE].copy())
        return run(self, requests, **kwargs)

    monkeypatch.setattr(rings.Ring, "run", recording)
    report = replay(
        big_write_trace(tmp_path), target=tmp_path / "t", strategy="uring-buffered", timing=timing, verify=True
    )
    assert np.concatenate(issued).tolist() == expected
    assert report.results[0].bytes_written == BIG and report.results[0].verified_files == 1
    if timing == "original":
        assert report.results[0].timing["ranks"]["-1"]["ops"] == 3
