"""diff compares reads as well as writes, and names the first byte where two files' ranges part."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import cli

from ckpt_trace.analysis.diff import first_difference


def ranges(*pairs) -> np.ndarray:
    return np.array(pairs, np.int64).reshape(-1, 2)


def test_the_first_difference_is_where_coverage_parts():
    assert first_difference(ranges((0, 100)), ranges((0, 50))) == 50
    assert first_difference(ranges((0, 10), (20, 30)), ranges((0, 10), (25, 30))) == 20
    assert first_difference(ranges(), ranges((5, 9))) == 5
    assert first_difference(ranges((10, 20)), ranges((0, 20))) == 0
    with pytest.raises(ValueError):
        first_difference(ranges((0, 5)), ranges((0, 5)))


def load_trace(path, read_bytes: int):
    from helpers.traces import CREATE, make_trace

    return make_trace(
        path,
        [
            {"op": "open", "path": "/ck/m.bin", "fd": 3, "flags": CREATE, "ret": 3},
            {"op": "write", "path": "/ck/m.bin", "fd": 3, "offset": 0, "size": 8192, "ret": 8192},
            {"op": "read", "path": "/ck/m.bin", "fd": 3, "offset": 0, "size": read_bytes, "ret": read_bytes},
            {"op": "close", "path": "/ck/m.bin", "fd": 3},
        ],
    )


@pytest.mark.slow
def test_diff_says_where_reads_part(tmp_path):
    a, b = load_trace(tmp_path / "a.arrow", 8192), load_trace(tmp_path / "b.arrow", 6000)
    data = json.loads(cli("diff", str(a), str(b), "--json").stdout)
    assert data["data_written"]["match"]
    read = data["data_read"]
    assert not read["match"] and read["differing"][0]["first_difference"] == 6000
    assert (read["bytes_a"], read["bytes_b"]) == (8192, 6000)
    text = cli("diff", str(a), str(b)).stdout
    assert "data read: different: 1 files differ (first m.bin from byte 6,000)" in text
    same = cli("diff", str(a), str(a)).stdout
    assert "data read: the same in A and B: 1 files, 8,192 bytes" in same


def replayed_load_trace(path, precreate_first: bool = True):
    """A recorded replay of ``load_trace``: the file pre-created (written whole) in the replay's target, then
    read; ``precreate_first`` False writes it after the read instead."""
    from helpers.traces import CREATE, make_trace

    write = {"op": "write", "path": "/t/ck/m.bin", "fd": 3, "offset": 0, "size": 8192, "ret": 8192}
    read = {"op": "read", "path": "/t/ck/m.bin", "fd": 4, "offset": 0, "size": 8192, "ret": 8192}
    ops = [
        {"op": "open", "path": "/t/ck/m.bin", "fd": 3, "flags": CREATE, "ret": 3},
        *([write] if precreate_first else []),
        {"op": "close", "path": "/t/ck/m.bin", "fd": 3},
        {"op": "open", "path": "/t/ck/m.bin", "fd": 4, "flags": 0, "ret": 4},
        read,
        *([] if precreate_first else [{**write, "fd": 4}]),
        {"op": "close", "path": "/t/ck/m.bin", "fd": 4},
    ]
    return make_trace(path, [{**op, "ts_ns": 1000 * i} for i, op in enumerate(ops)])


def only_reads_trace(path, name: str = "m.bin"):
    """A load: /ck/NAME (found) read whole."""
    from helpers.traces import make_trace

    ops = [
        {"op": "open", "path": f"/ck/{name}", "fd": 3, "flags": 0, "ret": 3},
        {"op": "read", "path": f"/ck/{name}", "fd": 3, "offset": 0, "size": 8192, "ret": 8192},
        {"op": "close", "path": f"/ck/{name}", "fd": 3},
    ]
    return make_trace(path, [{**op, "ts_ns": 1000 * i} for i, op in enumerate(ops)])


def test_a_replays_pre_created_inputs_are_no_difference_in_the_data_written(tmp_path):
    from ckpt_trace.analysis.diff import diff_files, written_verdict

    load = only_reads_trace(tmp_path / "load.arrow")
    data = diff_files(load, replayed_load_trace(tmp_path / "replayed.arrow"))
    written = data["data_written"]
    assert written["match"] and written["precreated_in_b"] == ["m.bin"] and written["written_only_in_b"] == []
    assert (written["files_b"], written["bytes_b"]) == (0, 0)
    assert data["data_read"]["match"]
    assert written_verdict(written) == (
        "data written: the same in A and B: 0 files, 0 bytes, at the same offsets (1 files B wrote before reading "
        "and A only read: a replay's inputs, left out)"
    )
    # the other way round: the inputs are A's
    assert diff_files(replayed_load_trace(tmp_path / "r2.arrow"), load)["data_written"]["precreated_in_a"] == ["m.bin"]
    # written after it was read: a difference
    late = diff_files(load, replayed_load_trace(tmp_path / "late.arrow", precreate_first=False))["data_written"]
    assert not late["match"] and late["written_only_in_b"] == ["m.bin"] and late["precreated_in_b"] == []
    # a file A never read: a difference
    other = diff_files(only_reads_trace(tmp_path / "o.arrow", "o.bin"), replayed_load_trace(tmp_path / "r3.arrow"))
    assert not other["data_written"]["match"] and other["data_written"]["written_only_in_b"] == ["m.bin"]
