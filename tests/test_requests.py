"""Request-level and memory-mapped I/O in traces: compared with what the engines themselves say they did.

fio's own ``--write_iolog`` is the truth for io_uring and libaio requests;
the safetensors header for what a load must read; the files on disk for
what a save wrote. Every recording here is real: fio, the project's own
emitted writer and reader, safetensors, the libaio and memmap workloads.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections import Counter
from pathlib import Path

import pytest
from conftest import CKPT_TRACE, _missing, cli, record
from helpers.fio import fio_iolog

from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import replay
from ckpt_trace.replayer.plan import merge_ranges

# The jobs of issue 11's acceptance test: iodepth 8, O_DIRECT; write 1 MiB, randwrite 4 KiB, randread 4 KiB.
FIO_JOBS = {
    "write-1m": ("write", "1m", "32m"),
    "randwrite-4k": ("randwrite", "4k", "2m"),
    "randread-4k": ("randread", "4k", "2m"),
}


@pytest.fixture
def fio():
    if shutil.which("fio") is None:
        _missing("fio is not installed", required_in_ci=True)
    return "fio"


def _fio_script(directory: Path, engines: tuple[str, ...]) -> str:
    commands = []
    for engine in engines:
        for name, (rw, bs, size) in FIO_JOBS.items():
            commands.append(
                f"fio --name={engine}-{name} --directory={directory} --ioengine={engine} --iodepth=8 "
                f"--direct=1 --rw={rw} --bs={bs} --size={size} --output=/dev/null "
                f"--write_iolog={directory.parent}/{engine}-{name}.iolog"
            )
    return " && ".join(commands)


@pytest.fixture(scope="session")
def fio_recordings(tmp_path_factory):
    """``fio_recordings(backend)``: one recording per backend of every FIO_JOBS job through the engines that
    backend can see (bcc: io_uring and libaio; strace: libaio) -> (trace, directory of the iologs)."""
    cache: dict[str, tuple[Path, Path]] = {}

    def get(backend: str):
        if backend not in cache:
            work = tmp_path_factory.mktemp(f"fio-{backend}")
            data = work / "data"
            data.mkdir()
            engines = ("io_uring", "libaio") if backend == "bcc" else ("libaio",)
            trace = work / "fio.arrow"
            record(backend, trace, f"{data}/", "sh", "-c", _fio_script(data, engines))
            cache[backend] = (trace, work)
        return cache[backend]

    return get


@pytest.mark.parametrize("job", list(FIO_JOBS))
@pytest.mark.parametrize("engine,backend_name", [("io_uring", "bcc"), ("libaio", "bcc"), ("libaio", "strace")])
def test_every_request_in_fios_own_iolog_is_in_the_trace_exactly(
    fio, fio_recordings, request, engine, backend_name, job
):
    request.getfixturevalue(f"{backend_name}_backend")
    trace_path, work = fio_recordings(backend_name)
    expected = fio_iolog(work / f"{engine}-{job}.iolog")
    rows = read_trace(trace_path).table.to_pylist()
    got = Counter(
        (r["path"], r["op"], r["offset"], r["size"])
        for r in rows
        if r["interface"] == engine and r["op"] in ("read", "write") and f"/{engine}-{job}." in r["path"]
    )
    assert sum(expected.values()) >= 32
    assert got == expected
    mine = [
        r
        for r in rows
        if r["interface"] == engine and r["path"] and f"/{engine}-{job}." in r["path"] and r["op"] in ("read", "write")
    ]
    assert all(r["ret"] == r["size"] and r["queue_id"] is not None and 1 <= r["in_flight"] <= 8 for r in mine)
    assert max(r["in_flight"] for r in mine) > 1, "fio keeps 8 in flight; the trace must show depth"


def test_summary_reports_request_bytes_per_interface(fio, bcc_backend, fio_recordings):
    trace, _ = fio_recordings("bcc")
    data = json.loads(cli("summary", str(trace), "--json").stdout)
    written = {name: entry["bytes_written"] for name, entry in data["interfaces"].items()}
    jobs_written = sum(int(size[:-1]) << 20 for rw, _, size in FIO_JOBS.values() if "write" in rw)
    assert written["io_uring"] == written["libaio"] == jobs_written


def test_strace_trace_says_what_it_could_not_see(fio, strace_backend, tmp_path, io_uring):
    data = tmp_path / "data"
    data.mkdir()
    trace = tmp_path / "t.arrow"
    proc = record(
        "strace",
        trace,
        f"{data}/",
        "fio",
        "--name=u",
        f"--directory={data}",
        "--ioengine=io_uring",
        "--iodepth=4",
        "--rw=write",
        "--bs=64k",
        "--size=1m",
        "--output=/dev/null",
    )
    meta = read_trace(trace).metadata
    assert meta["unseen"]["io_uring_requests"]["count"] == 16  # 1 MiB in 64 KiB requests, each submitted once
    assert "io_uring" in proc.stderr and "not in the trace" in proc.stderr


# -- the project's own writer and reader, traced -------------------------------------------------------------


def _coverage(rows: list[dict], path: str, op: str) -> list[tuple[int, int]]:
    return merge_ranges(
        [
            (r["offset"], r["offset"] + max(r["ret"], 0))
            for r in rows
            if r["path"] == path and r["op"] == op and r["offset"] is not None and r["ret"] > 0
        ]
    )


def test_emitted_writer_and_reader_are_covered_by_their_trace(bcc_backend, torch_installed, io_uring, tmp_path):
    out = tmp_path / "ck"
    save, load = tmp_path / "save.arrow", tmp_path / "load.arrow"
    emitted = (*CKPT_TRACE, "workload", "emitted", "--out", str(out), "--model", "gpt2-tiny", "--ranks", "2")
    record("bcc", save, f"{out}/", *emitted)
    rows = read_trace(save).table.to_pylist()
    data_files = sorted(p for p in out.iterdir() if p.suffix == ".data")
    assert data_files
    for path in data_files:
        assert _coverage(rows, str(path), "write") == [(0, path.stat().st_size)], path.name
    assert any(r["interface"] == "io_uring" for r in rows), "the emitted writer submits through io_uring"
    report = replay(save, target=tmp_path / "replayed", strategy="posix")
    assert report.size_mismatches == ()
    for path in data_files:
        assert (tmp_path / "replayed" / str(path).lstrip("/")).stat().st_size == path.stat().st_size
    # Cold, as the O_DIRECT writes left them (a file the page cache holds would be copied out of a mapping:
    # page faults, not these read requests): evicted explicitly, so a cache that kept some pages cannot decide
    for path in data_files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    record("bcc", load, f"{out}/", *emitted, "--load")
    rows = read_trace(load).table.to_pylist()
    for path in data_files:
        covered = _coverage(rows, str(path), "read")
        # every stored byte is read, in one stretch: all but the file's alignment padding (under 4 KiB)
        assert covered and covered[0][0] == 0 and covered[-1][1] > path.stat().st_size - 4096 and len(covered) == 1


def _safetensors_ranges(path: Path) -> list[tuple[int, int]]:
    """Byte ranges of the tensors in a safetensors file, from its own header (8-byte length, JSON)."""
    raw = path.read_bytes()
    (length,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8 : 8 + length])
    base = 8 + length
    return merge_ranges(
        [
            (base + e["data_offsets"][0], base + e["data_offsets"][1])
            for name, e in header.items()
            if name != "__metadata__"
        ]
    )


def test_safetensors_load_file_of_four_shards_is_covered_page_by_page(bcc_backend, torch_installed, tmp_path):
    out = tmp_path / "st"
    cli("workload", "safetensors", "--shards", "4", "--out", str(out), "--model", "gpt2-tiny")
    trace = tmp_path / "load.arrow"
    record(
        "bcc",
        trace,
        f"{out}/",
        *CKPT_TRACE,
        "workload",
        "safetensors",
        "--shards",
        "4",
        "--load",
        "--drop-caches",
        "--out",
        str(out),
        "--model",
        "gpt2-tiny",
    )
    rows = read_trace(trace).table.to_pylist()
    shards = sorted(out.glob("model-*-of-00004.safetensors"))
    assert len(shards) == 4
    for shard in shards:
        covered = _coverage(rows, str(shard), "read")
        mapped = [r for r in rows if r["path"] == str(shard) and r["interface"] == "mmap" and r["op"] == "read"]
        assert mapped and all(r["offset_source"] == "page" and r["offset"] % 4096 == 0 for r in mapped)
        for start, end in _safetensors_ranges(shard):
            assert any(s <= start and end <= e for s, e in covered), (shard.name, start, end, covered)


# -- libaio and memmap workloads, replayed as recorded ---------------------------------------------------------


@pytest.mark.parametrize("engine", ["libaio", "memmap"])
def test_workload_replays_with_its_interface_and_verifies(bcc_backend, torch_installed, io_uring, tmp_path, engine):
    out = tmp_path / "ck"
    trace = tmp_path / "t.arrow"
    record("bcc", trace, f"{out}/", *CKPT_TRACE, "workload", engine, "--out", str(out), "--model", "gpt2-tiny")
    rows = read_trace(trace).table.to_pylist()
    interface = "libaio" if engine == "libaio" else "mmap"
    data_file = next(out.glob("model.*.bin"))
    written = _coverage(rows, str(data_file), "write")
    if engine == "libaio":
        assert written == [(0, -(-data_file.stat().st_size // 4096) * 4096)]  # whole 4 KiB blocks, then cut
    else:
        assert written and written[0][0] == 0
    assert any(r["interface"] == interface and r["op"] == "write" for r in rows)
    report = replay(trace, target=tmp_path / "r", strategy="posix", verify=True)
    assert report.size_mismatches == ()
    assert (tmp_path / "r" / str(data_file).lstrip("/")).stat().st_size == data_file.stat().st_size
    assert report.results[0].verified_files >= 1


# -- closed loop: a replay, itself recorded, writes what the recording wrote --------------------------------


@pytest.mark.parametrize("strategy", ["posix", "uring-direct", "aggregated"])
def test_recorded_replay_of_a_recorded_save_writes_the_same_data(
    bcc_backend, torch_installed, io_uring, tmp_path, strategy
):
    original = tmp_path / "orig.arrow"
    record(
        "bcc",
        original,
        f"{tmp_path}/ck/",
        *CKPT_TRACE,
        "workload",
        "dcp",
        "--out",
        str(tmp_path / "ck"),
        "--ranks",
        "2",
        "--model",
        "gpt2-tiny",
        "--with-optimizer",
    )
    replayed = tmp_path / "replayed.arrow"
    record(
        "bcc",
        replayed,
        f"{tmp_path}/t/",
        *CKPT_TRACE,
        "replay",
        str(original),
        "--target",
        str(tmp_path / "t"),
        "--strategy",
        strategy,
    )
    data = json.loads(cli("diff", str(original), str(replayed), "--json").stdout)
    written = data["data_written"]
    assert written["match"], written
    assert written["files_a"] == 3 and written["bytes_a"] == written["bytes_b"] > 6_000_000
    assert data["files_only_in_a"] == data["files_only_in_b"] == []
    lines = cli("diff", str(original), str(replayed)).stdout.strip().splitlines()
    verdicts = [line for line in lines[-2:] if line.startswith("data ")]  # the output ends with its verdicts
    assert verdicts and verdicts[0].startswith("data written: the same in A and B: 3 files"), lines[-4:]
    # The same comparison finds a difference: the replay of another save (no optimizer state) is not this one.
    other = tmp_path / "other.arrow"
    record(
        "bcc",
        other,
        f"{tmp_path}/ck2/",
        *CKPT_TRACE,
        "workload",
        "dcp",
        "--out",
        str(tmp_path / "ck2"),
        "--ranks",
        "2",
        "--model",
        "gpt2-tiny",
    )
    assert not json.loads(cli("diff", str(original), str(other), "--json").stdout)["data_written"]["match"]
