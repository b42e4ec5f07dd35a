"""--verify: every strategy writes the same checkable content; corruption is caught loudly."""

from __future__ import annotations

import json

import pytest
from conftest import GOLDEN, cli

from ckpt_trace.errors import ReplayError
from ckpt_trace.formats import read_trace
from ckpt_trace.iolayer import pattern
from ckpt_trace.iolayer.buffers import pattern_buffer
from ckpt_trace.replayer import build_plan, replay
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.verify import verify_content


def test_pattern_windows_are_periodic_and_page_aligned_for_aligned_offsets():
    buf = pattern_buffer(3 * pattern.PAGE)
    for key in (0, 7, 250):
        for offset in (0, 4096, 123, pattern.PERIOD + 5):
            first = pattern.start(offset, key)
            assert buf.mmap[first : first + 3 * pattern.PAGE] == pattern.expected(offset, 3 * pattern.PAGE, key)
            if offset % pattern.PAGE == 0:
                assert first % pattern.PAGE == 0 and (buf.ptr + first) % pattern.PAGE == 0
    buf.close()


@pytest.mark.slow
def test_every_strategy_verifies_on_a_real_recording(io_uring, odd_strace, tmp_path):
    trace, _, out = odd_strace
    result_file = tmp_path / "r.json"
    cli(
        "replay",
        str(trace),
        "--strategy",
        "all",
        "--target",
        str(tmp_path / "t"),
        "--verify",
        "--buffer-size",
        "1MiB",
        "-o",
        str(result_file),
    )
    results = json.loads(result_file.read_text())["results"]
    plan = build_plan(read_trace(trace).table, "posix")
    assert all(r["verified_files"] == len(plan.checks.verify_ranges) > 3 for r in results)
    assert str(out / "a.final").lstrip("/") in plan.checks.verify_ranges  # followed through the rename


@pytest.mark.slow
def test_dcp_golden_verifies_under_aggregation(io_uring, tmp_path):
    report = replay(
        GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow", target=tmp_path / "t", strategy="aggregated", verify=True
    )
    assert report.results[0].verified_files == 3  # two shards and .metadata


@pytest.mark.slow
def test_a_corrupted_byte_is_reported_with_its_offset(tmp_path):
    trace = GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow"
    unverified = replay(trace, target=tmp_path / "u").plan  # planned without the ranges: refused, not passed
    assert not unverified.checks.ranges_planned and not unverified.checks.verify_ranges
    with pytest.raises(ReplayError, match="made without the ranges verification checks"):
        verify_content(TargetRoot(tmp_path / "u"), unverified)
    report = replay(trace, target=tmp_path / "t", verify=True)
    plan = report.plan
    path = next(p for p in plan.checks.verify_ranges if p.endswith("__1_0.distcp"))
    with open(tmp_path / "t" / path, "r+b") as handle:
        handle.seek(12345)
        byte = handle.read(1)
        handle.seek(12345)
        handle.write(bytes([byte[0] ^ 0xFF]))
    found = verify_content(TargetRoot(tmp_path / "t"), plan)
    assert [(m.path, m.offset) for m in found] == [(path, 12345)]


@pytest.mark.slow
def test_verify_failure_raises_with_the_first_mismatch(tmp_path, monkeypatch):
    import sys

    from ckpt_trace.replayer.verify import ContentMismatch

    module = sys.modules["ckpt_trace.replayer.replay"]  # the package re-exports a function of that name
    monkeypatch.setattr(module, "verify_content", lambda root, plan: [ContentMismatch("x", 7)])
    with pytest.raises(ReplayError, match=r"verification failed for posix: 1 file\(s\) differ.*x at byte 7"):
        replay(GOLDEN / "v1-odd-pattern-strace.arrow", target=tmp_path / "t", verify=True)
