"""Outputs on a shared machine (issue 38, findings 3 and 5): temporary files under new random names, never
through a planted link; an output that is the input refused whatever --force says.

Each test failed before the fix: the temporary name was ``.NAME.tmp-PID``, opened without O_EXCL and
following symlinks, and ``--force`` let ``replay -o``, ``report -o`` and ``export -o`` replace the trace.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import ODD, cli

from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import TraceWriter, read_trace, reserve_temporary, write_bytes_atomic, write_trace


def same_file(a: Path, b: Path) -> bool:
    return os.stat(a).st_ino == os.stat(b).st_ino and os.stat(a).st_dev == os.stat(b).st_dev


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "elsewhere" / "secret"
    victim.parent.mkdir()
    victim.write_bytes(b"precious\n")
    victim.chmod(0o600)
    return victim


def _plant(output: Path, victim: Path) -> None:
    """Symlinks at every name an output's temporary file had before the fix (``.NAME.tmp-PID``)."""
    (output.parent / f".{output.name}.tmp-{os.getpid()}").symlink_to(victim)


def _write_bytes(output: Path) -> None:
    write_bytes_atomic(output, b"{}\n")


def _write_trace(output: Path) -> None:
    trace = read_trace(ODD)
    write_trace(output, trace.table, trace.metadata)


def _trace_writer(output: Path) -> None:
    trace = read_trace(ODD)
    writer = TraceWriter(output, batch_rows=7)  # several batches: the placeholder is patched in place
    writer.write(trace.table)
    writer.close({**trace.metadata, "note": "x" * 10000})  # longer than the placeholder: rewritten


def _perfetto(output: Path) -> None:
    from ckpt_trace.report.export import export_perfetto

    export_perfetto(ODD, output)


def _parquet(output: Path) -> None:
    from ckpt_trace.report.export import export_parquet

    export_parquet(ODD, output)


@pytest.mark.parametrize("write", [_write_bytes, _write_trace, _trace_writer, _perfetto, _parquet])
def test_a_symlink_planted_at_the_old_temporary_name_is_never_followed(tmp_path, write):
    victim = _victim(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    output = shared / "out"
    _plant(output, victim)
    write(output)
    assert victim.read_bytes() == b"precious\n"
    assert output.exists() and not output.is_symlink()
    leftovers = sorted(p.name for p in shared.iterdir() if p.name != "out")
    assert leftovers == [f".out.tmp-{os.getpid()}"]  # only the planted link: no temporary file is left


def test_temporary_files_are_new_random_names_made_exclusively(tmp_path):
    from ckpt_trace.formats.atomic import AtomicFile

    output = tmp_path / "out.json"
    first, second = AtomicFile(output), AtomicFile(output)
    assert first.tmp != second.tmp and first.tmp.parent == tmp_path
    assert first.tmp.name.startswith(".out.json.") and (first.tmp.stat().st_mode & 0o077) == 0o044 & ~_umask()
    first.discard()
    second.discard()
    assert list(tmp_path.iterdir()) == []


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_failed_write_leaves_nothing_and_keeps_the_output(tmp_path):
    from ckpt_trace.formats.atomic import AtomicFile

    output = tmp_path / "out"
    output.write_bytes(b"old")
    with pytest.raises(RuntimeError), AtomicFile(output) as sink:
        sink.write(b"new")
        raise RuntimeError("boom")
    assert output.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_record_reservation_does_not_say_file_exists_about_a_missing_output(tmp_path):
    output = tmp_path / "t.arrow"
    (tmp_path / f".t.arrow.tmp-{os.getpid()}").write_bytes(b"someone else's")  # the old fixed name, taken
    reserved = reserve_temporary(output)
    assert reserved.exists() and reserved.parent == tmp_path and not output.exists()
    reserved.unlink()


@pytest.mark.slow
def test_record_onto_an_existing_trace_says_it_exists(tmp_path):
    output = tmp_path / "t.arrow"
    output.write_bytes(b"x")
    proc = cli("record", "-o", str(output), "--backend", "strace", "--", "true", check=False)
    assert proc.returncode != 0 and "already exists" in proc.stderr and "File exists" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("command", ["replay", "dry-run", "report", "export", "filter", "emit"])
def test_an_output_that_is_the_input_is_refused_even_with_force(tmp_path, command, link):
    trace = tmp_path / "t.arrow"
    trace.write_bytes(ODD.read_bytes())
    before = trace.read_bytes()
    output = {"same": trace, "symlink": tmp_path / "link.py", "hardlink": tmp_path / "hard.py"}[link]
    if link == "symlink":
        output.symlink_to(trace)
    elif link == "hardlink":
        os.link(trace, output)
    assert same_file(output, trace)
    if command == "emit" and link == "same":
        pytest.skip("emit writes only a .py file")
    args = {
        "replay": ["replay", str(trace), "--target", str(tmp_path / "r"), "-o", str(output)],
        "dry-run": ["replay", str(trace), "--target", str(tmp_path / "r"), "--dry-run", "-o", str(output)],
        "report": ["report", str(trace), "-o", str(output)],
        "export": ["export", str(trace), "-o", str(output)],
        "filter": ["filter", str(trace), "-o", str(output)],
        "emit": ["emit", str(trace), "-o", str(output)],
    }[command]
    proc = cli(*args, "--force", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "is the input" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert trace.read_bytes() == before and same_file(output, trace)


def test_emit_refuses_results_as_its_output(tmp_path):
    results = tmp_path / "r.py"
    results.write_text("{}")
    with pytest.raises(CkptTraceError, match="is the input"):
        from ckpt_trace.writer.emit import emit

        emit(ODD, results, results_path=results, force=True)


def test_an_output_directory_another_rank_makes_first_is_taken(tmp_path, monkeypatch):
    """The ranks of a job check their output directory side by side: when it is missing at the check and
    made by another rank just before this one's mkdir, it is used, not refused with "File exists" (a
    two-node test's rank failed so, 2026-11-29). Nothing in it is touched; a file of that name is still
    refused."""
    from ckpt_trace.iolayer import outputs

    out = tmp_path / "ck"
    real_mkdir = Path.mkdir

    def other_rank_first(self, *args, **kwargs):
        if self == out and not out.exists():  # the other rank's mkdir and first file, between check and mkdir
            real_mkdir(self)
            (out / "rank0.distcp").write_bytes(b"another rank's bytes")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", other_rank_first)
    assert outputs.check_output_dir(out, force=True) == out
    assert (out / "rank0.distcp").read_bytes() == b"another rank's bytes"
    monkeypatch.undo()
    file = tmp_path / "file"
    file.write_bytes(b"")
    with pytest.raises(CkptTraceError, match="not a directory"):
        outputs.check_output_dir(file, force=True)
