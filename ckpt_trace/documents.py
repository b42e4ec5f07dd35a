"""The JSON documents ckpt-trace prints (``--json``) and writes (replay results, baselines): typed definitions.

These TypedDicts are the contract that ``docs/JSON.md`` documents for people:
key names carry their units (``_bytes``, ``_ns``, ``_s``, ``_bytes_per_s``),
keys are only ever added within a ``version``, and ``tests/test_documents.py``
checks every command's real output against them with ``conforms``.
"""

from __future__ import annotations

import types
import typing
from typing import Any, TypedDict, Union

DOCUMENTS_VERSION = 1


class LatencyNs(TypedDict):
    """Nearest-rank latency percentiles of data operations, nanoseconds (``stats.percentiles_ns``)."""

    mean: int
    p50: int
    p90: int
    p99: int
    max: int


class ReplayResultDoc(TypedDict):
    """One strategy's measured run (``replayer.results.ReplayResult``)."""

    strategy: str
    elapsed_s: float
    bytes_written: int
    bytes_read: int
    data_ops: int
    metadata_ops: int
    latency_ns: LatencyNs
    cpu_user_s: float
    cpu_sys_s: float
    skipped_ops: dict[str, int]
    unaligned_ops: int
    speedup_vs_posix: float | None
    runs_elapsed_s: list[float]
    runs_p99_latency_ns: list[int]
    verified_files: int | None
    metadata_ops_saved: int
    notes: list[str]
    write_throughput_bytes_per_s: float
    read_throughput_bytes_per_s: float


class _ReplayDistributed(TypedDict, total=False):
    distributed: dict[str, Any]  # under torchrun: world_size, processes, slowest_process


class ReplayDoc(_ReplayDistributed):
    """``replay --json`` / ``-o``: the trace and its sha256 (results are tied to it), the target, the tool and
    machine, the options the replay ran with, one result per strategy; under torchrun, ``distributed``."""

    trace: str
    trace_sha256: str
    target: str
    creator: str
    creator_version: str
    environment: dict[str, Any]
    options: dict[str, Any]
    fio_write_bytes_per_s: float | None
    results: list[ReplayResultDoc]


class RecordDoc(TypedDict):
    """``record --json``."""

    trace: str
    backend: str
    rows: int
    lost_events: int
    exit_code: int
    exit_signal: int | None
    ended: str
    elapsed_s: float


class OpFigures(TypedDict):
    count: int
    bytes: int
    time_ns: int


class SizeBucket(TypedDict):
    """Data operations whose size is in [bucket_bytes, 2 * bucket_bytes)."""

    bucket_bytes: int
    read: int
    write: int
    bytes: int


class Alignment(TypedDict):
    alignment_bytes: int
    ops_with_known_offset: int
    ops_with_unknown_offset: int
    unaligned_offset_share: float
    unaligned_size_share: float


class SummaryDoc(TypedDict):
    """``summary --json`` (``analysis.summary.summarize``)."""

    trace: str
    backend: str | None
    command: list[str] | None
    rows: int
    duration_ns: int
    bytes_written: int
    bytes_read: int
    files: int
    processes: int
    threads: int
    ranks: list[int]
    ops: dict[str, OpFigures]
    data_ops: int
    metadata_ops: int
    data_time_ns: int
    metadata_time_ns: int
    size_histogram: list[SizeBucket]
    alignment: Alignment
    failed_ops: int
    lost_events: int
    filesystems: dict[str, Any]
    interfaces: dict[str, Any]
    unseen: dict[str, Any]
    rank_times: dict[str, Any]  # per rank (analysis.ranks): rows, io_time_ns, bytes, first_write_ns, save_time_ns
    hosts: dict[str, Any]  # the same per host (a merged trace's host column; else the trace's host), with ranks
    slowest_rank: dict[str, Any] | None  # most time in I/O calls (Darshan): rank, host, io_time_ns, save_time_ns
    slowest_save: dict[str, Any] | None  # longest first-to-last write (MLPerf Storage): rank, host, save_time_ns
    layout: LayoutSummaryDoc | None  # the checkpoint's layout joined to the rows (null without a layout)


