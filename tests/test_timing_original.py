"""--timing original paces every operation of each thread against its recorded start (relative to its
rank's first operation) and reports how closely: start error and window error per rank."""

from __future__ import annotations

import pytest

from ckpt_trace.replayer import replay


def paced_trace(tmp_path, gap_ns: int = 5_000_000, writes: int = 40):
    from helpers.traces import CREATE, make_trace

    ops = [{"op": "open", "path": "/ck/a.bin", "fd": 3, "flags": CREATE, "ret": 3, "ts_ns": 0}]
    # back-to-back offsets: the replayer would otherwise batch them into one run
    ops += [
        {
            "op": "write",
            "path": "/ck/a.bin",
            "fd": 3,
            "offset": i * 4096,
            "size": 4096,
            "ret": 4096,
            "ts_ns": (i + 1) * gap_ns,
        }
        for i in range(writes)
    ]
    ops.append({"op": "close", "path": "/ck/a.bin", "fd": 3, "ts_ns": (writes + 1) * gap_ns})
    return make_trace(tmp_path / "paced.arrow", ops)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["posix", "uring-buffered"])
def test_every_operation_is_paced_and_its_error_reported(tmp_path, strategy, request):
    if strategy != "posix":
        request.getfixturevalue("io_uring")
    trace = paced_trace(tmp_path)
    result = replay(trace, target=tmp_path / "t", strategy=strategy, timing="original").results[0]
    timing = result.timing
    assert timing is not None and timing["ranks"]["-1"]["ops"] == 42  # open, 40 writes, close
    window = timing["ranks"]["-1"]
    assert window["recorded_window_s"] == pytest.approx(0.205)
    assert abs(window["window_error"]) < 0.05  # within 5 % of the recorded window
    assert timing["start_error_share_p50"] < 0.05
    assert result.elapsed_s >= 0.2  # the gaps were kept: back to back it takes a few ms


@pytest.mark.slow
def test_asap_reports_no_timing(tmp_path):
    result = replay(paced_trace(tmp_path), target=tmp_path / "t").results[0]
    assert result.timing is None and result.elapsed_s < 0.2


@pytest.mark.slow
def test_the_error_is_told_apart_busy_from_woken(tmp_path):
    """Operations recorded at one instant find their thread still busy past their start (the one before
    them took time: a 32 MiB write among them): every one but the first (the paced clock's start) counts
    as busy."""
    from helpers.traces import CREATE, make_trace

    ops = [
        {"op": "open", "path": "/ck/a.bin", "fd": 3, "flags": CREATE, "ret": 3, "ts_ns": 0},
        {"op": "write", "path": "/ck/a.bin", "fd": 3, "offset": 0, "size": 32 << 20, "ret": 32 << 20, "ts_ns": 0},
        {"op": "write", "path": "/ck/a.bin", "fd": 3, "offset": 32 << 20, "size": 4096, "ret": 4096, "ts_ns": 0},
        {"op": "close", "path": "/ck/a.bin", "fd": 3, "ts_ns": 0},
    ]
    result = replay(make_trace(tmp_path / "burst.arrow", ops), target=tmp_path / "t", timing="original").results[0]
    timing = result.timing
    assert timing is not None
    rank = timing["ranks"]["-1"]
    assert rank["ops"] >= 4 and rank["busy_ops"] == rank["ops"] - 1
    assert timing["busy_share"] == pytest.approx((rank["ops"] - 1) / rank["ops"])
    assert timing["waited_error_p50_ns"] is not None and timing["waited_error_p50_ns"] >= 0


def test_the_report_says_where_the_error_comes_from():
    from ckpt_trace.report.render import timing_lines

    ranks = {"0": {"recorded_window_s": 1.0, "replayed_window_s": 1.1, "window_error": 0.1}}
    timing = {
        "start_error_share_p50": 0.02,
        "start_error_share_p99": 0.2,
        "busy_share": 0.4,
        "waited_error_p50_ns": 85_000,
        "ranks": ranks,
    }
    (line,) = timing_lines([{"strategy": "posix", "timing": timing}])
    assert line == (
        "posix paced: start error 2.0% median, 20.0% p99 of the I/O window; rank 0: 1.100 s for 1.000 s "
        "recorded (+10.0%); 40% of operations found their thread busy past their start, the others woke "
        "85.0 µs late (median)"
    )
    ranks["0"]["window_error"] = None  # every rank's window under 1 ms: no window clause
    (line,) = timing_lines([{"strategy": "posix", "timing": timing}])
    assert line.startswith("posix paced: start error 2.0% median, 20.0% p99 of the I/O window; 40% of")
