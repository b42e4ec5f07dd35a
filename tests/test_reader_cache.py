"""The emitted reader's read paths on real files: what the page cache holds is read through it and the rest
with O_DIRECT (per file, and per stretch of a partly cached file), as the load policy says; many small tensors
are read with a few large reads. Every load is compared byte for byte; the read calls are counted by the
reader's stats and, independently, by strace."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ckpt_trace import config
from ckpt_trace.iolayer.ring import fused_crc_copy

try:
    import torch
    import torch.distributed.checkpoint as dcp
    from writer_state import many_small_state, objects_equal_bitwise, zeros_like_state
except ImportError:  # tests needing torch skip (or fail under CI) through the torch_installed fixture
    torch = dcp = None

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
TESTS = Path(__file__).resolve().parent
SMALL = 600


def _options(policy: str = "auto", **more):
    from ckpt_trace.writer import WriterOptions

    return WriterOptions(**WriterOptions.load_flags(policy), **more)


def _save(path: Path, state: dict) -> Path:
    from ckpt_trace.writer import CheckpointWriter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=CheckpointWriter(path, _options()))  # O_DIRECT: nothing left cached
    (data,) = path.glob("*.data")
    return data


def _load(path: Path, state: dict, policy: str = "auto"):
    from ckpt_trace.writer import CheckpointReader

    target = zeros_like_state(state)
    reader = CheckpointReader(path, _options(policy))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, storage_reader=reader)
    assert objects_equal_bitwise(state, target)
    return reader.last_load_stats


def _cache(data: Path, warm_ranges: list[tuple[int, int]]) -> None:
    """Drop the file's pages from the page cache (fsync, POSIX_FADV_DONTNEED), then read these byte
    ranges back into it."""
    fd = os.open(data, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        for offset, size in warm_ranges:
            os.pread(fd, size, offset)
    finally:
        os.close(fd)


def _load_cached(path: Path, state: dict, data: Path, warm_ranges: list[tuple[int, int]], policy: str = "auto"):
    """``_cache`` then ``_load``; again (5 tries) where the reader found less of the file cached than was
    read in: on a shared machine another process may drop the caches (drop_caches) in between."""
    wanted = sum(size for _, size in warm_ranges)
    for _ in range(5):
        _cache(data, warm_ranges)
        stats = _load(path, state, policy)
        if policy != "auto" or stats["resident_bytes"] >= 0.99 * wanted:
            return stats
    raise AssertionError(f"the page cache did not keep {wanted:,} bytes of {data} until the load: {stats}")


def _resident(data: Path) -> float:
    from ckpt_trace.iolayer.pagecache import resident_share

    fd = os.open(data, os.O_RDONLY)
    try:
        return resident_share(fd, data.stat().st_size)[0]
    finally:
        os.close(fd)


def _places(path: Path) -> dict[str, tuple[int, int]]:
    """fqn -> (offset, size_bytes) in the data file, from the checkpoint's metadata."""
    from ckpt_trace.writer.format import read_metadata

    storage = read_metadata(path).storage_data
    return {index.fqn: (s.offset, s.size_bytes) for index, s in storage.items()}


