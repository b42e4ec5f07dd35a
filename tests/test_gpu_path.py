"""The GPU hop of the emitted writer and reader: the reader's copy overlap (with a CPU stand-in for the copy
engine), the async-save staging contract, page-locked staging kept between saves, and, on a GPU, save and
load of CUDA tensors end to end."""

from __future__ import annotations

import pytest

try:
    import torch
    import torch.distributed.checkpoint as dcp
    from writer_state import objects_equal_bitwise, plain_state, zeros_like_state
except ImportError:  # tests needing torch skip (or fail under CI) through the torch_installed fixture
    torch = dcp = None

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _has_gpu() -> bool:
    return torch is not None and torch.cuda.is_available()


needs_gpu = pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU (torch.cuda.is_available() is false)")


def _writer(path, **options):
    from ckpt_trace.writer import CheckpointWriter, WriterOptions

    return CheckpointWriter(path, WriterOptions(**options))


def _reader(path, **options):
    from ckpt_trace.writer import CheckpointReader, WriterOptions

    return CheckpointReader(path, WriterOptions(**options))


class DeferredCopier:
    """A stand-in for the CUDA copy engine: ``copy`` only queues the copy, which runs when its slot is
    waited on (as a GPU copy may complete any time before its event is waited on). If the reader read
    into a slot before waiting on it, the deferred copy would take the new read's bytes and the load would
    differ. It logs the order of events."""

    def __init__(self, reader) -> None:
        self.pending: dict[int, list] = {}
        self.log: list[tuple[str, int]] = []
        self.reader = reader

    def copy(self, dst, src, slot: int) -> None:
        self.pending.setdefault(slot, []).append((dst, src))
        self.log.append(("copy", slot))

    def wait(self, slot: int) -> None:
        for dst, src in self.pending.pop(slot, []):
            dst.copy_(src)
        self.log.append(("wait", slot))

    def wait_all(self) -> None:
        for slot in list(self.pending):
            self.wait(slot)

    def close(self) -> None:
        self.wait_all()


@pytest.mark.torch
@pytest.mark.io_uring
def test_reader_reuses_an_arena_slot_only_after_its_copies_and_overlaps_them_with_reads(
    tmp_path, torch_installed, io_uring, monkeypatch
):
    """With copies that complete only when waited on, the O_DIRECT load is still bit-identical (no slot is
    read into before its copies are done), and copies are queued while later reads are in flight."""
    from ckpt_trace.iolayer import ring as rings
    from ckpt_trace.writer import staging

    path = tmp_path / "ckpt"
    state = plain_state()
    dcp.save(state, storage_writer=_writer(path, buffer_bytes=8192, queue_depth=3))
    copiers: list[DeferredCopier] = []
    submitted: list[int] = []
    real_submit = rings.Ring.submit

    def submit(self, op, fd, address, size, offset, tag=0):
        if op == "read" and copiers:
            copiers[-1].log.append(("read", tag))
        submitted.append(tag)
        return real_submit(self, op, fd, address, size, offset, tag=tag)

    monkeypatch.setattr(rings.Ring, "submit", submit)
    real_wait = rings.Ring.wait_result

    def wait_result(self):
        request, moved = real_wait(self)
        if copiers:
            copiers[-1].log.append(("landed", request.tag))
        return request, moved

    monkeypatch.setattr(rings.Ring, "wait_result", wait_result)
    real_run = staging.StreamReader.run

    def run(self, fd, wanted, file_size_bytes, destination, done, copier=None):
        copiers.append(DeferredCopier(self))
        return real_run(self, fd, wanted, file_size_bytes, destination, done, copiers[-1])

    monkeypatch.setattr(staging.StreamReader, "run", run)
    target = zeros_like_state(state)
    reader = _reader(path, buffer_bytes=8192, queue_depth=3)
    dcp.load(target, storage_reader=reader)
    assert reader.last_load_direct_io and objects_equal_bitwise(state, target)
    log = [entry for copier in copiers for entry in copier.log]
    assert sum(kind == "read" for kind, _ in log) > 3  # more reads than slots: slots were reused
    # Overlap: copies are queued while other reads are in flight, and no slot is read into before the
    # copies out of it are done.
    overlapped = 0
    for copier in copiers:
        pending: set[int] = set()
        in_flight = 0
        for kind, slot in copier.log:
            if kind == "copy":
                pending.add(slot)
                overlapped += in_flight > 0
            elif kind == "wait":
                pending.discard(slot)
            elif kind == "read":
                assert slot not in pending
                in_flight += 1
            elif kind == "landed":
                in_flight -= 1
    assert overlapped > 0


