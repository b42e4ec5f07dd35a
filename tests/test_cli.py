"""The command line: one-line errors, exit codes, JSON output."""

from __future__ import annotations

import json

from conftest import cli


def one_line_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_unknown_flag(tmp_path):
    proc = cli("summary", "--bogus", str(tmp_path), check=False)
    assert proc.returncode == 2 and "--bogus" in one_line_error(proc)


def test_corrupt_trace_on_every_reading_command(tmp_path):
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(b"ARROW1\x00\x00garbage")
    for args in (("summary", str(bad)), ("replay", str(bad), "--target", str(tmp_path / "t"))):
        proc = cli(*args, check=False)
        assert proc.returncode == 2 and "not a readable Arrow IPC trace" in one_line_error(proc)
    assert not (tmp_path / "t").exists()


def test_unknown_strategy_and_workload(odd_strace, tmp_path):
    trace, _, _ = odd_strace
    proc = cli("replay", str(trace), "--strategy", "magic", "--target", str(tmp_path / "t"), check=False)
    assert proc.returncode == 2 and "unknown strategy 'magic'" in one_line_error(proc)
    proc = cli("workload", "nope", "--out", str(tmp_path / "w"), check=False)
    assert proc.returncode == 2 and "unknown workload" in one_line_error(proc)


def test_summary_json(odd_strace, tmp_path):
    trace, expected, _ = odd_strace
    data = json.loads(cli("summary", str(trace), "--json").stdout)
    writes = [e for e in expected if e["op"] == "write"]
    assert data["ops"]["write"]["count"] == len(writes)
    assert data["bytes_written"] == sum(e["bytes"] for e in writes)
    assert sum(b["write"] for b in data["size_histogram"]) == len(writes)
    assert 0 < data["alignment"]["unaligned_offset_share"] < 1
    assert data["lost_events"] == 0 and data["backend"] == "strace"


def test_replay_json_to_stdout_is_pure_json(odd_strace, tmp_path):
    trace, _, _ = odd_strace
    proc = cli("replay", str(trace), "--target", str(tmp_path / "t"), "--json")
    data = json.loads(proc.stdout)
    assert data["results"][0]["strategy"] == "posix" and data["trace"] == str(trace)
