"""The CUPTI subscriber's bookkeeping, run against a stand-in libcupti (tests/data/fake_cupti.c) so that it needs
no GPU: copies it wrote are counted as records, copies a failed write(2) lost as unwritten (never as written),
and a CUPTI call that fails is named in the status file."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from ckpt_trace.tracer import gpu

CC = os.environ.get("CC", "cc")
pytestmark = pytest.mark.skipif(shutil.which(shlex.split(CC)[0]) is None, reason="no C compiler")


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """(the subscriber, the stand-in libcupti), both compiled for this module."""
    directory = tmp_path_factory.mktemp("cupti")
    fake = directory / "libfakecupti.so"
    subprocess.run(
        [*shlex.split(CC), "-shared", "-fPIC", "-Wall", "-o", str(fake), str(REPO / "tests" / "data" / "fake_cupti.c")],
        check=True,
    )
    return gpu.build_injection(directory / "cache"), fake


def _inject(libraries, out, *, file_limit_bytes: int | None = None, **env) -> dict[str, str]:
    """Load the subscriber into a fresh Python as the CUDA driver would, exit (the subscriber flushes at exit);
    return its status file's fields. ``file_limit_bytes``: RLIMIT_FSIZE for that process (SIGXFSZ ignored, so a
    write past it fails with EFBIG, setrlimit(2))."""
    subscriber, fake = libraries
    limit = (
        f"signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({file_limit_bytes}, {file_limit_bytes})); "
        if file_limit_bytes
        else ""
    )
    script = f"import ctypes, resource, signal; {limit}ctypes.CDLL({str(subscriber)!r}).InitializeInjection()"
    environment = {**os.environ, "CKPT_TRACE_GPU_DIR": str(out), "CKPT_TRACE_CUPTI_LIB": str(fake), **env}
    subprocess.run([sys.executable, "-c", script], check=True, env=environment)
    status = next(out.glob("status-*.txt"))
    return dict(line.split(" ", 1) for line in status.read_text().splitlines())


def test_written_copies_are_counted_and_read_back(libraries, tmp_path):
    fields = _inject(libraries, tmp_path, FAKE_CUPTI_RECORDS="300")  # more than one batch of 256
    assert fields["state"] == "ok" and fields["records"] == "300" and fields["unwritten"] == "0"
    records, summary = gpu.GpuCapture(gpu.GpuPlan(True, "test", libraries[0], libraries[1]), tmp_path).collect()
    assert summary["records"] == 300 and not summary["errors"]
    assert records["bytes"].tolist() == [4096 * (i + 1) for i in range(300)]


def test_copies_a_failed_write_lost_are_counted_as_lost_not_written(libraries, tmp_path):
    """The copies file may not grow past 4 records (RLIMIT_FSIZE): of 10 copies, write(2) takes 4, then fails
    with EFBIG; the status counts 4 written and 6 lost, says why, and the 4 read back."""
    fields = _inject(libraries, tmp_path, file_limit_bytes=4 * gpu.COPY_RECORD.itemsize, FAKE_CUPTI_RECORDS="10")
    assert fields["records"] == "4" and fields["unwritten"] == "6"
    assert fields["state"] == f"error writing the copies file: {os.strerror(errno.EFBIG)} (6 records lost)"
    records, summary = gpu.GpuCapture(gpu.GpuPlan(True, "test", *libraries), tmp_path).collect()
    assert len(records) == 4 and next(iter(summary["errors"].values())).startswith("writing the copies file")


def test_a_failed_cupti_call_is_named_in_the_status(libraries, tmp_path):
    """cuptiActivityEnable refused (CUPTI_ERROR_NOT_INITIALIZED, 17): no records, and the status says which
    call failed and why, instead of "ok"."""
    fields = _inject(libraries, tmp_path, FAKE_CUPTI_ENABLE_RC="17")
    assert fields["state"] == "error cuptiActivityEnable: CUPTI_ERROR_NOT_INITIALIZED (CUPTI result 17)"
    assert fields["records"] == "0"