@pytest.mark.torch
@pytest.mark.io_uring
def test_async_save_returns_a_staged_copy_that_later_changes_do_not_reach(tmp_path, torch_installed, io_uring):
    """``dcp.async_save`` with the writer stages through ``writer.stage``: once it returns, the state may
    change, and the checkpoint still holds the values at the call."""
    path = tmp_path / "ckpt"
    state = plain_state()
    expected = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    writer = _writer(path)
    future = dcp.async_save(state, storage_writer=writer)
    for value in state.values():
        if isinstance(value, torch.Tensor) and value.numel() and value.dtype.is_floating_point:
            value.add_(1.0)  # training goes on
    future.result()
    writer.close()  # as some torch releases do after each async save: staging survives it
    state2 = plain_state(seed=1)
    dcp.async_save(state2, storage_writer=writer, checkpoint_id=str(tmp_path / "again")).result()
    writer.release_staging()
    target = zeros_like_state(expected)
    dcp.load(target, storage_reader=_reader(path))
    assert objects_equal_bitwise(expected, target)


@pytest.mark.torch
@pytest.mark.gpu
@needs_gpu
@pytest.mark.io_uring
def test_gpu_tensors_save_and_load_back_to_the_gpu_bit_identical(tmp_path, torch_installed, io_uring):
    """CUDA tensors saved by the writer (pinned staging, its own copy stream) and loaded by the O_DIRECT
    reader into CUDA destinations (asynchronous host-to-device copies out of the arena) are bit-identical;
    a second save registers no more page-locked memory than the first."""
    from ckpt_trace.writer import staging

    path = tmp_path / "ckpt"
    gen = torch.Generator(device="cuda").manual_seed(1)
    state = {f"w{i}": torch.randn(1 << (10 + i % 10), device="cuda", generator=gen) for i in range(40)}
    state["bf16"] = torch.randn(333, 77, device="cuda", generator=gen).to(torch.bfloat16)
    state["step"] = 3
    dcp.save(state, storage_writer=_writer(path))
    registered = staging.PINNED_POOL.registered
    dcp.save(state, storage_writer=_writer(tmp_path / "again"))
    assert staging.PINNED_POOL.registered == registered  # the second save reused the page-locked buffers
    target = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state.items()}
    reader = _reader(path)
    dcp.load(target, storage_reader=reader)
    assert reader.last_load_direct_io
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert target[key].is_cuda and torch.equal(target[key], value), key
    assert target["step"] == 3


@pytest.mark.torch
@pytest.mark.gpu
@needs_gpu
@pytest.mark.io_uring
def test_gpu_async_save_returns_after_the_copies_and_keeps_the_values_at_the_call(tmp_path, torch_installed, io_uring):
    """The async mode returns within 1.2x the device-to-host copy time measured with CUDA events (after a
    first save has cached the page-locked staging), and a state changed after it returns does not change
    the saved bytes."""
    path = tmp_path / "ckpt"
    state = {f"w{i}": torch.randn(4 << 20, device="cuda") for i in range(64)}  # 1 GiB
    writer = _writer(path)
    dcp.async_save(state, storage_writer=writer).result()  # warms the staging cache
    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for k, v in state.items():
        pinned[k].copy_(v, non_blocking=True)
    end.record()
    end.synchronize()
    copy_s = start.elapsed_time(end) / 1e3
    expected = {k: v.clone() for k, v in state.items()}
    import time

    began = time.perf_counter()
    future = dcp.async_save(state, storage_writer=writer, checkpoint_id=str(tmp_path / "second"))
    returned_s = time.perf_counter() - began
    for value in state.values():
        value.add_(1.0)
    future.result()
    writer.release_staging()
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(target, storage_reader=_reader(tmp_path / "second"))
    assert all(torch.equal(target[k], expected[k]) for k in state)
    print(f"async_save returned in {returned_s * 1e3:.1f} ms; device-to-host copies {copy_s * 1e3:.1f} ms")
    assert returned_s <= 1.2 * copy_s + 0.05  # + 50 ms: DCP's own bookkeeping (planning is not staged)


