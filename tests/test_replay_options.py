"""``ReplayOptions`` (``replayer/options.py``): one options object with its defaults in one place, taken alike by
single-node and distributed replay; distributed replay imports no private helper of replay's."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from ckpt_trace.errors import ReplayError
from ckpt_trace.replayer import replay
from ckpt_trace.replayer.distributed import replay_distributed
from ckpt_trace.replayer.options import DEFAULT_BUFFER_BYTES, DEFAULT_QUEUE_DEPTH, ReplayOptions

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "traces" / "golden" / "v2-dcp-gpt2-tiny-2ranks-bcc.arrow"


@pytest.mark.slow  # names replay (its signature only), which the marker check counts as starting one
def test_defaults_are_defined_once():
    options = ReplayOptions()
    assert (options.queue_depth, options.buffer_bytes) == (DEFAULT_QUEUE_DEPTH, DEFAULT_BUFFER_BYTES) == (32, 4 << 20)
    for function in (replay, replay_distributed):
        assert "options" in inspect.signature(function).parameters
        assert "queue_depth" not in inspect.signature(function).parameters  # not a second default
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.queue_depth = 1  # type: ignore[misc]


def test_keywords_override_the_object_and_unknown_ones_are_refused():
    base = ReplayOptions(queue_depth=8, verify=True)
    assert ReplayOptions.of(base, durable=True) == ReplayOptions(queue_depth=8, verify=True, durable=True)
    with pytest.raises(ReplayError, match="unknown replay option 'queue_dept'"):
        ReplayOptions.of(base, queue_dept=4)
    with pytest.raises(ReplayError, match="unknown timing"):
        ReplayOptions(timing="later").check("posix")
    with pytest.raises(ReplayError, match="unknown strategy"):
        ReplayOptions().check("nope")


@pytest.mark.slow
def test_a_replay_reports_the_options_it_was_given(tmp_path):
    options = ReplayOptions(queue_depth=8, buffer_bytes=2 << 20, repeat=1, verify=True)
    by_object = replay(GOLDEN, target=tmp_path / "a", strategy="posix", options=options)
    by_keywords = replay(
        GOLDEN, target=tmp_path / "b", strategy="posix", queue_depth=8, buffer_bytes=2 << 20, repeat=1, verify=True
    )
    for report in (by_object, by_keywords):
        assert report.options["queue_depth"] == 8 and report.options["buffer_bytes"] == 2 << 20
        assert report.results[0].verified_files > 0
        report.release()
    assert {k: v for k, v in by_object.options.items() if k != "rounds_rule"} == {
        k: v for k, v in by_keywords.options.items() if k != "rounds_rule"
    }


def test_distributed_replay_imports_no_private_helper_of_replay():
    tree = ast.parse((ROOT / "replayer/ckpt_trace/replayer/distributed.py").read_text())
    private = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "replay"
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert any(isinstance(node, ast.ImportFrom) and node.module == "replay" for node in ast.walk(tree))
    assert private == []
