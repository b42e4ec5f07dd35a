"""Issue 38, findings 6, 9, 13 and 14: no silent corruption, no silent change, clear messages.

``--verify`` fails on any size difference or short read (a truncated,
emptied or extended file passed before, a warning at most); odd but
well-formed traces are refused or replayed with what was skipped counted and
named (``--strict`` makes a skip an error); the messages say what is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_trace.errors import ReplayError
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.replay import _verify, replay, size_words

GOLDEN = Path(__file__).resolve().parent.parent / "traces" / "golden"
DCP = GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow"


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """A verified replay of the DCP golden trace: (target, plan, one of its written files)."""
    target = tmp_path_factory.mktemp("verify") / "t"
    report = replay(DCP, target=target, verify=True)
    path = next(p for p in report.plan.checks.verify_ranges if p.endswith("__1_0.distcp"))
    return target, report.plan, path


@pytest.mark.parametrize("change", ["truncated", "emptied", "extended"])
def test_verify_fails_on_a_truncated_emptied_or_extended_file(verified, change):
    target, plan, path = verified
    full = target / path
    original = full.read_bytes()
    try:
        if change == "truncated":
            os.truncate(full, len(original) // 2)
            expected = f"differ from the pattern, first {path} at byte {len(original) // 2}"
        elif change == "emptied":
            os.truncate(full, 0)
            expected = f"differ from the pattern, first {path} at byte 0"
        else:
            with open(full, "ab") as handle:
                handle.write(b"\0" * (1 << 20))
            expected = f"differ in size from the recording, first {path}: {len(original) + (1 << 20):,} B"
        with pytest.raises(ReplayError, match=expected):
            _verify(TargetRoot(target), plan)
    finally:
        full.write_bytes(original)
    assert _verify(TargetRoot(target), plan) == len(plan.checks.verify_ranges)


def test_a_missing_file_is_missing_not_none_bytes():
    assert size_words(None) == "missing" and size_words(1024) == "1,024 B"
