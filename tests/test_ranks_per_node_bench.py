"""benchmarks/ranks_per_node.py: one real round of 2-rank saves and loads by the emitted writer (memmove and
torch's copies) and DCP, through the CLI's workloads: each cell's samples, the checkpoint bytes, and DCP's
time over each engine's, with its verdict."""

from __future__ import annotations

import argparse

import pytest
from helpers.benchmarks import load_benchmark


@pytest.mark.slow
@pytest.mark.torch
def test_one_round_of_two_ranks_measures_every_engine_against_dcp(tmp_path, torch_installed):
    bench = load_benchmark("ranks_per_node")
    args = argparse.Namespace(rounds=1, model="gpt2-tiny", writer=None)
    cell = bench.measure(args, list(bench.ENGINES), 2, tmp_path)
    assert cell["ranks"] == 2 and set(cell["engines"]) == set(bench.ENGINES)
    for engine, phases in cell["engines"].items():
        for phase in bench.PHASES:
            entry = phases[phase]
            assert len(entry["io_s"]) == 1 and entry["io_s"][0] > 0 and entry["bytes"] > 0
            if engine == "dcp":
                assert "vs_dcp" not in entry
                continue
            ratio = cell["engines"]["dcp"][phase]["io_s"][0] / entry["io_s"][0]
            assert entry["vs_dcp"]["ratios"] == [ratio]
            assert entry["vs_dcp"]["verdict"] == "within noise"  # one round: no verdict, whatever the ratio
    for engine, phases in cell["engines"].items():  # each load read back what its save wrote
        assert phases["load"]["bytes"] == phases["save"]["bytes"], engine
    assert not any(tmp_path.iterdir())  # every checkpoint it wrote was removed
