"""pytest plugin (entry point ``pytest11: ckpt_trace``): storage regression checks inside pytest.

Fixture ``storage_check``: a function ``storage_check(traces, baseline,
tolerance="10%", strategies=(), repeat=None)`` that replays the baseline's
traces on the storage under test (``--ckpt-trace-target DIR``, default a
fresh temporary directory), fails the test listing every figure that
regressed, and returns the comparisons otherwise.

Marker ``ckpt_trace_check(traces, baseline, tolerance="10%")``: a test
carrying it runs that check before its body (which finds the comparisons
in ``storage_check.last_rows`` if it asks for the fixture)::

    @pytest.mark.ckpt_trace_check(["traces/prod-step.arrow"], "baselines/nvme.json", tolerance="5%")
    def test_nvme_tier_keeps_checkpoint_speed(storage_check):
        ...
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--ckpt-trace-target",
        default=None,
        help="ckpt-trace: directory on the storage under test (default: a temporary directory)",
    )


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "ckpt_trace_check(traces, baseline, tolerance='10%'): replay the traces on "
        "the storage under test and fail if the baseline's figures regressed",
    )


def _describe(rows) -> str:
    return "\n".join(f"{r.trace} {r.strategy} {r.metric}: {r.old:.6g} -> {r.new:.6g} ({r.change:+.1%})" for r in rows)


@pytest.fixture
def storage_check(request):
    """See the module docstring; CkptTraceError (a bad baseline, mismatched traces) propagates as an error."""
    from ckpt_trace.check.baseline import load_baseline, parse_tolerance, run_check

    option = request.config.getoption("--ckpt-trace-target")

    def check(traces, baseline, tolerance: str = "10%", strategies=(), repeat=None):
        allowed = parse_tolerance(tolerance)
        base = Path(option) if option else Path(tempfile.mkdtemp(prefix="ckpt-trace-check-"))
        target = base / f"{request.node.name}-{len(list(base.glob('*')))}" if option else base
        rows = run_check(
            [Path(t) for t in traces],
            load_baseline(baseline),
            target=target,
            tolerance=allowed,
            repeat=repeat,
            strategies=strategies,
        )
        check.last_rows = rows
        bad = [row for row in rows if row.regressed]
        if bad:
            pytest.fail(f"storage regressed beyond {allowed:.0%}:\n{_describe(bad)}", pytrace=False)
        return rows

    check.last_rows = None
    marker = request.node.get_closest_marker("ckpt_trace_check")
    if marker is not None:
        check(*marker.args, **marker.kwargs)
    return check


def pytest_collection_modifyitems(items) -> None:
    """Tests with the marker get the fixture even when they do not ask for it."""
    for item in items:
        if item.get_closest_marker("ckpt_trace_check") and "storage_check" not in getattr(item, "fixturenames", ()):
            item.fixturenames.append("storage_check")
