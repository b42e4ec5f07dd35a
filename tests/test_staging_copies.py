"""The emitted writer's staging copies (``writer.staging.copy_bytes``): the same bytes as
``torch.Tensor.copy_``, made by the calling thread alone, so a save from several ranks on a node starts
no OpenMP workers that spin on the other ranks' cores (benchmarks/ranks_per_node.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.mark.torch
def test_copy_bytes_gives_what_copy_gives(torch_installed):
    import torch

    from ckpt_trace.writer.staging import copy_bytes

    gen = torch.Generator().manual_seed(3)
    source = torch.randn(64, 48, generator=gen)
    cases = [
        (torch.empty(64, 48), source),  # contiguous, one dtype: the memmove
        (torch.empty(48, 64), source.t()),  # a transposed view: not contiguous
        (torch.empty(64, 48, dtype=torch.float64), source),  # a dtype conversion
        (torch.empty(64, 48), source[:1].expand(64, 48)),  # broadcast rows
        (torch.empty(0), torch.empty(0)),  # nothing to copy
        (torch.empty(8, dtype=torch.complex64), torch.randn(8, dtype=torch.complex64, generator=gen).conj()),
        (  # quantized: copy_ carries the scale and zero point too
            torch.quantize_per_tensor(torch.zeros(16), 1.0, 3, torch.qint8),
            torch.quantize_per_tensor(torch.randn(16, generator=gen), 0.1, 0, torch.qint8),
        ),
    ]
    for dst, src in cases:
        expected = dst.clone().copy_(src)
        copy_bytes(dst, src)
        if dst.is_quantized:
            assert torch.equal(dst.int_repr(), expected.int_repr()) and dst.q_scale() == expected.q_scale()
        else:
            assert torch.equal(dst.view(-1).view(torch.uint8), expected.view(-1).view(torch.uint8)), dst.dtype
    raw = torch.arange(256, dtype=torch.uint8).repeat(1000)
    dst = torch.zeros_like(raw)
    copy_bytes(dst[100:], raw[:-100])  # slices of 1-D byte tensors, as the staging buffers take them
    assert torch.equal(dst[100:], raw[:-100]) and not dst[:100].any()


_CHILD = textwrap.dedent(
    """
    import os, sys, tempfile, time, warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed.checkpoint as dcp
    from ckpt_trace.writer import CheckpointReader, CheckpointWriter, WriterOptions

    torch.set_num_threads(2)
    state = {f"t{i}": torch.frombuffer(bytearray(os.urandom(8 << 20)), dtype=torch.uint8) for i in range(3)}
    state["small"] = torch.frombuffer(bytearray(os.urandom(5000)), dtype=torch.uint8)
    dest = {k: torch.frombuffer(bytearray(v.numel()), dtype=torch.uint8) for k, v in state.items()}
    def tasks():
        return set(os.listdir("/proc/self/task"))

    def left():
        # Threads started since ``before`` that are still there: a joined Python thread may be listed for a
        # moment after join() returns (its OS thread is still exiting), an OpenMP worker stays parked for good.
        deadline = time.monotonic() + 2
        while (new := tasks() - before) and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(new)

    before = tasks()  # torch.zeros_like would start the workers here: a large fill is parallel too
    options = WriterOptions(checksums=False, queue_depth=4, load_direct_io=sys.argv[2] == "direct")
    dcp.save(state, storage_writer=CheckpointWriter(sys.argv[1], options), no_dist=True)
    after_save = left()
    dcp.load(dest, storage_reader=CheckpointReader(sys.argv[1], options), no_dist=True)  # the bytes, checked
    same = all(torch.equal(dest[k], state[k]) for k in state)
    print(after_save, same)
    """
)


def _threads_left(directory, way: str, torch_copies: bool) -> tuple[int, bool]:
    env = {**os.environ, "CKPT_TRACE_WRITER_SINGLE_THREAD_COPIES": "0" if torch_copies else "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(directory), way], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    save, same = proc.stdout.split()
    return int(save), same == "True"


@pytest.mark.slow
@pytest.mark.torch
def test_a_save_starts_no_openmp_workers(tmp_path, torch_installed):
    way = "direct"  # how the bytes are loaded back to be compared
    # The control: torch's copy_ of these 8 MiB tensors starts OpenMP workers (libgomp keeps them alive after
    # the parallel region), which is what the test looks for. Without it nothing here could fail.
    control = _threads_left(tmp_path / "control", way, torch_copies=True)
    if control[0] == 0:
        pytest.skip("torch's copy_ starts no OpenMP worker threads on this machine (one core, or no OpenMP)")
    save, same = _threads_left(tmp_path / "checkpoint", way, torch_copies=False)
    assert same and control[1]
    assert save == 0, f"threads left by the save: {save} (control {control})"
