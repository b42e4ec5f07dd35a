"""The GPU hop: the CUPTI subscriber builds and loads, copy records become rows on the trace's clock, copy rows
replay (or are skipped and counted without a GPU), and, on a GPU machine, a recorded DCP save of GPU tensors
holds one copy row per tensor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.compute as pc
import pytest
from conftest import CKPT_TRACE, REPO, cli
from helpers.traces import META

from ckpt_trace.formats import FORMAT_VERSION, read_trace, table_from_columns, vocabulary, write_trace
from ckpt_trace.tracer import gpu

GOLDEN = REPO / "traces" / "golden" / "v3-gpu-dcp-gpt2-tiny-1rank-strace.arrow"


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


needs_gpu = pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None and not os.environ.get("CC"), reason="no C compiler")


@pytest.mark.slow
@needs_cc
def test_the_subscriber_builds_and_says_why_it_records_nothing_without_cupti(tmp_path, monkeypatch):
    """The injection library builds with a C compiler alone, exports the driver's entry point, and loaded
    where no libcupti can be bound it writes a status line instead of failing the program."""
    library = gpu.build_injection(tmp_path / "cache")
    assert library.exists() and library == gpu.build_injection(tmp_path / "cache")  # cached by source hash
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    assert "InitializeInjection" in symbols
    out = tmp_path / "gpu"
    out.mkdir()
    script = (
        f"import ctypes, os; os.environ['CKPT_TRACE_GPU_DIR'] = {str(out)!r}; "
        f"os.environ['CKPT_TRACE_CUPTI_LIB'] = {str(tmp_path / 'no-libcupti.so')!r}; "
        f"print(ctypes.CDLL({str(library)!r}).InitializeInjection())"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "1"  # the driver goes on either way
    status = next(out.glob("status-*.txt")).read_text()
    assert status.startswith("state error cannot load CUPTI") and "clock_pair " in status
    records, summary = gpu.GpuCapture(gpu.GpuPlan(True, "test", library, None), out).collect()
    assert len(records) == 0 and summary["processes"] == 1
    assert next(iter(summary["errors"].values())).startswith("cannot load CUPTI")


def _records(pid: int) -> np.ndarray:
    records = np.zeros(4, gpu.COPY_RECORD)
    records["start_ns"] = [5_000, 1_000, 9_000, 12_000]
    records["end_ns"] = records["start_ns"] + [500, 250, 1_000, 0]
    records["bytes"] = [4096, 1 << 20, 512, 64]
    records["host_address"] = [0x7F00_0000_1000, 0, 0x1000, 0]
    records["pid"] = pid
    records["tid"] = [pid + 1, 0, pid, pid]
    records["stream"] = 7
    records["correlation"] = [11, 12, 13, 14]
    records["copy_kind"] = [2, 1, 2, 8]  # DtoH, HtoD, DtoH, DtoD
    records["src_kind"] = [3, 2, 3, 3]
    records["dst_kind"] = [1, 3, 2, 3]
    return records


def test_copy_records_become_rows_on_the_trace_clock(tmp_path):
    """Every field of a CUPTI record lands in its column; monotonic timestamps shift by the trace's start
    (bcc) or by the realtime offset first (strace); the trace reads back valid, in the current format version."""
    records = _records(pid=4242)
    cols = gpu.copy_columns(records, start_ns=900, realtime_offset_ns=None, ranks={4242: 3}, comms={4242: "python"})
    assert cols["ts_ns"] == [4_100, 100, 8_100, 11_100]
    assert cols["dur_ns"] == [500, 250, 1_000, 0]
    assert cols["op"] == ["copy_d2h", "copy_h2d", "copy_d2h", "copy_d2d"]
    assert cols["memory_kind"] == ["pageable", "pinned", "pinned", "device"]
    assert cols["tid"] == [4243, 4242, 4242, 4242]  # unknown thread: the process
    assert cols["address"] == [0x7F00_0000_1000, None, 0x1000, None]
    assert cols["rank"] == [3] * 4 and set(cols["interface"]) == {"cuda"}
    shifted = gpu.copy_columns(records, start_ns=10_000, realtime_offset_ns=9_500, ranks={}, comms={})
    assert shifted["ts_ns"][1] == 1_000 + 9_500 - 10_000 and shifted["rank"] == [-1] * 4
    path = write_trace(tmp_path / "t.arrow", table_from_columns(cols), META)
    trace = read_trace(path)
    assert trace.metadata["format_version"] == FORMAT_VERSION
    assert trace.table.column("device").to_pylist() == [0] * 4
    assert pc.sum(trace.table.column("size")).as_py() == 4096 + (1 << 20) + 512 + 64


@pytest.mark.slow
def test_gpu_on_without_cupti_refuses_before_the_command_runs(tmp_path):
    """``--gpu on`` where no libcupti exists: one line, exit 2, the command never ran, no trace."""
    marker = tmp_path / "ran"
    env = {**os.environ, "CKPT_TRACE_CUPTI_LIB": str(tmp_path / "missing.so")}
    proc = subprocess.run(
        [
            *CKPT_TRACE,
            "record",
            "--gpu",
            "on",
            "-o",
            str(tmp_path / "t.arrow"),
            "--",
            "touch",
            str(marker),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--gpu on" in proc.stderr and "libcupti" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists() and not (tmp_path / "t.arrow").exists()


@pytest.mark.slow
def test_the_golden_gpu_trace_reads_and_replays_without_a_gpu(tmp_path):
    """The DCP save recorded on an H100 (traces/golden/README.md): one copy row per tensor, inside the save's
    span, in the same trace as the writes; replayed where torch sees no GPU, the copies are skipped and
    counted, and the files come out at their recorded sizes."""
    trace = read_trace(GOLDEN)
    table = trace.table
    copies = table.filter(pc.equal(table.column("interface"), vocabulary.CUDA))
    expected = json.loads(GOLDEN.with_suffix(".tensors.json").read_text())
    d2h = copies.filter(pc.equal(copies.column("op"), vocabulary.COPY_D2H))
    assert sorted(d2h.column("size").to_pylist()) == sorted(expected["tensor_bytes"])
    assert set(d2h.column("memory_kind").to_pylist()) <= {"pageable", "pinned"}
    writes = table.filter(
        pc.and_(pc.equal(table.column("op"), "write"), pc.equal(table.column("interface"), "syscall"))
    )
    assert writes.num_rows > 0
    first_write, last_write = pc.min(writes.column("ts_ns")).as_py(), pc.max(writes.column("ts_ns")).as_py()
    assert pc.min(d2h.column("ts_ns")).as_py() < last_write and pc.max(d2h.column("ts_ns")).as_py() > 0
    assert first_write > 0
    if _has_gpu():
        pytest.skip("this machine has a GPU: the GPU replay test covers it")
    proc = cli(
        "replay",
        str(GOLDEN),
        "--target",
        str(tmp_path / "t"),
        "--strategy",
        "posix",
        "--json",
        "-o",
        str(tmp_path / "r.json"),
    )
    result = json.loads((tmp_path / "r.json").read_text())["results"][0]
    assert result["gpu_copies"]["skipped"] == copies.num_rows and result["gpu_copies"]["executed"] == 0
    assert "copy rows skipped" in proc.stderr
    for name, size in json.loads(GOLDEN.with_suffix(".sizes.json").read_text()).items():
        assert (tmp_path / "t" / name.lstrip("/")).stat().st_size == size


def _record_cuda_workload(tmp_path, engine: str):
    """Record ``ckpt-trace workload ENGINE --device cuda`` (gpt2-tiny, into tmp_path/ckpt) with ``--gpu on``:
    (trace path, its table, its device-to-host copy rows)."""
    trace_path = tmp_path / f"{engine}.arrow"
    cli(
        "record",
        "--gpu",
        "on",
        "-o",
        str(trace_path),
        "--",
        *CKPT_TRACE,
        "workload",
        engine,
        "--device",
        "cuda",
        "--model",
        "gpt2-tiny",
        "--out",
        str(tmp_path / "ckpt"),
    )
    table = read_trace(trace_path).table
    return trace_path, table, table.filter(pc.equal(table.column("op"), vocabulary.COPY_D2H))


@pytest.mark.slow
@pytest.mark.gpu
@needs_gpu
def test_a_recorded_dcp_save_of_gpu_tensors_holds_one_copy_per_tensor(tmp_path):
    """On the GPU machine: record a DCP save of CUDA tensors; the trace holds one device-to-host copy per
    tensor, bytes equal to the tensor's, inside the save's span, beside the writes; the replay re-executes
    the copies with the recorded memory kind and with pinned staging."""
    trace_path, table, d2h = _record_cuda_workload(tmp_path, "dcp")
    from ckpt_trace.workloads.engines import tensor_bytes

    assert sorted(d2h.column("size").to_pylist()) == sorted(tensor_bytes("gpt2-tiny", with_optimizer=False))
    writes = table.filter(pc.equal(table.column("op"), "write"))
    assert pc.min(d2h.column("ts_ns")).as_py() < pc.max(writes.column("ts_ns")).as_py()
    for mode in ("recorded", "pinned"):
        out = tmp_path / f"{mode}.json"
        cli(
            "replay",
            str(trace_path),
            "--target",
            str(tmp_path / mode),
            "--strategy",
            "posix",
            "--gpu-copies",
            mode,
            "--json",
            "-o",
            str(out),
        )
        copies = json.loads(out.read_text())["results"][0]["gpu_copies"]
        assert copies["executed"] == table.filter(pc.equal(table.column("interface"), "cuda")).num_rows
        assert copies["skipped"] == 0 and copies["bytes"] > 0


@pytest.mark.slow
@pytest.mark.gpu
@needs_gpu
def test_copy_timestamps_fall_between_the_programs_own_clock_reads(tmp_path):
    """The subscriber's clock is CLOCK_MONOTONIC: copies made between two clock reads of the program carry
    timestamps between them, with the program's thread, bytes, direction and host memory kind."""
    capture = gpu.GpuCapture(gpu.plan_capture("on"), tmp_path / "gpu")
    capture.directory.mkdir()
    program = (
        "import os, time, torch; x = torch.randn(1 << 20, device='cuda'); torch.cuda.synchronize(); "
        "t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC); a = x.cpu(); "
        "p = torch.empty(1 << 20, pin_memory=True); p.copy_(x); torch.cuda.synchronize(); "
        "t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC); print(t0, t1, os.getpid(), a.data_ptr(), p.data_ptr())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], env={**os.environ, **capture.env()}, capture_output=True, text=True, check=True
    )
    t0, t1, pid, pageable, pinned = (int(v) for v in proc.stdout.split())
    records, summary = capture.collect()
    d2h = records[(records["copy_kind"] == 2) & (records["start_ns"] >= t0)]
    assert summary["errors"] == {} and len(d2h) == 2
    assert (d2h["end_ns"] <= t1).all() and (d2h["bytes"] == 4 << 20).all() and (d2h["tid"] == pid).all()
    assert d2h["host_address"].tolist() == [pageable, pinned]
    assert d2h["dst_kind"].tolist() == [1, 2]  # pageable, then pinned


@pytest.mark.slow
@pytest.mark.gpu
@needs_gpu
def test_the_emitted_writer_stages_gpu_tensors_through_pinned_buffers(tmp_path):
    """The emitted writer saves CUDA tensors by asynchronous copies into page-locked staging buffers: the
    recorded copies are pinned, one or more per tensor, and the checkpoint loads back bit for bit."""
    _, table, d2h = _record_cuda_workload(tmp_path, "emitted")
    from ckpt_trace.workloads.engines import tensor_bytes

    assert set(d2h.column("memory_kind").to_pylist()) == {"pinned"}
    assert pc.sum(d2h.column("size")).as_py() == sum(tensor_bytes("gpt2-tiny", with_optimizer=False))
    cli("workload", "emitted", "--device", "cuda", "--model", "gpt2-tiny", "--out", str(tmp_path / "ckpt"), "--load")
