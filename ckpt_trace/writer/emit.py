"""``ckpt-trace emit``: choose the writer's parameters from a trace and replay results, and write the module.

Pure choice (``choose``) plus rendering (``render_module``) and an atomic
write (``emit``); no torch is imported here. The choice, per parameter:

- ``direct_io``: on when the fastest replayed strategy bypasses the page cache
  (its measured O_DIRECT share, else its declared ``direct_io`` in
  ``replayer.strategies``: uring-direct, aggregated), off when a buffered
  strategy (posix, uring-buffered) won; on without replay results (arXiv 2512.24511 measured
  O_DIRECT aggregated writes fastest).
- ``queue_depth``: the replay's ``--queue-depth`` when a strategy using it
  (``uses_queue_depth``: the io_uring ones) won, else the tunable default.
- ``buffer_bytes``: the replay's ``--buffer-size`` when aggregated won, else
  the default (4 MiB, inside the paper's best 1-4 MiB range).
- ``writer_threads``: 1 (one data file per rank) when aggregated won with
  ``--pack-files``; otherwise the most threads that wrote for one rank in the
  trace, at most ``os.cpu_count()``.
- ``load_direct_io`` (the reader): from a replay of a recorded *load* (the
  trace wrote nothing, or the winner read more than it wrote), on when an O_DIRECT strategy read fastest,
  off when a buffered one did; otherwise on: the ``auto`` policy, where the
  reader reads what the page cache holds buffered and measures, at each
  load, which way reads the cold bytes faster on the device.
- ``load_measure_cold_way`` (the reader): off (cold bytes always O_DIRECT)
  when a replayed load's verdict clearly favours an O_DIRECT strategy; else
  on (measured at each load).

All of these come from a *verdict* only (``verdict``): the strategy of least
median time is taken when its paired speed-up over every other replayed
strategy is clear of 1.0 (``replayer.verdicts``); otherwise every parameter
keeps its default and the module's header says why. A load trace tunes only
the reader, a save only the writer. "Page cache bypassed" is what the
winner's bytes did (``o_direct_bytes_share``), not its name. A trace moving
fewer than ``config.REPLAY_MIN_JUDGE_BYTES`` has nothing to judge.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from ckpt_trace import config
from ckpt_trace.documents import load_replay_results
from ckpt_trace.errors import CheckpointError
from ckpt_trace.formats import sha256_file, write_bytes_atomic
from ckpt_trace.iolayer.outputs import check_output_file
from ckpt_trace.replayer import strategies
from ckpt_trace.replayer.replay import NothingToJudge
from ckpt_trace.version import __version__

from .options import WriterOptions

_LOAD_DEFAULT = (
    "no replayed load: auto, what the page cache holds read buffered and the rest the way "
    "measured faster on the device at the load (O_DIRECT stream or buffered; the reader's stats say)"
)


@dataclass(frozen=True)
class Choice:
    """The chosen ``options`` and one line of reason per parameter (name -> why)."""

    options: WriterOptions
    reasons: dict[str, str]
    winner: str | None


def _winner(results: dict) -> dict:
    return min(results["results"], key=lambda r: r["elapsed_s"] if r["elapsed_s"] > 0 else float("inf"))


def verdict(results: dict) -> tuple[dict | None, str]:
    """The strategy the replay's verdict names, or None, and one line saying why.

    The candidate is the strategy of least median elapsed time (``elapsed_s``
    is its median run); it is taken only when its speed-up over every other
    replayed strategy, from paired rounds (``versus``, ``replayer.verdicts``),
    is ``faster``: an interval clear of 1.0. A lone strategy is taken as given
    (nothing was compared); results without paired rounds are not a verdict.
    """
    entries = results["results"]
    best = _winner(results)
    if len(entries) == 1:
        return best, f"{best['strategy']}, the only strategy replayed (nothing compared)"
    versus = best.get("versus")
    if not versus:
        return None, "the results have no paired rounds (replayed by an older ckpt-trace): no verdict"
    unclear = {other: entry for other, entry in versus.items() if entry.get("verdict") != "faster"}
    if unclear:
        other, entry = min(unclear.items(), key=lambda kv: kv[1]["median"])
        return None, (
            f"no strategy clear of the others: the fastest median, {best['strategy']}, is "
            f"{entry['median']:.2f}x {other} ({entry['low']:.2f}-{entry['high']:.2f}x over "
            f"{entry['n']} rounds, {entry['verdict']})"
        )
    low = min(entry["low"] for entry in versus.values())
    rounds = min(entry["n"] for entry in versus.values())
    return best, (
        f"{best['strategy']} was faster than every other strategy (by {low:.2f}x or more at the "
        f"interval's low end, {rounds} paired rounds)"
    )


def phase_view(results: dict, phase: str) -> dict | None:
    """``results`` as ``verdict`` sees them for one phase of a trace holding a save and a load: each entry's
    ``elapsed_s`` and ``versus`` those of its ``phases[phase]`` (``replayer.runs.add_phase_verdicts``); None
    where an entry has no verdicts for that phase (a save or a load alone, or older results)."""
    entries = []
    for entry in results["results"]:
        mine = (entry.get("phases") or {}).get(phase) or {}
        if "versus" not in mine:
            return None
        entries.append({**entry, "elapsed_s": mine["elapsed_s"], "versus": mine["versus"]})
    return {**results, "results": entries}


def _strategy(entry: dict) -> strategies.Strategy | None:
    """The strategy of a results entry (``+pack-files`` dropped), or None for a name the table lacks."""
    return strategies.find(entry["strategy"].removesuffix("+pack-files"))


def _bypasses_cache(entry: dict) -> bool:
    """Whether a strategy's bytes went with O_DIRECT (its measured ``o_direct_bytes_share`` where the results
    carry it: a uring-direct whose writes were all unaligned ran buffered), else its declared ``direct_io``
    (``replayer.strategies``). The entry's strategy is a known one (``choose`` refuses others)."""
    share = entry.get("o_direct_bytes_share")
    if share is not None:
        return share >= 0.9
    spec = _strategy(entry)
    if spec is None:
        raise CheckpointError(f"the results hold strategy {entry['strategy'][:60]!r}, not one ckpt-trace replays")
    return spec.direct_io


