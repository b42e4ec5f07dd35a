"""Documents from data are validated, never executed (issue 38, findings 4 and 10).

``emit`` used to paste the trace path, the results' options and strategy names into the generated
module's docstring unescaped (a ``\"\"\"`` in any of them ran code when the module was imported) and took
any strategy name; malformed trace metadata, results and baselines ended in internal errors (exit 70).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import ODD, cli

from ckpt_trace.formats import read_trace, sha256_file, write_trace

PAYLOAD = 'x"""\nimport sys; sys.modules["pwned"] = 1\n"""\\\\\\n\'\'\'\r\x00\x1b \udcff end'


def _results(trace: Path, **changes) -> dict:
    entry = {
        "strategy": "aggregated",
        "elapsed_s": 0.5,
        "bytes_written": 100,
        "bytes_read": 0,
        "write_throughput_bytes_per_s": 200.0,
        "speedup_vs_posix": 2.0,
    }
    data = {
        "trace": str(trace),
        "trace_sha256": sha256_file(trace),
        "options": {"queue_depth": 8, "buffer_bytes": 1 << 20, "pack_files": False, "durable": False},
        "results": [entry, {**entry, "strategy": "posix", "elapsed_s": 1.0, "speedup_vs_posix": 1.0}],
    }
    data.update(changes)
    return data


def test_emit_renders_quotes_backslashes_and_newlines_of_every_field_as_text(tmp_path):
    from ckpt_trace.writer.emit import emit

    name = PAYLOAD.replace("\x00", "").replace("\udcff", "")  # a file name holds all but NUL and / (Arrow: UTF-8)
    folder = tmp_path / name
    folder.mkdir()
    trace = folder / f"t{name}.arrow"
    trace.write_bytes(ODD.read_bytes())
    data = _results(trace)
    data["options"][PAYLOAD] = PAYLOAD  # option names and values are printed in the docstring
    data["options"]["timing"] = PAYLOAD
    data["trace"] = PAYLOAD
    results = folder / "r.json"
    results.write_text(json.dumps(data))
    output = tmp_path / "tuned_writer.py"
    emit(trace, output, results_path=results)
    source = output.read_text()
    tree = ast.parse(source)
    kinds = [type(node).__name__ for node in tree.body]
    assert kinds == ["Expr", "ImportFrom", "Assign", "FunctionDef", "FunctionDef", "FunctionDef"], kinds  # nothing else
    docstring = ast.get_docstring(tree, clean=False)
    assert str(trace) in docstring and f"{PAYLOAD}={PAYLOAD}" in docstring
    spec = importlib.util.spec_from_file_location("tuned_writer", output)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "pwned" not in sys.modules and module.__doc__ == docstring
    assert type(module.OPTIONS).__name__ == "WriterOptions"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ['posix"""; import os', "fastest", "aggregated+magic"])
def test_emit_refuses_strategies_it_does_not_know(tmp_path, strategy):
    results = tmp_path / "r.json"
    data = _results(ODD)
    data["results"][0]["strategy"] = strategy
    results.write_text(json.dumps(data))
    proc = cli("emit", str(ODD), "-o", str(tmp_path / "w.py"), "--from-results", str(results), check=False)
    assert proc.returncode == 2 and "not one ckpt-trace replays" in proc.stderr, proc.stderr
    assert not (tmp_path / "w.py").exists()


def _one_line(proc, *words) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert all(word in lines[0] for word in words), lines[0]


@pytest.mark.parametrize(
    "key,value",
    [
        ("lost_events", "many"),
        ("lost_events", -3),
        ("command", "rm -rf"),
        ("host", 7),
        ("elapsed_ns", "fast"),
        ("gpu", [1]),
    ],
)
@pytest.mark.slow
def test_malformed_trace_metadata_is_one_line_naming_the_key(tmp_path, key, value):
    trace = read_trace(ODD)
    bad = write_trace(tmp_path / "bad.arrow", trace.table, {**trace.metadata, key: value})
    for args in (
        ["summary", str(bad)],
        ["diff", str(ODD), str(bad)],
        ["report", str(bad), "-o", str(tmp_path / "r.html")],
        ["emit", str(bad), "-o", str(tmp_path / "w.py")],
        ["replay", str(bad), "--target", str(tmp_path / "t"), "--dry-run"],
    ):
        _one_line(cli(*args, check=False), repr(key))