GOLDEN_ODD = sorted(
    (__import__("pathlib").Path(__file__).resolve().parent.parent / "traces" / "golden").glob(
        "*odd-pattern*strace*.arrow"
    )
)


@pytest.mark.slow
def test_gds_without_a_gpu_or_kvikio_is_one_line_and_a_failure(tmp_path):
    """Where gds cannot run, ``replay --strategy gds`` says why in one line and exits non-zero, creating
    nothing in the target."""
    from conftest import cli

    if _has_gpu():
        pytest.skip("this machine has a GPU: test_gds_replays_through_cufile covers it")
    proc = cli("replay", str(GOLDEN_ODD[-1]), "--strategy", "gds", "--target", str(tmp_path / "t"), check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "gds" in lines[0] and ("GPU" in lines[0] or "KvikIO" in lines[0])
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").iterdir())


class _FakeKvikio:
    """KvikIO's settings as the probe reads them, for each combination of the machine's state."""

    __version__ = "26.10.0"

    def __init__(self, compat: str, gds: bool) -> None:
        import types

        self.defaults = types.SimpleNamespace(get=lambda name: f"CompatMode.{compat}")
        self.cufile_driver = types.SimpleNamespace(get=lambda name: gds)


@pytest.mark.parametrize(
    ("compat", "gds", "nvidia_fs", "true_gds"),
    [
        ("OFF", True, True, True),
        ("AUTO", True, True, True),
        ("AUTO", False, True, False),
        ("ON", True, True, False),
        ("OFF", True, False, False),
    ],
)
def test_gds_mode_is_true_gds_only_when_kvikio_cufile_and_nvidia_fs_agree(
    monkeypatch, compat, gds, nvidia_fs, true_gds
):
    from ckpt_trace.replayer import gds as gds_module

    fake = _FakeKvikio(compat, gds)
    monkeypatch.setattr(gds_module.glob, "glob", lambda pattern: ["/dev/nvidia-fs0"] if nvidia_fs else [])
    mode = gds_module._mode(fake)
    assert mode.true_gds is true_gds
    assert mode.label.startswith("true GDS" if true_gds else "compatibility mode, not true GDS")


@pytest.mark.slow
@pytest.mark.gpu
@needs_gpu
def test_gds_replays_through_cufile_and_says_which_mode(tmp_path):
    """On a GPU with KvikIO: ``replay --strategy gds --verify`` leaves the files posix leaves, every data byte
    through cuFile, and the results say whether it was true GDS or compatibility mode."""
    import json

    from conftest import cli

    try:
        import kvikio  # noqa: F401
    except ImportError:
        pytest.skip("KvikIO is not installed")
    trace = GOLDEN_ODD[-1]
    sizes = {}
    for strategy in ("posix", "gds"):
        out = tmp_path / f"{strategy}.json"
        cli(
            "replay",
            str(trace),
            "--strategy",
            strategy,
            "--target",
            str(tmp_path / strategy),
            "--verify",
            "--json",
            "-o",
            str(out),
        )
        result = json.loads(out.read_text())["results"][0]
        root = tmp_path / strategy
        sizes[strategy] = {
            str(p.relative_to(root)): p.stat().st_size
            for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".ckpt-trace")
        }
        if strategy == "gds":
            assert any(note.startswith("gds: ") for note in result["notes"]), result["notes"]
            print(next(note for note in result["notes"] if note.startswith("gds: ")))
            moved = sum(p["bytes"] for p in result["data_paths"].values())
            assert result["data_paths"]["cufile"]["bytes"] == moved > 0
    assert sizes["gds"] == sizes["posix"]