def choose(
    threads_per_rank: int, results: dict | None, cpu_count: int | None = None, *, reads_only: bool = False
) -> Choice:
    """The writer's parameters for a trace whose ranks wrote from at most ``threads_per_rank`` threads (the
    summary's ``writer_threads_per_rank``) and (optionally) its replay results; see the module docstring.

    With results, only the direction the trace moved (a load: the reader's ``load_direct_io``; a save: the
    writer's parameters) is tuned, and only from a verdict (``verdict``); every other parameter keeps its
    default, and ``Choice.reasons`` says which came from the verdict and why. A trace that only read
    (``reads_only``: no byte written) is a load with or without results: nothing in it tunes the writer."""
    defaults = WriterOptions()
    threads = min(threads_per_rank, cpu_count or os.cpu_count() or 1)
    if results is None and reads_only:
        kept = "default (the trace only reads: nothing in it tunes the writer)"
        reasons = {name: kept for name in ("direct_io", "queue_depth", "buffer_bytes", "writer_threads")}
        reasons["load_direct_io"] = _LOAD_DEFAULT
        return Choice(defaults.validate(), reasons, None)
    if results is None:
        reasons = {
            "direct_io": "no replay results: O_DIRECT, the fastest in arXiv 2512.24511",
            "queue_depth": "no replay results: default",
            "buffer_bytes": "no replay results: default",
            "writer_threads": f"{threads} thread(s) wrote per rank in the trace",
            "load_direct_io": _LOAD_DEFAULT,
        }
        return Choice(WriterOptions(writer_threads=threads).validate(), reasons, None)
    entries = results["results"]
    unknown = next((r["strategy"] for r in entries if _strategy(r) is None), None)
    if unknown is not None:
        raise CheckpointError(
            f"the results hold strategy {unknown[:60]!r}, not one ckpt-trace replays "
            f"({', '.join(strategies.names())}, optionally +pack-files); emit tunes only from those"
        )
    reference = next((r for r in entries if r["strategy"] == "posix"), entries[0])
    load = reads_only or reference.get("bytes_read", 0) > reference.get("bytes_written", 0)  # a replayed load
    saves, loads = phase_view(results, "save"), phase_view(results, "load")
    options = results.get("options", {})
    if saves is not None and loads is not None and not reads_only:  # a save and a load: each by its own time
        (best, why), (best_load, why_load) = verdict(saves), verdict(loads)
        load = False
        why = f"save: {why}; load: {why_load}"
    else:
        best, why = verdict(results)
        best_load = best if load else None
    durable_note = (
        "" if options.get("durable") or load else "; the replay was not --durable, which favours the page cache"
    )
    reasons = {"verdict": why + durable_note}
    if best is None or load:
        kept = "a load tunes only the reader" if load else "no verdict"
        reasons.update(
            {
                "direct_io": f"default ({kept})",
                "queue_depth": f"default ({kept})",
                "buffer_bytes": f"default ({kept})",
                "writer_threads": f"default ({kept})"
                if reads_only
                else f"{threads} thread(s) wrote per rank in the trace",
            }
        )
        direct, queue_depth, buffer_bytes = defaults.direct_io, defaults.queue_depth, defaults.buffer_bytes
        threads = defaults.writer_threads if reads_only else threads
    else:
        spec = strategies.get(best["strategy"].removesuffix("+pack-files"))
        direct = _bypasses_cache(best)
        packed = options.get("pack_files", False) and spec.packs_files
        queue_depth = (
            int(options.get("queue_depth", defaults.queue_depth)) if spec.uses_queue_depth else defaults.queue_depth
        )
        buffer_bytes = (
            int(options.get("buffer_bytes", defaults.buffer_bytes)) if spec.uses_buffer_bytes else defaults.buffer_bytes
        )
        threads = 1 if packed else threads
        reasons.update(
            {
                "direct_io": f"from the verdict: {best['strategy']} ({'page cache bypassed' if direct else 'buffered'})",
                "queue_depth": "from the verdict: the replay's --queue-depth"
                if spec.uses_queue_depth and "queue_depth" in options
                else "default",
                "buffer_bytes": "from the verdict: the replay's --buffer-size" if spec.uses_buffer_bytes else "default",
                "writer_threads": "from the verdict: one file per rank (--pack-files won)"
                if packed
                else f"{threads} thread(s) wrote per rank in the trace",
            }
        )
    if not load and loads is None:
        load_direct = defaults.load_direct_io
        reasons["load_direct_io"] = "default (a save tunes only the writer): " + _LOAD_DEFAULT
    elif best_load is None:
        load_direct = defaults.load_direct_io
        reasons["load_direct_io"] = "default (no verdict on this load): " + _LOAD_DEFAULT
    else:
        load_direct = _bypasses_cache(best_load)
        reasons["load_direct_io"] = (
            f"from the verdict: {best_load['strategy']} read this load fastest "
            f"({'page cache bypassed' if load_direct else 'buffered'})"
        )
    measure = not (best_load is not None and load_direct)
    reasons["load_measure_cold_way"] = (
        "from the verdict: cold bytes always O_DIRECT, which read this load fastest"
        if not measure
        else "default: the reader measures the faster way for cold bytes at each load, on its own bytes"
    )
    chosen = WriterOptions(
        buffer_bytes=buffer_bytes,
        queue_depth=queue_depth,
        direct_io=direct,
        writer_threads=threads,
        load_direct_io=load_direct,
        load_measure_cold_way=measure,
    )
    winner = best_load if load else best
    return Choice(chosen.validate(), reasons, winner["strategy"] if winner is not None else None)


