"""The strategy table (``replayer/strategies``): one declaration per strategy, read by replay, emit, the CLI and
the benchmarks; an unknown name is an error everywhere, never a silent default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import cli, one_line

from ckpt_trace.errors import CheckpointError, ReplayError
from ckpt_trace.replayer import strategies
from ckpt_trace.replayer.options import ReplayOptions
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.replay import CHOICES, STRATEGIES, derive_plan, make_executor
from ckpt_trace.writer.emit import choose

ROOT = Path(__file__).resolve().parent.parent


def test_all_and_the_choices_come_from_the_table():
    assert STRATEGIES == strategies.in_all() == ("posix", "uring-buffered", "uring-direct", "aggregated")
    assert strategies.choices() == CHOICES and CHOICES[-1] == "all" and "gds" in CHOICES
    table = strategies.table()
    assert list(table)[0] == "posix" and all(name == spec.name for name, spec in table.items())
    assert not table["posix"].direct_io and table["aggregated"].direct_io and table["aggregated"].uses_buffer_bytes
    assert strategies.expand("all") == STRATEGIES and strategies.expand("uring-direct") == ("uring-direct",)


def test_an_unknown_strategy_is_an_error_everywhere(tmp_path):
    with pytest.raises(ReplayError, match="unknown strategy 'nope'"):
        strategies.get("nope")
    with pytest.raises(ReplayError, match="unknown strategy 'nope'"):
        ReplayOptions().check("nope")
    with pytest.raises(ReplayError, match="unknown strategy 'nope'"):
        make_executor("nope", TargetRoot(tmp_path), 32)
    with pytest.raises(ReplayError, match="unknown strategy 'nope'"):
        derive_plan(None, "nope")  # refused before the plan is looked at
    doc = {
        "results": [{"strategy": "nope", "elapsed_s": 1.0, "bytes_written": 1 << 30, "bytes_read": 0}],
        "options": {},
    }
    with pytest.raises(CheckpointError, match="strategy 'nope', not one ckpt-trace replays"):
        choose(1, doc)


def test_emit_reads_each_strategys_declared_defaults():
    for name, spec in strategies.table().items():
        doc = {
            "results": [{"strategy": name, "elapsed_s": 1.0, "bytes_written": 1 << 30, "bytes_read": 0}],
            "options": {"queue_depth": 7, "buffer_bytes": 2 << 20},
        }
        chosen = choose(1, doc).options
        assert chosen.direct_io == spec.direct_io, name
        assert (chosen.queue_depth == 7) == spec.uses_queue_depth, name
        assert (chosen.buffer_bytes == 2 << 20) == spec.uses_buffer_bytes, name


def test_no_module_outside_the_table_branches_on_a_strategy_name():
    named = "|".join(re.escape(name) for name in strategies.names() if name != "posix")
    branch = re.compile(rf"""strategy\)?\s*(==|!=|in)\s*\(?["']({named})["']""")
    for path in (
        "replayer/ckpt_trace/replayer/replay.py",
        "replayer/ckpt_trace/replayer/distributed.py",
        "replayer/ckpt_trace/replayer/verify.py",
        "replayer/ckpt_trace/replayer/results.py",
        "ckpt_trace/writer/emit.py",
        "ckpt_trace/cli.py",
        "benchmarks/engine_rate.py",
    ):
        text = (ROOT / path).read_text()
        assert not branch.search(text), (path, branch.search(text))


@pytest.mark.slow
def test_the_cli_refuses_an_unknown_strategy_in_one_line(tmp_path):
    proc = cli(
        "replay",
        str(ROOT / "traces/golden/v2-dcp-gpt2-tiny-2ranks-bcc.arrow"),
        "--target",
        str(tmp_path / "t"),
        "--strategy",
        "nope",
        check=False,
    )
    assert proc.returncode == 2 and "'nope' is not one of" in one_line(proc)
    assert not (tmp_path / "t").exists()
