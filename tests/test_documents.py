"""Every command's --json document matches its typed definition in ckpt_trace.documents (docs/JSON.md)."""

from __future__ import annotations

import json

import pytest
from conftest import DCP, ODD, cli

from ckpt_trace import documents as d


def check(document: dict, definition: type) -> None:
    problem = d.conforms(document, definition)
    assert problem is None, f"{definition.__name__}: {problem}"


def test_the_checker_catches_a_wrong_document():
    assert d.conforms({"output": "x", "bytes": 1}, d.ReportDoc) == "missing key 'figures'"
    assert "is not an integer" in d.conforms({"output": "x", "bytes": 1.5, "figures": 2}, d.ReportDoc)
    assert "latency_ns" in (
        d.conforms(
            {
                "strategy": "posix",
                "elapsed_s": 1,
                "bytes_written": 0,
                "bytes_read": 0,
                "data_ops": 0,
                "metadata_ops": 0,
                "latency_ns": {"p50": 1},
            },
            d.ReplayResultDoc,
        )
        or ""
    )


@pytest.mark.slow
def test_reading_commands(tmp_path):
    check(json.loads(cli("summary", str(ODD), "--json").stdout), d.SummaryDoc)
    check(json.loads(cli("diff", str(ODD), str(DCP), "--json").stdout), d.DiffDoc)
    check(json.loads(cli("replay", str(ODD), "--target", str(tmp_path / "t"), "--json").stdout), d.ReplayDoc)
    check(
        json.loads(
            cli("replay", str(DCP), "--strategy", "all", "--dry-run", "--target", str(tmp_path / "d"), "--json").stdout
        ),
        d.DryRunDoc,
    )
    check(
        json.loads(cli("export", str(ODD), "--format", "parquet", "-o", str(tmp_path / "pq"), "--json").stdout),
        d.ExportDoc,
    )
    check(json.loads(cli("report", str(ODD), "-o", str(tmp_path / "r.html"), "--json").stdout), d.ReportDoc)
    check(json.loads(cli("emit", str(DCP), "-o", str(tmp_path / "w.py"), "--json").stdout), d.EmitDoc)


def test_record_json(strace_backend, tmp_path):
    proc = cli(
        "record",
        "--backend",
        strace_backend,
        "-o",
        str(tmp_path / "t.arrow"),
        "--json",
        "--",
        "sh",
        "-c",
        f"echo x > {tmp_path}/f",
    )
    check(json.loads(proc.stdout), d.RecordDoc)
