"""``ckpt-trace upgrade``: any older trace rewritten as the current format version, every row kept."""

from __future__ import annotations

import json
import os

import pyarrow.ipc as ipc
import pytest
from conftest import REPO, cli

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import FORMAT_VERSION, METADATA_KEY, read_extra_metadata, read_trace, sha256_file
from ckpt_trace.formats.convert import upgrade_trace

OLDER = [
    path
    for path in sorted((REPO / "traces" / "golden").glob("v*.arrow"))
    if not path.name.startswith(f"v{FORMAT_VERSION}-")
]


@pytest.mark.parametrize("golden", OLDER, ids=lambda p: p.name)
def test_every_older_golden_upgrades_to_the_same_rows(tmp_path, golden):
    result = upgrade_trace(golden, tmp_path / "new.arrow", batch_rows=300)  # several batches
    before, after = read_trace(golden), read_trace(tmp_path / "new.arrow")
    assert after.metadata["format_version"] == FORMAT_VERSION == result["to_version"]
    assert result["from_version"] == before.metadata["format_version"] and result["rows"] == before.num_rows
    assert {name: after.table[name].to_pylist() for name in after.table.column_names} == {
        name: before.table[name].to_pylist() for name in before.table.column_names
    }
    assert read_extra_metadata(tmp_path / "new.arrow")["upgraded_from"] == {
        "format_version": before.metadata["format_version"],
        "sha256": sha256_file(golden),
    }
    assert {key: value for key, value in after.metadata.items() if key not in ("format_version", "upgraded_from")} == {
        key: value for key, value in before.metadata.items() if key != "format_version"
    }
    stored = ipc.open_file(str(tmp_path / "new.arrow")).schema.names
    assert "offset" in stored and not [name for name in stored if name.endswith("_delta")]


@pytest.mark.slow
def test_upgrade_refuses_its_input_as_output_and_keeps_other_keys(tmp_path):
    original = tmp_path / "old.arrow"
    original.write_bytes(OLDER[-1].read_bytes())
    data = original.read_bytes()
    with pytest.raises(CkptTraceError, match="is the input trace"):
        upgrade_trace(original, original, overwrite=True)
    os.link(original, tmp_path / "same.arrow")
    with pytest.raises(CkptTraceError, match="is the input trace"):
        upgrade_trace(original, tmp_path / "same.arrow", overwrite=True)
    assert original.read_bytes() == data
    proc = cli("upgrade", str(original), "-o", str(tmp_path / "old.arrow"), "--force", check=False)
    assert proc.returncode != 0 and "is the input trace" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert original.read_bytes() == data
    new = tmp_path / "new.arrow"
    doc = json.loads(cli("upgrade", str(original), "-o", str(new), "--json").stdout)
    assert doc["output"] == str(new) and doc["to_version"] == FORMAT_VERSION and doc["rows"] > 0
    refused = cli("upgrade", str(original), "-o", str(new), check=False)
    assert refused.returncode != 0 and "already exists" in refused.stderr
    cli("upgrade", str(original), "-o", str(new), "--force")
    schema = ipc.open_file(str(new)).schema
    assert list(schema.metadata) == [METADATA_KEY]
