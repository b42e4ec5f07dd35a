"""``anonymize``: a trace to share replays to the same pattern and holds none of the original names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli
from helpers.traces import CREATE, trace_of

from ckpt_trace.formats import read_metadata, read_trace

SECRETS = ("zorblax", "ckptvault", "run-7f3q", "weights-quux", "hostfrobnic", "trainglorp")


def _trace(path: Path) -> Path:
    base = "/zorblax/ckptvault/run-7f3q"
    files = {f"{base}/weights-quux-{i}.distcp": (i + 1) * 100_000 for i in range(3)}
    rows = []
    for index, (name, size) in enumerate(files.items()):
        fd = 3 + index
        rows += [
            {"op": "open", "path": name, "fd": fd, "ret": fd, "flags": CREATE},
            {"op": "write", "path": name, "fd": fd, "offset": 0, "size": size // 2, "ret": size // 2},
            {
                "op": "write",
                "path": name,
                "fd": fd,
                "offset": size // 2,
                "size": size - size // 2,
                "ret": size - size // 2,
            },
            {"op": "close", "path": name, "fd": fd},
        ]
    rows.append({"op": "rename", "path": f"{base}/weights-quux-0.distcp", "new_path": f"{base}/final.distcp"})
    meta = {
        "creator": "test",
        "creator_version": "0",
        "host": "hostfrobnic",
        "kernel": "6.1.0",
        "arch": "x86_64",
        "command": ["python3", "trainglorp.py", "--out", base],
        "backend": "strace",
        "backend_reason": f"requested; log under {base}",
        "start_wall_time_ns": 0,
        "lost_events": 0,
        "filesystems": {"/zorblax": {"type": "xfs", "block_size": 4096, "device": "/dev/hostfrobnic-vg"}},
        "path_filters": [base + "/"],
    }
    return trace_of(path, rows, meta, comm="trainglorp", rank=0)


@pytest.mark.slow
def test_an_anonymized_trace_replays_the_same_pattern_and_names_nothing(tmp_path):
    original = _trace(tmp_path / "t.arrow")
    shared = tmp_path / "shared.arrow"
    done = json.loads(cli("anonymize", str(original), "-o", str(shared), "--json").stdout)
    assert done["rows"] == read_trace(original).num_rows and "sizes" in done["kept"]
    raw = shared.read_bytes()
    text = json.dumps(read_metadata(shared)) + json.dumps(read_trace(shared).table.to_pylist())
    for secret in SECRETS + ("python3",):
        assert secret.encode() not in raw and secret not in text, secret
    table, anon = read_trace(original).table, read_trace(shared).table
    for column in ("op", "size", "offset", "ts_ns", "rank", "pid", "flags"):
        assert table.column(column).to_pylist() == anon.column(column).to_pylist(), column
    paths, anon_paths = table.column("path").to_pylist(), anon.column("path").to_pylist()
    assert len(set(paths)) == len(set(anon_paths))  # file identity kept
    assert all(a.count("/") == b.count("/") and a.endswith(".distcp") for a, b in zip(anon_paths, paths) if a)
    plans = []
    for trace in (original, shared):
        dry = json.loads(cli("replay", str(trace), "--target", str(tmp_path / "dry"), "--dry-run", "--json").stdout)
        plans.append([(p["strategy"], p["ops"], p["write_bytes"]) for p in dry["plans"]])
    assert plans[0] == plans[1]
    sizes = []
    for name, trace in (("a", original), ("b", shared)):
        cli("replay", str(trace), "--target", str(tmp_path / name))
        sizes.append(sorted(p.stat().st_size for p in (tmp_path / name).rglob("*") if p.is_file()))
    assert sizes[0] == sizes[1] and len(sizes[0]) == 3


@pytest.mark.slow
def test_the_same_key_gives_the_same_names_and_the_input_is_never_the_output(tmp_path):
    original = _trace(tmp_path / "t.arrow")
    for name in ("a.arrow", "b.arrow"):
        cli("anonymize", str(original), "-o", str(tmp_path / name), "--key", "k1")
    assert (
        read_trace(tmp_path / "a.arrow").table.column("path").to_pylist()
        == read_trace(tmp_path / "b.arrow").table.column("path").to_pylist()
    )
    proc = cli("anonymize", str(original), "-o", str(original), "--force", check=False)
    assert proc.returncode == 2 and "is the input" in proc.stderr
