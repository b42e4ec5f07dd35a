"""`make demo` runs the whole loop; here at a small size (GPT-2-tiny, 2 ranks), as a new user would run it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from ckpt_trace.formats import read_trace

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_make_demo_runs_the_whole_loop_and_says_where_each_result_is(tmp_path, torch_installed, io_uring):
    work, trace = tmp_path / "demo", tmp_path / "demo.arrow"
    env = {**os.environ, "MAKEFLAGS": ""}
    args = [
        "make",
        "-s",
        "-C",
        str(REPO),
        "demo",
        f"DEMO_DIR={work}",
        f"DEMO_TRACE={trace}",
        "DEMO_MODEL=gpt2-tiny",
        "DEMO_RANKS=2",
    ]
    for _attempt in range(2):  # idempotent: the second run replaces the first's results
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for number in range(1, 6):
        assert f"== {number}. " in out
    results, writer, report = work / "replay.json", work / "demo_writer.py", work / "report.html"
    for path in (trace, results, writer, report):
        assert str(path) in out and path.exists(), path
    assert {r["rank"] for r in read_trace(trace).table.to_pylist() if r["op"] == "write"} == {0, 1}
    data = json.loads(results.read_text())
    assert [r["strategy"] for r in data["results"]] == ["posix", "uring-buffered", "uring-direct", "aggregated"]
    assert "emitted vs DCP" in out and "aggregated" in out
    spec = importlib.util.spec_from_file_location("demo_writer", writer)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.make_writer) and callable(module.make_reader)
    assert "<img" in report.read_text()
    assert sorted(p.name for p in work.iterdir()) == ["demo_writer.py", "replay.json", "report.html"]
