"""Shared fixtures: capability checks that skip with a reason, or fail under CI=true on our machines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNDER_CI = os.environ.get("CI") == "true"
REPO = Path(__file__).resolve().parent.parent


def _missing(reason: str, required_in_ci: bool) -> None:
    if UNDER_CI and required_in_ci:
        pytest.fail(f"required under CI=true but unavailable: {reason}")
    pytest.skip(reason)


@pytest.fixture
def bcc_backend():
    """Skip (or fail under CI) unless the bcc backend can run here."""
    from ckpt_trace.tracer import bcc_backend as backend

    problem = backend.probe()
    if problem:
        _missing(f"bcc backend unavailable: {problem}", required_in_ci=True)
    return "bcc"


@pytest.fixture
def strace_backend():
    if shutil.which("strace") is None:
        _missing("strace is not installed", required_in_ci=True)
    return "strace"


@pytest.fixture(params=["strace", "bcc"])
def backend(request):
    """Each tracing backend in turn."""
    return request.getfixturevalue(f"{request.param}_backend")


@pytest.fixture
def torch_installed():
    try:
        import torch  # noqa: F401
    except ImportError:
        _missing("torch is not installed (pip install 'ckpt-trace[torch]')", required_in_ci=True)


def cli(*args: str, check: bool = True, cwd: str | os.PathLike | None = None, timeout: float = 600):
    """Run ``ckpt-trace ARGS`` in a subprocess with this interpreter; return the CompletedProcess."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    proc = subprocess.run([sys.executable, "-m", "ckpt_trace.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"ckpt-trace {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def record_odd_pattern(backend: str, workdir: Path) -> tuple[Path, list[dict], Path]:
    """Record the odd-pattern workload into workdir; return (trace, kernel-observed ops, output dir)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "out"
    expected = workdir / "expected.json"
    trace = workdir / f"{backend}.arrow"
    cli("record", "--backend", backend, "-o", str(trace), "--path-filter", f"{out}/", "--",
        sys.executable, "-m", "ckpt_trace.workloads.odd_pattern", str(out), str(expected))
    return trace, json.loads(expected.read_text()), out


@pytest.fixture
def io_uring():
    """Skip (or fail under CI) unless io_uring works here through pyuring."""
    from ckpt_trace.replayer.uring import io_uring_available

    problem = io_uring_available()
    if problem:
        _missing(f"io_uring unavailable: {problem}", required_in_ci=True)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        _missing("mounting a tmpfs needs root", required_in_ci=True)
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)
