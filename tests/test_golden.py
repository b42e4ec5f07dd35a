"""Golden traces of every format version are read, checked against what was recorded, and replayed.

What each is checked against was written by the workload or the engine
itself when it was recorded (``scripts/golden.py``): the odd-pattern
workload's list of operations, fio's own ``--write_iolog``, file sizes.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import GOLDEN
from helpers.fio import fio_iolog

from ckpt_trace.formats import SUPPORTED_VERSIONS, read_trace
from ckpt_trace.replayer import replay

TRACES = sorted(GOLDEN.glob("v*.arrow"))


def _version(path: Path) -> int:
    return int(path.name.split("-")[0][1:])


def _of(kind: str) -> list[Path]:
    return [path for path in TRACES if path.name.split("-", 1)[1].startswith(kind)]


def test_every_supported_version_has_a_golden_trace():
    assert {_version(path) for path in TRACES} == set(SUPPORTED_VERSIONS)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_golden_trace_reads_with_its_version(path):
    trace = read_trace(path)
    assert trace.metadata["format_version"] == _version(path)
    assert trace.num_rows > 0 and trace.metadata["lost_events"] == 0
    assert trace.metadata["arch"] == "x86_64"


@pytest.mark.parametrize("path", _of("odd-pattern"), ids=lambda p: p.name)
def test_odd_pattern_golden_holds_every_operation_exactly(path):
    trace = read_trace(path)
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    got = Counter(
        (r["op"], r["path"], r["offset"], r["ret"]) for r in trace.table.to_pylist() if r["op"] in ("read", "write")
    )
    assert got == Counter((e["op"], e["path"], e["offset"], e["bytes"]) for e in expected)


@pytest.mark.slow
@pytest.mark.parametrize("path", _of("dcp"), ids=lambda p: p.name)
def test_dcp_golden_replays_to_the_recorded_file_sizes(tmp_path, path):
    sizes = json.loads(path.with_suffix(".sizes.json").read_text())
    report = replay(path, target=tmp_path / "t")
    for name, size in sizes.items():
        assert (tmp_path / "t" / name.lstrip("/")).stat().st_size == size
    assert report.size_mismatches == ()
    assert {r for r in read_trace(path).table["rank"].to_pylist()} >= {0, 1}


@pytest.mark.parametrize("engine", ["uring", "libaio"])
@pytest.mark.parametrize("path", _of("requests"), ids=lambda p: p.name)
def test_requests_golden_holds_every_operation_of_fios_own_iolog(path, engine):
    expected = fio_iolog(path.with_suffix(f".{engine}.iolog"))
    table = read_trace(path).table.to_pylist()
    interface = {"uring": "io_uring", "libaio": "libaio"}[engine]
    got = Counter(
        (r["path"], r["op"], r["offset"], r["size"])
        for r in table
        if r["interface"] == interface and r["op"] in ("read", "write")
    )
    assert sum(expected.values()) > 0 and got == expected


@pytest.mark.slow
@pytest.mark.parametrize("path", _of("requests"), ids=lambda p: p.name)
def test_requests_golden_replays_every_strategy_to_the_recorded_sizes_and_content(tmp_path, path, io_uring):
    sizes = json.loads(path.with_suffix(".sizes.json").read_text())
    report = replay(path, target=tmp_path, strategy="all", verify=True)  # verify raises on a byte out of place
    assert report.size_mismatches == () and {r.strategy for r in report.results} >= {"posix", "aggregated"}
    for result in report.results:
        assert result.verified_files >= len(sizes)
        for name, size in sizes.items():
            assert (tmp_path / result.strategy / name.lstrip("/")).stat().st_size == size
