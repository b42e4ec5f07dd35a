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
    assert "versus" not in save  # one strategy: nothing to judge


@pytest.mark.slow
def test_a_save_and_a_load_are_each_judged_by_their_own_time(tmp_path, io_uring):
    """Under ``--strategy all`` each phase of a trace holding a save and a load gets its own paired verdicts:
    per strategy, the phase's time in every round (``runs_elapsed_s``) and its speed-ups over every other
    strategy from those times, as ``verdicts.versus_all`` computes them for whole runs; the text output gives
    each phase's speed-up over posix."""
    from conftest import cli
    from helpers.traces import CREATE, make_trace

    from ckpt_trace.replayer.verdicts import paired_interval

    who = {"path": "/ck/m.bin", "fd": 3}
    ops = [
        {"op": "open", **who, "flags": CREATE, "ret": 3},
        *({"op": "write", **who, "offset": i << 16, "size": 1 << 16, "ret": 1 << 16} for i in range(32)),
        {"op": "close", **who},
        {"op": "open", **who, "flags": 0, "ret": 3},
        *({"op": "read", **who, "offset": i << 16, "size": 1 << 16, "ret": 1 << 16} for i in range(32)),
        {"op": "close", **who},
    ]
    trace = make_trace(tmp_path / "t.arrow", ops)
    report = replay(trace, target=tmp_path / "t", strategy="all", repeat=3)
    by_name = {r.strategy: r for r in report.results}
    for phase in ("save", "load"):
        times = {name: r.phases[phase]["runs_elapsed_s"] for name, r in by_name.items()}
        assert all(len(t) == 3 and all(x > 0 for x in t) for t in times.values()), times
        for name, r in by_name.items():
            assert set(r.phases[phase]["versus"]) == set(by_name) - {name}
            for other, entry in r.phases[phase]["versus"].items():
                assert entry == paired_interval(times[other], times[name])
            assert r.phases[phase]["elapsed_s"] in times[name]  # the median run's own phase time
    report.release()
    out = cli("replay", str(trace), "--strategy", "all", "--repeat", "3", "--target", str(tmp_path / "u")).stdout
    lines = " ".join(out.split())
    assert "aggregated save:" in lines and "aggregated load:" in lines and "x posix" in lines
