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
from conftest import DCP
from helpers.traces import file_rows, trace_of

from ckpt_trace.errors import ReplayError
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.replay import _verify, replay, size_words


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


# -- findings 9, 13, 14: odd but well-formed traces ----------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"size": 1 << 62, "ret": 1 << 62},
            r"trace row 1: size 4611686018427387904 is more than one read or write "
            r"moves on Linux \(2,147,479,552 B\)",
        ),
        ({"offset": -4096}, "trace row 1: offset -4096 is negative"),
        ({"ts_ns": -1}, "trace row 1: ts_ns -1 is negative"),
        ({"ts_ns": 5_000}, "trace row 2: ts_ns 2000 goes back in time"),
    ],
)
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["posix", "aggregated"])
def test_values_out_of_their_range_are_refused_in_one_line_before_any_io(tmp_path, change, message, strategy):
    trace = trace_of(tmp_path / "t.arrow", file_rows("/ck/a", 4096, **change))
    with pytest.raises(ReplayError, match=message):
        replay(trace, target=tmp_path / "t", strategy=strategy)
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
def test_open_flags_of_minus_one_are_refused(tmp_path):
    rows = file_rows("/ck/a", 4096)
    rows[0]["flags"] = -1
    with pytest.raises(ReplayError, match="trace row 0: flags -1 are not open"):
        replay(trace_of(tmp_path / "t.arrow", rows), target=tmp_path / "t")


def _skipping_trace(tmp_path: Path) -> Path:
    """3 MiB written to ck/a, half a MiB of it by rows of an operation nobody knows; a rename to '/..'."""
    rows = file_rows("/ck/a", 1 << 20)[:2]
    rows += [
        {"op": "write", "path": "/ck/a", "fd": 3, "offset": 1 << 20, "size": 1 << 20, "ret": 1 << 20},
        {"op": "frobnicate", "path": "/ck/a", "fd": 3, "offset": 2 << 20, "size": 1 << 19, "ret": 1 << 19},
        {"op": "write", "path": "/ck/a", "fd": 3, "offset": (2 << 20) + (1 << 19), "size": 1 << 19, "ret": 1 << 19},
        {"op": "close", "path": "/ck/a", "fd": 3},
        {"op": "rename", "path": "/ck/a", "new_path": "/.."},
    ]
    return trace_of(tmp_path / "t.arrow", rows)


@pytest.mark.slow
def test_skipped_rows_are_counted_and_named_and_strict_refuses_them(tmp_path):
    trace = _skipping_trace(tmp_path)
    report = replay(trace, target=tmp_path / "t")
    result = report.results[0]
    assert result.skipped_ops["unsupported_frobnicate"] == 1 and result.skipped_ops["no_path"] == 1
    assert any("1 trace row(s) not replayed (unsupported_frobnicate)" in note for note in result.notes)
    assert any("(no_path)" in note and "rename to '/..'" in note for note in result.notes)
    with pytest.raises(ReplayError, match=r"strict=True: 1 trace row\(s\) not replayed \(no_path\).*1 more kind"):
        replay(trace, target=tmp_path / "s", strict=True)
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_a_strip_prefix_equal_to_a_recorded_file_is_a_counted_skip(tmp_path):
    trace = trace_of(tmp_path / "t.arrow", file_rows("/data/ck", 4096) + file_rows("/data/other", 1 << 17, fd=4))
    report = replay(trace, target=tmp_path / "t", strip_prefix="/data/ck")
    assert report.results[0].bytes_written == 1 << 17 and report.results[0].skipped_ops["no_path"] == 1
    assert any("--strip-prefix equal to the file" in note for note in report.results[0].notes)
    with pytest.raises(ReplayError, match="strict=True"):
        replay(trace, target=tmp_path / "s", strip_prefix="/data/ck", strict=True)


def test_too_many_open_files_says_to_raise_ulimit(tmp_path):
    import errno

    from ckpt_trace.replayer.engine import _op_error
    from ckpt_trace.replayer.optable import PlanOp

    err = _op_error(PlanOp(seq=0, kind="open", ts_ns=0, path="ck/a"), OSError(errno.EMFILE, os.strerror(errno.EMFILE)))
    assert "Too many open files" in str(err) and "ulimit -n" in str(err)


@pytest.mark.slow
def test_a_path_used_as_a_file_and_a_directory_is_named_before_any_io(tmp_path):
    rows = file_rows("/ck/a", 1 << 17) + file_rows("/ck/a/b", 1 << 17, fd=4)  # as if "a/b" were one name
    with pytest.raises(ReplayError, match="opens ck/a as a file and names files below it.*'/' inside a recorded"):
        replay(trace_of(tmp_path / "t.arrow", rows), target=tmp_path / "t")
    assert not (tmp_path / "t").exists()
