"""The emitted writer's implementation: DCP save/load round trips on real files, several ranks, failures."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_trace.writer.layout import align_up, plan_files, plan_stream

try:
    import torch
    import torch.distributed.checkpoint as dcp
    from writer_state import objects_equal_bitwise, plain_state, zeros_like_state
except ImportError:  # tests needing torch skip (or fail under CI) through the torch_installed fixture
    torch = dcp = None

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
TESTS = Path(__file__).resolve().parent


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 50_000), max_size=40), files=st.integers(1, 4))
def test_file_layout_places_every_item_aligned_without_overlap(sizes, files):
    layouts = plan_files(list(enumerate(sizes)), files, align_bytes=4096, item_align_bytes=64)
    placed = sorted(p.key for layout in layouts for p in layout.placements)
    assert placed == list(range(len(sizes)))
    for layout in layouts:
        end = 0
        for p in layout.placements:
            assert p.offset % 64 == 0 and p.offset >= end and p.size_bytes == sizes[p.key]
            end = p.offset + p.size_bytes
        assert layout.size_bytes == align_up(end, 4096)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30_000), min_size=1, max_size=40),
    piece=st.sampled_from([4096, 8192, 65536]),
    skip=st.sets(st.integers(0, 39)),
)
def test_stream_reads_are_aligned_and_cover_every_wanted_byte_once(sizes, piece, skip):
    layout = plan_files(list(enumerate(sizes)), 1, align_bytes=4096, item_align_bytes=64)[0]
    wanted = [(p.offset, p.size_bytes) for p in layout.placements if p.key not in skip]
    reads = plan_stream(wanted, piece_bytes=piece, align_bytes=4096, file_size_bytes=layout.size_bytes)
    assert all(
        offset % 4096 == 0 and 0 < size <= piece and size % 4096 == 0 and offset + size <= layout.size_bytes
        for offset, size in reads
    )
    assert all(a + n <= b for (a, n), (b, _) in zip(reads, reads[1:]))  # in file order, no byte read twice
    covered = [(a, a + n) for a, n in reads]
    for offset, size in wanted:
        position = offset
        for a, b in covered:
            if a <= position < b:
                position = min(b, offset + size)
        assert position == offset + size, (offset, size)


def _writer(path, **options):
    from ckpt_trace.writer import CheckpointWriter, WriterOptions

    return CheckpointWriter(path, WriterOptions(**options))


def _reader(path, **options):
    from ckpt_trace.writer import CheckpointReader, WriterOptions

    return CheckpointReader(path, WriterOptions(**options))


def _round_trip(path: Path, direct_load: bool | None = None, **options):
    """Save and load ``plain_state()`` with these options; the load went through O_DIRECT when
    ``direct_load`` (default: as the options ask)."""
    state = plain_state()
    writer = _writer(path, **options)
    dcp.save(state, storage_writer=writer)
    target = zeros_like_state(state)
    reader = _reader(path, **options)
    dcp.load(target, storage_reader=reader)
    if direct_load is None:  # a buffered save leaves its pages in the page cache: the cache-aware reader uses them
        direct_load = options.get("load_direct_io", True) and (
            options.get("direct_io", True) or not options.get("load_cache_aware", True)
        )
    assert reader.last_load_direct_io == direct_load
    return state, target, writer


@pytest.mark.torch
@pytest.mark.io_uring
def test_buffered_loads_fill_the_destination_tensors_in_place(tmp_path, torch_installed, io_uring):
    """Whole contiguous destinations are read into where they are; a transposed (non-contiguous) one and a
    narrower dtype are filled through a scratch copy; either way bit-identical to the saved state."""
    import torch

    path = tmp_path / "ckpt"
    state = {"w": torch.randn(300, 70), "t": torch.randn(64, 48), "b": torch.arange(1000, dtype=torch.int64), "step": 7}
    dcp.save(state, storage_writer=_writer(path))
    target = {
        "w": torch.zeros(300, 70),
        "t": torch.zeros(48, 64).t(),
        "b": torch.zeros(1000, dtype=torch.int64),
        "step": 0,
    }
    pointers = {name: target[name].data_ptr() for name in ("w", "t", "b")}
    reader = _reader(path, load_direct_io=False)
    dcp.load(target, storage_reader=reader)
    assert reader.last_load_direct_io is False
    assert {name: target[name].data_ptr() for name in pointers} == pointers
    assert not target["t"].is_contiguous()
    for name in ("w", "t", "b"):
        assert torch.equal(target[name], state[name])
    assert target["step"] == 7


@pytest.mark.torch
@pytest.mark.io_uring
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"buffer_bytes": 8192, "queue_depth": 2},
        {"buffer_bytes": 16384, "queue_depth": 3, "writer_threads": 3},
        {"direct_io": False, "preallocate": False},
        {"load_direct_io": False, "buffer_bytes": 8192, "queue_depth": 2},
        {"load_direct_io": False, "load_streams": 1},
        {"load_direct_io": False, "load_streams": 5, "writer_threads": 2},
    ],
    ids=[
        "defaults",
        "tiny-buffers",
        "three-threads",
        "buffered",
        "buffered-loads",
        "one-load-stream",
        "five-load-streams",
    ],
)
def test_save_then_load_is_bit_identical(tmp_path, torch_installed, io_uring, options):
    state, target, writer = _round_trip(tmp_path / "ckpt", **options)
    assert objects_equal_bitwise(state, target)
    assert target["nested"]["layer"]["name"] == "block.0" and target["nested"]["betas"] == (0.9, 0.95)
    data_files = sorted(p for p in (tmp_path / "ckpt").iterdir() if p.suffix == ".data")
    assert len(data_files) == options.get("writer_threads", 1) == writer.last_save.files
    assert writer.last_save.direct_io == options.get("direct_io", True)
    for data in data_files:
        assert data.stat().st_size % 4096 == 0
    raw = b"".join(p.read_bytes() for p in data_files)
    assert state["f32"].numpy().tobytes() in raw  # tensors are stored raw, not as per-tensor torch.save zips


@pytest.mark.torch
@pytest.mark.io_uring
def test_an_o_direct_load_of_three_files_faults_in_one_arena(tmp_path, torch_installed, io_uring, monkeypatch):
    from ckpt_trace.writer import staging

    path = tmp_path / "ckpt"
    state = plain_state()
    dcp.save(state, storage_writer=_writer(path, writer_threads=3, buffer_bytes=16384, queue_depth=3))
    assert len(list(path.glob("*.data"))) == 3
    arenas = []

    class Counted(staging.AlignedBuffer):
        def __init__(self, size_bytes: int) -> None:
            super().__init__(size_bytes)
            arenas.append(size_bytes)

    monkeypatch.setattr(staging, "AlignedBuffer", Counted)
    target = zeros_like_state(state)
    reader = _reader(path, buffer_bytes=16384, queue_depth=3)
    dcp.load(target, storage_reader=reader)
    assert reader.last_load_direct_io is True and objects_equal_bitwise(state, target)
    assert arenas == [3 * 16384]  # allocated once, reused by the three files


@pytest.mark.torch
@pytest.mark.io_uring
def test_four_ranks_save_and_load_their_shards(tmp_path, torch_installed, io_uring):
    from writer_state import save_and_load_rank

    from ckpt_trace.workloads.engines import spawn_ranks

    path = tmp_path / "ckpt"
    sys.path.insert(0, str(TESTS))
    spawn_ranks(save_and_load_rank, 4, (str(path), 16384, 4))
    assert sorted(p.name for p in path.glob("ok-*")) == [f"ok-{r}" for r in range(4)]
    ranks_with_files = {p.name.split("_")[2] for p in path.glob("__*.data")}
    assert len(ranks_with_files) > 1  # each rank wrote its own data files


@pytest.mark.torch
@pytest.mark.io_uring
def test_killed_save_leaves_previous_checkpoint_loadable_then_next_save_cleans_up(tmp_path, torch_installed, io_uring):
    path = tmp_path / "ckpt"
    state = plain_state(seed=0)
    dcp.save(state, storage_writer=_writer(path))
    committed = sorted(p.name for p in path.iterdir())
    env = {**os.environ, "PYTHONPATH": f"{TESTS}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, str(TESTS / "writer_state.py"), str(path), "9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    orphans = sorted(set(p.name for p in path.iterdir()) - set(committed))
    assert orphans and all(name.endswith(".data") for name in orphans)  # the killed save got as far as its data

    target = zeros_like_state(state)
    dcp.load(target, storage_reader=_reader(path))
    assert objects_equal_bitwise(state, target)  # the previous checkpoint, not a mix

    newer = plain_state(seed=2)
    dcp.save(newer, storage_writer=_writer(path))
    names = sorted(p.name for p in path.iterdir())
    assert not set(orphans) & set(names) and not set(committed[:-1]) & set(names)
    target = zeros_like_state(newer)
    dcp.load(target, storage_reader=_reader(path))
    assert objects_equal_bitwise(newer, target)


def _load_error(path: Path) -> str:
    with pytest.raises(dcp.api.CheckpointException) as caught:
        dcp.load(zeros_like_state(plain_state()), storage_reader=_reader(path))
    return str(caught.value)


@pytest.mark.torch
@pytest.mark.io_uring
def test_missing_or_truncated_data_file_is_named(tmp_path, torch_installed, io_uring):
    path = tmp_path / "ckpt"
    dcp.save(plain_state(), storage_writer=_writer(path))
    data = next(path.glob("*.data"))
    original = data.read_bytes()
    os.truncate(data, len(original) - 4096)
    message = _load_error(path)
    assert "checkpoint data file truncated" in message and str(data) in message
    data.unlink()
    message = _load_error(path)
    assert "checkpoint data file missing" in message and str(data) in message
    (path / "ckpt-trace.metadata").unlink()
    assert "no committed checkpoint" in _load_error(path)


@pytest.mark.torch
@pytest.mark.io_uring
@pytest.mark.root
@pytest.mark.parametrize("preallocate", [True, False])
def test_full_disk_names_the_file_and_keeps_the_previous_checkpoint(
    small_tmpfs, torch_installed, io_uring, preallocate
):
    path = small_tmpfs / "ckpt"
    small = {"w": torch.arange(1000, dtype=torch.float32)}
    dcp.save(small, storage_writer=_writer(path, preallocate=preallocate))
    before = sorted(p.name for p in path.iterdir())
    big = {"w": torch.randn(512, 1024)}  # 2 MiB on a 1 MiB file system
    with pytest.raises(dcp.api.CheckpointException) as caught:
        dcp.save(big, storage_writer=_writer(path, preallocate=preallocate, buffer_bytes=64 << 10))
    assert "no space left on device" in str(caught.value) and str(path) in str(caught.value)
    assert sorted(p.name for p in path.iterdir()) == before  # the failed save's data file is gone
    target = {"w": torch.zeros(1000)}
    dcp.load(target, storage_reader=_reader(path))
    assert torch.equal(target["w"], small["w"])


@pytest.mark.torch
@pytest.mark.io_uring
def test_refused_o_direct_falls_back_to_buffered_and_says_so(tmp_path, torch_installed, io_uring, monkeypatch):
    from ckpt_trace.iolayer import files

    real_open = os.open

    def no_direct(path, flags, mode=0o777, **kwargs):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(files.os, "open", no_direct)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state, target, writer = _round_trip(tmp_path / "ckpt", direct_load=False)  # loaded buffered
    assert any("O_DIRECT refused" in str(w.message) for w in caught)
    assert writer.last_save.direct_io is False
    assert objects_equal_bitwise(state, target)


GOLDEN_DCP = Path(__file__).resolve().parent.parent / "traces" / "golden" / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow"


def _import_module(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.torch
@pytest.mark.io_uring
def test_emitted_module_is_tuned_from_the_replay_and_round_trips(tmp_path, torch_installed, io_uring):
    from conftest import cli

    results = tmp_path / "results.json"
    cli(
        "replay",
        str(GOLDEN_DCP),
        "--target",
        str(tmp_path / "replay"),
        "--strategy",
        "aggregated",
        "--queue-depth",
        "5",
        "--buffer-size",
        "2MiB",
        "--durable",
        "-o",
        str(results),
    )
    module_path = tmp_path / "my_writer.py"
    proc = cli("emit", str(GOLDEN_DCP), "--from-results", str(results), "-o", str(module_path), "--json")
    chosen = json.loads(proc.stdout)
    assert chosen["options"] == {
        "buffer_bytes": 2 << 20,
        "queue_depth": 5,
        "direct_io": True,
        "writer_threads": 1,
        "align_bytes": 4096,
        "preallocate": True,
        "load_direct_io": True,
        "load_streams": 2,
        "load_cache_aware": True,
        "checksums": True,
        "load_measure_cold_way": True,
    }
    text = module_path.read_text()
    assert str(GOLDEN_DCP) in text and str(results) in text and "aggregated" in text
    module = _import_module(module_path)
    assert module.OPTIONS.queue_depth == 5 and module.OPTIONS.buffer_bytes == 2 << 20
    state = plain_state()
    dcp.save(state, storage_writer=module.make_writer(tmp_path / "ckpt"))
    target = zeros_like_state(state)
    dcp.load(target, storage_reader=module.make_reader(tmp_path / "ckpt"))
    assert objects_equal_bitwise(state, target)
    # the module's one-process load: DCP's path for this state (it holds objects), the direct one for tensors
    again = zeros_like_state(state)
    assert module.load(again, tmp_path / "ckpt").last_load_stats["planner"] == "dcp"
    assert objects_equal_bitwise(state, again)
    tensors = {"f32": torch.zeros_like(state["f32"]), "bf16": torch.zeros_like(state["bf16"])}
    assert module.load(tensors, tmp_path / "ckpt").last_load_stats["planner"] == "direct"
    assert torch.equal(tensors["f32"], state["f32"]) and torch.equal(tensors["bf16"], state["bf16"])


@pytest.mark.slow
def test_emit_without_results_and_its_refusals(tmp_path):
    from conftest import cli

    module_path = tmp_path / "w.py"
    cli("emit", str(GOLDEN_DCP), "-o", str(module_path))
    text = module_path.read_text()
    assert "replay:  none given" in text and "direct_io=True" in text
    compile(text, str(module_path), "exec")
    again = cli("emit", str(GOLDEN_DCP), "-o", str(module_path), check=False)
    assert again.returncode == 2 and "exists" in again.stderr and module_path.read_text() == text
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "results"}')
    proc = cli("emit", str(GOLDEN_DCP), "--from-results", str(bad), "-o", str(tmp_path / "x.py"), check=False)
    assert proc.returncode == 2 and "missing key 'results'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.py").exists()


@pytest.mark.torch
@pytest.mark.slow
def test_a_failed_rank_does_not_leave_its_peers_waiting_in_the_rendezvous(torch_installed):
    """Rank 0 fails before the rendezvous; rank 1 waits there for it. The job must end with rank 0's reason once
    the peers' grace is over, not after the store's 30-minute timeout (a hang, so the bound is generous)."""
    import time

    from writer_state import fail_or_wait_rank

    from ckpt_trace.errors import WorkloadError
    from ckpt_trace.workloads.engines import _PEER_GRACE_S, spawn_ranks

    started = time.monotonic()
    with pytest.raises(WorkloadError, match=r"rank 0: rank 0 gave up before the rendezvous \(and rank\(s\) 1\)"):
        spawn_ranks(fail_or_wait_rank, 2)
    assert time.monotonic() - started < _PEER_GRACE_S + 300


def test_a_rank_with_nothing_to_write_writes_no_file(tmp_path, torch_installed):
    from torch.distributed.checkpoint.planner import SavePlan

    writer = _writer(tmp_path / "ckpt")
    writer.prepare_local_plan(SavePlan([]))
    assert writer.write_data(SavePlan([]), planner=None).wait() == []
    assert writer.last_save.files == 0 and list((tmp_path / "ckpt").iterdir()) == []


@pytest.mark.torch
@pytest.mark.io_uring
def test_a_warm_file_is_read_from_the_page_cache_and_a_cold_one_with_o_direct(tmp_path, torch_installed, io_uring):
    """The cache-aware reader asks the page cache first (cachestat(2)): a checkpoint whose pages it holds is
    read buffered, the same one after its pages are dropped (POSIX_FADV_DONTNEED) with O_DIRECT; both
    loads are bit-identical, and the stats say which way the file went."""
    from ckpt_trace.iolayer import pagecache

    path = tmp_path / "ckpt"
    state = plain_state()
    dcp.save(state, storage_writer=_writer(path))  # O_DIRECT: nothing left in the page cache
    data = next(path.glob("*.data"))
    ways = {}
    for warm in (False, True):
        fd = os.open(data, os.O_RDONLY)
        try:
            if warm:
                while os.read(fd, 1 << 20):  # fill the page cache
                    pass
            else:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            share, method = pagecache.resident_share(fd, data.stat().st_size)
        finally:
            os.close(fd)
        assert (share >= 0.99) if warm else (share <= 0.05), (warm, share, method)
        target = zeros_like_state(state)
        reader = _reader(path)
        dcp.load(target, storage_reader=reader)
        assert objects_equal_bitwise(state, target)
        ways[warm] = (
            reader.last_load_direct_io,
            reader.last_load_stats["buffered_files"],
            reader.last_load_stats["cache_probe"],
        )
    assert ways[False][:2] == (True, 0) and ways[True][:2] == (False, 1)
    assert ways[True][2] in ("cachestat", "nowait")
    reader = _reader(path, load_cache_aware=False)  # asked not to look: O_DIRECT even when warm
    dcp.load(zeros_like_state(state), storage_reader=reader)
    assert reader.last_load_direct_io is True
