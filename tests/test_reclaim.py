"""Proactive reclaim that evicts page cache (``tracer.reclaim``: the trace's ``proactive_reclaim`` metadata):
read from DAMON's sysfs interface, checked against a tree laid out as the kernel documents it
(Documentation/admin-guide/mm/damon/usage.rst) and against this machine's own /sys/kernel/mm/damon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import record

from ckpt_trace.formats import read_metadata
from ckpt_trace.tracer import reclaim


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def _scheme(prefix: str, action: str, age: int, filters: list[tuple[str, str, str]]) -> dict[str, str]:
    files = {
        f"{prefix}/action": action,
        f"{prefix}/access_pattern/age/min": str(age),
        f"{prefix}/quotas/bytes": str(64 << 20),
        f"{prefix}/quotas/reset_interval_ms": "500",
        f"{prefix}/ops_filters/nr_filters": str(len(filters)),
    }
    for i, (kind, matching, allow) in enumerate(filters):
        files |= {
            f"{prefix}/ops_filters/{i}/type": kind,
            f"{prefix}/ops_filters/{i}/matching": matching,
            f"{prefix}/ops_filters/{i}/allow": allow,
        }
    return files


def test_the_running_schemes_that_evict_page_cache_are_found(tmp_path):
    """Of two kdamonds, the one ``off`` is left out; of the running one's schemes, ``willneed`` (it brings pages
    in) is left out and ``pageout`` found, with its idle time in seconds (age in aggregation intervals)."""
    root = tmp_path / "admin"
    on = "kdamonds/0/contexts/0"
    files = {
        "kdamonds/nr_kdamonds": "2",
        "kdamonds/0/state": "on",
        f"{on}/operations": "paddr",
        f"{on}/monitoring_attrs/intervals/aggr_us": "2000000",
        **_scheme(f"{on}/schemes/0", "willneed", 1, []),
        **_scheme(f"{on}/schemes/1", "pageout", 30, [("anon", "Y", "N"), ("unmapped", "Y", "Y")]),
        "kdamonds/1/state": "off",
        "kdamonds/1/contexts/0/operations": "vaddr",
        **_scheme("kdamonds/1/contexts/0/schemes/0", "pageout", 1, []),
    }
    _write(root, files)
    found = reclaim.schemes(root)
    assert found == [
        {
            "kdamond": 0,
            "operations": "paddr",
            "action": "pageout",
            "min_age_s": 60.0,
            "quota_bytes": 64 << 20,
            "quota_reset_interval_ms": 500,
            "filters": [
                {"type": "anon", "matching": True, "allow": False},
                {"type": "unmapped", "matching": True, "allow": True},
            ],
        }
    ]
    line = reclaim.describe(found)
    assert line is not None and "pageout of pages idle for 60 s or more, at most 64 MiB per 500 ms" in line
    assert "anon excluded, unmapped allowed" in line
    assert reclaim.schemes(tmp_path / "missing") == [] and reclaim.describe([]) is None


@pytest.mark.slow
def test_record_stores_and_says_this_machines_schemes(tmp_path, strace_backend):
    """What ``record`` stores and prints equals what DAMON's sysfs says on this machine, read just before; where
    no scheme runs, the key is absent and nothing is said."""
    live = reclaim.schemes()
    trace = tmp_path / "t.arrow"
    proc = record(strace_backend, trace, tmp_path, "true")
    meta = read_metadata(trace)
    if live:
        assert meta["proactive_reclaim"] == live
        assert f"ckpt-trace: note: {reclaim.describe(live)}" in " ".join(proc.stderr.split())
    else:
        assert "proactive_reclaim" not in meta and "DAMON" not in proc.stderr


@pytest.mark.slow
def test_summary_shows_the_recorded_schemes(tmp_path):
    from conftest import cli
    from helpers.traces import META, trace_of

    rows = [{"op": "open", "path": "/ck/a", "fd": 3, "flags": 0, "ret": 3}]
    scheme = {
        "kdamond": 0,
        "operations": "paddr",
        "action": "pageout",
        "min_age_s": 60.0,
        "quota_bytes": 128 << 20,
        "quota_reset_interval_ms": 1000,
        "filters": [],
    }
    trace = trace_of(tmp_path / "t.arrow", rows, {**META, "proactive_reclaim": [scheme]})
    assert json.loads(cli("summary", str(trace), "--json").stdout)["proactive_reclaim"] == [scheme]
    text = " ".join(cli("summary", str(trace)).stdout.split())
    assert "page-cache reclaim (DAMON)" in text and "pageout idle >= 60 s, <= 128.0 MiB per 1000 ms" in text
    assert "DAMON" not in cli("summary", str(trace_of(tmp_path / "u.arrow", rows, dict(META)))).stdout
