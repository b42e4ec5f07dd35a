"""Numbers and places checked before the work starts (issue 38, findings 12 and 15): record on a full file
system refuses before the command runs; NaN, infinite, zero or negative limits are refused; bench does not
build a mistyped target's directory tree."""

from __future__ import annotations

import pytest
from conftest import ODD, cli


def _one_line(proc, *words) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def test_record_on_a_full_file_system_refuses_before_the_command_starts(small_tmpfs, tmp_path, strace_backend):
    marker = tmp_path / "ran"
    proc = cli(
        "record", "-o", str(small_tmpfs / "t.arrow"), "--backend", "strace", "--", "touch", str(marker), check=False
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "No space left on device" in errors[0] and "16 MiB" in errors[0], proc.stderr
    assert not marker.exists() and list(small_tmpfs.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-5"])
def test_report_refuses_a_fio_limit_that_is_not_a_positive_number(tmp_path, value):
    proc = cli("report", str(ODD), "-o", str(tmp_path / "r.html"), "--fio-limit", value, check=False)
    _one_line(proc, "--fio-limit")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["baseline", "check"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_baseline_and_check_refuse_min_seconds_that_are_not_finite(tmp_path, command, value):
    args = (
        ["baseline", str(ODD), "-o", str(tmp_path / "b.json")]
        if command == "baseline"
        else ["check", str(ODD), "--baseline", str(tmp_path / "b.json")]
    )
    proc = cli(*args, "--target", str(tmp_path / "t"), f"--min-seconds={value}", check=False)
    _one_line(proc, "--min-seconds")
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
def test_bench_refuses_a_target_whose_parent_is_missing(tmp_path):
    target = tmp_path / "missing" / "deeper" / "dir"
    proc = cli("bench", "--quick", "--target", str(target), "-o", str(tmp_path / "out"), check=False)
    _one_line(proc, "does not exist")
    assert not (tmp_path / "missing").exists()


@pytest.mark.root
def test_record_into_a_filled_file_system_refuses_in_one_line_before_the_command_runs(tmp_path, strace_backend):
    """Finding 12 as found: a full disk (creating an empty file still succeeds there) let the whole job run,
    then lost the recording. Now: one line, exit 2, the command never started, nothing left on the disk."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(full)], check=True)
    try:
        with open(full / "filler", "wb") as filler:  # fill it to the last block
            try:
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            except OSError as err:
                assert err.errno == 28  # ENOSPC
        assert os.statvfs(full).f_bavail == 0
        marker = tmp_path / "ran"
        proc = cli(
            "record",
            "-o",
            str(full / "t.arrow"),
            "--backend",
            "strace",
            "--",
            "sh",
            "-c",
            f"echo ran > {marker}",
            check=False,
        )
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert len(errors) == 1 and "t.arrow" in errors[0], (
            proc.stderr
        )  # one error line (the backend notes come before it)
        assert "No space left on device" in errors[0], proc.stderr
        assert not marker.exists(), "the command ran although its recording could not be written"
        assert sorted(p.name for p in full.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", str(full)], check=True)
