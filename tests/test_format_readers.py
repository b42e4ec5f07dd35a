"""formats/README.md's snippets for pyarrow, pandas, polars and DuckDB run as written, on a golden trace."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, cli

from ckpt_trace.formats import read_trace

README = REPO / "formats" / "README.md"
GOLDEN = REPO / "traces" / "golden" / "v4-dcp-gpt2-tiny-2ranks-bcc.arrow"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
NEEDS = {"pandas": "pandas", "polars": "polars", "duckdb": "duckdb"}


def _missing(code: str) -> str | None:
    for name in NEEDS.values():
        if f"import {name}" in code:
            try:
                __import__(name)
            except ImportError:
                return name
    return None


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    where = tmp_path_factory.mktemp("readers")
    shutil.copy(GOLDEN, where / "trace.arrow")
    cli("export", str(where / "trace.arrow"), "--format", "parquet", "-o", str(where / "trace.parquet"))
    return where


def test_the_readme_has_a_snippet_per_reader():
    assert len(SNIPPETS) >= 4
    for name in ("pyarrow", "pandas", "polars", "duckdb"):
        assert any(f"import {name}" in code for code in SNIPPETS), name


@pytest.mark.parametrize("code", SNIPPETS, ids=lambda code: code.splitlines()[0].lstrip("# ").split(":")[0])
def test_snippet_runs(workdir, code):
    missing = _missing(code)
    if missing:
        pytest.skip(f"{missing} is not installed (pip install 'ckpt-trace[readers]')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_pandas_recipe_decodes_every_column_as_ckpt_trace_does(workdir):
    """The README's pandas snippet, run on the golden trace, gives ckpt-trace's own decoded tid, offset and ret."""
    pd = pytest.importorskip("pandas")
    code = next(code for code in SNIPPETS if "import pandas" in code)
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        exec(compile(code, "formats/README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    expected = read_trace(workdir / "trace.arrow").table
    df = namespace["df"]
    assert expected["offset"].null_count < expected.num_rows and (expected["ret"].to_pylist() != expected["size"].to_pylist())
    for name in ("tid", "offset", "ret"):
        got = [None if pd.isna(value) else int(value) for value in df[name].tolist()]
        assert got == expected[name].to_pylist(), name
