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
