"""The page cache as recorded: ``cold_bytes`` (format version 6), the bytes of each read that came from storage,
from the page-cache insertions the bcc backend records (``tracer.page_cache``)."""

from __future__ import annotations

import json
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import cli
from helpers.replay_io import device_read_bytes, process_read_bytes

from ckpt_trace.formats import read_trace, table_from_columns
from ckpt_trace.iolayer.pagecache import evict
from ckpt_trace.tracer import page_cache

SIZE = 16 << 20
PAGE = page_cache.PAGE_BYTES


def _reads(path, offsets, sizes, ends):
    count = len(offsets)
    return table_from_columns(
        {
            "ts_ns": [0] * count,
            "dur_ns": list(ends),
            "pid": [1] * count,
            "tid": [1] * count,
            "comm": ["t"] * count,
            "rank": [0] * count,
            "syscall": ["pread64"] * count,
            "op": ["read"] * count,
            "fd": [3] * count,
            "path": [str(path)] * count,
            "new_path": [None] * count,
            "offset": list(offsets),
            "offset_source": ["explicit"] * count,
            "size": list(sizes),
            "ret": list(sizes),
            "flags": [None] * count,
            "iov_count": [None] * count,
        }
    )


def test_a_page_is_cold_when_inserted_before_the_read_ended(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * (10 * PAGE))
    st = os.stat(path)
    inserts = page_cache.Inserts()
    # pages 0-3 inserted at 10 ns (one folio, as readahead inserts them), page 5 at 1000 ns
    inserts.add_arrays([10, 1000], [page_cache.kernel_dev(st.st_dev)] * 2, [st.st_ino] * 2, [0, 5], [3, 5])
    table = _reads(path, [100, 2 * PAGE, 0, 6 * PAGE], [PAGE, 4 * PAGE, 10 * PAGE, PAGE], [100, 100, 2000, 100])
    cold = inserts.cold_bytes(table).to_pylist()
    # [100, 100 + PAGE): pages 0 and 1, both cold; pages 2-5 read by 100 ns: page 5 came in later, so was warm;
    # the whole file read by 2000 ns: pages 0-3 and 5; page 6 never inserted: warm
    assert cold == [PAGE, 2 * PAGE, 5 * PAGE, 0]
    assert inserts.pages() == 5


def test_rows_that_are_no_data_read_or_whose_file_is_gone_are_unknown(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * PAGE)
    table = _reads(path, [0], [PAGE], [10])
    gone = _reads(tmp_path / "gone", [0], [PAGE], [10])
    inserts = page_cache.Inserts()
    assert inserts.cold_bytes(table).to_pylist() == [0]  # no insertion: warm
    assert inserts.cold_bytes(gone).to_pylist() == [None]
    write = table.set_column(table.column_names.index("op"), "op", pa.array(["write"]).dictionary_encode())
    assert inserts.cold_bytes(write).to_pylist() == [None]


