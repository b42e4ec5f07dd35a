"""JUnit XML of a storage check, for CI systems: one testsuite, one testcase per trace and strategy.

A case fails when a figure regressed, is skipped when a figure was too noisy
to judge (neither pass nor fail), and passes otherwise.

Schema: the de-facto JUnit XML read by Jenkins, GitLab and GitHub Actions
(testsuites > testsuite > testcase, with <failure> or <system-out>).
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.etree import ElementTree

from ckpt_trace.stats import median_index

from .baseline import Comparison


def junit_xml(rows: Sequence[Comparison], tolerance: float) -> bytes:
    """JUnit XML: one testsuite, one testcase per trace and strategy, a <failure> listing regressed figures."""
    cases: dict[tuple[str, str], list[Comparison]] = {}
    for row in rows:
        cases.setdefault((row.trace, row.strategy), []).append(row)
    failures = sum(any(r.regressed for r in group) for group in cases.values())
    skipped = sum(
        not any(r.regressed for r in group) and any(r.status == "noisy" for r in group) for group in cases.values()
    )
    root = ElementTree.Element("testsuites", name="ckpt-trace", tests=str(len(cases)), failures=str(failures))
    suite = ElementTree.SubElement(
        root,
        "testsuite",
        name="ckpt-trace check",
        tests=str(len(cases)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
    )
    for (trace, strategy), group in cases.items():
        runs = group[0].new_runs_elapsed_s
        elapsed = runs[median_index(runs)]
        case = ElementTree.SubElement(
            suite, "testcase", classname=f"ckpt-trace.{trace}", name=strategy, time=f"{elapsed:.3f}"
        )
        lines = [
            f"{r.metric}: {r.old:.6g} -> {r.new:.6g} ({r.change:+.1%}; noise +-{max(r.old_noise, r.new_noise):.1%}): "
            f"{r.status}"
            for r in group
        ]
        bad = [r for r in group if r.regressed]
        noisy = [r for r in group if r.status == "noisy"]
        if bad:
            failure = ElementTree.SubElement(
                case, "failure", message=f"{len(bad)} figure(s) regressed beyond {tolerance:.0%}"
            )
            failure.text = "\n".join(lines)
        elif noisy:
            skipped = ElementTree.SubElement(
                case, "skipped", message=f"{len(noisy)} figure(s) too noisy to judge at {tolerance:.0%}"
            )
            skipped.text = "\n".join(lines)
        else:
            ElementTree.SubElement(case, "system-out").text = "\n".join(lines)
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)
