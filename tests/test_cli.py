"""The command line: one-line errors, exit codes, JSON output."""

from __future__ import annotations

import json

import pytest
from conftest import cli


def one_line_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.slow
def test_unknown_flag(tmp_path):
    proc = cli("summary", "--bogus", str(tmp_path), check=False)
    assert proc.returncode == 2 and "--bogus" in one_line_error(proc)


@pytest.mark.slow
def test_corrupt_trace_on_every_reading_command(tmp_path):
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(b"ARROW1\x00\x00garbage")
    for args in (("summary", str(bad)), ("replay", str(bad), "--target", str(tmp_path / "t"))):
        proc = cli(*args, check=False)
        assert proc.returncode == 2 and "not a readable Arrow IPC trace" in one_line_error(proc)
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
def test_unknown_strategy_and_workload(odd_strace, tmp_path):
    trace, _, _ = odd_strace
    proc = cli("replay", str(trace), "--strategy", "magic", "--target", str(tmp_path / "t"), check=False)
    line = one_line_error(proc)
    assert proc.returncode == 2 and "'magic' is not one of" in line and "'aggregated'" in line
    proc = cli("workload", "nope", "--out", str(tmp_path / "w"), check=False)
    assert proc.returncode == 2 and "'nope' is not one of" in one_line_error(proc)


@pytest.mark.slow
def test_summary_json(odd_strace, tmp_path):
    trace, expected, _ = odd_strace
    data = json.loads(cli("summary", str(trace), "--json").stdout)
    writes = [e for e in expected if e["op"] == "write"]
    assert data["ops"]["write"]["count"] == len(writes)
    assert data["bytes_written"] == sum(e["bytes"] for e in writes)
    assert sum(b["write"] for b in data["size_histogram"]) == len(writes)
    assert 0 < data["alignment"]["unaligned_offset_share"] < 1
    assert data["lost_events"] == 0 and data["backend"] == "strace"


@pytest.mark.slow
def test_replay_json_to_stdout_is_pure_json(odd_strace, tmp_path):
    trace, _, _ = odd_strace
    proc = cli("replay", str(trace), "--target", str(tmp_path / "t"), "--json")
    data = json.loads(proc.stdout)
    assert data["results"][0]["strategy"] == "posix" and data["trace"] == str(trace)


COMMANDS = (
    "record",
    "replay",
    "summary",
    "merge",
    "synth",
    "filter",
    "upgrade",
    "export",
    "report",
    "diff",
    "baseline",
    "check",
    "emit",
    "workload",
    "bench",
    "version",
)


@pytest.mark.slow
def test_version_flag_and_bare_command():
    from ckpt_trace.version import __version__

    assert cli("--version").stdout.strip() == f"ckpt-trace {__version__}"
    bare = cli(check=False)
    assert bare.returncode == 0 and "error" not in bare.stderr + bare.stdout
    assert "Commands:" in bare.stdout and "..." not in bare.stdout.split("Commands:")[1]  # short lines, not cut


@pytest.mark.slow
def test_every_help_has_an_example_and_names_values_not_python_types():
    import re

    for command in COMMANDS:
        text = cli(command, "--help").stdout
        examples = text.split("Examples:")[1].strip().splitlines() if "Examples:" in text else []
        assert examples and all(line.strip().startswith("ckpt-trace ") for line in examples[:1]), command
        assert not re.search(r"<(str|int|float|path|list\[[a-z]+\])>|\{[a-z_]+\}", text), (command, text)
    from ckpt_trace.replayer import strategies

    replay = cli("replay", "--help").stdout
    assert "<posix|uring-buffered|uring-direct|aggregated|gds|" in replay and "--target DIR" in replay
    assert f"<{'|'.join(strategies.choices())}>" in replay  # the strategy table's names, then all


@pytest.mark.slow
def test_replay_table_fits_80_columns_when_piped(odd_strace, tmp_path):
    """Piped, the results table is plain and at most 80 columns; the columns left out are named, and --wide
    shows them all."""
    trace, _, _ = odd_strace
    narrow = cli("replay", str(trace), "--target", str(tmp_path / "a")).stdout
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert "write tput" in narrow and "vs posix" in narrow and "--wide" in narrow
    wide = cli("replay", str(trace), "--target", str(tmp_path / "b"), "--wide").stdout
    assert "cpu sys" in wide and "unaligned" in wide and max(len(line) for line in wide.splitlines()) > 80
