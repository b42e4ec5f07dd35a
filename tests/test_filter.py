"""``filter``: the rows kept are exactly those a row-by-row reading of the trace selects, the output is a
valid trace with its source's metadata and provenance, and bad conditions or outputs get one line."""

from __future__ import annotations

import fnmatch
import json

import pytest
from conftest import REPO, cli

from ckpt_trace.analysis.filter import Conditions, filter_trace, parse_window
from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import read_trace

GOLDEN = REPO / "traces" / "golden"
DCP = GOLDEN / "v2-dcp-gpt2-tiny-2ranks-bcc.arrow"


def _rows(path):
    return read_trace(path).table.to_pylist()


@pytest.mark.parametrize(
    "conditions",
    [
        Conditions(ranks="1"),
        Conditions(ranks="0-1", ops="write,fsync"),
        Conditions(path_glob="*/__1_*.distcp", ops="write"),
        Conditions(pids="0-99999999", time="1s.."),
        Conditions(time="..2.5s", ops="open,close,rename"),
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.to_json().items()),
)
def test_kept_rows_are_those_a_row_by_row_reading_selects(tmp_path, conditions):
    source = _rows(DCP)
    start, end = parse_window(conditions.time) if conditions.time else (None, None)
    wanted_ops = set(conditions.ops.split(",")) if conditions.ops else None
    ranks = {"1": {1}, "0-1": {0, 1}, None: None}[conditions.ranks]

    def keep(row) -> bool:
        return (
            (ranks is None or row["rank"] in ranks)
            and (conditions.pids is None or 0 <= row["pid"] <= 99999999)
            and (wanted_ops is None or row["op"] in wanted_ops)
            and (
                conditions.path_glob is None
                or (row["path"] is not None and fnmatch.fnmatchcase(row["path"], conditions.path_glob))
            )
            and (start is None or row["ts_ns"] >= start)
            and (end is None or row["ts_ns"] < end)
        )

    expected = [row for row in source if keep(row)]
    result = filter_trace(DCP, tmp_path / "f.arrow", conditions)
    got = _rows(tmp_path / "f.arrow")
    strip = ("device", "memory_kind")  # added by version 3; null in both
    assert [{k: v for k, v in r.items() if k not in strip} for r in got] == [
        {k: v for k, v in r.items() if k not in strip} for r in expected
    ]
    assert 0 < result["rows_out"] == len(expected) < result["rows_in"] == len(source)
    meta = read_trace(tmp_path / "f.arrow").metadata
    assert meta["command"] == read_trace(DCP).metadata["command"]
    assert meta["provenance"][-1]["conditions"] == conditions.to_json()
    assert meta["provenance"][-1]["rows_out"] == len(expected)


@pytest.mark.slow
def test_the_cli_filters_one_rank_and_refuses_what_it_cannot_read(tmp_path):
    proc = cli("filter", str(DCP), "-o", str(tmp_path / "r1.arrow"), "--rank", "1", "--op", "write", "--json")
    data = json.loads(proc.stdout)
    assert data["rows_out"] == sum(1 for r in _rows(DCP) if r["rank"] == 1 and r["op"] == "write")
    for args, words in (
        (["--rank", "1-0"], "range"),
        (["--op", "writ"], "unknown op"),
        (["--time", "5s..1s"], "empty time window"),
        (["--time", "5q.."], "not a time"),
    ):
        bad = cli("filter", str(DCP), "-o", str(tmp_path / "x.arrow"), *args, check=False)
        assert bad.returncode == 2 and words in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "x.arrow").exists()
    again = cli("filter", str(DCP), "-o", str(tmp_path / "r1.arrow"), "--rank", "0", check=False)
    assert again.returncode != 0 and "already exists" in again.stderr  # never overwritten without --force
    with pytest.raises(CkptTraceError, match="the trace being filtered"):
        filter_trace(tmp_path / "r1.arrow", tmp_path / "r1.arrow", Conditions(ranks="1"), overwrite=True)
