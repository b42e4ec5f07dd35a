"""The layout is the architecture: import names are paths, and each stage imports only the stages before it."""

from __future__ import annotations

import importlib
import importlib.machinery
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = [REPO, REPO / "formats", REPO / "iolayer", REPO / "tracer", REPO / "replayer"]
STAGES = {"formats": "formats", "iolayer": "iolayer", "tracer": "tracer", "replayer": "replayer"}


def _modules():
    """Every module of the ckpt_trace namespace found by plain path rules over the source roots."""
    spec = importlib.machinery.PathFinder.find_spec("ckpt_trace", [str(p) for p in SOURCE_ROOTS])
    assert spec is not None and spec.loader is None, "ckpt_trace must be a namespace package (no __init__.py)"
    found = {}
    for info in pkgutil.walk_packages(list(spec.submodule_search_locations), prefix="ckpt_trace."):
        found[info.name] = Path(info.module_finder.path)
    return found


def test_every_import_name_is_its_path():
    modules = _modules()
    for stage, folder in STAGES.items():
        assert f"ckpt_trace.{stage}" in modules, f"{folder}/ckpt_trace/{stage} not found by path"
    for name in modules:
        relative = Path(*name.split("."))
        module = importlib.import_module(name)
        path = Path(module.__file__)
        tail = path.parent if path.name == "__init__.py" else path.with_suffix("")
        assert tail.parts[-len(relative.parts) :] == relative.parts, (name, path)
        assert any(path.is_relative_to(root) for root in SOURCE_ROOTS), (name, path)


@pytest.mark.slow
def test_the_stage_order_holds():
    """import-linter's contracts in pyproject.toml: formats imports nothing of ours; nothing imports upward."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
            "--no-cache",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.slow
def test_a_violation_is_caught(tmp_path):
    """The check can fail: a contract forbidding an import the replayer really makes is reported broken."""
    config = tmp_path / "contracts.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["ckpt_trace"]\n\n'
        '[[tool.importlinter.contracts]]\nname = "replayer without formats"\ntype = "forbidden"\n'
        'source_modules = ["ckpt_trace.replayer"]\nforbidden_modules = ["ckpt_trace.formats"]\n'
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
            "--no-cache",
            "--config",
            str(config),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "replayer without formats BROKEN" in proc.stdout, proc.stdout[-2000:]
