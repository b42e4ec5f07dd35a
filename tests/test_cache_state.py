"""The page cache as recorded: the files a trace reads are cold when the clock starts (unless --cache warm),
and setup (pre-creation, its sync) stays outside the clock."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from conftest import cli

from ckpt_trace.replayer import build_plan, replay
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.posix import posix_executor
from ckpt_trace.replayer.replay import prepare_cache

SIZE = 8 << 20


def resident_bytes(path) -> int:
    """Bytes of ``path`` in the page cache, by util-linux fincore(1) (mincore(2))."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], check=True, capture_output=True, text=True
    ).stdout
    return int(out.split()[0])


@pytest.fixture
def load_trace(tmp_path):
    from helpers.traces import make_trace

    if shutil.which("fincore") is None:
        pytest.skip("fincore (util-linux) not installed")
    ops = [
        {"op": "open", "path": "/ck/model.bin", "fd": 3, "flags": 0, "ret": 3},
        *(
            {"op": "read", "path": "/ck/model.bin", "fd": 3, "offset": i << 20, "size": 1 << 20, "ret": 1 << 20}
            for i in range(SIZE >> 20)
        ),
        {"op": "close", "path": "/ck/model.bin", "fd": 3},
    ]
    return make_trace(tmp_path / "load.arrow", ops)


@pytest.mark.parametrize("state", ["cold", "warm"])
def test_the_read_files_are_cold_or_warm_when_the_clock_starts(load_trace, tmp_path, state):
    from ckpt_trace.formats import read_trace

    plan = build_plan(read_trace(load_trace).table, "posix")
    (tmp_path / "t").mkdir()
    root = TargetRoot(tmp_path / "t")
    posix_executor(root, 1 << 20).prepare(plan)
    path = tmp_path / "t" / "ck" / "model.bin"
    assert path.stat().st_size == SIZE and resident_bytes(path) == SIZE  # just written: all in memory
    prepare_cache(root, plan, state)
    assert resident_bytes(path) == (0 if state == "cold" else SIZE)


@pytest.mark.slow
def test_a_load_replays_cold_by_default_and_says_why(load_trace, tmp_path):
    report = replay(load_trace, target=tmp_path / "t", durable=True)
    result = report.results[0]
    assert report.options["cache_state"] == "cold" and result.bytes_read == SIZE
    assert any("does not say which reads hit the page cache" in note for note in result.notes)
    warm = replay(load_trace, target=tmp_path / "w", cache="warm").results[0]
    assert not any("page cache" in note for note in warm.notes)
    proc = cli("replay", str(load_trace), "--target", str(tmp_path / "c"), "--cache", "bogus", check=False)
    assert proc.returncode == 2 and "--cache" in proc.stderr


def test_durable_does_not_sync_files_the_load_never_wrote(load_trace, tmp_path, monkeypatch):
    import os

    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    from ckpt_trace.formats import read_trace

    plan = build_plan(read_trace(load_trace).table, "posix")
    (tmp_path / "t").mkdir()
    executor = posix_executor(TargetRoot(tmp_path / "t"), 1 << 20)
    executor.prepare(plan)
    monkeypatch.setattr(os, "fsync", spy)
    executor.run(plan, durable=True)
    assert synced == []  # the load's file was pre-created: its sync is setup


def test_the_recorded_state_counts_each_byte_once(tmp_path):
    from helpers.traces import make_trace

    from ckpt_trace.formats import read_trace
    from ckpt_trace.replayer.cache_state import recorded_cache

    read = {"op": "read", "path": "/ck/m.bin", "fd": 3}
    trace = make_trace(
        tmp_path / "load.arrow",
        [
            {"op": "open", "path": "/ck/m.bin", "fd": 3, "flags": 0, "ret": 3},
            {**read, "offset": 0, "size": 8192, "ret": 8192, "cold_bytes": 8192},
            {**read, "offset": 0, "size": 8192, "ret": 8192, "cold_bytes": 8192},  # read again: still cold
            {**read, "offset": 8192, "size": 8192, "ret": 8192, "cold_bytes": 0},
            {**read, "offset": 12288, "size": 4096, "ret": 4096, "cold_bytes": 4096},  # inserted after the warm read
        ],
    )
    loaded = read_trace(trace)
    assert loaded.table.column("cold_bytes").to_pylist()[1:] == [8192, 8192, 0, 4096]
    state = recorded_cache(loaded, None, ["ck/m.bin"])
    # cold: [0, 8192) and [12288, 16384); warm and never cold: [8192, 12288)
    assert (state.cold_bytes, state.warm_bytes) == (12288, 4096)
    assert "page cache recorded: 12,288 B cold (dropped before the clock), 4,096 B warm" in state.note()


def _pre_created(loaded, target):
    """(root, posix plan, recorded page-cache state) of ``loaded`` (a ``formats.Trace``), its files pre-created
    under ``target`` as a replay makes them."""
    from ckpt_trace.replayer.replay import resolve_cache

    plan = build_plan(loaded.table, "posix")
    target.mkdir()
    root = TargetRoot(target)
    posix_executor(root, 1 << 20).prepare(plan)
    state, _, recorded = resolve_cache("recorded", plan, loaded)
    assert state == "recorded" and recorded is not None
    return root, plan, recorded