def _link_table():
    """A save as the emitted writer records it with bcc: device-to-host copies into two page-locked staging
    buffers (A and B), io_uring write requests from them, one write from an unrelated buffer, one copy of
    another process into buffer A's range, and a plain write syscall (no buffer address)."""
    from ckpt_trace.formats import table_from_columns

    A, B, OTHER = 0x7F00_0000_0000, 0x7F00_0040_0000, 0x5555_0000_0000
    rows = [  # (ts_ns, dur_ns, pid, op, interface, address, size)
        (100, 10, 7, "copy_d2h", "cuda", A, 1 << 20),
        (120, 10, 7, "copy_d2h", "cuda", A + (1 << 20), 3 << 20),
        (130, 5, 9, "copy_d2h", "cuda", A, 4 << 20),  # another process: never feeds pid 7's writes
        (140, 50, 7, "write", "io_uring", A, 4 << 20),  # fed by both copies into A; the latest one is named
        (150, 10, 7, "copy_d2h", "cuda", B, 4 << 20),
        (145, 50, 7, "write", "io_uring", B, 4 << 20),  # starts before B's copy ended: not fed by it
        (200, 50, 7, "write", "io_uring", B, 4 << 20),  # fed by B's copy
        (210, 50, 7, "write", "io_uring", OTHER, 4096),  # a buffer no copy filled
        (220, 50, 7, "write", "syscall", None, 4096),  # no address: unknown, never linked
    ]
    columns = {
        name: [row[i] for row in rows]
        for i, name in enumerate(("ts_ns", "dur_ns", "pid", "op", "interface", "address", "size"))
    }
    n = len(rows)
    columns.update(
        tid=columns["pid"],
        rank=[0] * n,
        syscall=["x"] * n,
        ret=columns["size"],
        comm=["python"] * n,
        fd=[3] * n,
        path=["/ckpt/0.data" if op == "write" else None for op in columns["op"]],
        new_path=[None] * n,
        offset=[0] * n,
        offset_source=[None] * n,
        flags=[None] * n,
        iov_count=[None] * n,
        memory_kind=["pinned" if op == "copy_d2h" else None for op in columns["op"]],
    )
    return table_from_columns(columns)


def test_copy_to_write_links_name_the_copy_that_filled_the_written_buffer():
    from ckpt_trace.analysis.gpu import copy_summary, copy_write_links

    table = _link_table()
    writes, copies = copy_write_links(table, block_rows=2)
    assert dict(zip(writes.tolist(), copies.tolist())) == {3: 1, 6: 4}
    rank = copy_summary(table)["ranks"][0]
    assert (rank["fed_writes"], rank["fed_write_bytes"], rank["writes_with_buffer"]) == (2, 8 << 20, 4)


@pytest.mark.slow
def test_summary_says_how_many_writes_a_copy_fed(tmp_path):
    from conftest import cli

    from ckpt_trace.formats import write_trace

    path = tmp_path / "links.arrow"
    write_trace(
        path,
        _link_table(),
        {
            "creator": "test",
            "creator_version": "0",
            "host": "h",
            "kernel": "k",
            "command": ["save"],
            "backend": "bcc",
            "start_wall_time_ns": 0,
            "filesystems": {},
            "lost_events": 0,
            "arch": "x86_64",
        },
    )
    summary = __import__("json").loads(cli("summary", str(path), "--json").stdout)
    rank = summary["gpu"]["ranks"]["0"]
    assert rank["fed_writes"] == 2 and rank["writes_with_buffer"] == 4
    text = cli("summary", str(path)).stdout
    assert "2 of 4 writes with a known host buffer were fed by a device-to-host copy" in " ".join(text.split())
