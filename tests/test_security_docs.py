"""The README's security section, run: the setpriv wrapper traces a command as another user."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import _missing, cli

from ckpt_trace.formats import read_trace

README = Path(__file__).resolve().parent.parent / "README.md"


def test_setpriv_runs_the_traced_command_as_another_user(tmp_path, strace_backend):
    if os.geteuid() != 0:
        _missing("changing user needs root", required_in_ci=True)
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    assert "setpriv --reuid=alice --regid=alice --init-groups --reset-env -- torchrun train.py" in README.read_text()
    trace = tmp_path / "t.arrow"
    proc = cli(
        "record",
        "-o",
        str(trace),
        "--backend",
        "strace",
        "--",
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--reset-env",
        "--",
        "sh",
        "-c",
        "id -u; cat /etc/hostname",
    )
    assert proc.stdout.split()[0] == "65534", proc.stdout
    table = read_trace(trace).table
    assert "id" in set(table.column("comm").to_pylist())  # the command under setpriv is traced
    assert "/etc/hostname" in set(table.column("path").to_pylist())
