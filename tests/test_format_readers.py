"""formats/README.md's one-line readers (pyarrow, pandas, polars, DuckDB) run as written and read the same
``offset``, ``tid`` and ``ret`` as ``ckpt_trace.formats.read_trace``, with no decoding code: on every
version 5 golden trace, and on every older golden trace after ``ckpt-trace upgrade``. A snippet that read a
column of another meaning (version 4's differences, say) or none would fail here."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO, cli

from ckpt_trace.formats import FORMAT_VERSION, read_metadata, read_trace

README = REPO / "formats" / "README.md"
GOLDEN = sorted((REPO / "traces" / "golden").glob("v*.arrow"))
SNIPPETS = {
    re.split(r"[^A-Za-z]", code.splitlines()[0].lstrip("# "))[0]: code
    for code in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
}
READERS = ("pyarrow", "pandas", "polars", "DuckDB")
CHECKED = ("offset", "tid", "ret")


def _as_int(value) -> int | None:
    import pandas as pd

    return None if value is None or pd.isna(value) else int(value)


def _values(reader: str, namespace: dict) -> dict[str, list]:
    """The checked columns of what the snippet left in its namespace, as Python ints and None."""
    if reader == "pyarrow":
        table = namespace["table"]
        return {name: table[name].to_pylist() for name in CHECKED}
    if reader == "pandas":
        df = namespace["df"]
        return {name: [_as_int(value) for value in df[name].tolist()] for name in CHECKED}
    if reader == "polars":
        df = namespace["df"]
        return {name: df[name].to_list() for name in CHECKED}
    rows = namespace["rows"].fetchall()  # DuckDB keeps a projection's row order (preserve_insertion_order)
    return {name: [_as_int(row[i]) for row in rows] for i, name in enumerate(CHECKED)}


@pytest.fixture(scope="module")
def trace_files(tmp_path_factory) -> dict[str, Path]:
    """Per golden trace, a directory holding it as ``trace.arrow``: as it is (version 5), or upgraded."""
    out = {}
    for path in GOLDEN:
        where = tmp_path_factory.mktemp(path.stem)
        if read_metadata(path)["format_version"] == FORMAT_VERSION:
            shutil.copy(path, where / "trace.arrow")
        else:
            cli("upgrade", str(path), "-o", str(where / "trace.arrow"))
        out[path.name] = where
    return out


def test_the_readme_has_a_short_snippet_per_reader():
    assert set(SNIPPETS) >= set(READERS)
    for reader in READERS:
        code = [line for line in SNIPPETS[reader].splitlines() if line and not line.startswith(("#", "import "))]
        assert len(code) <= 2, (reader, code)  # no decoding recipe
    assert any(path.name.startswith(f"v{FORMAT_VERSION}-") for path in GOLDEN)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.name)
def test_snippet_reads_what_ckpt_trace_reads(trace_files, golden, reader):
    code = SNIPPETS[reader]
    for module in ("pandas", "polars", "duckdb"):
        if f"import {module}" in code:
            pytest.importorskip(module, reason="pip install 'ckpt-trace[readers]'")
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(trace_files[golden.name])
    try:
        exec(compile(code, "formats/README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    expected = read_trace(golden).table  # the original, read (decoded, upgraded) by ckpt_trace.formats
    got = _values(reader, namespace)
    for name in CHECKED:
        assert got[name] == expected[name].to_pylist(), (reader, name)
