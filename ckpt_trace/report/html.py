"""``ckpt-trace report``: one self-contained HTML page (PNG figures embedded as data URIs) about a trace.

Figures (matplotlib, Agg backend): operations per process/thread over time;
request-size histogram by count and by bytes (power-of-two buckets, as in
``summary``); offset versus time for the files with the most bytes;
throughput over time; and, given replay results, write throughput per
strategy with the fio device limit as a line when known (``--fio-limit`` or
a ``fio_write_bytes_per_s`` key in the results file, as the benchmarks
write). The page marks ``data-images-ok`` on <body> once every image has
decoded, so a headless browser can confirm it rendered.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckpt_trace.analysis.summary import DATA_OPS, summarize
from ckpt_trace.documents import load_replay_results
from ckpt_trace.errors import CkptTraceError
from ckpt_trace.formats import Trace, read_trace, sha256_file, write_bytes_atomic
from ckpt_trace.iolayer.outputs import check_output_file
from ckpt_trace.units import human_bytes, human_ns, human_rate

from .figures import png_base64, pyplot

TOP_FILES = 6
THROUGHPUT_BINS = 100
_COLORS = {"write": "#d62728", "read": "#1f77b4", "fsync": "#2ca02c", "other": "#999999"}


_png = png_base64


def _columns(trace: Trace) -> dict[str, list]:
    table = trace.table
    return {c: table[c].to_pylist() for c in ("ts_ns", "dur_ns", "pid", "tid", "op", "path", "offset", "size", "ret")}


def timeline_png(trace: Trace) -> str:
    """One lane per (pid, tid); each operation a bar from entry to exit, coloured by kind."""
    plt = pyplot()
    cols = _columns(trace)
    start = min(cols["ts_ns"]) if cols["ts_ns"] else 0
    lanes = sorted({(p, t) for p, t in zip(cols["pid"], cols["tid"])})
    index = {lane: i for i, lane in enumerate(lanes)}
    bars: dict[str, dict[int, list]] = {}
    for ts, dur, pid, tid, op in zip(cols["ts_ns"], cols["dur_ns"], cols["pid"], cols["tid"], cols["op"]):
        kind = op if op in _COLORS else "other"
        bars.setdefault(kind, {}).setdefault(index[(pid, tid)], []).append(((ts - start) / 1e9, max(dur, 1) / 1e9))
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.35 * len(lanes)))
    for kind, per_lane in bars.items():
        for lane, spans in per_lane.items():
            ax.broken_barh(spans, (lane - 0.4, 0.8), facecolors=_COLORS[kind], label=kind)
    handles = {h.get_label(): h for h in ax.get_legend_handles_labels()[0]}
    ax.legend(handles.values(), handles.keys(), loc="upper right", fontsize=8)
    ax.set_yticks(range(len(lanes)), [f"pid {p} / tid {t}" for p, t in lanes], fontsize=8)
    ax.set_xlabel("time since first operation (s)")
    ax.set_title("Operations per process / thread")
    return _png(fig)


def histogram_png(summary: dict) -> str:
    """Request sizes in power-of-two buckets: operation count (left) and bytes (right)."""
    plt = pyplot()
    buckets = summary["size_histogram"]
    labels = [human_bytes(b["bucket_bytes"]) for b in buckets]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    x = range(len(buckets))
    left.bar(x, [b["write"] for b in buckets], color=_COLORS["write"], label="write")
    left.bar(x, [b["read"] for b in buckets], bottom=[b["write"] for b in buckets], color=_COLORS["read"],
             label="read")
    right.bar(x, [b["bytes"] / (1 << 20) for b in buckets], color="#555555")
    for ax, title in ((left, "operations"), (right, "MiB moved")):
        ax.set_xticks(list(x), labels, rotation=60, fontsize=7)
        ax.set_title(f"Request sizes: {title}")
    left.legend(fontsize=8)
    return _png(fig)


def offsets_png(trace: Trace) -> str:
    """Offset (MiB) against time for the files with the most bytes moved, one panel each."""
    plt = pyplot()
    cols = _columns(trace)
    start = min(cols["ts_ns"]) if cols["ts_ns"] else 0
    moved: dict[str, int] = {}
    for op, path, ret in zip(cols["op"], cols["path"], cols["ret"]):
        if op in DATA_OPS and path:
            moved[path] = moved.get(path, 0) + max(ret or 0, 0)
    files = sorted(moved, key=moved.get, reverse=True)[:TOP_FILES] or ["(no data operations)"]
    fig, axes = plt.subplots(len(files), 1, figsize=(11, 1.9 * len(files)), squeeze=False)
    for ax, path in zip(axes[:, 0], files):
        for op in DATA_OPS:
            points = [((ts - start) / 1e9, off / (1 << 20)) for ts, o, p, off in
                      zip(cols["ts_ns"], cols["op"], cols["path"], cols["offset"]) if o == op and p == path and
                      off is not None]
            if points:
                ax.scatter(*zip(*points), s=4, color=_COLORS[op], label=op)
        ax.set_title(f"{path} ({human_bytes(moved.get(path, 0))})", fontsize=8, loc="left")
        ax.set_ylabel("offset (MiB)", fontsize=8)
    axes[-1, 0].set_xlabel("time since first operation (s)")
    fig.subplots_adjust(hspace=0.7)
    return _png(fig)


def throughput_png(trace: Trace) -> str:
    """Bytes written and read per time bin (MB/s), attributed at each operation's completion."""
    plt = pyplot()
    cols = _columns(trace)
    if not cols["ts_ns"]:
        raise CkptTraceError(f"{trace.path} holds no operations to report")
    start = min(cols["ts_ns"])
    end = max(ts + dur for ts, dur in zip(cols["ts_ns"], cols["dur_ns"]))
    width_ns = max(1, (end - start) // THROUGHPUT_BINS + 1)
    totals = {op: [0] * THROUGHPUT_BINS for op in DATA_OPS}
    for ts, dur, op, ret in zip(cols["ts_ns"], cols["dur_ns"], cols["op"], cols["ret"]):
        if op in DATA_OPS and ret and ret > 0:
            totals[op][min(THROUGHPUT_BINS - 1, (ts + dur - start) // width_ns)] += ret
    times = [(i + 0.5) * width_ns / 1e9 for i in range(THROUGHPUT_BINS)]
    fig, ax = plt.subplots(figsize=(11, 3.2))
    for op in DATA_OPS:
        ax.plot(times, [b / (width_ns / 1e9) / 1e6 for b in totals[op]], color=_COLORS[op], label=op)
    ax.set_xlabel("time since first operation (s)")
    ax.set_ylabel("MB/s")
    ax.set_title(f"Throughput over time ({width_ns / 1e6:.1f} ms bins)")
    ax.legend(fontsize=8)
    return _png(fig)


def strategies_png(results: list[dict], fio_limit_bytes_per_s: float | None) -> str:
    """Write throughput per replayed strategy (bars) and the fio device limit (dashed line)."""
    plt = pyplot()
    labels = [f"{r['source']}: {r['strategy']}" if r.get("source") else r["strategy"] for r in results]
    values = [r.get("write_throughput_bytes_per_s", 0) / 1e6 for r in results]
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.45 * len(results)))
    ax.barh(range(len(results)), values, color="#4c72b0")
    ax.set_yticks(range(len(results)), labels, fontsize=8)
    ax.invert_yaxis()
    for i, value in enumerate(values):
        ax.text(value, i, f" {value:,.0f}", va="center", fontsize=8)
    if fio_limit_bytes_per_s:
        ax.axvline(fio_limit_bytes_per_s / 1e6, color="#d62728", linestyle="--",
                   label=f"fio limit {fio_limit_bytes_per_s / 1e6:,.0f} MB/s")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("write throughput (MB/s)")
    ax.set_title("Replay strategies")
    return _png(fig)


def load_results(paths: Sequence[str | os.PathLike], trace: Trace) -> tuple[list[dict], float | None]:
    """Results of ``replay -o`` files of ``trace`` (refused when of another trace), labelled by file name;
    and a fio limit if one holds it."""
    rows, fio = [], None
    digest = sha256_file(trace.path) if paths else None
    for path in map(Path, paths):
        data = load_replay_results(path, digest, str(trace.path))
        fio = fio or data.get("fio_write_bytes_per_s")
        rows.extend({**entry, "source": path.stem if len(paths) > 1 else ""} for entry in data["results"])
    return rows, fio


def _summary_html(summary: dict) -> str:
    facts = [("trace", summary["trace"]), ("backend", summary["backend"]), ("rows", f"{summary['rows']:,}"),
             ("duration", human_ns(summary["duration_ns"])), ("written", human_bytes(summary["bytes_written"])),
             ("read", human_bytes(summary["bytes_read"])), ("files", summary["files"]),
             ("processes / threads", f"{summary['processes']} / {summary['threads']}"),
             ("ranks", ", ".join(map(str, summary["ranks"])) or "-"),
             ("data ops / time", f"{summary['data_ops']:,} / {human_ns(summary['data_time_ns'])}"),
             ("metadata ops / time", f"{summary['metadata_ops']:,} / {human_ns(summary['metadata_time_ns'])}"),
             ("offsets not 4 KiB aligned", f"{summary['alignment']['unaligned_offset_share']:.1%}"),
             ("failed ops", summary["failed_ops"]), ("lost events", summary["lost_events"])]
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    ops = "".join(f"<tr><td>{html.escape(op)}</td><td>{v['count']:,}</td><td>{human_bytes(v['bytes'])}</td>"
                  f"<td>{human_ns(v['time_ns'])}</td></tr>" for op, v in summary["ops"].items())
    interfaces = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{e['ops']:,}</td><td>{human_bytes(e['bytes_written'])}</td>"
        f"<td>{human_bytes(e['bytes_read'])}</td><td>{human_ns(e['latency_ns'].get('p50', 0))}</td>"
        f"<td>{human_ns(e['latency_ns'].get('p99', 0))}</td>"
        f"<td>{_depths(e.get('in_flight'))}</td></tr>" for name, e in summary.get("interfaces", {}).items())
    unseen = "".join(f"<p class='warning'>{html.escape(capture)}: {entry['count']:,} not in the trace "
                     f"({html.escape(entry['reason'])})</p>" for capture, entry in summary.get("unseen", {}).items())
    return (f"<table class='facts'>{rows}</table><h3>Operations</h3><table><tr><th>op</th><th>count</th>"
            f"<th>bytes</th><th>time in syscall</th></tr>{ops}</table>"
            "<h3>I/O interfaces (data operations)</h3><table><tr><th>interface</th><th>ops</th><th>written</th>"
            "<th>read</th><th>p50 latency</th><th>p99 latency</th><th>requests in flight at submission</th></tr>"
            f"{interfaces}</table>{unseen}")


