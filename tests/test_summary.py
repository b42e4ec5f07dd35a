"""``summary``: the vectorised request-size histogram equals a row-by-row count (bucket b holds [b, 2b)), and
the summary read from the file in small record batches equals the one computed from the whole table."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_trace.analysis.summary import _size_buckets, summarize, summarize_file
from ckpt_trace.formats import read_trace

GOLDEN = sorted((REPO / "traces" / "golden").glob("v*.arrow"))


def _by_row(sizes, ops):
    buckets = {}
    for size, op in zip(sizes, ops):
        size = size or 0
        bucket = 0 if size <= 0 else 1 << (size.bit_length() - 1)
        entry = buckets.setdefault(bucket, {"bucket_bytes": bucket, "read": 0, "write": 0, "bytes": 0})
        entry[op] += 1
        entry["bytes"] += size
    return [buckets[key] for key in sorted(buckets)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.none(), st.integers(0, 2**62), st.sampled_from([1, 2, 4095, 4096, 2**53 - 1, 2**53, 2**53 + 1])
            ),
            st.sampled_from(["read", "write"]),
        ),
        max_size=200,
    )
)
def test_histogram_matches_a_row_by_row_count(rows):
    sizes, ops = [r[0] for r in rows], [r[1] for r in rows]
    counted = _size_buckets(
        np.array([size or 0 for size in sizes], np.int64), np.array([op == "write" for op in ops], bool)
    )
    assert counted == _by_row(sizes, ops)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_the_file_summary_in_small_batches_equals_the_whole_table_summary(path):
    whole = summarize(read_trace(path))
    for batch_rows in (1, 97, 1 << 20):
        assert summarize_file(path, batch_rows=batch_rows) == whole


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_batches_shared_out_over_threads_sum_to_the_same_summary(path):
    """``accumulate`` folds batches on several accumulators and merges them: the figures, and the order of
    the GPU copies, do not depend on how many."""
    from ckpt_trace.analysis.summary import accumulate
    from ckpt_trace.formats import scan

    results = []
    for threads in (1, 2, 3):
        _, batches = scan(path, batch_rows=7)
        acc = accumulate(batches, threads=threads)
        results.append((acc.result(), [t.to_pylist() for t in acc.copies]))
    assert results[0] == results[1] == results[2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=300), st.integers(1, 7))
def test_latency_histogram_is_within_its_bucket_of_the_exact_percentiles(samples, batches):
    """The bounded histogram the summary keeps per interface: each percentile at most one 1/64-octave bucket
    (1.1 %) below the exact nearest-rank one, never above it; mean and max exact, whatever the batching."""
    from ckpt_trace.stats import LatencyHistogram, percentiles_ns

    histogram = LatencyHistogram(exact_limit=0)  # the buckets alone (below its limit it answers exactly)
    for part in np.array_split(np.array(samples, dtype=np.int64), batches):
        histogram.add(part)
    exact, bucketed = percentiles_ns(samples), histogram.percentiles_ns()
    assert bucketed["max"] == exact["max"] and bucketed["mean"] == exact["mean"]
    for key in ("p50", "p90", "p99"):
        assert exact[key] / 2 ** (1 / 64) - 1 <= bucketed[key] <= exact[key], key


def test_every_pass_over_a_trace_feeds_the_progress_bar_to_its_end(tmp_path):
    """summary, report, diff, filter and export tell their progress sink each file batch of each pass,
    ending at done == total (what the CLI's bar draws on a terminal)."""
    from ckpt_trace.analysis.diff import diff_files
    from ckpt_trace.analysis.filter import Conditions, filter_trace
    from ckpt_trace.analysis.profile import profile_file
    from ckpt_trace.report.export import export_parquet

    trace = REPO / "traces" / "golden" / "v2-dcp-gpt2-tiny-2ranks-bcc.arrow"
    runs = {
        "summary": lambda p: summarize_file(trace, progress=p),
        "report": lambda p: profile_file(trace, progress=p),
        "diff": lambda p: diff_files(trace, trace, progress=p),
        "filter": lambda p: filter_trace(trace, tmp_path / "f.arrow", Conditions(ranks="0"), progress=p),
        "export": lambda p: export_parquet(trace, tmp_path / "pq", progress=p),
    }
    for name, run in runs.items():
        calls: dict[str, list[tuple[int, int]]] = {}
        run(lambda label, done, total, calls=calls: calls.setdefault(label, []).append((done, total)))
        assert calls, name
        for label, steps in calls.items():
            dones = [done for done, _ in steps]
            assert dones == sorted(dones) and steps[-1][0] == steps[-1][1] >= 1, (name, label, steps)
    assert set(calls) == {"writing"}


@pytest.mark.parametrize("name", ["v1-odd-pattern-strace", "v2-odd-pattern-strace", "v2-dcp-gpt2-tiny-2ranks-bcc"])
def test_writer_threads_per_rank_counts_the_threads_that_wrote(name):
    """What emit sizes the writer's threads by: per rank (per process without one), the distinct threads with
    write rows, counted row by row here; the summary gets it in batches."""
    path = REPO / "traces" / "golden" / f"{name}.arrow"
    table = read_trace(path).table
    per_owner: dict = {}
    for row in table.to_pylist():
        if row["op"] == "write":
            owner = row["rank"] if row["rank"] >= 0 else ("pid", row["pid"])
            per_owner.setdefault(owner, set()).add(row["tid"])
    expected = max((len(tids) for tids in per_owner.values()), default=1)
    assert summarize_file(path, batch_rows=7)["writer_threads_per_rank"] == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-1, 2**21), st.integers(0, 2**23), st.integers(0, 2**23)), min_size=1, max_size=40)
)
def test_distinct_ranks_pids_and_tids_packed_or_not_equal_python_sets(rows):
    """The one packed hashed unique (where rank, pid and tid fit) and the per-column fallback both give the
    distinct values a row-by-row set gives."""
    from ckpt_trace.analysis.summary import Accumulator

    acc = Accumulator()
    rank, pid, tid = (np.array(column, np.int32) for column in zip(*rows))
    acc._add_identities(rank, pid, tid)
    assert (acc.ranks, acc.pids, acc.tids) == tuple(set(column) for column in zip(*rows))


def test_metadata_operations_are_the_formats_list_link_and_symlink_included():
    """The summary counts as metadata operations exactly the rows whose op is in formats' ``METADATA_OPS``
    (the list ``report``'s profile uses): rows turned into link(2) and symlink(2) are counted with the rest."""
    import pyarrow as pa

    from ckpt_trace.formats import Trace, vocabulary

    trace = read_trace(REPO / "traces" / "golden" / "v5-odd-pattern-strace.arrow")
    ops = trace.table.column("op").cast(pa.string()).to_pylist()
    data_rows = [i for i, op in enumerate(ops) if op in vocabulary.DATA_OPS][:4]
    for i, name in zip(data_rows, ("link", "symlink", "link", "symlink")):
        ops[i] = name
    table = trace.table.set_column(trace.table.schema.get_field_index("op"), "op", pa.array(ops, pa.string()))
    summary = summarize(Trace(trace.path, table, trace.metadata))
    assert len(data_rows) == 4
    assert summary["metadata_ops"] == sum(op in vocabulary.METADATA_OPS for op in ops)
    assert {"link", "symlink"} <= set(summary["ops"])
