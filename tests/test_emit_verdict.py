"""emit decides from the verdict: a strategy only when its paired interval is clear of every other's, one
direction only (a load tunes the reader), the winner's measured data path, and nothing from an empty trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli

from ckpt_trace.writer.emit import choose
from ckpt_trace.writer.options import WriterOptions


def entry(low: float, high: float, n: int = 6) -> dict:
    verdict = "faster" if low > 1 else "slower" if high < 1 else "within noise"
    return {"median": (low + high) / 2, "low": low, "high": high, "coverage": 0.97, "n": n, "verdict": verdict}


def results(versus_aggregated: dict, *, read: bool = False, direct_share: float = 1.0) -> dict:
    moved = {"bytes_read": 1 << 30, "bytes_written": 0} if read else {"bytes_read": 0, "bytes_written": 1 << 30}
    names = ["posix", "uring-buffered", "aggregated"]
    docs = []
    for name in names:
        elapsed = 0.5 if name == "aggregated" else 1.0
        versus = versus_aggregated if name == "aggregated" else {"aggregated": entry(0.4, 0.6)}
        docs.append(
            {
                "strategy": name,
                "elapsed_s": elapsed,
                "versus": versus,
                **moved,
                "o_direct_bytes_share": direct_share if name == "aggregated" else 0.0,
            }
        )
    return {"results": docs, "options": {"queue_depth": 16, "buffer_bytes": 2 << 20, "durable": True}}


def test_a_clear_winner_tunes_the_writer_and_says_it_came_from_the_verdict():
    choice = choose(2, results({"posix": entry(1.6, 2.2), "uring-buffered": entry(1.3, 1.9)}), cpu_count=8)
    assert choice.winner == "aggregated"
    assert (choice.options.queue_depth, choice.options.buffer_bytes, choice.options.direct_io) == (16, 2 << 20, True)
    assert choice.reasons["queue_depth"].startswith("from the verdict")
    assert "faster than every other strategy (by 1.30x" in choice.reasons["verdict"]
    assert choice.reasons["load_direct_io"].startswith("default (a save tunes only the writer)")


def test_within_noise_keeps_the_defaults_and_says_why():
    choice = choose(2, results({"posix": entry(1.6, 2.2), "uring-buffered": entry(0.9, 1.4)}), cpu_count=8)
    defaults = WriterOptions()
    assert choice.winner is None
    assert (choice.options.queue_depth, choice.options.buffer_bytes) == (defaults.queue_depth, defaults.buffer_bytes)
    assert (
        "no strategy clear of the others" in choice.reasons["verdict"] and "uring-buffered" in choice.reasons["verdict"]
    )
    assert choice.reasons["direct_io"] == "default (no verdict)"


def test_a_load_tunes_only_the_reader_from_the_measured_path():
    clear = {"posix": entry(1.6, 2.2), "uring-buffered": entry(1.3, 1.9)}
    choice = choose(2, results(clear, read=True, direct_share=0.0), cpu_count=8)
    defaults = WriterOptions()
    assert choice.options.load_direct_io is False  # the winner's bytes went through the page cache
    assert (choice.options.direct_io, choice.options.queue_depth) == (defaults.direct_io, defaults.queue_depth)
    assert choice.reasons["queue_depth"] == "default (a load tunes only the reader)"


def test_a_save_and_a_load_tune_the_writer_and_the_reader_each_from_its_own_phase():
    """A trace holding both: the writer from the save phase's verdict (aggregated clear), the reader from the
    load phase's (posix clear, its bytes through the page cache), although the whole runs' verdict (here
    uring-buffered) says otherwise."""
    docs = results({"posix": entry(1.6, 2.2), "uring-buffered": entry(0.5, 0.7)})
    save_clear = {"posix": entry(1.6, 2.2), "uring-buffered": entry(1.3, 1.9)}
    for doc in docs["results"]:
        name = doc["strategy"]
        doc["bytes_read"] = doc["bytes_written"] = 1 << 30
        save_versus = save_clear if name == "aggregated" else {"aggregated": entry(0.4, 0.6)}
        load_versus = (
            {"uring-buffered": entry(1.2, 1.5), "aggregated": entry(1.4, 1.8)}
            if name == "posix"
            else {"posix": entry(0.5, 0.8)}
        )
        doc["phases"] = {
            "save": {"elapsed_s": 0.2 if name == "aggregated" else 0.4, "versus": save_versus},
            "load": {"elapsed_s": 0.1 if name == "posix" else 0.3, "versus": load_versus},
        }
    choice = choose(2, docs, cpu_count=8)
    assert (choice.options.direct_io, choice.options.queue_depth) == (True, 16)  # aggregated's
    assert choice.options.load_direct_io is False and choice.options.load_measure_cold_way is True
    assert choice.reasons["load_direct_io"].startswith("from the verdict: posix read this load fastest")
    assert (
        choice.reasons["verdict"].startswith("save: aggregated was faster")
        and "load: posix was faster" in (choice.reasons["verdict"])
    )
    for doc in docs["results"]:  # without the phases' verdicts (older results): the whole runs decide
        doc["phases"] = {phase: {"elapsed_s": 0.1} for phase in ("save", "load")}
    assert "save:" not in choose(2, docs, cpu_count=8).reasons["verdict"]


def test_results_without_rounds_are_no_verdict():
    docs = results({})
    for doc in docs["results"]:
        doc.pop("versus")
    assert choose(1, docs, cpu_count=8).winner is None


@pytest.mark.slow
def test_emit_on_a_trace_too_small_to_judge_is_one_line(tmp_path):
    from helpers.traces import too_small_to_judge

    trace = too_small_to_judge(tmp_path / "t.arrow")
    proc = cli("emit", str(trace), "-o", str(tmp_path / "w.py"), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nothing to judge" in proc.stderr
    assert not (tmp_path / "w.py").exists()


@pytest.mark.slow
@pytest.mark.io_uring
def test_emit_header_names_the_verdict(io_uring, tmp_path):
    golden = Path(__file__).resolve().parent.parent / "traces" / "golden" / "v4-dcp-gpt2-tiny-2ranks-bcc.arrow"
    out = tmp_path / "r.json"
    cli("replay", str(golden), "--strategy", "all", "--target", str(tmp_path / "t"), "--repeat", "3", "-o", str(out))
    cli("emit", str(golden), "--from-results", str(out), "-o", str(tmp_path / "w.py"))
    text = (tmp_path / "w.py").read_text()
    assert "verdict: no strategy clear of the others" in text  # 3 rounds never tell strategies apart
    assert "Parameters (from the verdict: none):" in text


def test_a_trace_that_only_reads_tunes_no_writer_parameter_without_results():
    choice = choose(1, None, cpu_count=8, reads_only=True)
    assert choice.options == WriterOptions().validate() and choice.winner is None
    for name in ("direct_io", "queue_depth", "buffer_bytes", "writer_threads"):
        assert choice.reasons[name] == "default (the trace only reads: nothing in it tunes the writer)"
    assert "arXiv" not in choice.reasons["direct_io"]  # no longer "O_DIRECT, the fastest" for a writer never traced


def test_a_trace_that_only_reads_is_a_load_whatever_the_results_moved():
    clear = {"posix": entry(1.6, 2.2), "uring-buffered": entry(1.3, 1.9)}
    choice = choose(3, results(clear, direct_share=0.0), cpu_count=8, reads_only=True)  # results say "written"
    assert choice.options.writer_threads == WriterOptions().writer_threads
    assert choice.options.load_direct_io is False and choice.reasons["load_direct_io"].startswith("from the verdict")
    assert choice.reasons["writer_threads"] == "default (a load tunes only the reader)"


@pytest.mark.slow
def test_emit_on_a_load_only_trace_leaves_the_writer_at_its_defaults(tmp_path):
    from helpers.traces import make_trace

    size = 1 << 20
    trace = make_trace(
        tmp_path / "load.arrow",
        [
            {"op": "open", "path": "/ck/a.distcp", "fd": 3, "flags": 0, "ret": 3},
            {"op": "read", "path": "/ck/a.distcp", "fd": 3, "offset": 0, "size": size, "ret": size},
            {"op": "close", "path": "/ck/a.distcp", "fd": 3},
        ],
    )
    cli("emit", str(trace), "-o", str(tmp_path / "w.py"))
    text = (tmp_path / "w.py").read_text()
    assert "direct_io = True: default (the trace only reads: nothing in it tunes the writer)" in text
    assert "Parameters (from the verdict: none):" in text


def test_a_clear_load_verdict_pins_the_readers_cold_way_and_no_verdict_leaves_it_measured():
    """A load whose verdict clearly favours a strategy whose bytes went O_DIRECT pins the reader's cold bytes
    to O_DIRECT (``load_measure_cold_way`` off, from the verdict); a load without a clear verdict, or won
    buffered, and a save leave the reader measuring the cold way at each load."""
    clear = {"posix": entry(1.6, 2.2), "uring-buffered": entry(1.3, 1.9)}
    direct = choose(1, results(clear, read=True, direct_share=1.0))
    assert direct.options.load_direct_io is True and direct.options.load_measure_cold_way is False
    assert direct.reasons["load_measure_cold_way"].startswith("from the verdict")
    buffered = choose(1, results(clear, read=True, direct_share=0.0))
    assert buffered.options.load_direct_io is False and buffered.options.load_measure_cold_way is True
    tie = choose(1, results({"posix": entry(0.8, 1.3), "uring-buffered": entry(0.9, 1.2)}, read=True))
    assert tie.options.load_measure_cold_way is True and tie.reasons["load_measure_cold_way"].startswith("default")
    save = choose(1, results(clear, direct_share=1.0))
    assert save.options.load_measure_cold_way is True
