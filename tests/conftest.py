"""Shared fixtures: capability checks that skip with a reason, or fail under CI=true on our machines."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

UNDER_CI = os.environ.get("CI") == "true"
# Replays of the tests' small traces need no verdict: one round unless a test asks (--repeat, or
# test_verdicts' explicit Rounds); the default 3-20 rounds would multiply the suite's time.
os.environ.setdefault("CKPT_TRACE_REPLAY_MIN_ROUNDS", "1")
os.environ.setdefault("CKPT_TRACE_REPLAY_MAX_ROUNDS", "3")
REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "traces" / "golden"  # the committed golden traces (made by scripts/golden.py)
DCP = GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow"  # a 2-rank DCP save of gpt2-tiny, recorded by bcc
ODD = GOLDEN / "v1-odd-pattern-strace.arrow"  # the odd-pattern workload, recorded by strace
_SYSTEM_TMP = tempfile.gettempdir()


@pytest.fixture(scope="session", autouse=True)
def _earlier_runs_pruned(tmp_path_factory, pytestconfig):
    """Remove pytest's numbered base directories of runs before the previous one now, at this run's start:
    pytest removes them only at the end (its ``tmp_path_retention_count``, 1 here), so a run started
    beside three old ones, about 10 GB each before the retention policy was "failed", could fill the disk
    midway. Only ``pytest-of-USER/pytest-N`` directories, older than this run's by more than the count,
    and with no ``.lock`` (a live session's) are removed; a ``--basetemp`` run removes nothing."""
    base = tmp_path_factory.getbasetemp()
    keep = int(pytestconfig.getini("tmp_path_retention_count"))
    if not (base.parent.name.startswith("pytest-of-") and base.name.startswith("pytest-")):
        return
    number = base.name.removeprefix("pytest-")
    if not number.isdigit():
        return
    for old in base.parent.glob("pytest-*"):
        suffix = old.name.removeprefix("pytest-")
        if suffix.isdigit() and int(suffix) < int(number) - keep and not (old / ".lock").exists():
            shutil.rmtree(old, ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_tmpdir(monkeypatch, tmp_path_factory):
    """Each test its own $TMPDIR: the scratch a killed recording leaves there (strace logs, GPU subscriber
    directories), which the next ``record`` names on stderr, belongs to the test that made it, never to a
    later test that counts stderr lines (nor to what other runs on this machine left in /tmp). Short
    (``/tmp/ctt-XXXXXXXX``): AF_UNIX socket paths made under it stay within their 108 bytes."""
    tmp_path_factory.getbasetemp()  # pytest's own base (tmp_path), fixed from the system's $TMPDIR before ours
    path = tempfile.mkdtemp(prefix="ctt-", dir=_SYSTEM_TMP)
    monkeypatch.setenv("TMPDIR", path)
    monkeypatch.setattr(tempfile, "tempdir", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_cold_way(monkeypatch, _own_tmpdir):
    """Each test starts with no cold way measured: the emitted reader keeps the way it measured per device
    for the rest of the process (``ckpt_trace.writer.load._COLD_WAYS``) and for later processes of the boot
    (a file, ``config.READER_COLD_WAYS``), so an earlier test's large cold load would otherwise decide how a
    later test's cold load reads. The file is the test's own (under its $TMPDIR, which ``_own_tmpdir``
    made), for the test's processes too, and never the user's."""
    path = os.path.join(_own_tmpdir, "reader-cold-ways.json")
    monkeypatch.setenv("CKPT_TRACE_READER_COLD_WAYS", path)
    config = sys.modules.get("ckpt_trace.config")
    if config is not None:
        monkeypatch.setattr(config, "READER_COLD_WAYS", path)
    module = sys.modules.get("ckpt_trace.writer.load")  # not imported here: torch stays unloaded where unused
    if module is not None:
        module._COLD_WAYS.clear()
    yield
    module = sys.modules.get("ckpt_trace.writer.load")
    if module is not None:
        module._COLD_WAYS.clear()


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


CKPT_TRACE = (sys.executable, "-m", "ckpt_trace.cli")  # the command ckpt-trace with this interpreter


def cli(*args: str, check: bool = True, cwd: str | os.PathLike | None = None, timeout: float = 600):
    """Run ``ckpt-trace ARGS`` in a subprocess with this interpreter; return the CompletedProcess."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    proc = subprocess.run(
        [*CKPT_TRACE, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"ckpt-trace {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def record(backend: str | None, trace: Path, path_filter: str | os.PathLike, *command: str, check: bool = True):
    """``ckpt-trace record [--backend BACKEND] -o TRACE --path-filter PATH_FILTER -- COMMAND`` (``cli``; the
    default backend where ``backend`` is None); return the CompletedProcess."""
    chosen = ("--backend", backend) if backend is not None else ()
    return cli("record", *chosen, "-o", str(trace), "--path-filter", str(path_filter), "--", *command, check=check)


def cli_without(module: str, *args: str):
    """``ckpt-trace ARGS`` in a subprocess where ``import MODULE`` fails (ImportError): the CompletedProcess."""
    hide = f"import runpy, sys; sys.modules[{module!r}] = None; runpy.run_module('ckpt_trace.cli', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", hide, *args], capture_output=True, text=True, timeout=600)


def one_line(proc) -> str:
    """The one line a failed command printed on stderr (asserting it is one line and no traceback)."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def record_odd_pattern(backend: str, workdir: Path) -> tuple[Path, list[dict], Path]:
    """Record the odd-pattern workload into workdir; return (trace, kernel-observed ops, output dir)."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "out"
    expected = workdir / "expected.json"
    trace = workdir / f"{backend}.arrow"
    record(backend, trace, f"{out}/", sys.executable, "-m", "ckpt_trace.workloads.odd_pattern", str(out), str(expected))
    return trace, json.loads(expected.read_text()), out


@pytest.fixture(scope="session")
def odd_recordings(tmp_path_factory):
    """One recording of the odd-pattern workload per backend for the whole session (the trace and the
    workload's files are read-only to tests): ``odd_recordings(backend)`` -> (trace, expected ops, out dir)."""
    cache: dict[str, tuple[Path, list[dict], Path]] = {}

    def get(backend: str):
        if backend not in cache:
            cache[backend] = record_odd_pattern(backend, tmp_path_factory.mktemp(f"odd-{backend}"))
        return cache[backend]

    return get


@pytest.fixture
def odd_strace(strace_backend, odd_recordings):
    """The session's strace recording of the odd-pattern workload: (trace, expected ops, out dir)."""
    return odd_recordings("strace")


@pytest.fixture
def odd_recording(backend, odd_recordings):
    """The session's recording of the odd-pattern workload by each backend in turn."""
    return odd_recordings(backend)


@pytest.fixture
def io_uring():
    """Skip (or fail under CI) unless io_uring works here (ckpt-trace's ring can be set up)."""
    from ckpt_trace.replayer.uring import io_uring_available

    problem = io_uring_available()
    if problem:
        _missing(f"io_uring unavailable: {problem}", required_in_ci=True)


@contextlib.contextmanager
def mounted_tmpfs(mount: Path, options: str, what: str = "a tmpfs"):
    """A tmpfs mounted with ``options`` (mount(8) ``-o``) on the new directory ``mount``, unmounted afterwards;
    root only (skips, or fails under CI, naming ``what``)."""
    if os.geteuid() != 0:
        _missing(f"mounting {what} needs root", required_in_ci=True)
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (root only), unmounted afterwards."""
    with mounted_tmpfs(tmp_path / "small", "size=1m") as mount:
        yield mount


# -- markers ------------------------------------------------------------------------------------------------
# Capabilities follow from the fixtures a test asks for (bcc_backend: bcc and root, ...), and so does ``slow``
# for the fixtures that record, start processes or build file systems. Every other slow test says so itself
# (``@pytest.mark.slow``): test_markers.py fails, naming it, for a test that starts a process (the CLI, a
# subprocess, a recording, a replay) without either. ``make test-fast`` runs ``-m "not slow"``.
_CAPABILITY_MARKERS = {
    "bcc_backend": ("bcc", "root"),
    "strace_backend": ("strace",),
    "io_uring": ("io_uring",),
    "torch_installed": ("torch",),
    "small_tmpfs": ("root",),
    "sector_4k_mount": ("root",),
}
_SLOW_FIXTURES = {
    "odd_recordings",
    "backend",
    "bcc_backend",
    "strace_backend",
    "torch_installed",
    "chromium",
    "small_tmpfs",
    "sector_4k_mount",
    "baseline",
    "report_page",
}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        for fixture, markers in _CAPABILITY_MARKERS.items():
            if fixture in fixtures:
                for marker in markers:
                    item.add_marker(marker)
        if fixtures & _SLOW_FIXTURES:
            item.add_marker("slow")
