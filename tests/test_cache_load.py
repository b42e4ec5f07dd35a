"""A real DCP load (gpt2-tiny, 2 ranks, Adam state), recorded with bcc cold and warm, replays in the page-cache
state it was recorded in; and the closed loop: a posix replay of the load (and of the save), itself recorded,
compares equal to the recording with ``diff``. Read times are measured by ``benchmarks/cache_load.py``
(GPT-2-small figures in docs/verdicts.md), not asserted here."""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pyarrow.compute as pc
import pytest
from conftest import CKPT_TRACE, cli, record
from helpers.replay_io import device_read_bytes

from ckpt_trace.formats import read_trace
from ckpt_trace.iolayer.pagecache import evict

SHAPE = ("--ranks", "2", "--model", "gpt2-tiny", "--with-optimizer")
DRIVER = Path(__file__).parent / "helpers" / "replay_io.py"


def _files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.iterdir() if p.is_file())


def _drop(checkpoint: Path) -> None:
    for path in _files(checkpoint):
        evict(path)


def _record_load(checkpoint: Path, trace: Path) -> list[int | None]:
    """Record the load of ``checkpoint``; its read rows' cold_bytes."""
    record("bcc", trace, f"{checkpoint}/", *CKPT_TRACE, "workload", "dcp", "--load", "--out", str(checkpoint), *SHAPE)
    table = read_trace(trace).table
    return table.filter(pc.equal(table.column("op"), "read")).column("cold_bytes").to_pylist()


def _replay_io(trace: Path, target: Path) -> dict:
    """``tests/helpers/replay_io.py``'s figures of a posix replay of ``trace`` (a child process)."""
    out = target.with_suffix(".json")
    subprocess.run([sys.executable, str(DRIVER), str(trace), str(target), str(out)], check=True, timeout=600)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_a_dcp_load_replays_in_the_page_cache_state_it_was_recorded_in(bcc_backend, torch_installed, tmp_path):
    if device_read_bytes(tmp_path) is None:
        pytest.skip(f"{tmp_path} is on no block device of /proc/diskstats (tmpfs?): its reads cannot be counted")
    checkpoint = tmp_path / "ck"
    cli("workload", "dcp", "--out", str(checkpoint), *SHAPE)
    size = sum(p.stat().st_size for p in _files(checkpoint))
    _drop(checkpoint)
    cold = _record_load(checkpoint, tmp_path / "cold.arrow")
    assert None not in cold and sum(cold) >= size  # pages read more than once count each time
    # Warm: the files' pages held mapped by this process while the load reads them (a page cache dropped by
    # another process of the machine keeps mapped pages)
    with ExitStack() as held:
        for path in _files(checkpoint):
            f = held.enter_context(open(path, "rb"))
            view = held.enter_context(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
            assert sum(view[i] for i in range(0, len(view), mmap.PAGESIZE)) >= 0  # every page faulted in
        warm = _record_load(checkpoint, tmp_path / "warm.arrow")
    assert None not in warm and sum(warm) == 0
    # Replayed cold: the distinct bytes the trace read cold (every byte of the checkpoint, or nearly) come from
    # storage, by the replaying process (/proc/self/io) within 10 %; the device (every process of this shared
    # machine adds to it) read at least 90 % of them.
    figures = _replay_io(tmp_path / "cold.arrow", tmp_path / "c")
    print("cold replay:", figures)
    assert figures["state"] == "recorded" and 0.9 * size <= figures["cold_bytes"] <= size
    assert f"page cache recorded: {figures['cold_bytes']:,} B cold" in figures["note"]
    assert abs(figures["process_read_bytes"] - figures["cold_bytes"]) <= 0.1 * figures["cold_bytes"]
    assert figures["device_read_bytes"] >= 0.9 * figures["cold_bytes"]
    # Replayed warm: nothing from storage
    figures = _replay_io(tmp_path / "warm.arrow", tmp_path / "w")
    print("warm replay:", figures)
    assert figures["state"] == "recorded" and figures["cold_bytes"] == 0
    assert figures["process_read_bytes"] <= 0.05 * size


@pytest.mark.slow
def test_a_recorded_posix_replay_of_a_dcp_load_diffs_the_same(bcc_backend, torch_installed, tmp_path):
    checkpoint = tmp_path / "ck"
    cli("workload", "dcp", "--out", str(checkpoint), *SHAPE)
    size = sum(p.stat().st_size for p in _files(checkpoint))
    _record_load(checkpoint, tmp_path / "load.arrow")
    replayed = tmp_path / "replayed.arrow"
    target = tmp_path / "t"
    replay = ("replay", str(tmp_path / "load.arrow"), "--target", str(target), "--strategy", "posix", "--repeat", "1")
    record("bcc", replayed, f"{target}/", *CKPT_TRACE, *replay)
    data = json.loads(cli("diff", str(tmp_path / "load.arrow"), str(replayed), "--json").stdout)
    read, written = data["data_read"], data["data_written"]
    assert read["match"] and read["files_a"] == 3 and read["bytes_a"] == read["bytes_b"] == size, read
    # the replay wrote the files it read (pre-created before its clock): its inputs, not a difference
    assert written["match"] and sorted(written["precreated_in_b"]) == sorted(p.name for p in _files(checkpoint))
    assert written["files_a"] == written["files_b"] == 0
    lines = cli("diff", str(tmp_path / "load.arrow"), str(replayed)).stdout.strip().splitlines()
    assert any(line.startswith("data read: the same in A and B: 3 files") for line in lines[-4:]), lines[-4:]
