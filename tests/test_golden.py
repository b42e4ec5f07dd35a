"""Golden traces of every format version are read, checked against what was recorded, and replayed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from ckpt_trace.formats import SUPPORTED_VERSIONS, read_trace
from ckpt_trace.replayer import replay

GOLDEN = Path(__file__).resolve().parent.parent / "traces" / "golden"
TRACES = sorted(GOLDEN.glob("v*.arrow"))


def test_every_supported_version_has_a_golden_trace():
    versions = {int(path.name.split("-")[0][1:]) for path in TRACES}
    assert versions == set(SUPPORTED_VERSIONS)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_golden_trace_reads_with_its_version(path):
    trace = read_trace(path)
    assert trace.metadata["format_version"] == int(path.name.split("-")[0][1:])
    assert trace.num_rows > 0 and trace.metadata["lost_events"] == 0


def test_odd_pattern_golden_holds_every_operation_exactly():
    trace = read_trace(GOLDEN / "v1-odd-pattern-strace.arrow")
    expected = json.loads((GOLDEN / "v1-odd-pattern-strace.expected.json").read_text())
    got = Counter((r["op"], r["path"], r["offset"], r["ret"]) for r in trace.table.to_pylist() if r["op"] in ("read", "write"))
    assert got == Counter((e["op"], e["path"], e["offset"], e["bytes"]) for e in expected)


def test_dcp_golden_replays_to_the_recorded_file_sizes(tmp_path):
    sizes = json.loads((GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.sizes.json").read_text())
    report = replay(GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow", target=tmp_path / "t")
    for path, size in sizes.items():
        assert (tmp_path / "t" / path.lstrip("/")).stat().st_size == size
    assert report.size_mismatches == ()
    assert {r for r in read_trace(GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow").table["rank"].to_pylist()} >= {0, 1}
