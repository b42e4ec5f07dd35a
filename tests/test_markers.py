"""The suite's own habits. Markers are declared, not inferred: a test that starts a process (the CLI, a
subprocess, a recording, a replay, a bench) says ``@pytest.mark.slow`` itself (or its module's ``pytestmark``
does, or it asks for a fixture conftest marks slow), so ``make test-fast`` (``-m "not slow"``) leaves it out.
No test module imports another. Both checked on the source of every test module, whatever this run collected."""

from __future__ import annotations

import ast

from conftest import _SLOW_FIXTURES, REPO

# Names whose use in a test's body means it starts a process or runs a whole command.
# (conftest's ``record``, ``cli_without``: commands run; ``CKPT_TRACE``: the command line that starts the CLI.)
SLOW_NAMES = {
    "cli",
    "cli_without",
    "subprocess",
    "Popen",
    "record",
    "CKPT_TRACE",
    "record_odd_pattern",
    "spawn_ranks",
    "run_bench",
    "replay",
}


def _own_nodes(function: ast.AST):
    """The nodes of ``function``'s own body, not of the functions defined in it (run in a thread, say)."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def _marks_slow(decorators: list[ast.expr]) -> bool:
    return any("slow" in ast.unparse(decorator) for decorator in decorators)


def _unmarked(path) -> list[str]:
    tree = ast.parse(path.read_text())
    module_slow = any(
        isinstance(node, ast.Assign)
        and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
        and "slow" in ast.unparse(node.value)
        for node in tree.body
    )
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.name.startswith("test_"):
            continue
        own = list(_own_nodes(node))
        used = {n.id for n in own if isinstance(n, ast.Name)} | {n.attr for n in own if isinstance(n, ast.Attribute)}
        arguments = {a.arg for a in node.args.args}
        if used & SLOW_NAMES and not (module_slow or _marks_slow(node.decorator_list) or arguments & _SLOW_FIXTURES):
            found.append(f"{path.name}::{node.name}")
    return found


def test_every_test_that_starts_a_process_is_marked_slow():
    unmarked = [name for path in sorted((REPO / "tests").rglob("test_*.py")) for name in _unmarked(path)]
    assert not unmarked, f"mark these @pytest.mark.slow (they start processes): {unmarked}"


def test_no_test_module_imports_another():
    """Shared helpers live in conftest.py or the tests/helpers package: a test module imported by another runs
    twice under two names (pytest's and the importer's), fixtures and module state included."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[-1].startswith("test_")]
    assert not found, found