def _trace_lines(trace_path: Path, digest: str, summary: dict) -> list[str]:
    ranks = summary["ranks"]
    rank_text = f"ranks {ranks[0]}-{ranks[-1]}" if ranks else "no ranks"
    return [
        f"trace:   {trace_path} (sha256 {digest[:16]})",
        f"         {summary['rows']:,} rows, {rank_text}, {summary['processes']} processes, "
        f"{summary['bytes_written']:,} bytes written in {summary['ops'].get('write', {}).get('count', 0):,} writes,",
        f"         {summary['alignment']['unaligned_offset_share']:.1%} of offsets not 4 KiB aligned",
    ]


def _results_lines(results_path: Path, results: dict) -> list[str]:
    options = results.get("options", {})
    lines = [
        f"replay:  {results_path} ({', '.join(f'{k}={v}' for k, v in options.items()) or 'options not recorded'})",
        f"         {'strategy':<24}{'write MB/s':>12}{'elapsed s':>11}{'vs posix':>10}",
    ]
    for entry in results["results"]:
        speedup = entry.get("speedup_vs_posix")
        noise = "~" if (entry.get("speedup") or {}).get("verdict") == "within noise" else ""
        lines.append(
            f"         {entry['strategy']:<24}{entry.get('write_throughput_bytes_per_s', 0) / 1e6:>12,.0f}"
            f"{entry['elapsed_s']:>11.3f}{f'{speedup:.2f}x{noise}' if speedup else '-':>10}"
        )
    return lines