@pytest.mark.parametrize(
    "change,key",
    [
        ({"results": "abc"}, "'results' is not a list"),
        ({"results": []}, "'results' is empty"),
        ({"options": [1]}, "options"),
        ({"options": {"queue_depth": "many"}}, "queue_depth"),
        ({"options": {"buffer_bytes": -1}}, "buffer_bytes"),
        ({"fio_write_bytes_per_s": "fast"}, "fio_write_bytes_per_s"),
        ("elapsed_s=fast", "elapsed_s"),
        ("elapsed_s=nan", "elapsed_s"),
        ("elapsed_s=-1", "elapsed_s"),
        ("bytes_written=1.5", "bytes_written"),
        ("strategy=3", "strategy"),
    ],
)
@pytest.mark.slow
def test_malformed_results_are_one_line_naming_the_key(tmp_path, change, key):
    data = _results(ODD)
    if isinstance(change, dict):
        data.update(change)
    else:
        name, value = change.split("=")
        data["results"][0][name] = {"fast": "fast", "nan": float("nan"), "-1": -1, "1.5": 1.5, "3": 3}[value]
    results = tmp_path / "r.json"
    results.write_text(json.dumps(data))
    for args in (
        ["emit", str(ODD), "-o", str(tmp_path / "w.py"), "--from-results", str(results)],
        ["report", str(ODD), str(results), "-o", str(tmp_path / "r.html")],
    ):
        _one_line(cli(*args, check=False), key)


@pytest.mark.parametrize(
    "change,key",
    [
        ({"options": "x"}, "options"),
        ("repeat=five", "repeat"),
        ("repeat=0", "repeat"),
        ("durable=1", "durable"),
        ({"traces": "t"}, "traces"),
        ("min_seconds=inf", "min_seconds"),
    ],
)
@pytest.mark.slow
def test_malformed_baselines_are_one_line_naming_the_key(tmp_path, change, key):
    from ckpt_trace.check.baseline import BASELINE_FORMAT, BASELINE_VERSION

    data = {
        "format": BASELINE_FORMAT,
        "version": BASELINE_VERSION,
        "environment": {},
        "options": {
            "strategies": ["posix"],
            "repeat": 3,
            "min_seconds": 1.0,
            "queue_depth": 8,
            "buffer_bytes": 1 << 20,
            "durable": True,
        },
        "traces": [{"name": "t", "path": str(ODD), "sha256": sha256_file(ODD), "results": {}}],
    }
    if isinstance(change, dict):
        data.update(change)
    else:
        name, value = change.split("=")
        data["options"][name] = {"five": "five", "0": 0, "1": 1, "inf": float("inf")}[value]
    baseline = tmp_path / "b.json"
    baseline.write_text(json.dumps(data))
    _one_line(cli("check", str(ODD), "--baseline", str(baseline), "--target", str(tmp_path / "t"), check=False), key)


# -- ranges (finding 8): intervals, never lists ------------------------------------------------------------


def test_wide_rank_and_pid_ranges_are_intervals_not_lists(tmp_path):
    import tracemalloc

    from ckpt_trace.analysis.filter import Conditions, filter_trace

    tracemalloc.start()
    result = filter_trace(ODD, tmp_path / "f.arrow", Conditions(ranks="-1-10000000", pids="1-20000000"))
    _, peak = (
        tracemalloc.get_traced_peak() if hasattr(tracemalloc, "get_traced_peak") else tracemalloc.get_traced_memory()
    )
    tracemalloc.stop()
    assert peak < 50 << 20, f"{peak / 2**20:.0f} MiB of Python objects for two ranges"
    assert result["rows_out"] == result["rows_in"] == read_trace(ODD).num_rows  # every pid is in 1-20000000


@pytest.mark.parametrize(
    "rank,kept",
    [("0-999999999999", 0), ("-1-999999999999", None), ("99999999999999999999", "error"), ("-1,-1,0-3,2-9", None)],
)
@pytest.mark.slow
def test_ranges_are_cut_to_the_columns_type(tmp_path, rank, kept):
    trace = read_trace(ODD)
    proc = cli("filter", str(ODD), "-o", str(tmp_path / "f.arrow"), "--rank", rank, "--json", check=False)
    if kept == "error":
        _one_line(proc, "no rank can be", "2,147,483,647")
        return
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["rows_out"] == (trace.num_rows if kept is None else kept)  # every row of this trace has rank -1