class LayoutKindDoc(TypedDict):
    """One kind (or size class) of objects in ``summary``'s ``layout``."""

    objects: int
    object_bytes: int
    bytes_written: int
    bytes_read: int
    write_ops: int
    read_ops: int
    time_ns: int


class LayoutSummaryDoc(TypedDict):
    """``summary --json``'s ``layout`` (``analysis.layout.LayoutJoin.result``): the rows joined to the
    checkpoint's layout; null when the trace has no layout."""

    objects: int
    files: int
    formats: list[str]
    unknown_files: list[str]
    bytes_written: int
    bytes_read: int
    attributed_bytes_written: int
    attributed_bytes_read: int
    unattributed_bytes_written: int
    unattributed_bytes_read: int
    outside_layout_bytes_written: int
    outside_layout_bytes_read: int
    by_kind: list[LayoutKindDoc]
    by_size_class: list[LayoutKindDoc]
    small_object_bytes: int
    small_object_time_share: float
    largest: list[dict[str, Any]]
    costliest: list[dict[str, Any]]


class PlanDoc(TypedDict):
    """One strategy's plan in ``replay --dry-run --json``."""

    strategy: str
    workers: int
    ops: dict[str, int]
    write_bytes: int
    read_bytes: int
    largest_op_bytes: int
    block_bytes: int
    alignment: dict[str, int]
    precreate_files: int
    skipped_ops: dict[str, int]
    packed_files: int
    metadata_ops_saved: int


class DryRunDoc(TypedDict):
    trace: str
    plans: list[PlanDoc]


class ExportDoc(TypedDict, total=False):
    """``export --json``: ``events`` (perfetto) or ``rows`` (parquet)."""

    trace: str
    format: str
    output: str
    events: int
    rows: int


class ReportDoc(TypedDict):
    """``report --json``."""

    output: str
    bytes: int
    figures: int


class Change(TypedDict):
    a: float
    b: float
    change: float
    ratio: float | None


class DiffDoc(TypedDict):
    """``diff --json``: trace A and B side by side."""

    a: str
    b: str
    totals: dict[str, Change]
    ops: dict[str, Change]
    size_histogram: dict[str, Change]
    unaligned_offset_share: Change
    files_only_in_a: list[str]
    files_only_in_b: list[str]


class ComparisonDoc(TypedDict):
    trace: str
    strategy: str
    metric: str
    old: float
    new: float
    change: float
    regressed: bool
    new_runs_elapsed_s: list[float]
    old_noise: float
    new_noise: float
    status: str


class CheckDoc(TypedDict):
    """``check --json``: ``status`` per figure is ok, regressed or noisy (too noisy to judge)."""

    tolerance: float
    regressed: int
    noisy: int
    comparisons: list[ComparisonDoc]


class EmitDoc(TypedDict):
    """``emit --json``: the chosen writer options and one reason per option."""

    output: str
    options: dict[str, Any]
    reasons: dict[str, str]
    fastest_strategy: str | None


class WorkloadDoc(TypedDict):
    """``workload --json``: ``phase`` save or load; ``bytes`` of the checkpoint's files."""

    engine: str
    phase: str
    out: str
    files: int
    bytes: int
    elapsed_s: float
    io_s: float


