"""Save and load measured apart: per phase and per rank, with the slowest rank's time."""

from __future__ import annotations

import pytest

from ckpt_trace.replayer import replay


@pytest.mark.slow
def test_a_save_then_a_load_are_reported_apart(tmp_path):
    from helpers.traces import CREATE, make_trace

    ops = []
    for rank in (0, 1):
        path, pid = f"/ck/r{rank}.bin", 10 + rank
        who = {"path": path, "fd": 3, "pid": pid, "tid": pid, "rank": rank}
        ops += [
            {"op": "open", **who, "flags": CREATE, "ret": 3},
            *(
                {"op": "write", **who, "offset": i << 16, "size": 1 << 16, "ret": 1 << 16}
                for i in range(8 * (rank + 1))
            ),
            {"op": "close", **who},
            {"op": "open", **who, "flags": 0, "ret": 3},
            *({"op": "read", **who, "offset": i << 16, "size": 1 << 16, "ret": 1 << 16} for i in range(4)),
            {"op": "close", **who},
        ]
    trace = make_trace(tmp_path / "t.arrow", ops)
    result = replay(trace, target=tmp_path / "t").results[0]
    save, load = result.phases["save"], result.phases["load"]
    assert (save["bytes"], load["bytes"]) == (24 << 16, 8 << 16)
    assert {r: e["bytes"] for r, e in save["ranks"].items()} == {"0": 8 << 16, "1": 16 << 16}
    assert {r: e["bytes"] for r, e in load["ranks"].items()} == {"0": 4 << 16, "1": 4 << 16}
    for phase in (save, load):
        assert 0 < phase["slowest_rank_s"] <= phase["elapsed_s"] <= result.elapsed_s
        assert phase["slowest_rank_s"] == max(e["elapsed_s"] for e in phase["ranks"].values())
        assert phase["throughput_bytes_per_s"] == phase["bytes"] / phase["elapsed_s"]
    assert result.to_json()["phases"] == result.phases