def _depths(in_flight: dict | None) -> str:
    """'p50 4, max 8: 1: 12, 2: 30, 4: 100...' (power-of-two buckets), or '-' for system calls."""
    if not in_flight:
        return "-"
    buckets = ", ".join(f"{b}: {c:,}" for b, c in in_flight["histogram"].items())
    return html.escape(f"median {in_flight['p50']}, max {in_flight['max']} ({buckets})")


def _results_html(results: list[dict]) -> str:
    def row(r: dict) -> str:
        speedup = f"{r['speedup_vs_posix']:.2f}x" if r.get("speedup_vs_posix") else "-"
        cells = (r.get("source") or "", r["strategy"], f"{r.get('elapsed_s', 0):.3f} s",
                 human_rate(r.get("write_throughput_bytes_per_s", 0)), human_ns(r.get("latency_ns", {}).get("p99", 0)),
                 speedup)
        return "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"

    return ("<table><tr><th>results</th><th>strategy</th><th>elapsed</th><th>write</th><th>p99</th>"
            f"<th>vs posix</th></tr>{''.join(row(r) for r in results)}</table>")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ckpt-trace report: {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }} th, td {{ border: 1px solid #ccc; padding: 3px 8px; }}
th {{ background: #f3f3f3; text-align: left; }} td {{ text-align: right; }} img {{ max-width: 100%; }}
</style></head>
<body data-images-ok="0">
<h1>ckpt-trace report</h1><p>{title}</p>
<h2>Summary</h2>{summary}
{sections}
<script>
window.addEventListener("load", function () {{
  var images = Array.prototype.slice.call(document.images);
  var ok = images.filter(function (im) {{ return im.complete && im.naturalWidth > 0; }}).length;
  document.body.setAttribute("data-images-ok", String(ok));
  document.body.setAttribute("data-images-total", String(images.length));
}});
</script>
</body></html>
"""


def build_report(trace: Trace, results: list[dict], fio_limit_bytes_per_s: float | None) -> str:
    """The page's HTML text."""
    summary = summarize(trace)
    figures = [("Timeline", timeline_png(trace)), ("Request sizes", histogram_png(summary)),
               ("Offset versus time", offsets_png(trace)), ("Throughput over time", throughput_png(trace))]
    sections = "".join(f"<h2>{title}</h2><img alt='{title}' src='data:image/png;base64,{data}'>"
                       for title, data in figures)
    if results:
        sections += ("<h2>Strategy comparison</h2>" + _results_html(results) +
                     f"<img alt='Strategy comparison' src='data:image/png;base64,"
                     f"{strategies_png(results, fio_limit_bytes_per_s)}'>")
    return _PAGE.format(title=html.escape(str(trace.path)), summary=_summary_html(summary), sections=sections)


def write_report(trace_path: str | os.PathLike, output: str | os.PathLike, *, results_paths: Sequence = (),
                 fio_limit_bytes_per_s: float | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Build the page for ``trace_path`` (and replay results) and write it atomically to ``output``.

    Returns {"output", "bytes", "figures"}. Raises TraceFormatError for a
    bad trace, CkptTraceError for bad results, an existing output without
    ``overwrite``, or missing matplotlib.
    """
    output = check_output_file(output, overwrite)
    trace = read_trace(trace_path)
    results, fio = load_results(results_paths, trace)
    text = build_report(trace, results, fio_limit_bytes_per_s or fio)
    write_bytes_atomic(output, text.encode())
    return {"output": str(output), "bytes": len(text), "figures": text.count("<img ")}
