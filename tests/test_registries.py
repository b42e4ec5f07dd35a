"""The tracer backends' and the built-in workloads' tables (``tracer/backends``, ``workloads/builtin``):
one module per name, read by record, the CLI and the workload runner; an unknown name is an error, never a
default (the workload runner used to run safetensors for any name it did not know)."""

from __future__ import annotations

import dataclasses
import pkgutil
import shutil

import pytest
from conftest import cli

from ckpt_trace import registry
from ckpt_trace.errors import TracerError, WorkloadError
from ckpt_trace.tracer import BACKENDS, backends, choose_backend
from ckpt_trace.workloads import ENGINES, builtin, engines


def test_backends_come_from_one_table():
    assert BACKENDS == backends.choices() == ("auto", "bcc", "strace")
    table = backends.table()
    assert table["bcc"].clock == "CLOCK_MONOTONIC" and table["strace"].clock == "CLOCK_REALTIME"
    assert table["strace"].wrapped and not table["bcc"].wrapped
    assert all(spec.attach is not None for spec in table.values())  # record --pid dispatches through the table
    with pytest.raises(TracerError, match="unknown backend 'nope'"):
        choose_backend("nope")
    with pytest.raises(TracerError, match="unknown backend 'nope'"):
        backends.get("nope")


def test_requested_and_auto_choices_follow_each_backends_probe(monkeypatch):
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    assert choose_backend("strace").name == "strace"
    bcc = backends.table()["bcc"]
    monkeypatch.setitem(backends.table(), "bcc", dataclasses.replace(bcc, problem=lambda: "no BPF here"))
    with pytest.raises(TracerError, match="bcc backend unavailable: no BPF here"):
        choose_backend("bcc")
    choice = choose_backend("auto")
    assert (choice.name, choice.reason, choice.may_fall_back) == ("strace", "bcc unavailable: no BPF here", False)
    strace = backends.table()["strace"]
    monkeypatch.setitem(backends.table(), "strace", dataclasses.replace(strace, problem=lambda: "not installed"))
    with pytest.raises(TracerError, match=r"no tracing backend: bcc unavailable \(no BPF here\) and strace"):
        choose_backend("auto")


def test_an_unknown_workload_is_an_error_and_writes_nothing(tmp_path):
    with pytest.raises(WorkloadError, match="unknown workload 'nope'"):
        builtin.run("nope", tmp_path / "out", model="gpt2-tiny")
    assert not (tmp_path / "out").exists()


def test_each_workload_runs_its_own_function(monkeypatch, tmp_path):
    called = []
    for name, spec in list(builtin.table().items()):
        monkeypatch.setitem(
            builtin.table(),
            name,
            dataclasses.replace(spec, run=lambda args, name=name: called.append((name, args.out.name)) or 0.0),
        )
    for name in ENGINES:
        builtin.run(name, tmp_path / name, model="gpt2-tiny")
    assert called == [(name, name) for name in ENGINES]
    with pytest.raises(WorkloadError, match="--ranks applies to the dcp and emitted workloads only"):
        builtin.run("memmap", tmp_path / "m", ranks=2, model="gpt2-tiny")
    with pytest.raises(WorkloadError, match="--mmap applies to torch-save --load only"):
        builtin.run("dcp", tmp_path / "d", mmap=True, model="gpt2-tiny")


def test_a_workload_is_one_module_of_the_builtin_package():
    modules = [m.name for m in pkgutil.iter_modules(builtin.__path__) if not m.name.startswith("_")]
    assert sorted(modules) == sorted(name.replace("-", "_") for name in ENGINES)
    assert builtin.names() == ENGINES and ENGINES[:2] == ("dcp", "torch-save")  # in each module's order
    for name, spec in builtin.table().items():
        assert spec.run.__module__ == f"{builtin.__name__}.{name.replace('-', '_')}"  # its own function
        assert spec.options <= set(engines.OPTIONS) and spec.summary
    assert builtin.takers("ranks") == "the dcp and emitted workloads only"
    with pytest.raises(WorkloadError, match="unknown workload 'nope' \\(choose from dcp, torch-save"):
        builtin.get("nope")


def test_a_packaging_mistake_is_a_workload_error(tmp_path, monkeypatch):
    package = tmp_path / "fake_workloads"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "empty.py").write_text("NOTHING = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkloadError, match="fake_workloads.empty defines no WORKLOAD = Workload"):
        registry.discover(
            "fake_workloads", [str(package)], "WORKLOAD", engines.Workload, reserved="", error=WorkloadError
        )
    (package / "empty.py").unlink()
    (package / "one.py").write_text("from ckpt_trace.workloads.builtin.dcp import WORKLOAD\n")
    (package / "two.py").write_text("from ckpt_trace.workloads.builtin.dcp import WORKLOAD\n")
    with pytest.raises(WorkloadError, match="name 'dcp' is declared twice"):
        registry.discover(
            "fake_workloads", [str(package)], "WORKLOAD", engines.Workload, reserved="", error=WorkloadError
        )


@pytest.mark.slow
def test_the_cli_offers_the_tables_names(tmp_path):
    record = cli("record", "--help").stdout
    assert f"<{'|'.join(backends.choices())}>" in record
    proc = cli("workload", "nope", "--out", str(tmp_path / "o"), check=False)
    assert proc.returncode == 2 and "'nope' is not one of" in proc.stderr
    assert not (tmp_path / "o").exists()
    help_text = " ".join(cli("workload", "--help").stdout.split())
    assert all(name in help_text for name in ENGINES)
    assert "Processes (dcp and emitted)" in help_text  # the options' help reads the table too
