"""The engine conformance check shared by the per-engine test modules (``make test-engines``).

For one engine and one tracing backend: the engine saves a small model (``drive.py``) under
``ckpt-trace record --path-filter CKPT/``, and the same program runs once more under plain strace (its own
log is the reference); per file of the checkpoint, the data calls and bytes of the trace must equal
strace's (for io_uring engines on bcc, the requests must equal those perf saw on the kernel's
``io_uring:io_uring_submit_req`` tracepoint; for mapped I/O, the trace must leave no mapped byte
uncovered); the files the engine left must be the same in both runs. The trace then replays under every
strategy with ``--verify``, and each strategy's tree must hold the engine's files with the engine's sizes.
The load is checked the same way (its reads against strace's).

Set ``CKPT_TRACE_ENGINES=1`` to run (the default run skips these: they take minutes and need the engines,
``pip install 'ckpt-trace[engines]'``). ``CKPT_TRACE_ENGINES_REPORT=FILE`` appends one JSON line per
engine, backend and phase (the README's engine table is made from it).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import cli

from ckpt_trace.formats import read_metadata, read_trace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import drive  # noqa: E402
import ds_ops  # noqa: E402
import references  # noqa: E402

# Engines whose data moves through io_uring requests (compared with perf on bcc) or file mappings.
URING = {"runai": ("load",)}
MAPPED = {"memmap"}
LIBAIO = {"deepspeed-fast"}  # engines submitting libaio iocbs (compared iocb for iocb with strace's io_submit)
# What a backend cannot see: strace sees neither io_uring requests nor pages touched through a mapping.
STRACE_BLIND = {("runai", "load"), ("memmap", "save"), ("memmap", "load")}


def _skip_unless_enabled(engine: str) -> None:
    if os.environ.get("CKPT_TRACE_ENGINES") != "1":
        pytest.skip("engine conformance runs with CKPT_TRACE_ENGINES=1 (make test-engines)")
    module = {
        "torch-save": "torch",
        "dcp": "torch",
        "dcp-async": "torch",
        "hf": "transformers",
        "runai": "runai_model_streamer",
        "memmap": "numpy",
        "deepspeed-fast": "deepspeed",
    }.get(engine, engine)
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{drive.PACKAGES[engine]} is not installed (pip install 'ckpt-trace[engines]')")
    if shutil.which("strace") is None:
        pytest.skip("strace (the reference) is not installed")
    if engine.startswith("deepspeed"):
        lock = ds_ops.stale_lock(ds_ops.extensions_dir(_env()))
        if lock is not None:
            pytest.fail(
                f"{lock}: a killed build of a DeepSpeed op left this lock and no process holds it; every load would "
                "wait on it forever (remove it if no build is running)",
                pytrace=False,
            )
        reason = _prebuild(engine)
        if reason:
            pytest.skip(reason)


@functools.cache
def _prebuild(engine: str) -> str | None:
    """Build the engine's JIT ops (minutes, once: ``ds_ops``) by one untraced save, not inside a recording;
    the reason the engine cannot run here, or None."""
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run(
            _drive(engine, "save", Path(scratch) / "ckpt", Path(scratch) / "report.json"),
            capture_output=True,
            text=True,
            env=_env(),
            timeout=3600,
        )
    if proc.returncode == 0:
        return None
    if engine == "deepspeed-fast":
        return (
            f"DeepSpeed's FastPersist writer does not run here (its async_io op needs libaio-dev): "
            f"{proc.stderr.strip().splitlines()[-1:]}"
        )
    return f"DeepSpeed does not run here: {proc.stderr.strip().splitlines()[-1:]}"


def _drive(engine: str, phase: str, ckpt: Path, report: Path) -> list[str]:
    return [sys.executable, str(HERE / "drive.py"), engine, phase, str(ckpt), str(report)]


def _env() -> dict:
    env = ds_ops.env(os.environ)  # one ninja and one build directory for DeepSpeed's JIT ops
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _reference(engine: str, phase: str, ckpt: Path, report: Path, log: Path) -> None:
    # -s also bounds the elements of an array strace prints: libaio engines need their io_submit's iocbs.
    strings = "32" if engine in LIBAIO else "0"
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-y", "-s", strings, "-o", str(log), *_drive(engine, phase, ckpt, report)],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert proc.returncode == 0, f"{engine} {phase} under strace failed:\n{proc.stderr[-2000:]}"


def _record(backend: str, engine: str, phase: str, ckpt: Path, report: Path, trace: Path) -> None:
    env = _env()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpt_trace.cli",
            "record",
            "--backend",
            backend,
            "--path-filter",
            f"{ckpt}/",
            "-o",
            str(trace),
            "--",
            *_drive(engine, phase, ckpt, report),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, f"record {engine} {phase} ({backend}) failed:\n{proc.stderr[-3000:]}"


def _tree(root: Path) -> dict[str, int]:
    return {
        references.normalise(str(p.relative_to(root))): p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".ckpt-trace")
    }


def check(engine: str, backend: str, tmp_path: Path) -> None:
    """The whole check for ``engine`` on ``backend`` (see the module docstring)."""
    _skip_unless_enabled(engine)
    rec, ref = tmp_path / "rec" / "ckpt", tmp_path / "ref" / "ckpt"  # same name lengths: same strace output
    for phase in ("save", "load"):
        trace = tmp_path / f"{phase}.arrow"
        _record(backend, engine, phase, rec, tmp_path / f"rec-{phase}.json", trace)
        log = tmp_path / f"ref-{phase}.log"
        _reference(engine, phase, ref, tmp_path / f"ref-{phase}.json", log)
        table = read_trace(trace).table
        meta = read_metadata(trace)
        ours = references.trace_file_io(table, rec)
        theirs = references.strace_file_io(log, ref)
        line = {
            "engine": engine,
            "version": json.loads((tmp_path / f"rec-{phase}.json").read_text())["version"],
            "backend": backend,
            "phase": phase,
            "rows": table.num_rows,
            "lost_events": meta.get("lost_events"),
        }
        if (engine, phase) in STRACE_BLIND and backend == "strace":
            line["capture"] = "not visible to strace (io_uring requests or mapped pages)"
        else:
            bytes_ours = {k: (c["write_bytes"], c["read_bytes"]) for k, c in ours.items()}
            bytes_theirs = {k: (c["write_bytes"], c["read_bytes"]) for k, c in theirs.items()}
            calls_ours = {k: (c["write_calls"], c["read_calls"]) for k, c in ours.items()}
            calls_theirs = {k: (c["write_calls"], c["read_calls"]) for k, c in theirs.items()}
            line.update(
                files=len(theirs),
                calls=sum(a + b for a, b in calls_theirs.values()),
                bytes=sum(a + b for a, b in bytes_theirs.values()),
                bytes_exact=bytes_ours == bytes_theirs,
                calls_exact=calls_ours == calls_theirs,
            )
            assert bytes_ours == bytes_theirs, (phase, bytes_ours, bytes_theirs)
            assert calls_ours == calls_theirs, (phase, calls_ours, calls_theirs)
        if engine in URING and phase in URING[engine] and backend == "bcc" and shutil.which("perf"):
            data = tmp_path / f"perf-{phase}.data"
            proc = references.perf_record(_drive(engine, phase, ref, tmp_path / "perf.json"), data, env=_env())
            if proc.returncode == 0:
                seen = references.perf_uring(data)
                requests = table.filter(pc.equal(table["interface"].cast(pa.string()), "io_uring"))
                data_requests = sum(1 for s in requests["syscall"].to_pylist() if s and ("READ" in s or "WRITE" in s))
                kernel = sum(n for op, n in seen.items() if "READ" in op or "WRITE" in op)
                line.update(io_uring_requests=data_requests, perf_requests=kernel)
                assert data_requests == kernel, (data_requests, dict(seen))
        if engine in MAPPED and backend == "bcc":
            uncovered = meta.get("mapped_uncovered_bytes")
            line["mapped_uncovered_bytes"] = uncovered
            assert uncovered in (0, None) or uncovered == 0, uncovered
        # Every strategy, unless the trace moves too little to judge them against each other (a load through a
        # mapping or io_uring seen by strace): then the as-recorded replay alone.
        target = tmp_path / f"replay-{phase}"
        strategies = "all"
        verified = ("replay", str(trace), "--verify", "--target", str(target), "--strip-prefix", str(rec))
        proc = cli(*verified, "--strategy", strategies, timeout=1200, check=False)
        if proc.returncode != 0 and "nothing to judge" in proc.stderr:
            strategies = "posix"
            shutil.rmtree(target, ignore_errors=True)
            proc = cli(*verified, "--strategy", strategies, timeout=1200, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        line["replay_strategies"] = strategies
        if phase == "save":
            files_rec = {
                references.normalise(k): v
                for k, v in json.loads((tmp_path / "rec-save.json").read_text())["files"].items()
            }
            files_ref = {
                references.normalise(k): v
                for k, v in json.loads((tmp_path / "ref-save.json").read_text())["files"].items()
            }
            assert files_rec == files_ref, "the engine left different files in two runs"
            line["engine_files"] = len(files_rec)
            dirs = sorted(p for p in target.iterdir() if p.is_dir()) if strategies == "all" else [target]
            for strategy_dir in dirs:
                # Files the engine only read (a script DeepSpeed copies in) are laid out for the replay too.
                tree = {k: v for k, v in _tree(strategy_dir).items() if k in files_rec or not _read_source(k)}
                assert tree == files_rec, (strategy_dir.name, tree, files_rec)
        line["replay_exact"] = True
        _report(line)


def _read_source(relative: str) -> bool:
    """Whether a replayed file lies outside the checkpoint (its path kept whole: a file the engine read)."""
    return relative.split("/", 1)[0] in ("usr", "work", "opt", "home", "root", "tmp", "etc", "proc", "sys")


def _report(line: dict) -> None:
    report = os.environ.get("CKPT_TRACE_ENGINES_REPORT")
    if report:
        with open(report, "a") as fh:
            fh.write(json.dumps(line) + "\n")


def make_test(engine: str):
    """A test function checking ``engine`` with each backend in turn (the ``backend`` fixture)."""

    @pytest.mark.engines
    @pytest.mark.slow
    def test_conformance(backend, tmp_path):
        check(engine, backend, tmp_path)

    test_conformance.__doc__ = f"{engine}: capture equal to strace's (and perf's) on both backends, replay exact."
    return test_conformance