def test_cold_ranges_amid_warm_ones_are_out_of_the_page_cache_when_the_clock_starts(tmp_path):
    """A warm file with cold ranges inside (as pages evicted between warming and recording leave): the warm pages
    are in (read with readahead, so in large folios where the kernel makes them, as a warm file's are), and
    none of the cold ranges' pages, although large folios straddle their edges (a DONTNEED of the range alone
    drops no folio it only partly covers: on this ext4 every cold page stayed resident that way). Checked by
    cachestat(2) per range."""
    from helpers.traces import make_trace

    from ckpt_trace.formats import read_trace
    from ckpt_trace.iolayer.pagecache import resident_pages

    mib, page, size = 1 << 20, 4096, 24 << 20
    cold_of = {5: mib, 12: 300_000, 13: mib, 20: page, 21: 70_000}  # read index: its first cold bytes
    read = {"op": "read", "path": "/ck/m.bin", "fd": 3, "size": mib, "ret": mib}
    trace = make_trace(
        tmp_path / "load.arrow",
        [
            {"op": "open", "path": "/ck/m.bin", "fd": 3, "flags": 0, "ret": 3},
            *({**read, "offset": i * mib + 4000, "cold_bytes": cold_of.get(i, 0)} for i in range(size // mib - 1)),
            {"op": "close", "path": "/ck/m.bin", "fd": 3},
        ],
    )
    loaded = read_trace(trace)
    root, plan, recorded = _pre_created(loaded, tmp_path / "t")
    state = "recorded"
    prepare_cache(root, plan, state, recorded)
    cold = [(i * mib + 4000, n) for i, n in cold_of.items()]
    cold_pages = {p for offset, n in cold for p in range(offset // page, -(-(offset + n) // page))}
    read_pages = {
        p for i in range(size // mib - 1) for p in range((i * mib + 4000) // page, -(-((i + 1) * mib + 4000) // page))
    }
    fd = os.open(tmp_path / "t" / "ck" / "m.bin", os.O_RDONLY)
    try:
        if resident_pages(fd, 0, size) is None:
            pytest.skip("cachestat(2) is missing (Linux before 6.5)")
        stayed = [p for p in sorted(cold_pages) if resident_pages(fd, p * page, page)]
        missing = [p for p in sorted(read_pages - cold_pages) if not resident_pages(fd, p * page, page)]
    finally:
        os.close(fd)
    assert not stayed, f"{len(stayed)} of {len(cold_pages)} cold pages stayed in the page cache"
    assert not missing, f"{len(missing)} warm pages are not in the page cache"
    assert recorded.resident_cold_bytes == 0 and "stayed" not in recorded.note()


def test_warm_pages_evicted_while_other_files_are_prepared_are_read_again_before_the_clock(tmp_path, monkeypatch):
    """The kernel may evict a prepared file's pages while the next file is prepared (on the development VM a
    DAMON pageout scheme does, at random): here the first file loses 1 MiB of its warm pages when the second
    file's warm ranges have been read. When the preparation returns, every warm page of both is in the page
    cache again (cachestat(2)) and nothing is said missing."""
    from helpers.traces import make_trace

    from ckpt_trace.formats import read_trace
    from ckpt_trace.iolayer.pagecache import resident_pages
    from ckpt_trace.replayer import cache_state

    mib, size = 1 << 20, 8 << 20
    rows = []
    for name, fd in (("a", 3), ("b", 4)):
        rows.append({"op": "open", "path": f"/ck/{name}.bin", "fd": fd, "flags": 0, "ret": fd})
        read = {"op": "read", "path": f"/ck/{name}.bin", "fd": fd, "size": mib, "ret": mib, "cold_bytes": 0}
        rows += [{**read, "offset": i * mib} for i in range(size // mib)]
    loaded = read_trace(make_trace(tmp_path / "load.arrow", rows))
    root, plan, recorded = _pre_created(loaded, tmp_path / "t")
    state = "recorded"
    first = tmp_path / "t" / "ck" / "a.bin"
    read_ranges, evicted = cache_state._read_ranges, []

    def read_then_evict(fd, ranges, chunk):
        read_ranges(fd, ranges, chunk)
        if os.readlink(f"/proc/self/fd/{fd}").endswith("b.bin") and not evicted:
            victim = os.open(first, os.O_RDONLY)
            try:
                os.posix_fadvise(victim, 3 * mib, mib, os.POSIX_FADV_DONTNEED)
                evicted.append(resident_pages(victim, 3 * mib, mib))
            finally:
                os.close(victim)

    monkeypatch.setattr(cache_state, "_read_ranges", read_then_evict)
    prepare_cache(root, plan, state, recorded)
    if evicted == [None]:
        pytest.skip("cachestat(2) is missing (Linux before 6.5)")
    assert evicted == [0]  # the eviction happened, after the first file was prepared
    assert resident_bytes(first) == size and resident_bytes(tmp_path / "t" / "ck" / "b.bin") == size
    assert recorded.missing_warm_bytes == 0 and "were not in it" not in recorded.note()


def test_the_note_says_what_the_preparation_could_not_do():
    from ckpt_trace.replayer.cache_state import RecordedCache

    note = RecordedCache(cold_bytes=8192, warm_bytes=4096, resident_cold_bytes=4096, missing_warm_bytes=12288).note()
    assert note.endswith(
        "8,192 B cold (dropped before the clock), 4,096 B warm (read before the clock); 4,096 B of the cold pages "
        "stayed in the page cache; 12,288 B of the warm pages were not in it when the clock started"
    )
