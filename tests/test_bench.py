"""ckpt-trace bench: the matrix's plans (pure), the bytes each writer process puts on disk, the end-to-end
command on real storage, refusals on a 4 KiB-sector device, and bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import CKPT_TRACE, _missing, cli
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_trace.bench import matrix as bm
from ckpt_trace.bench import worker
from ckpt_trace.bench.heatmap import grid_values, matrix_of
from ckpt_trace.bench.matrix import BenchPoint, make_matrix
from ckpt_trace.bench.results import point_of, read_bench
from ckpt_trace.bench.run import SCRATCH_PREFIX, run_bench
from ckpt_trace.errors import BenchError
from ckpt_trace.iolayer import pattern

KIB, MIB = 1 << 10, 1 << 20
POINT = BenchPoint(
    size_bytes=64 * KIB,
    misaligned_bytes=0,
    queue_depth=4,
    processes=1,
    direct=True,
    engine="uring",
    aggregated=False,
    preallocated=True,
)

sizes = st.sampled_from([512, 4 * KIB, 12 * KIB, 64 * KIB, MIB, 3 * MIB])
points = st.builds(
    BenchPoint,
    size_bytes=sizes,
    misaligned_bytes=st.sampled_from([0, 512]),
    queue_depth=st.integers(1, 8),
    processes=st.integers(1, 4),
    direct=st.booleans(),
    engine=st.sampled_from(bm.ENGINES),
    aggregated=st.booleans(),
    preallocated=st.booleans(),
    direction=st.sampled_from(bm.DIRECTIONS),
)

# A small sweep for the CLI tests: 2 sizes x 2 queue depths x up to 2 processes, 4 MiB a point.
SMALL_SWEEP = ("--quick", "--sizes", "64KiB,1MiB", "--queue-depths", "1,8", "--max-processes", "2", "--volume", "4MiB")


# -- the plans (pure) -------------------------------------------------------------------------------------


@given(point=points, volume=st.integers(1, 16 * MIB))
def test_pieces_tile_the_stream_from_the_misaligned_start(point, volume):
    stream = bm.stream_bytes(point, volume)
    assert stream % point.size_bytes == 0 and stream >= point.size_bytes
    if volume // point.processes >= point.size_bytes:
        assert stream <= volume // point.processes < stream + point.size_bytes
    position = point.misaligned_bytes
    for offset, size in bm.pieces(point, stream):
        assert offset == position and 0 < size <= point.size_bytes
        position += size
    assert position == point.misaligned_bytes + stream


@given(point=points, volume=st.integers(1, 16 * MIB), aggregate=st.sampled_from([MIB, 4 * MIB]))
def test_staging_writes_are_block_aligned_and_cover_the_file(point, volume, aggregate):
    stream = bm.stream_bytes(point, volume)
    writes = bm.staging_writes(point, stream, aggregate, 4096)
    end = point.misaligned_bytes + stream
    assert [offset for offset, _ in writes] == list(range(0, end, aggregate))
    assert all(offset % 4096 == 0 and size % 4096 == 0 and 0 < size <= aggregate for offset, size in writes)
    last_offset, last_size = writes[-1]
    assert last_offset + last_size >= end > last_offset + last_size - 4096


def test_every_heat_map_cell_is_a_run_point_and_posix_has_no_queue():
    matrix = make_matrix(quick=True, max_processes=4)
    run = matrix.points()
    assert len(run) == len(set(run))
    assert len(matrix.pairs()) == 28  # eight dimensions, each with two or more values
    for row, column in matrix.pairs():
        grid = matrix.grid(row, column)
        assert len(grid) == len(matrix.values[row]) and all(len(line) == len(matrix.values[column]) for line in grid)
        for i, line in enumerate(grid):
            for j, point in enumerate(line):
                assert getattr(point, row) == matrix.values[row][i]
                assert getattr(point, column) == matrix.values[column][j]
                assert point.canonical() in run
    assert all(p.queue_depth == 1 for p in run if p.engine == "posix")
    assert matrix.baseline in run


def test_matrix_shapes_and_custom_values():
    full = make_matrix(quick=False, max_processes=6)
    assert full.values["size_bytes"][0] == 4 * KIB and full.values["size_bytes"][-1] == 64 * MIB
    assert full.values["queue_depth"] == (1, 2, 4, 8, 16, 32, 64, 128)
    assert full.values["processes"] == (1, 2, 4, 6) and full.volume_bytes == 1 << 30
    custom = make_matrix(quick=True, max_processes=2, sizes=(16 * MIB, 8 * KIB, 2 * MIB), queue_depths=(64, 4))
    assert custom.baseline.size_bytes == 2 * MIB and custom.baseline.queue_depth == 4
    assert custom.values["processes"] == (1, 2)
    with pytest.raises(ValueError):
        make_matrix(quick=True, max_processes=2, sizes=(0,))
    with pytest.raises(ValueError):
        bm.Matrix(values=dict(custom.values, queue_depth=(8,)), baseline=custom.baseline, volume_bytes=MIB)


def test_describe_names_every_dimension():
    text = bm.describe(dataclasses.replace(POINT, misaligned_bytes=512, processes=2))
    assert text == "64 KiB +512 B writes, io_uring QD 4, O_DIRECT, not aggregated, fallocate, 2 processes"


# -- one writer process's bytes on disk ---------------------------------------------------------------------


def expected_file(point: BenchPoint, stream: int) -> bytes:
    """What the stream leaves in the file: zeros before the misaligned start, then the pattern of every
    byte's own offset (so a piece at the wrong offset differs)."""
    return bytes(point.misaligned_bytes) + pattern.expected(point.misaligned_bytes, stream, 0)