def _per_page(inserts, reads) -> list[int]:
    """Cold bytes of each read counted page by page (the rule of ``tracer.page_cache``, without intervals):
    ``inserts`` rows (ts_ns, file, first, last page), ``reads`` rows (file, offset, ret, ts_ns, dur_ns)."""
    first: dict[tuple[int, int], int] = {}
    for ts, number, lo, hi in inserts.tolist():
        for page in range(lo, hi + 1):
            first[(number, page)] = min(ts, first.get((number, page), ts))
    out = []
    for number, offset, ret, ts, dur in reads.tolist():
        cold = 0
        for page in range(offset // PAGE, (offset + ret - 1) // PAGE + 1) if ret > 0 else ():
            if first.get((number, page), ts + dur + 1) <= ts + dur:
                cold += min((page + 1) * PAGE, offset + ret) - max(page * PAGE, offset)
        out.append(cold)
    return out


def _intervals(tmp_path, inserts, reads, sizes) -> tuple[page_cache.Inserts, list[int]]:
    """``tracer.page_cache`` on ``inserts`` and ``reads`` (as in ``_per_page``), the files made in ``tmp_path``."""
    paths = [tmp_path / f"f{number}" for number in range(len(sizes))]
    keys = []
    for path, size in zip(paths, sizes):
        path.write_bytes(bytes(size))
        keys.append((page_cache.kernel_dev(os.stat(path).st_dev), os.stat(path).st_ino))
    state = page_cache.Inserts()
    dev = np.array([keys[n][0] for n in inserts[:, 1]], np.int64)
    ino = np.array([keys[n][1] for n in inserts[:, 1]], np.int64)
    state.add_arrays(inserts[:, 0], dev, ino, inserts[:, 2], inserts[:, 3])
    table = _reads(paths[0], reads[:, 1], reads[:, 2], reads[:, 3] + reads[:, 4])
    table = table.set_column(table.column_names.index("path"), "path", pa.array([str(paths[n]) for n in reads[:, 0]]))
    return state, state.cold_bytes(table).to_pylist()


def test_intervals_count_a_real_insert_stream_as_page_by_page(tmp_path):
    # A load recorded with bcc (scripts/save_cache_inserts.py: two files, partly warm at the start, pages
    # dropped mid-way and read again, so some pages were inserted twice, and 11 of its 109 reads hold a page
    # first inserted after the read ended); cold_bytes as the per-page method of that recording wrote it.
    saved = np.load(Path(__file__).parent / "data" / "cache_inserts.npz")
    inserts, reads, recorded = saved["inserts"], saved["reads"], saved["cold_bytes"].tolist()
    sizes = json.loads(str(saved["meta"]))["sizes"]
    if json.loads(str(saved["meta"]))["page_bytes"] != PAGE:
        pytest.skip("the stream was recorded with another page size")
    expected = _per_page(inserts, reads)
    assert expected == recorded
    state, cold = _intervals(tmp_path, inserts, reads, sizes)
    assert cold == expected
    assert sum(cold) > 0 and any(c == 0 for c in cold)  # cold and warm reads both
    assert any(0 < c < ret for c, ret in zip(cold, reads[:, 2].tolist()))  # reads partly cold
    assert state.pages() == len({(n, p) for _, n, lo, hi in inserts.tolist() for p in range(lo, hi + 1)})
    assert state.runs() < len(inserts) < state.pages()  # runs merge folios; a folio holds pages


def test_intervals_fold_in_pieces_as_all_at_once(tmp_path, monkeypatch):
    # Overlapping, out-of-order and repeated insertions, folded every 7 records: the same column
    rng = np.random.default_rng(5)
    count = 400
    first = rng.integers(0, 300, count)
    inserts = np.stack(
        [rng.integers(0, 10_000, count), rng.integers(0, 2, count), first, first + rng.integers(0, 20, count)], 1
    )
    offset = rng.integers(0, 300 * PAGE, 200)
    ts = rng.integers(0, 10_000, 200)
    reads = np.stack(
        [rng.integers(0, 2, 200), offset, rng.integers(0, 20 * PAGE, 200), ts, rng.integers(0, 500, 200)], 1
    )
    expected = _per_page(inserts, reads)
    monkeypatch.setattr(page_cache, "FOLD_EVENTS", 7)
    state = page_cache.Inserts()
    paths = [tmp_path / "a", tmp_path / "b"]
    for path in paths:
        path.write_bytes(bytes(330 * PAGE))
    keys = [(page_cache.kernel_dev(os.stat(p).st_dev), os.stat(p).st_ino) for p in paths]
    for part in np.array_split(inserts, 50):
        dev = [keys[n][0] for n in part[:, 1]]
        state.add_arrays(part[:, 0], dev, [keys[n][1] for n in part[:, 1]], part[:, 2], part[:, 3])
        assert state._pending < 7
    table = _reads(paths[0], reads[:, 1], reads[:, 2], reads[:, 3] + reads[:, 4])
    table = table.set_column(table.column_names.index("path"), "path", pa.array([str(paths[n]) for n in reads[:, 0]]))
    assert state.cold_bytes(table).to_pylist() == expected
    assert state.pages() == len({(n, p) for _, n, lo, hi in inserts.tolist() for p in range(lo, hi + 1)})


def _record_load(tmp_path, data, name):
    trace = tmp_path / f"{name}.arrow"
    reader = f"f = open({str(data)!r}, 'rb', buffering=0)\nwhile f.read(1 << 20): pass"
    cli("record", "--backend", "bcc", "--path-filter", str(data), "-o", str(trace), "--", sys.executable, "-c", reader)
    loaded = read_trace(trace)
    reads = loaded.table.filter(pc.equal(loaded.table.column("op"), "read"))
    return trace, loaded, reads


@pytest.mark.slow
def test_a_load_read_cold_then_warm_records_its_cold_bytes(bcc_backend, tmp_path):
    data = tmp_path / "model.bin"
    data.write_bytes(np.random.default_rng(0).bytes(SIZE))
    evict(data)
    _, cold, reads = _record_load(tmp_path, data, "cold")
    assert cold.metadata["format_version"] == 6
    assert cold.metadata["page_cache"]["insert_events"] > 0
    assert sum(reads.column("size").to_pylist()) >= SIZE
    # every byte of the file came from storage: the file's pages were dropped, each read by one row
    assert sum(reads.column("cold_bytes").to_pylist()) == SIZE
    # Warm: the file's pages held mapped by this process while the command reads it (a page cache dropped
    # by another process of the machine, echo 3 > drop_caches, keeps mapped pages)
    with open(data, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as held:
        assert sum(held[i] for i in range(0, SIZE, PAGE)) >= 0  # every page faulted in
        _, _, warm = _record_load(tmp_path, data, "warm")
    assert warm.column("cold_bytes").null_count == 0 and sum(warm.column("cold_bytes").to_pylist()) == 0


def _replayed_device_reads(trace, target, cache: str = "recorded") -> tuple[int, int, str]:
    """(bytes read from the device while the run's clock ran: by every process of the machine, by this
    one; the state prepared) of a posix replay of ``trace`` prepared as ``cache`` says."""
    from ckpt_trace.replayer import build_plan
    from ckpt_trace.replayer.paths import TargetRoot
    from ckpt_trace.replayer.posix import posix_executor
    from ckpt_trace.replayer.replay import prepare_cache, resolve_cache

    loaded = read_trace(trace)
    plan = build_plan(loaded.table, "posix")
    target.mkdir()
    root = TargetRoot(target)
    executor = posix_executor(root, 1 << 20)
    executor.prepare(plan)
    state, _, recorded = resolve_cache(cache, plan, loaded)
    prepare_cache(root, plan, state, recorded)
    before, mine = device_read_bytes(target), process_read_bytes()
    executor.run(plan)
    after, mine = device_read_bytes(target), process_read_bytes() - mine
    assert before is not None and after is not None
    return after - before, mine, state


@pytest.mark.slow
def test_a_load_replays_in_the_page_cache_state_it_was_recorded_in(bcc_backend, tmp_path):
    if device_read_bytes(tmp_path) is None:
        pytest.skip(f"{tmp_path} is on no block device of /proc/diskstats (tmpfs?): its reads cannot be counted")
    data = tmp_path / "model.bin"
    data.write_bytes(np.random.default_rng(1).bytes(SIZE))
    evict(data)
    cold_trace, _, reads = _record_load(tmp_path, data, "cold")
    recorded_cold = sum(reads.column("cold_bytes").to_pylist())
    assert recorded_cold == SIZE
    with open(data, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as held:
        assert sum(held[i] for i in range(0, SIZE, PAGE)) >= 0
        warm_trace, _, warm = _record_load(tmp_path, data, "warm")
    assert sum(warm.column("cold_bytes").to_pylist()) == 0
    # The device's reads during each replay's run: the bytes the trace read cold, within 10 %. Counted twice:
    # /proc/diskstats for the device (every process of this shared machine adds to it, so only its lower
    # bound is asserted: the run did read that much from the device) and /proc/self/io (this process's
    # reads from storage, its threads' included), both ways.
    device, mine, state = _replayed_device_reads(cold_trace, tmp_path / "c")
    print(f"cold replay: device {device:,} B, this process {mine:,} B, recorded cold {recorded_cold:,} B")
    assert state == "recorded" and device >= 0.9 * recorded_cold, device
    assert abs(mine - recorded_cold) <= 0.1 * recorded_cold, mine
    device, mine, state = _replayed_device_reads(warm_trace, tmp_path / "w")
    print(f"warm replay: device {device:,} B, this process {mine:,} B, recorded cold 0 B")
    assert state == "recorded" and mine <= 0.1 * SIZE, mine
    # and what the results say; a trace that does not say (no cold_bytes) replays cold
    from ckpt_trace.replayer import replay

    report = replay(cold_trace, target=tmp_path / "r", repeat=1)
    assert report.options["cache_state"] == "recorded"
    assert f"page cache recorded: {SIZE:,} B cold" in " ".join(report.results[0].notes)
    report = replay(warm_trace, target=tmp_path / "r2", repeat=1)
    assert f"0 B cold (dropped before the clock), {SIZE:,} B warm" in " ".join(report.results[0].notes)