def docstring_literal(text: str) -> str:
    """``text`` as a triple-quoted Python string literal that evaluates to exactly ``text``, whatever it holds
    (quotes, backslashes, control characters, undecodable path bytes): backslash and double quote are
    escaped, every character but newline and printable ones written as an escape. Text from data (paths,
    strategy names, options) thus never becomes code (Python reference, "String and Bytes literals")."""
    parts = []
    for char in text:
        if char in '\\"':
            parts.append("\\" + char)
        elif char == "\n" or (char.isprintable() and not 0xD800 <= ord(char) <= 0xDFFF):
            parts.append(char)
        else:
            code = ord(char)
            parts.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return '"""' + "".join(parts) + '\n"""'


def small_object_lines(layout: dict | None, buffer_bytes: int) -> list[str]:
    """The emitted header's paragraph on small objects, from the trace's checkpoint layout (``summary``'s
    ``layout``): the rule (objects smaller than a staging buffer are packed end to end, each at a
    ``config.WRITER_ITEM_ALIGN_BYTES`` boundary, into shared staging buffers, so they leave as whole
    buffer writes), its threshold (``buffer_bytes``), and what the small objects cost in the recording."""
    rule = (
        f"Small objects: every object smaller than a staging buffer (threshold buffer_bytes = "
        f"{buffer_bytes:,} B) is packed end to end, each at a {config.WRITER_ITEM_ALIGN_BYTES}-byte boundary, "
        "into staging buffers it shares with its neighbours, and leaves as part of whole-buffer writes; "
        "larger ones are cut into whole buffers."
    )
    if not layout or layout.get("missing") is not None or not layout.get("by_size_class"):
        return [
            rule,
            "    (the trace has no checkpoint layout: ckpt-trace annotate TRACE --checkpoint DIR adds it)",
            "",
        ]
    small = next((e for e in layout["by_size_class"] if e["size_class"] == "<64 KiB"), None)
    if small is None:
        return [rule, "    The recording's checkpoint has no object under 64 KiB.", ""]
    aligned = small["object_bytes"] + small["objects"] * (config.WRITER_ITEM_ALIGN_BYTES - 1)
    writes = max(1, -(-aligned // buffer_bytes))
    ops = small["write_ops"] + small["read_ops"]
    return [
        rule,
        f"    Why: in the recording, {small['objects']:,} objects under 64 KiB ({small['object_bytes']:,} B) "
        f"took {ops:,} operations and {layout['small_object_time_share']:.0%} of the time spent on checkpoint "
        f"objects; packed, they fill about {writes:,} buffer write(s).",
        "",
    ]


def render_module(
    trace_path: Path,
    digest: str,
    summary: dict,
    choice: Choice,
    results_path: Path | None,
    results: dict | None,
    today: datetime.date | None = None,
    module: str = "{module}",
) -> str:
    """The emitted module's source: a docstring saying what chose what, the pinned options, the factories.

    Every value taken from the trace or the results appears only inside the docstring, escaped
    (``docstring_literal``), or as a validated integer or flag; ``module`` is the name the usage example
    imports. Raises CheckpointError for an option that is not an integer or a flag."""
    today = today or datetime.date.today()
    header = [f"Checkpoint writer emitted by ckpt-trace {__version__} on {today.isoformat()}.", "", "Chosen from:"]
    lines = _trace_lines(trace_path, digest, summary)
    if results is not None and results_path is not None:
        lines += _results_lines(results_path, results) + [f"verdict: {choice.reasons.get('verdict', '-')}"]
    else:
        lines.append("replay:  none given (ckpt-trace emit --from-results REPLAY_JSON tunes from measurements)")
    header += [f"    {line}" for line in lines]
    from_verdict = [n for n, why in choice.reasons.items() if why.startswith("from the verdict")]
    header += ["", "Parameters (from the verdict: " + (", ".join(from_verdict) or "none") + "):"]
    values = choice.options.to_json()
    for name in ("buffer_bytes", "queue_depth", "direct_io", "writer_threads", "load_direct_io"):
        header.append(f"    {name} = {values[name]!r}: {choice.reasons[name]}")
    if "load_measure_cold_way" in choice.reasons:
        name = "load_measure_cold_way"
        header.append(f"    {name} = {values[name]!r}: {choice.reasons[name]}")
    staging_mib = values["buffer_bytes"] * values["queue_depth"] * values["writer_threads"] / (1 << 20)
    header += [f"Staging memory per rank: {staging_mib:,.0f} MiB.", ""] + small_object_lines(
        summary.get("layout"), values["buffer_bytes"]
    )
    header += [
        "Needs ckpt-trace-runtime (torch, numpy; no pyarrow): 'pip wheel --no-deps ./runtime' in ckpt-trace's",
        "repository builds its wheel, for a training image without ckpt-trace.",
        "",
        "Use:",
        "    import torch.distributed.checkpoint as dcp",
        "    from {module} import make_reader, make_writer",
        "    dcp.save(state_dict, storage_writer=make_writer('/checkpoints/step-1000'))",
        "    dcp.load(state_dict, storage_reader=make_reader('/checkpoints/step-1000'))",
        "    # one process, whole tensors: the same reader without DCP's planner (else dcp.load itself)",
        "    from {module} import load",
        "    load(state_dict, '/checkpoints/step-1000')",
    ]
    for name, value in values.items():  # only numbers and flags become code
        if type(value) not in (int, bool):
            raise CheckpointError(f"writer option {name} = {value!r} is not an integer or a flag")
    args = "\n".join(f"    {name}={values[name]!r}," for name in values)
    docstring = docstring_literal("\n".join(header).replace("{module}", module))
    return (
        f"{docstring}\n\n"
        "from ckpt_trace.writer import CheckpointReader, CheckpointWriter, WriterOptions, load_state_dict\n\n"
        f"OPTIONS = WriterOptions(\n{args}\n)\n\n\n"
        "def make_writer(path):\n"
        '    """A torch.distributed.checkpoint StorageWriter for the checkpoint directory ``path``."""\n'
        "    return CheckpointWriter(path, OPTIONS)\n\n\n"
        "def make_reader(path):\n"
        '    """The StorageReader for checkpoints written by ``make_writer``."""\n'
        "    return CheckpointReader(path, OPTIONS)\n\n\n"
        "def load(state_dict, path):\n"
        '    """Fill ``state_dict`` in place from a checkpoint written by ``make_writer``, in this process, without\n'
        "    DCP's planner where its tensors allow (``ckpt_trace.writer.load_state_dict``; else ``dcp.load``).\n"
        '    Returns the reader (``last_load_stats``)."""\n'
        "    return load_state_dict(state_dict, path, OPTIONS)\n"
    )


def emit(
    trace_path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    results_path: str | os.PathLike | None = None,
    force: bool = False,
) -> Choice:
    """Write the tuned writer module to ``output``; returns the choice.

    Raises TraceFormatError for a bad trace, CkptTraceError for results of
    another trace, unreadable results or an existing ``output`` without ``force``.
    """
    from ckpt_trace.analysis.summary import summarize_file

    output = Path(output)
    if output.suffix != ".py":
        raise CheckpointError(f"{output} must be a .py file, to be imported")
    check_output_file(output, force, inputs=(trace_path, results_path))
    trace_path = Path(trace_path)
    summary = summarize_file(trace_path)  # in record batches: any trace size
    digest = sha256_file(trace_path)
    if summary["rows"] == 0 or summary["bytes_written"] + summary["bytes_read"] < config.REPLAY_MIN_JUDGE_BYTES:
        raise NothingToJudge(
            f"nothing to judge: the trace's reads and writes move "
            f"{summary['bytes_written'] + summary['bytes_read']:,} B, under "
            f"{config.REPLAY_MIN_JUDGE_BYTES:,} B (CKPT_TRACE_REPLAY_MIN_JUDGE_BYTES); no module written"
        )
    results = load_replay_results(results_path, digest, str(trace_path)) if results_path is not None else None
    reads_only = summary["bytes_written"] == 0 and summary["bytes_read"] > 0
    choice = choose(summary["writer_threads_per_rank"], results, reads_only=reads_only)
    text = render_module(
        trace_path, digest, summary, choice, Path(results_path) if results_path else None, results, module=output.stem
    )
    write_bytes_atomic(output, text.encode("utf-8"))
    return choice
