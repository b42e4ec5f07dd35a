"""One error family: every library error is a CkptTraceError of the errors module; a library message names the
call's keyword argument, never a command-line flag, and the CLI words the same error with its flag."""

from __future__ import annotations

import ast
import collections
import pickle
import re

import pytest
from conftest import REPO, cli
from helpers.traces import trace_of

from ckpt_trace import errors
from ckpt_trace.errors import CkptTraceError, RegressionError, ReplayError
from ckpt_trace.replayer import replay

STAGES = ("ckpt_trace", "formats/ckpt_trace", "iolayer/ckpt_trace", "tracer/ckpt_trace", "replayer/ckpt_trace")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
# Library modules whose raise statements still name a flag, and how many: the number may only go down (a
# workload's own command line, engines.py and synth.py, names its flags on purpose).
STILL_NAMING_FLAGS = {
    "ckpt_trace/bench/run.py": 2,
    "ckpt_trace/report/export.py": 1,
    "ckpt_trace/workloads/builtin/__init__.py": 11,
    "ckpt_trace/workloads/engines.py": 3,
    "ckpt_trace/workloads/synth.py": 1,
    "tracer/ckpt_trace/tracer/gpu.py": 2,
}


def _flag_naming_raises() -> collections.Counter:
    found: collections.Counter = collections.Counter()
    for folder in STAGES:
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative == "ckpt_trace/cli.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    text = "".join(
                        c.value
                        for arg in node.exc.args
                        for c in ast.walk(arg)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    )
                    if FLAG.search(text):
                        found[relative] += 1
    return found


def test_library_errors_name_no_more_flags_than_before():
    found = _flag_naming_raises()
    grown = {path: count for path, count in found.items() if count > STILL_NAMING_FLAGS.get(path, 0)}
    assert not grown, f"library errors naming a CLI flag (say {{option}} and pass option=...): {grown}"


def test_every_error_class_of_ours_is_in_the_family():
    assert issubclass(RegressionError, CkptTraceError) and errors.RegressionError is RegressionError
    from ckpt_trace.check import baseline

    assert baseline.RegressionError is RegressionError  # defined once, in the errors module


@pytest.mark.slow
def test_python_and_the_cli_word_the_same_error_each_in_its_own_terms(tmp_path):
    """replay(repeat=0) says ``repeat``, ``ckpt-trace replay --repeat 0`` says ``--repeat``; a non-empty target
    says ``force=True`` from Python and ``--force`` from the CLI. One line each, exit status 2."""
    trace = trace_of(tmp_path / "t.arrow", [{"op": "mkdir", "path": "/d"}])
    with pytest.raises(ReplayError) as caught:
        replay(trace, target=tmp_path / "a", repeat=0)
    assert str(caught.value) == "repeat must be at least 1" and caught.value.option == "repeat"
    proc = cli("replay", str(trace), "--target", str(tmp_path / "b"), "--repeat", "0", check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == "ckpt-trace: error: --repeat must be at least 1"

    full = tmp_path / "full"
    full.mkdir()
    (full / "kept").write_text("x")
    with pytest.raises(ReplayError, match=r"is not empty \(use force=True to replay into it\)$"):
        replay(trace, target=full)
    proc = cli("replay", str(trace), "--target", str(full), check=False)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("is not empty (use --force to replay into it)")
    assert len(proc.stderr.strip().splitlines()) == 1 and (full / "kept").read_text() == "x"


def test_an_errors_option_survives_pickling():
    """A distributed replay's worker sends its error to the parent pickled: the option and the class stay."""
    error = ReplayError("{option} must be at least 1", option="queue_depth")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is ReplayError and again.option == "queue_depth" and str(again) == str(error)
    assert again.render(lambda option: "--" + option.replace("_", "-")) == "--queue-depth must be at least 1"