@pytest.mark.torch
@pytest.mark.io_uring
def test_the_policy_and_the_page_cache_choose_each_files_way(tmp_path, torch_installed, io_uring):
    """auto: a cold file (after fsync + POSIX_FADV_DONTNEED) goes O_DIRECT, the same file warm goes through
    the page cache; direct and buffered keep their way whatever the cache holds. The stats name the probe and
    its time, and the bytes and read calls of each way."""
    state = many_small_state(small=40, large=2, large_elements=1 << 18)
    path = tmp_path / "ckpt"
    data = _save(path, state)
    size = data.stat().st_size
    wanted = sum(n for _, n in _places(path).values())
    seen = {}
    for warm in (False, True):
        _cache(data, [(0, size)] if warm else [])
        assert (_resident(data) >= 0.99) if warm else (_resident(data) <= 0.05)
        for policy in ("auto", "direct", "buffered"):
            seen[warm, policy] = _load_cached(path, state, data, [(0, size)] if warm else [], policy)
    cold, hot = seen[False, "auto"], seen[True, "auto"]
    assert (cold["direct_files"], cold["buffered_files"], cold["direct_bytes"]) == (1, 0, wanted)
    assert (hot["direct_files"], hot["buffered_files"], hot["buffered_bytes"]) == (0, 1, wanted)
    assert cold["direct_reads"] >= 1 and hot["direct_reads"] == 0
    # warm: copied out of a mapping of the file, no read call (writer.load._read_mapped)
    assert hot["mapped_bytes"] == wanted and hot["mapped_calls"] >= 1 and hot["buffered_reads"] == 0
    assert cold["mapped_bytes"] == cold["mapped_calls"] == 0 and cold["mapped_checks"] is None
    # the checksums: with the copy in one pass where this CPU allows (iolayer.ring.fused_crc_copy)
    assert hot["mapped_checks"] == ("one pass" if fused_crc_copy() else "before each copy")
    for stats in (cold, hot):
        assert stats["policy"] == "auto" and stats["cache_probe"] in ("cachestat", "nowait")
        assert stats["probes"] >= 1 and stats["probe_ns"] > 0
    assert hot["resident_bytes"] >= 0.99 * size and cold["resident_bytes"] <= 0.05 * size
    for warm in (False, True):
        direct, buffered = seen[warm, "direct"], seen[warm, "buffered"]
        assert (direct["direct_files"], direct["probes"]) == (1, 0)
        assert (buffered["buffered_files"], buffered["probes"]) == (1, 0)


@pytest.mark.torch
@pytest.mark.io_uring
def test_a_partly_cached_file_is_read_both_ways_by_stretch(tmp_path, torch_installed, io_uring, monkeypatch):
    """Two of six 2 MiB tensors in the page cache, the rest not (stretches of 1 MiB asked one at a time):
    the two are read buffered, the other four with O_DIRECT, in one load, every byte right."""
    from ckpt_trace.writer import load

    monkeypatch.setattr(load, "_SEGMENT_BYTES", 1 << 20)
    state = many_small_state(small=0, large=6, large_elements=1 << 19)
    path = tmp_path / "ckpt"
    data = _save(path, state)
    places = _places(path)
    warm = [places["large.1"], places["large.4"]]
    stats = _load_cached(path, state, data, warm)
    assert stats["mixed_files"] == 1 and stats["probes"] == 1 + 6
    assert stats["buffered_bytes"] == sum(n for _, n in warm)
    assert stats["direct_bytes"] == sum(n for _, n in places.values()) - stats["buffered_bytes"]