def _matches(value: Any, hint: Any) -> str | None:
    """None when ``value`` fits the type ``hint``, else why not."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return None
    if origin in (Union, types.UnionType):
        reasons = [_matches(value, option) for option in typing.get_args(hint)]
        return None if any(r is None for r in reasons) else f"{value!r} fits none of {hint}"
    if hint is type(None):
        return None if value is None else f"{value!r} is not null"
    if typing.is_typeddict(hint):
        return conforms(value, hint)
    if origin is list:
        if not isinstance(value, list):
            return f"{value!r} is not a list"
        (item,) = typing.get_args(hint)
        return next((f"[{i}]: {r}" for i, v in enumerate(value) if (r := _matches(v, item))), None)
    if origin is dict:
        if not isinstance(value, dict):
            return f"{value!r} is not an object"
        _, item = typing.get_args(hint)
        return next((f"[{k!r}]: {r}" for k, v in value.items() if (r := _matches(v, item))), None)
    if hint is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else f"{value!r} is not a number"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else f"{value!r} is not an integer"
    return None if isinstance(value, hint) else f"{value!r} is not {hint.__name__}"


def conforms(document: Any, definition: type) -> str | None:
    """None when ``document`` (parsed JSON) holds every key of the TypedDict ``definition`` with a value of
    its type (extra keys are allowed: documents only grow), else the first problem, as a path and a reason."""
    if not isinstance(document, dict):
        return f"{type(document).__name__} is not an object"
    hints = typing.get_type_hints(definition)
    required = getattr(definition, "__required_keys__", frozenset(hints))
    for key, hint in hints.items():
        if key not in document:
            if key in required:
                return f"missing key {key!r}"
            continue
        problem = _matches(document[key], hint)
        if problem:
            return f"{key}: {problem}"
    return None


# -- documents read back (results, baselines): what the readers take, validated before use ------------------


class PairedIn(TypedDict, total=False):
    """A paired speed-up (``replayer.verdicts.paired_interval``) as read back."""

    median: float | None
    low: float | None
    high: float | None
    coverage: float | None
    n: int
    verdict: str


class ResultIn(TypedDict, total=False):
    """One result of a results file as ``emit`` and ``report`` read it: ``strategy`` and ``elapsed_s`` are
    required; the other keys, where present, must have these types (benchmark files lack some)."""

    strategy: str
    elapsed_s: float
    bytes_written: int
    bytes_read: int
    data_ops: int
    metadata_ops: int
    latency_ns: dict[str, float]
    cpu_user_s: float
    cpu_sys_s: float
    skipped_ops: dict[str, int]
    unaligned_ops: int
    speedup_vs_posix: float | None
    runs_elapsed_s: list[float]
    runs_p99_latency_ns: list[float]
    verified_files: int | None
    metadata_ops_saved: int
    notes: list[str]
    write_throughput_bytes_per_s: float
    read_throughput_bytes_per_s: float
    versus: dict[str, PairedIn]
    speedup: PairedIn | None
    o_direct_bytes_share: float | None


class ReplayOptionsIn(TypedDict, total=False):
    """The ``options`` of a results file (``replay`` writes them all; each is checked where present)."""

    queue_depth: int
    buffer_bytes: int
    pack_files: bool
    repeat: int | None
    min_seconds: float | None
    durable: bool
    drop_caches: bool
    timing: str
    gpu_copies: str
    world_size: int | None


class ResultsIn(TypedDict, total=False):
    """A results file as read back (``ReplayDoc``'s keys that readers use; ``results`` required)."""

    trace: str
    trace_sha256: str
    target: str
    environment: dict[str, Any]
    options: ReplayOptionsIn
    fio_write_bytes_per_s: float | None
    results: list[ResultIn]


class _BaselineOptionsOptional(TypedDict, total=False):
    min_seconds: float


class BaselineOptionsIn(_BaselineOptionsOptional):
    """A baseline's ``options`` (``check.baseline``'s module docstring)."""

    strategies: list[str]
    repeat: int
    queue_depth: int
    buffer_bytes: int
    durable: bool


class BaselineResultIn(TypedDict, total=False):
    """One strategy's figures for one trace in a baseline."""

    throughput_bytes_per_s: float
    p99_latency_ns: float
    elapsed_s: float
    runs_elapsed_s: list[float]
    runs_p99_latency_ns: list[float]
    throughput_noise: float
    p99_noise: float
    bytes_written: int
    bytes_read: int


class _BaselineTraceOptional(TypedDict, total=False):
    path: str


class BaselineTraceIn(_BaselineTraceOptional):
    name: str
    sha256: str
    results: dict[str, BaselineResultIn]


class BaselineIn(TypedDict):
    """A baseline file as ``check`` reads it."""

    environment: dict[str, Any]
    options: BaselineOptionsIn
    traces: list[BaselineTraceIn]


def _not_finite(value: Any, where: str = "") -> str | None:
    """The first NaN or infinite number in parsed JSON (Python's json reads NaN and Infinity), as a path."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return f"{where or 'value'}: {value!r} is not a finite number"
    if isinstance(value, dict):
        return next((r for k, v in value.items() if (r := _not_finite(v, f"{where}.{k}" if where else str(k)))), None)
    if isinstance(value, list):
        return next((r for i, v in enumerate(value) if (r := _not_finite(v, f"{where}[{i}]"))), None)
    return None


def check_document(document: Any, definition: type, where: str, error: type[Exception] | None = None) -> None:
    """Raise ``error`` (default CkptTraceError) with one line naming the key when ``document`` does not fit
    the TypedDict ``definition`` (``conforms``) or holds a NaN or infinite number."""
    from ckpt_trace.errors import CkptTraceError

    problem = conforms(document, definition) or _not_finite(document)
    if problem:
        raise (error or CkptTraceError)(f"{where}: {problem}")


def load_replay_results(path, trace_sha256: str | None = None, trace_name: str = "the trace") -> dict:
    """Read a ``replay -o`` results file, and tie it to the trace whose sha256 is ``trace_sha256``.

    The document is validated against ``ResultsIn`` (types of every key a reader uses, finite numbers,
    non-negative times and sizes). Raises CkptTraceError (one line, naming the key) for a missing or
    unreadable file, one without results (each needs ``strategy`` and ``elapsed_s``), a value of the wrong
    type, or, when ``trace_sha256`` is given, results of another trace or of an unknown one (no
    ``trace_sha256``): tuning or reporting from them would be silently wrong.
    """
    import json
    from pathlib import Path

    from ckpt_trace.errors import CkptTraceError

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CkptTraceError(f"replay results not found: {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CkptTraceError(f"{path} is not a replay results file: {err}") from None
    if not isinstance(data, dict) or "results" not in data:
        raise CkptTraceError(f"{path} is not a replay results file: missing key 'results'")
    if not isinstance(data["results"], list) or not data["results"]:
        raise CkptTraceError(
            f"{path} is not a replay results file: key 'results' is "
            f"{'empty' if data['results'] == [] else 'not a list of results'}"
        )
    check_document(data, ResultsIn, str(path))
    for index, entry in enumerate(data["results"]):
        if "strategy" not in entry or "elapsed_s" not in entry:
            raise CkptTraceError(f"{path}: results[{index}]: each result needs 'strategy' and 'elapsed_s'")
        negative = next(
            (
                key
                for key, value in entry.items()
                if isinstance(value, (int, float))
                and not isinstance(value, bool)
                and value < 0
                and key != "speedup_vs_posix"
            ),
            None,
        )
        if negative:
            raise CkptTraceError(f"{path}: results[{index}].{negative}: {entry[negative]!r} is negative")
    options = data.get("options", {})
    negative = next(
        (
            key
            for key, value in options.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0
        ),
        None,
    )
    if negative:
        raise CkptTraceError(f"{path}: options.{negative}: {options[negative]!r} is negative")
    if trace_sha256 is not None:
        recorded = data.get("trace_sha256")
        if recorded is None:
            raise CkptTraceError(
                f"{path} does not say which trace it replayed (no trace_sha256); replay "
                f"{trace_name} again with this release"
            )
        if recorded != trace_sha256:
            raise CkptTraceError(
                f"{path} holds results of another trace ({data.get('trace')}, sha256 "
                f"{recorded[:12]}), not of {trace_name} (sha256 {trace_sha256[:12]})"
            )
    return data