def _grid(misaligned_preallocated, **fixed) -> list[BenchPoint]:
    """``POINT`` under every engine, direct or not, aggregated or not, and each (misaligned bytes,
    preallocated) pair; ``fixed`` sets other fields."""
    return [
        dataclasses.replace(
            POINT,
            **fixed,
            engine=engine,
            direct=direct,
            aggregated=aggregated,
            misaligned_bytes=misaligned,
            preallocated=preallocated,
        )
        for engine in bm.ENGINES
        for direct in (False, True)
        for aggregated in (False, True)
        for misaligned, preallocated in misaligned_preallocated
    ]


def _assert_planned_ops(result, point: BenchPoint, stream: int) -> None:
    """The stream took the planned I/O calls (a staging buffer each when aggregated, a piece each otherwise),
    timed each (``latencies_ns``: 8 bytes a call) and moved ``stream`` bytes in a positive time."""
    planned = (
        len(bm.staging_writes(point, stream, MIB // 8, 4096))
        if point.aggregated
        else len(list(bm.pieces(point, stream)))
    )
    assert result.io_ops == planned and len(result.latencies_ns) == 8 * planned
    assert result.end_ns > result.start_ns and result.stream_bytes == stream


WRITER_CASES = _grid(((0, False), (512, True)))


@pytest.mark.io_uring
@pytest.mark.parametrize("point", WRITER_CASES, ids=lambda p: bm.describe(p).replace(" ", "_"))
def test_writer_puts_every_piece_at_its_offset(point, tmp_path, io_uring):
    stream = 5 * point.size_bytes  # five pieces; aggregated, they span three 128 KiB staging buffers
    path = tmp_path / "stream.data"
    writer = worker.StreamWriter(point, str(path), stream, aggregate_bytes=MIB // 8, block_bytes=4096)
    try:
        result = writer.run()
    finally:
        writer.close()
    data = path.read_bytes()
    assert len(data) == point.misaligned_bytes + stream
    assert data == expected_file(point, stream) == worker.expected_content(point, stream)
    _assert_planned_ops(result, point, stream)


READER_CASES = _grid(((0, False), (512, False)), direction="read")


def resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache, as util-linux fincore(1) (mincore(2)) reports them."""
    if shutil.which("fincore") is None:
        _missing("fincore (util-linux) is needed to see the page cache", required_in_ci=True)
    done = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.split()[0])


@pytest.mark.io_uring
@pytest.mark.parametrize("point", READER_CASES, ids=lambda p: bm.describe(p).replace(" ", "_"))
def test_reader_reads_every_piece_back_from_a_cold_file(point, tmp_path, io_uring):
    stream = 5 * point.size_bytes  # five pieces; aggregated, three 128 KiB staging windows, the last past EOF
    path = tmp_path / "stream.data"
    try:
        reader = worker.StreamReader(point, str(path), stream, aggregate_bytes=MIB // 8, block_bytes=4096)
    except OSError as err:
        assert point.direct and err.errno in worker.UNSUPPORTED  # a file system without O_DIRECT (tmpfs)
        return
    try:
        assert resident_bytes(path) == 0  # laid out and dropped from the page cache: the reads hit the storage
        try:
            result = reader.run()
        except OSError as err:  # O_DIRECT at a 512-byte offset on a 4 KiB-sector device
            assert point.direct and point.misaligned_bytes and err.errno in worker.UNSUPPORTED
            return
        got = bytes(reader.destination.mmap[:stream])
    finally:
        reader.close()
    assert path.read_bytes() == expected_file(point, stream)  # laid out as a write stream leaves it
    assert got == expected_file(point, stream)[point.misaligned_bytes :]
    _assert_planned_ops(result, point, stream)


@pytest.mark.io_uring
@pytest.mark.parametrize("aggregated", [False, True])
def test_a_read_stream_that_returns_wrong_bytes_fails(tmp_path, aggregated, io_uring):
    point = dataclasses.replace(POINT, direction="read", direct=False, aggregated=aggregated, preallocated=False)
    stream = 5 * point.size_bytes
    path = tmp_path / "stream.data"
    reader = worker.StreamReader(point, str(path), stream, aggregate_bytes=MIB // 8, block_bytes=4096)
    try:
        with open(path, "r+b") as handle:  # another writer changes one byte of the fourth piece
            handle.seek(3 * point.size_bytes + 100)
            old = handle.read(1)
            handle.seek(-1, os.SEEK_CUR)
            handle.write(bytes([old[0] ^ 0xFF]))
        with pytest.raises(ValueError, match=f"wrong bytes at file offset {3 * point.size_bytes + 100}$"):
            reader.run()
    finally:
        reader.close()


def test_read_points_are_never_preallocated_and_their_grids_leave_preallocation_out():
    matrix = make_matrix(
        quick=True, max_processes=2, sizes=(4 * KIB, MIB), queue_depths=(1, 8), directions=("write", "read")
    )
    reads = [p for p in matrix.points() if p.direction == "read"]
    writes = [p for p in matrix.points() if p.direction == "write"]
    assert reads and writes and not any(p.preallocated for p in reads)
    assert len(matrix.pairs("write")) == 28 and len(matrix.pairs("read")) == 21
    assert all("preallocated" not in pair and "direction" not in pair for pair in matrix.pairs("read"))
    assert {dataclasses.replace(p, direction="write") for p in reads} <= {
        dataclasses.replace(p, preallocated=False) for p in writes
    }  # the same points, mirrored
    with pytest.raises(ValueError, match="directions must be among write, read"):
        make_matrix(quick=True, directions=("sideways",))


# -- the command, end to end ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.io_uring
def test_bench_writes_table_heat_maps_and_the_best_configuration(tmp_path, io_uring):
    import matplotlib.image

    target = tmp_path / "storage"
    target.mkdir()
    keep = target / "precious.bin"
    keep.write_bytes(b"not ours")
    out = tmp_path / "results"
    proc = cli(
        "bench",
        "--target",
        str(target),
        *SMALL_SWEEP,
        "-o",
        str(out),
        "--json",
    )
    data = json.loads(proc.stdout)

    assert sorted(p.name for p in target.iterdir()) == ["precious.bin"] and keep.read_bytes() == b"not ours"
    table, metadata = read_bench(out / "bench.arrow")
    matrix = matrix_of(metadata)
    assert table.num_rows == len(matrix.points()) == data["points"]
    rows = table.to_pylist()
    ran = [r for r in rows if r["error"] is None]
    assert ran, "no point ran"
    for row in ran:
        assert row["volume_bytes"] == bm.stream_bytes(point_of(row), 4 * MIB) * row["processes"]
        assert row["throughput_bytes_per_s"] == pytest.approx(row["volume_bytes"] / row["elapsed_s"])
        assert row["latency_p50_ns"] <= row["latency_p99_ns"] <= row["latency_max_ns"]
    fastest = max(ran, key=lambda r: r["throughput_bytes_per_s"])
    assert data["best"]["throughput_bytes_per_s"] == fastest["throughput_bytes_per_s"]
    assert data["best"]["description"] == bm.describe(point_of(fastest))
    assert metadata["environment"]["filesystem"] and metadata["volume_bytes"] == 4 * MIB

    assert len(data["heatmaps"]) == len(matrix.pairs()) == 28
    for name in data["heatmaps"]:
        image = matplotlib.image.imread(name)
        assert image.shape[0] > 100 and image.shape[1] > 100
    values = grid_values(table, matrix, "size_bytes", "queue_depth")
    assert len(values) == 2 and all(len(line) == 2 for line in values)

    plain = cli(
        "bench",
        "--target",
        str(target),
        "--quick",
        "--sizes",
        "64KiB",
        "--queue-depths",
        "1",
        "--max-processes",
        "1",
        "--volume",
        "1MiB",
        "-o",
        str(out),
        "--force",
    )
    assert "best write: 64 KiB aligned writes" in plain.stdout


@pytest.mark.slow
@pytest.mark.io_uring
def test_bench_sweeps_reads_and_writes_with_one_heat_map_set_each(tmp_path, io_uring):
    target, out = tmp_path / "storage", tmp_path / "results"
    target.mkdir()
    proc = cli(
        "bench",
        "--target",
        str(target),
        *SMALL_SWEEP,
        "--direction",
        "both",
        "-o",
        str(out),
        "--json",
    )
    data = json.loads(proc.stdout)
    assert list(target.iterdir()) == []
    table, metadata = read_bench(out / "bench.arrow")
    matrix = matrix_of(metadata)
    rows = table.to_pylist()
    assert matrix.directions == ("write", "read") and len(rows) == len(matrix.points()) == data["points"]
    reads = [r for r in rows if r["direction"] == "read"]
    assert reads and not any(r["preallocated"] for r in reads)
    ran = [r for r in reads if r["error"] is None]
    assert ran and all(r["volume_bytes"] == bm.stream_bytes(point_of(r), 4 * MIB) * r["processes"] for r in ran)
    fastest = max(ran, key=lambda r: r["throughput_bytes_per_s"])
    best = data["directions"]["read"]["best"]
    assert best["throughput_bytes_per_s"] == fastest["throughput_bytes_per_s"]
    assert best["description"].startswith("1 MiB aligned reads") or "reads" in best["description"]
    assert data["best"] == data["directions"]["write"]["best"]
    names = sorted(Path(p).name for p in data["heatmaps"])
    assert len([n for n in names if n.startswith("heatmap-read-")]) == 21
    assert len(names) == 28 + 21 and "heatmap-read-size_bytes-queue_depth.png" in names
    effects = {e["dimension"] for e in data["directions"]["read"]["effects"]}
    assert "preallocated" not in effects and "queue_depth" in effects


@pytest.fixture
def sector_4k_mount(tmp_path):
    """An ext4 file system on a loop device with 4096-byte logical sectors (root), removed afterwards."""
    if os.geteuid() != 0:
        _missing("a loop device needs root", required_in_ci=True)
    if shutil.which("losetup") is None or shutil.which("mkfs.ext4") is None:
        _missing("losetup and mkfs.ext4 are needed (util-linux, e2fsprogs)", required_in_ci=True)
    image, mount = tmp_path / "disk.img", tmp_path / "mnt"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(96 * MIB)
    attached = subprocess.run(
        ["losetup", "--find", "--show", "--sector-size", "4096", str(image)], capture_output=True, text=True
    )
    if attached.returncode != 0:
        _missing(f"losetup failed: {attached.stderr.strip()}", required_in_ci=True)
    device = attached.stdout.strip()
    try:
        subprocess.run(["mkfs.ext4", "-q", device], check=True)
        subprocess.run(["mount", device, str(mount)], check=True)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)
        subprocess.run(["losetup", "-d", device], capture_output=True)


@pytest.mark.root
@pytest.mark.io_uring
def test_4k_sector_device_refuses_misaligned_o_direct_and_aggregation_repairs_it(sector_4k_mount, io_uring):
    base = make_matrix(quick=True, max_processes=1, sizes=(64 * KIB,), queue_depths=(4,), volume_bytes=MIB)
    matrix = dataclasses.replace(
        base, values={**base.values, "engine": ("posix", "uring"), "processes": (1,), "preallocated": (True,)}
    )
    rows, _ = run_bench(sector_4k_mount, matrix)
    by_point = {point_of(r): r for r in rows}
    for point, row in by_point.items():
        refused = point.direct and point.misaligned_bytes and not point.aggregated
        if refused:
            assert row["error"].startswith("EINVAL: this storage refuses O_DIRECT at an offset misaligned by 512 B")
            assert row["throughput_bytes_per_s"] is None
        else:
            assert row["error"] is None and row["throughput_bytes_per_s"] > 0, point
    assert any(p.direct and p.misaligned_bytes and p.aggregated for p in by_point)
    assert sorted(p.name for p in sector_4k_mount.iterdir()) == ["lost+found"]


@pytest.mark.slow
@pytest.mark.io_uring
def test_repeat_keeps_the_median_run_and_a_single_point_matrix_runs_once(tmp_path, io_uring):
    single = {name: (getattr(bm.BASELINE, name),) for name in bm.DIMENSIONS}
    matrix = bm.Matrix(
        values={**single, "size_bytes": (256 * KIB,)},
        baseline=dataclasses.replace(bm.BASELINE, size_bytes=256 * KIB),
        volume_bytes=2 * MIB,
    )
    assert matrix.pairs() == [] and matrix.points() == [matrix.baseline]
    rows, metadata = run_bench(tmp_path, matrix, repeat=3)
    assert len(rows) == 1 and metadata["repeat"] == 3
    runs = rows[0]["runs_elapsed_s"]
    assert len(runs) == 3 and rows[0]["elapsed_s"] == sorted(runs)[1]
    assert rows[0]["io_ops"] == 8 and rows[0]["volume_bytes"] == 2 * MIB


# -- failures ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.io_uring
def test_a_killed_writer_process_fails_the_bench_at_once_and_leaves_no_scratch(tmp_path, monkeypatch, io_uring):
    def die(self):
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(worker.StreamWriter, "run", die)
    matrix = make_matrix(quick=True, max_processes=2, sizes=(64 * KIB,), queue_depths=(4,), volume_bytes=MIB)
    with pytest.raises(BenchError, match="exited with code -9 before reporting"):
        run_bench(tmp_path, matrix)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(SCRATCH_PREFIX)]


@pytest.mark.slow
@pytest.mark.io_uring
def test_ctrl_c_stops_the_writers_removes_the_scratch_and_says_one_line(tmp_path, io_uring):
    import time

    target = tmp_path / "storage"
    proc = subprocess.Popen(
        [
            *CKPT_TRACE,
            "bench",
            "--target",
            str(target),
            "--quick",
            "--volume",
            "64MiB",
            "-o",
            str(tmp_path / "out"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not list(target.glob(f"{SCRATCH_PREFIX}*/writer*.data")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground process group
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert stderr.strip().splitlines() == ["ckpt-trace: interrupted"]
    assert list(target.iterdir()) == [] and not (tmp_path / "out").exists()
    assert wait_until_gone(proc.pid, timeout_s=10), "a writer process outlived the command"


def wait_until_gone(group: int, timeout_s: float) -> bool:
    """True once no process of process group ``group`` is left (polled, up to ``timeout_s``)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.slow
def test_bad_input_is_one_line_and_nothing_is_overwritten(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench.arrow").write_bytes(b"earlier results")
    cases = [
        (["--target", str(target)], "is not a directory"),
        (["--target", str(tmp_path / "t"), "-o", str(out)], "is not empty"),
        (["--target", str(tmp_path / "t"), "--sizes", "4KiB,lots"], "not a size"),
        (["--target", str(tmp_path / "t"), "--queue-depths", "0"], "must be positive"),
        (["--target", str(tmp_path / "t"), "--queue-depths", "8x"], "not a queue depth"),
        (["--target", str(tmp_path / "t"), "--volume", "0"], "at least one byte"),
        (["--target", str(tmp_path / "t"), "--aggregate-size", "0"], "at least one byte"),
        (["--target", str(tmp_path / "t"), "--repeat", "0", "-o", str(tmp_path / "o2")], "--repeat"),
    ]
    for args, message in cases:
        proc = cli("bench", *args, check=False, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    assert (out / "bench.arrow").read_bytes() == b"earlier results"


@pytest.mark.root
def test_too_little_space_is_refused_before_any_write(small_tmpfs, tmp_path):
    proc = cli("bench", "--target", str(small_tmpfs), "--quick", "-o", str(tmp_path / "o"), check=False)
    assert proc.returncode == 2 and "MiB free; the bench needs" in proc.stderr
    assert list(small_tmpfs.iterdir()) == [] and not (tmp_path / "o").exists()


def test_read_bench_rejects_foreign_and_truncated_files(tmp_path):
    golden = sorted((Path(__file__).parent.parent / "traces" / "golden").glob("*.arrow"))
    assert golden, "the golden traces are committed"
    with pytest.raises(BenchError, match="missing the schema metadata key ckpt_trace.bench"):
        read_bench(golden[0])
    import pyarrow as pa

    from ckpt_trace.bench.results import to_table, write_table

    row = {
        **dataclasses.asdict(POINT),
        "volume_bytes": MIB,
        "elapsed_s": 0.5,
        "runs_elapsed_s": [0.5],
        "throughput_bytes_per_s": 2.0 * MIB,
        "io_ops": 16,
        "latency_p50_ns": 1,
        "latency_p99_ns": 2,
        "latency_max_ns": 3,
        "cpu_s": 0.1,
        "error": None,
    }
    path = tmp_path / "bench.arrow"
    write_table(to_table([row], {"volume_bytes": MIB}), path)
    table, metadata = read_bench(path)
    assert table.to_pylist() == [row] and metadata["version"] == 2
    # A version 1 file (writes only: write_ops, no direction) reads as version 2.
    old = {k: v for k, v in row.items() if k not in ("io_ops", "direction")} | {"write_ops": 16}
    v1 = pa.Table.from_pylist([old]).replace_schema_metadata(
        {
            b"ckpt_trace.bench": json.dumps(
                {"format": "ckpt-trace-bench", "version": 1, "values": {"size_bytes": [64 * KIB]}}
            ).encode()
        }
    )
    write_table(v1, path)
    table, metadata = read_bench(path)
    assert table.to_pylist() == [row] and metadata["version"] == 2 and metadata["values"]["direction"] == ["write"]
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(BenchError, match="not a readable Arrow file"):
        read_bench(path)
    other = pa.table({"x": [1]}).replace_schema_metadata({b"ckpt_trace.bench": b'{"format": "x", "version": 9}'})
    write_table(other, path)
    with pytest.raises(BenchError, match="version 9 is not supported"):
        read_bench(path)


@settings(max_examples=25)
@given(point=points)
def test_describe_and_labels_never_fail(point):
    assert ("reads" if point.direction == "read" else "writes") in bm.describe(point)
    for name in bm.DIMENSIONS:
        assert bm.label(name, getattr(point, name))