@pytest.mark.torch
@pytest.mark.io_uring
@pytest.mark.parametrize("mapped", [True, False], ids=["mapped-copy", "preadv"])
def test_many_small_tensors_are_read_with_a_few_large_reads(tmp_path, torch_installed, io_uring, monkeypatch, mapped):
    """600 tensors under 64 KiB beside 4 of 4 MiB: warm (copied out of a mapping of the file, a window of
    64 MiB per mmap(2); or, ``READER_MAPPED_COPY`` off, scattering preadv straight into the destinations, in
    pieces of ``_HOT_BYTES``) and cold (O_DIRECT stream: the cold way left unmeasured), far fewer calls than
    tensors; a partial load (every other small tensor: gaps between the wanted items) is batched too and
    leaves the others untouched."""
    from ckpt_trace.writer import load

    monkeypatch.setattr(load, "_PROBE_BYTES", 1 << 40)
    monkeypatch.setattr(config, "READER_MAPPED_COPY", int(mapped))
    state = many_small_state()
    path = tmp_path / "ckpt"
    data = _save(path, state)
    size = data.stat().st_size
    tensors = len(state)
    cold = _load_cached(path, state, data, [])
    warm = _load_cached(path, state, data, [(0, size)])
    assert cold["direct_files"] == 1 and cold["direct_reads"] <= -(-size // (4 << 20))
    assert warm["buffered_files"] == 1
    part = {k: v for i, (k, v) in enumerate(state.items()) if i % 2 or k.startswith("large")}
    partial = _load_cached(path, part, data, [(0, size)])
    if mapped:  # one window per 64 MiB of each reading thread's stretch (2), no read call
        assert warm["buffered_reads"] == partial["buffered_reads"] == 0
        assert 1 <= warm["mapped_calls"] <= -(-size // (64 << 20)) + 2 < tensors // 8
        assert warm["mapped_bytes"] == warm["buffered_bytes"] and partial["mapped_bytes"] == partial["buffered_bytes"]
        return
    # warm: batches of up to _BATCH_BYTES, each read in pieces of _HOT_BYTES (checked as they land), a short
    # piece at most at each batch's end and each stream's (2)
    calls = -(-size // load._HOT_BYTES) + -(-size // load._BATCH_BYTES) + 2
    assert warm["mapped_calls"] == 0 and 1 <= warm["buffered_reads"] <= calls < tensors // 8
    assert partial["buffered_reads"] <= calls


@pytest.mark.torch
@pytest.mark.io_uring
def test_the_cold_way_is_measured_on_the_loads_own_bytes(tmp_path, torch_installed, io_uring, monkeypatch):
    """auto, cold file: the first cold items are read with O_DIRECT and the next buffered, each timed; the
    rest goes buffered unless O_DIRECT won by a margin, and the next cold load in the process reuses the
    device's measurement. Forced each way (by the margin O_DIRECT must win by), every byte lands right and the stats add up: the probe runs
    are read one way each, the rest the chosen way."""
    from ckpt_trace.writer import load

    monkeypatch.setattr(load, "_PROBE_BYTES", 1 << 20)
    state = many_small_state(small=20, large=6, large_elements=1 << 18)  # 6 x 1 MiB after 20 small tensors
    path = tmp_path / "ckpt"
    data = _save(path, state)
    wanted = sum(n for _, n in _places(path).values())
    for margin, chosen in ((float("inf"), "buffered"), (0.0, "direct")):
        monkeypatch.setattr(load, "_DIRECT_MARGIN", margin)
        load._COLD_WAYS.clear()
        measured = _load_cached(path, state, data, [])
        assert (measured["cold_way"], measured["cold_way_source"]) == (chosen, "measured")
        assert measured["cold_direct_bytes_per_s"] > 0 and measured["cold_buffered_bytes_per_s"] > 0
        assert measured["direct_bytes"] + measured["buffered_bytes"] == wanted
        assert measured["direct_reads"] >= 1 and measured["buffered_reads"] >= 1  # each way ran
        probe_bytes = 1 << 20
        if chosen == "buffered":  # only the first probe run went O_DIRECT
            assert probe_bytes <= measured["direct_bytes"] < 2 * probe_bytes + (64 << 10)
        else:  # only the second probe run went buffered
            assert probe_bytes <= measured["buffered_bytes"] < 2 * probe_bytes + (64 << 10)
        again = _load_cached(path, state, data, [])
        assert (again["cold_way"], again["cold_way_source"]) == (chosen, "earlier load")
        assert again[f"{'buffered' if chosen == 'buffered' else 'direct'}_bytes"] == wanted
        # A later process of this boot (the in-process memory cleared) finds it stored and does not measure
        stored = json.loads(Path(config.READER_COLD_WAYS).read_text())
        assert [entry["way"] for entry in stored.values()] == [chosen]
        load._COLD_WAYS.clear()
        later = _load_cached(path, state, data, [])
        assert (later["cold_way"], later["cold_way_source"]) == (chosen, "earlier process")
        assert later[f"{'buffered' if chosen == 'buffered' else 'direct'}_bytes"] == wanted
        assert later["cold_direct_bytes_per_s"] is None
        Path(config.READER_COLD_WAYS).unlink()
    monkeypatch.setattr(load, "_PROBE_BYTES", 64 << 20)  # too few cold bytes to measure: O_DIRECT, said so
    load._COLD_WAYS.clear()
    small = _load_cached(path, state, data, [])
    assert (small["cold_way"], small["cold_way_source"], small["direct_bytes"]) == ("direct", "default", wanted)
    assert not Path(config.READER_COLD_WAYS).exists()  # nothing measured: nothing stored
    # Kept in the process only where the setting is empty
    monkeypatch.setattr(load, "_PROBE_BYTES", 1 << 20)
    monkeypatch.setattr(config, "READER_COLD_WAYS", "")
    load._COLD_WAYS.clear()
    assert _load_cached(path, state, data, [])["cold_way_source"] == "measured"
    load._COLD_WAYS.clear()
    assert _load_cached(path, state, data, [])["cold_way_source"] == "measured"


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.io_uring
@pytest.mark.parametrize("mapped", [True, False], ids=["mapped-copy", "preadv"])
def test_strace_counts_the_reads_the_stats_count(tmp_path, torch_installed, io_uring, strace_backend, mapped):
    """The warm load of 600 small tensors in a child process under ``strace -f -c``, restricted to the data
    file (``-P``): its mmap(2) calls are the reader's ``mapped_calls`` and it makes no read call (the mapped
    copy); with ``CKPT_TRACE_READER_MAPPED_COPY=0``, its preadv calls are the reader's ``buffered_reads``, far
    fewer than the tensors (one per ``_HOT_BYTES`` piece). The checkpoint lives on a tmpfs of its own, whose
    pages are always in the page cache (no other process dropping caches can turn the load cold)."""
    from conftest import mounted_tmpfs

    with mounted_tmpfs(tmp_path / "memory", "size=128m") as memory:
        path = memory / "ckpt"
        data = _save(path, many_small_state())
        summary = tmp_path / "strace.txt"
        code = (
            f"import sys; sys.path.insert(0, {str(TESTS)!r}); import writer_state as w; "
            "w.load_many_small(sys.argv[1], 'auto')"
        )
        command = [shutil.which("strace") or "strace", "-f", "-c", "-o", str(summary), "-P", str(data)]
        command += ["-e", "trace=read,pread64,readv,preadv,preadv2,mmap", sys.executable, "-c", code, str(path)]
        env = dict(os.environ, CKPT_TRACE_READER_MAPPED_COPY=str(int(mapped)))
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True, env=env)
        size = data.stat().st_size
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["equal"] and result["stats"]["buffered_files"] == 1, result
    assert result["stats"]["resident_bytes"] >= 0.99 * size
    table = summary.read_text()
    calls = {m[1]: int(m[0]) for m in re.findall(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", table, re.M)}
    calls.pop("total", None)
    if mapped:
        assert set(calls) == {"mmap"} and calls["mmap"] == result["stats"]["mapped_calls"] >= 1, table
        assert result["stats"]["buffered_reads"] == 0 and result["stats"]["mapped_bytes"] > 0
        return
    assert set(calls) <= {"preadv", "preadv2"}, table  # CPython's os.preadv may call preadv2
    from ckpt_trace.writer import load  # pieces of _HOT_BYTES (checked as they land), as the test above counts

    most = -(-size // load._HOT_BYTES) + -(-size // load._BATCH_BYTES) + 2
    assert sum(calls.values()) == result["stats"]["buffered_reads"] <= most < (SMALL + 4) // 8, table


@pytest.mark.torch
@pytest.mark.io_uring
def test_the_cold_way_can_be_pinned_to_o_direct(tmp_path, torch_installed, io_uring, monkeypatch):
    """``load_measure_cold_way=False`` (what emit pins from a clear O_DIRECT verdict): a cold file large
    enough to measure is read wholly with O_DIRECT, nothing measured, every byte right."""
    from ckpt_trace.writer import CheckpointReader, load

    monkeypatch.setattr(load, "_PROBE_BYTES", 1 << 20)
    state = many_small_state(small=20, large=6, large_elements=1 << 18)
    path = tmp_path / "ckpt"
    data = _save(path, state)
    _cache(data, [])
    target = zeros_like_state(state)
    reader = CheckpointReader(path, _options(load_measure_cold_way=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, storage_reader=reader)
    assert objects_equal_bitwise(state, target)
    stats = reader.last_load_stats
    assert (stats["cold_way"], stats["cold_way_source"], stats["buffered_bytes"]) == ("direct", "options", 0)
    assert stats["cold_direct_bytes_per_s"] is None and not load._COLD_WAYS
