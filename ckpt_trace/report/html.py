"""``ckpt-trace report``: one self-contained HTML page about a trace, organised by the data's way.

Sections, in the order the bytes travel: the **job** (command, host, kernel,
file systems, the I/O window), the **GPU copies** before the I/O (traces with
copies), the **calls and requests** per I/O interface (operations and their
latency distribution, request sizes, files with their access pattern, offsets
over time), the **ranks** over time (a heat map of bytes per rank, throughput,
I/O time per rank with the slowest and a chosen rank, the timeline of those
two), the **storage** (what ``replay`` measured, against fio's limit when
known) and the **recommendation** (what ``emit`` would choose, and why).

Every figure is drawn from the aggregates of ``analysis.profile`` (two passes
over the trace in record batches), never from the rows, so a 10 M-row trace
renders as fast as its aggregates compute, and per-rank views stay readable
at 1,024 ranks: the heat map has one pixel row per rank, the I/O time becomes a
distribution above 64 ranks, and only the slowest and the chosen rank get a
timeline. Figures are PNG (matplotlib, Agg) embedded as data URIs: the page
needs nothing else. It marks ``data-images-ok``/``data-images-total`` on
<body> once its images decoded, so a headless browser can confirm it rendered.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_trace.analysis.layout import layout_report
from ckpt_trace.analysis.profile import KINDS, TOP_FILES, format_ranges, profile_file
from ckpt_trace.analysis.ranks import rank_times_file
from ckpt_trace.documents import load_replay_results
from ckpt_trace.formats import sha256_file, write_bytes_atomic
from ckpt_trace.iolayer.outputs import check_output_file
from ckpt_trace.units import human_bytes, human_ns, human_rate

from .figures import png_base64, pyplot
from .render import GPU_COPY_COLUMNS, gpu_copy_cells

TOP_FILE_ROWS = 20
HEAT_LABELLED_OWNERS = 40  # above this, the heat map labels every n-th rank
RANK_BARS = 64  # above this, I/O time per rank is drawn as a distribution
_COLORS = {"write": "#d62728", "read": "#1f77b4", "fsync": "#2ca02c", "copy": "#9467bd", "other": "#999999"}
_WIDTH_IN = 11.0


def _legend_outside(ax, **kwargs) -> None:
    """The legend right of the axes, where it cannot cover data."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        ax.legend(
            unique.values(),
            unique.keys(),
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            borderaxespad=0,
            **kwargs,
        )


def _seconds(profile: dict) -> np.ndarray:
    window = profile["window"]
    return (np.arange(window["bins"]) + 0.5) * window["bin_ns"] / 1e9


def _time_label(profile: dict) -> str:
    lead = profile["window"]["lead_in_ns"]
    return "seconds since the first data operation" + (f" ({lead / 1e9:.1f} s after recording began)" if lead else "")


def heatmap_png(profile: dict) -> str:
    """Bytes moved per rank (rows) per time bin (columns), in MB/s on a log colour scale."""
    plt = pyplot()
    from matplotlib.colors import LogNorm

    heat = np.asarray(profile["heat"]) / (profile["window"]["bin_ns"] / 1e9) / 1e6
    owners = profile["owners"]
    height = 1.6 + min(0.22 * len(owners), 5.5)
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, height))
    positive = heat[heat > 0]
    if positive.size:
        extent = (0, profile["window"]["bins"] * profile["window"]["bin_ns"] / 1e9, len(owners) - 0.5, -0.5)
        image = ax.imshow(
            np.where(heat > 0, heat, np.nan),
            aspect="auto",
            interpolation="nearest",
            cmap="viridis",
            norm=LogNorm(vmin=max(positive.min(), positive.max() / 1e5), vmax=positive.max()),
            extent=extent,
        )
        fig.colorbar(image, ax=ax, label="MB/s", pad=0.01)
    step = max(1, int(np.ceil(len(owners) / HEAT_LABELLED_OWNERS)))
    ticks = list(range(0, len(owners), step))
    ax.set_yticks(ticks, [owners[i]["label"] for i in ticks], fontsize=7)
    ax.set_xlabel(_time_label(profile))
    ax.set_title("Bytes moved per rank over time (each at its operation's completion)")
    return png_base64(fig)


def throughput_png(profile: dict) -> str:
    """Bytes written and read per time bin, MB/s."""
    plt = pyplot()
    seconds = _seconds(profile)
    per_s = profile["window"]["bin_ns"] / 1e9
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 3.0))
    for row, op in enumerate(("write", "read")):
        values = np.asarray(profile["throughput"][row]) / per_s / 1e6
        if values.any():
            ax.plot(seconds, values, color=_COLORS[op], label=op, drawstyle="steps-mid")
    ax.set_ylim(bottom=0)
    ax.margins(y=0.12)
    ax.set_xlim(0, profile["window"]["bins"] * per_s)
    ax.set_xlabel(_time_label(profile))
    ax.set_ylabel("MB/s")
    ax.set_title(f"Throughput over time ({profile['window']['bin_ns'] / 1e6:,.1f} ms bins)")
    _legend_outside(ax)
    return png_base64(fig)


def ranks_png(profile: dict) -> str:
    """Time in file system calls per rank: one bar each up to RANK_BARS ranks, else their distribution;
    the slowest and the chosen rank marked."""
    plt = pyplot()
    owners = profile["owners"]
    seconds = np.array([o["io_time_ns"] / 1e9 for o in owners])
    slowest = next(i for i, o in enumerate(owners) if o["id"] == profile["slowest"])
    chosen = next(i for i, o in enumerate(owners) if o["id"] == profile["chosen"])
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 3.0))
    if len(owners) <= RANK_BARS:
        colors = ["#4c72b0"] * len(owners)
        colors[chosen] = "#ff7f0e"
        colors[slowest] = "#d62728"
        ax.bar(range(len(owners)), seconds, color=colors)
        step = max(1, len(owners) // 32)
        ax.set_xticks(
            range(0, len(owners), step),
            [owners[i]["label"] for i in range(0, len(owners), step)],
            rotation=60,
            fontsize=7,
        )
        from matplotlib.patches import Patch

        handles = [Patch(color="#d62728", label=f"slowest: {owners[slowest]['label']}")]
        if chosen != slowest:
            handles.append(Patch(color="#ff7f0e", label=f"chosen: {owners[chosen]['label']}"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
        ax.set_ylabel("seconds in I/O calls")
        ax.margins(y=0.12)
    else:
        ax.hist(seconds, bins=50, color="#4c72b0")
        ax.axvline(seconds[slowest], color="#d62728", label=f"slowest: {owners[slowest]['label']}")
        if chosen != slowest:
            ax.axvline(seconds[chosen], color="#ff7f0e", linestyle="--", label=f"chosen: {owners[chosen]['label']}")
        ax.axvline(float(np.median(seconds)), color="#555555", linestyle=":", label="median")
        ax.set_xlabel("seconds in I/O calls")
        ax.set_ylabel("ranks")
    ax.set_title(f"Time in file system calls per rank ({len(owners):,} ranks and processes)")
    if len(owners) > RANK_BARS:
        _legend_outside(ax)
    return png_base64(fig)


def timeline_png(profile: dict) -> str:
    """The operations on files of the slowest and the chosen rank, one lane per thread that touched a file;
    operations shorter than a pixel merged into pixel-wide bars."""
    plt = pyplot()
    bars = np.asarray(profile["timelines"])
    labels = profile["owner_labels"]
    lanes = sorted({(int(o), int(t)) for o, t in bars[:, :2]}) if len(bars) else []
    index = {lane: i for i, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 1.3 + 0.4 * max(1, len(lanes))))
    for kind_id, kind in enumerate(KINDS):
        mine = bars[bars[:, 2] == kind_id] if len(bars) else bars
        for lane, i in index.items():
            rows = mine[(mine[:, 0] == lane[0]) & (mine[:, 1] == lane[1])]
            if len(rows):
                ax.broken_barh(
                    list(zip(rows[:, 3] / 1e9, rows[:, 4] / 1e9)), (i - 0.4, 0.8), facecolors=_COLORS[kind], label=kind
                )
    ax.set_yticks(range(len(lanes)), [f"{labels.get(o, o)} · tid {t}" for o, t in lanes], fontsize=8)
    ax.set_ylim(-0.6, max(1, len(lanes)) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(0, (profile["window"]["end_ns"] - profile["window"]["start_ns"]) / 1e9)
    ax.set_xlabel(_time_label(profile))
    ax.set_title("Timeline of the slowest and the chosen rank (threads that touched files)")
    _legend_outside(ax)
    return png_base64(fig)


def latency_png(profile: dict) -> str:
    """Each operation's latency distribution: share of its operations per quarter-octave bucket, log time."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 3.2))
    for op, entry in list(profile["latency"].items())[:8]:
        if entry["buckets"]:
            ns, counts = np.array(entry["buckets"]).T
            ax.plot(
                ns / 1e3, counts / entry["count"], marker=".", drawstyle="steps-mid", label=f"{op} ({entry['count']:,})"
            )
    ax.set_xscale("log")
    ax.set_xlabel("latency (µs, log scale)")
    ax.set_ylabel("share of the op's calls")
    ax.set_ylim(bottom=0)
    ax.margins(y=0.12)
    ax.set_title("Latency distribution by operation (quarter-octave buckets)")
    _legend_outside(ax)
    return png_base64(fig)


def sizes_png(summary: dict) -> str:
    """Request sizes in power-of-two buckets: operation count (left) and bytes (right), labelled bars."""
    plt = pyplot()
    buckets = summary["size_histogram"] or [{"bucket_bytes": 0, "write": 0, "read": 0, "bytes": 0}]
    labels = [human_bytes(b["bucket_bytes"]) for b in buckets]
    fig, (left, right) = plt.subplots(1, 2, figsize=(_WIDTH_IN, 3.6))
    x = range(len(buckets))
    writes = [b["write"] for b in buckets]
    left.bar(x, writes, color=_COLORS["write"], label="write")
    left.bar(x, [b["read"] for b in buckets], bottom=writes, color=_COLORS["read"], label="read")
    right.bar(x, [b["bytes"] / (1 << 20) for b in buckets], color="#555555")
    for ax, title in ((left, "operations"), (right, "MiB moved")):
        ax.set_xticks(list(x), labels, rotation=60, fontsize=7)
        ax.set_title(f"Request sizes: {title}")
        ax.set_ylim(bottom=0)
        ax.margins(y=0.15)  # headroom: the tallest bar is never cut
    left.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.32), ncol=2, borderaxespad=0)
    fig.subplots_adjust(wspace=0.25)
    return png_base64(fig)


def offsets_png(profile: dict) -> str:
    """Offset against time for the files with the most bytes, one panel each on one shared time axis:
    a dot per (time bin, offset bin) that moved bytes."""
    plt = pyplot()
    files = profile["offsets"]
    fig, axes = plt.subplots(
        max(1, len(files)), 1, figsize=(_WIDTH_IN, 0.8 + 1.6 * max(1, len(files))), sharex=True, squeeze=False
    )
    window, seconds = profile["window"], _seconds(profile)
    for ax, entry in zip(axes[:, 0], files):
        span_mib = max(entry["size_bytes"], 1) / (1 << 20)
        shape = np.asarray(entry["write"]).shape
        offsets_mib = (np.arange(shape[1]) + 0.5) * span_mib / shape[1]
        for op in ("write", "read"):
            t, o = np.nonzero(np.asarray(entry[op]))
            if len(t):
                ax.scatter(seconds[t], offsets_mib[o], s=5, color=_COLORS[op], label=op)
        ax.set_ylim(0, span_mib)
        ax.set_title(f"{_short(entry['path'], 90)} ({human_bytes(entry['size_bytes'])})", fontsize=8, loc="left")
        ax.set_ylabel("offset (MiB)", fontsize=8)
        _legend_outside(ax)
    if not files:
        axes[0, 0].set_title("(no data operations)")
    axes[-1, 0].set_xlim(0, window["bins"] * window["bin_ns"] / 1e9)
    axes[-1, 0].set_xlabel(_time_label(profile))
    fig.subplots_adjust(hspace=0.55)
    return png_base64(fig)


def strategies_png(results: list[dict], fio_limit_bytes_per_s: float | None) -> str:
    """Write throughput per replayed strategy (bars) and the fio device limit (dashed line)."""
    plt = pyplot()
    labels = [f"{r['source']}: {r['strategy']}" if r.get("source") else r["strategy"] for r in results]
    values = [r.get("write_throughput_bytes_per_s", 0) / 1e6 for r in results]
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 0.9 + 0.45 * len(results)))
    ax.barh(range(len(results)), values, color="#4c72b0")
    ax.set_yticks(range(len(results)), labels, fontsize=8)
    ax.invert_yaxis()
    for i, value in enumerate(values):
        ax.text(value, i, f" {value:,.0f}", va="center", fontsize=8)
    top = max(values + [fio_limit_bytes_per_s / 1e6 if fio_limit_bytes_per_s else 0, 1])
    ax.set_xlim(0, top * 1.15)  # room for the value labels
    if fio_limit_bytes_per_s:
        ax.axvline(
            fio_limit_bytes_per_s / 1e6,
            color="#d62728",
            linestyle="--",
            label=f"fio limit {fio_limit_bytes_per_s / 1e6:,.0f} MB/s",
        )
        _legend_outside(ax)
    ax.set_xlabel("write throughput (MB/s)")
    ax.set_title("Replay strategies")
    return png_base64(fig)


def load_results(paths: Sequence[str | os.PathLike], trace_path: str | os.PathLike) -> tuple[list[dict], float | None]:
    """Results of ``replay -o`` files of the trace (refused when of another trace), labelled by file name
    when there are several; and a fio limit if one holds it."""
    rows, fio = [], None
    digest = sha256_file(trace_path) if paths else None
    for path in map(Path, paths):
        data = load_replay_results(path, digest, str(trace_path))
        fio = fio or data.get("fio_write_bytes_per_s")
        rows.extend(
            {
                **entry,
                "source": path.stem if len(paths) > 1 else "",
                "options": data.get("options", {}),
                "environment": data.get("environment", {}),
            }
            for entry in data["results"]
        )
    return rows, fio


# -- tables -----------------------------------------------------------------------------------


def _short(text: str, width: int = 64) -> str:
    """Middle-elided text: the start and the end of a long path both stay readable."""
    text = str(text)
    return text if len(text) <= width else text[: width // 2 - 1] + "…" + text[-(width - width // 2) :]


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='{cls}'><tr>{head}</tr>{body}</table>"


def _facts(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(val))}</td></tr>" for k, val in rows)
    return f"<table class='facts'>{body}</table>"


def _job_html(profile: dict) -> str:
    meta, summary, window = profile["metadata"], profile["summary"], profile["window"]
    command = meta.get("command") or []
    filesystems = (
        "; ".join(
            f"{mount}: {fs.get('type', '?')}, {fs.get('block_size', '?')} B blocks"
            + (f", on {fs['device']}" if fs.get("device") else "")
            + (f" ({fs['device_model']})" if fs.get("device_model") else "")
            for mount, fs in (meta.get("filesystems") or {}).items()
        )
        or "-"
    )
    lead = window["lead_in_ns"]
    facts = [
        ("command", _short(" ".join(command) if isinstance(command, list) else command, 160)),
        (
            "host / kernel / arch",
            f"{meta.get('host') or '-'} / {meta.get('kernel') or '-'} / {meta.get('arch') or '-'}",
        ),
        ("file systems", filesystems),
        (
            "backend",
            f"{meta.get('backend')} ({meta.get('backend_reason') or 'recorded'}), format v{meta.get('format_version')}",
        ),
        ("path filters", ", ".join(meta.get("path_filters") or []) or "none"),
        (
            "recording",
            f"{human_ns(meta.get('elapsed_ns') or summary['duration_ns'])}, exit code {meta.get('exit_code', '-')}",
        ),
        (
            "I/O window",
            f"{human_ns(window['end_ns'] - window['start_ns'])}, from "
            f"{lead / 1e9:.2f} s after recording began" + ("; every time axis starts there" if lead else ""),
        ),
        ("ranks", format_ranges(summary["ranks"]) or "-"),
        ("processes / threads", f"{summary['processes']} / {summary['threads']}"),
        ("rows", f"{summary['rows']:,}"),
        ("written / read", f"{human_bytes(summary['bytes_written'])} / {human_bytes(summary['bytes_read'])}"),
        ("files", f"{summary['files']:,}"),
        ("failed ops", f"{summary['failed_ops']:,}"),
        ("lost events", f"{summary['lost_events']:,}"),
    ]
    unseen = "".join(
        f"<p class='warning'>{html.escape(capture)}: {entry['count']:,} not in the trace "
        f"({html.escape(entry['reason'])})</p>"
        for capture, entry in summary.get("unseen", {}).items()
    )
    lost = (
        (
            f"<p class='warning'>{summary['lost_events']:,} events were lost while recording: the figures below "
            "undercount</p>"
        )
        if summary["lost_events"]
        else ""
    )
    cut = (
        (
            f"<p class='warning'>{html.escape(str(summary['interrupted']))} cut the recording: the trace holds only "
            "what happened until then</p>"
        )
        if summary.get("interrupted")
        else ""
    )
    return _facts(facts) + unseen + lost + cut


def _gpu_html(summary: dict) -> str:
    gpu = summary.get("gpu") or {}
    if not gpu.get("copies"):
        return ""
    rows = [gpu_copy_cells(rank, entry) for rank, entry in gpu["ranks"].items()]
    return (
        "<h2 id='gpu'>GPU copies</h2><p>Host&lt;-&gt;device copies before the file I/O (CUPTI), per rank; "
        "overlap: copy time during which the same rank's file operations were also in flight.</p>"
        + _table(GPU_COPY_COLUMNS, rows)
    )


def _depths(in_flight: dict | None) -> str:
    """'median 4, max 8' for request interfaces, '-' for system calls."""
    if not in_flight:
        return "-"
    return f"median {in_flight['p50']}, max {in_flight['max']}"


def _calls_html(profile: dict, figures: dict) -> str:
    summary = profile["summary"]
    interfaces = [
        (
            name,
            f"{e['ops']:,}",
            human_bytes(e["bytes_written"]),
            human_bytes(e["bytes_read"]),
            human_ns(e["latency_ns"].get("p50", 0)),
            human_ns(e["latency_ns"].get("p99", 0)),
            _depths(e.get("in_flight")),
        )
        for name, e in summary.get("interfaces", {}).items()
    ]
    ops = []
    for op, entry in summary["ops"].items():
        lat = profile["latency"].get(op, {})
        ops.append(
            (
                op,
                f"{entry['count']:,}",
                human_bytes(entry["bytes"]) if entry["bytes"] else "-",
                human_ns(entry["time_ns"]),
                human_ns(lat.get("p50_ns", 0)),
                human_ns(lat.get("p90_ns", 0)),
                human_ns(lat.get("p99_ns", 0)),
                human_ns(lat.get("max_ns", 0)),
            )
        )
    total = max(profile["data_ops"], 1)
    sizes = [
        (f"{s['size_bytes']:,} B ({human_bytes(s['size_bytes'])})", f"{s['count']:,}", f"{s['count'] / total:.1%}")
        for s in profile["sizes"]
    ]
    alignment = summary["alignment"]
    return (
        "<h2 id='calls'>Calls and requests</h2>"
        "<h3>I/O interfaces (data operations)</h3>"
        + _table(
            ("interface", "ops", "written", "read", "p50 latency", "p99 latency", "requests in flight"), interfaces
        )
        + "<h3>Operations</h3><p>Latency percentiles from quarter-octave buckets (within 19 %); max exact.</p>"
        + _table(("op", "count", "bytes", "time", "p50", "p90", "p99", "max"), ops)
        + figures["Latency distribution"]
        + "<h3>Request sizes</h3>"
        + figures["Request sizes"]
        + "<div class='pair'><div><h4>Most common access sizes</h4>"
        + _table(("size", "data ops", "share"), sizes)
        + "</div><div><h4>Alignment (4 KiB)</h4>"
        + _facts(
            [
                ("offsets not aligned", f"{alignment['unaligned_offset_share']:.1%}"),
                ("sizes not aligned", f"{alignment['unaligned_size_share']:.1%}"),
                ("offsets unknown", f"{alignment['ops_with_unknown_offset']:,}"),
            ]
        )
        + "</div></div>"
        + _files_html(profile)
        + _layout_html(profile.get("layout"))
        + figures["Offset versus time"]
    )


def _layout_html(layout: dict | None) -> str:
    """The checkpoint's objects (``analysis.layout.layout_report``): by kind, by size, and inside each file."""
    if not layout:
        return ""
    summary = layout["summary"]
    groups = []
    for title, key, label in (("by kind", "by_kind", "kind"), ("by object size", "by_size_class", "size_class")):
        rows = [
            (
                e[label],
                f"{e['objects']:,}",
                human_bytes(e["object_bytes"]),
                human_bytes(e["bytes_written"]),
                human_bytes(e["bytes_read"]),
                f"{e['write_ops'] + e['read_ops']:,}",
                human_ns(e["time_ns"]),
            )
            for e in summary[key]
        ]
        groups.append(
            f"<h4>Objects {title}</h4>"
            + _table((label.replace("_", " "), "objects", "size", "written", "read", "ops", "time"), rows, "files")
        )
    per_file = []
    for path, entry in layout["files"].items():
        rows = [
            (
                _short(o["name"] or "(unknown)"),
                o["kind"],
                f"{o['offset']:,}",
                human_bytes(o["length"]),
                human_bytes(o["bytes_written"]),
                human_bytes(o["bytes_read"]),
                f"{o['write_ops'] + o['read_ops']:,}",
                human_ns(o["time_ns"]),
            )
            for o in entry["objects"]
        ]
        more = f" ({entry['more']:,} more not shown)" if entry["more"] else ""
        per_file.append(
            f"<h4>{html.escape(_short(path))}: {entry['count']:,} objects{more}</h4>"
            + _table(("object", "kind", "offset", "size", "written", "read", "ops", "time"), rows, "files")
        )
    unknown = summary["unknown_files"]
    return (
        "<h3>Checkpoint objects</h3>"
        f"<p>The checkpoint's layout ({html.escape(', '.join(summary['formats']))}): "
        f"{summary['objects']:,} objects in {summary['files']:,} files; "
        f"{human_bytes(summary['attributed_bytes_written'] + summary['attributed_bytes_read'])} of the bytes moved "
        f"are attributed to objects, {summary['small_object_time_share']:.0%} of their time to objects under "
        f"{human_bytes(summary['small_object_bytes'])}. A row spanning several objects counts its bytes to each."
        + (
            f" Unknown files: {html.escape(', '.join(unknown[:5]))}{' ...' if len(unknown) > 5 else ''}."
            if unknown
            else ""
        )
        + "</p>"
        + "".join(groups)
        + "".join(per_file)
    )


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def _files_html(profile: dict) -> str:
    files = profile["files"]
    shown, rest = files[:TOP_FILE_ROWS], files[TOP_FILE_ROWS:]
    rows = [
        (
            _short(f["path"]),
            human_bytes(f["written"]),
            human_bytes(f["read"]),
            f"{f['data_ops']:,}",
            f"{f['meta_ops']:,}",
            f"{f['syncs']:,}",
            human_ns(f["time_ns"]),
            _share(f["sequential"], f["data_ops"]),
            _share(f["consecutive"], f["data_ops"]),
            f"{f['owners']:,}",
        )
        for f in shown
    ]
    if rest:
        rows.append(
            (
                f"{len(rest):,} more files",
                human_bytes(sum(f["written"] for f in rest)),
                human_bytes(sum(f["read"] for f in rest)),
                f"{sum(f['data_ops'] for f in rest):,}",
                f"{sum(f['meta_ops'] for f in rest):,}",
                f"{sum(f['syncs'] for f in rest):,}",
                human_ns(sum(f["time_ns"] for f in rest)),
                "",
                "",
                "",
            )
        )
    return (
        f"<h3>Files</h3><p>{len(files):,} files, most bytes first. Sequential: a data operation at or after "
        "where the previous one of the same direction and rank ended; consecutive: exactly there (Darshan's "
        "POSIX counters).</p>"
        + _table(
            ("file", "written", "read", "data ops", "meta ops", "syncs", "time", "sequential", "consecutive", "ranks"),
            rows,
            "files",
        )
        + (
            f"<p>Offsets over time of the {min(TOP_FILES, len(profile['offsets']))} files with the most bytes:</p>"
            if profile["offsets"]
            else ""
        )
    )


def _owner_row(kind: str, o: dict) -> tuple:
    span = (o["last_ns"] - o["first_ns"]) if o["first_ns"] is not None else 0
    return (
        kind,
        o["label"],
        human_bytes(o["bytes_written"]),
        human_bytes(o["bytes_read"]),
        f"{o['data_ops']:,}",
        human_ns(o["io_time_ns"]),
        human_ns(span),
    )


def _ranks_html(profile: dict, figures: dict) -> str:
    owners = profile["owners"]
    if not owners:
        return "<h2 id='ranks'>Ranks over time</h2><p>No rank or process moved data.</p>"
    by_id = {o["id"]: o for o in owners}
    times = np.array([o["io_time_ns"] for o in owners] or [0])
    moved = np.array([o["bytes_written"] + o["bytes_read"] for o in owners] or [0])
    spread = [
        ("ranks and processes", f"{len(owners):,}"),
        (
            "I/O time min / median / max",
            f"{human_ns(times.min())} / {human_ns(float(np.median(times)))} / {human_ns(times.max())}",
        ),
        (
            "bytes min / median / max",
            f"{human_bytes(moved.min())} / {human_bytes(float(np.median(moved)))} / {human_bytes(moved.max())}",
        ),
    ]
    rows = [_owner_row("slowest", by_id[profile["slowest"]])]
    if profile["chosen"] != profile["slowest"]:
        rows.append(_owner_row("chosen", by_id[profile["chosen"]]))
    times = profile.get("rank_times") or {}
    save = times.get("slowest_save")
    if save:  # MLPerf Storage's figure beside Darshan's slowest rank
        where = f" on {save['host']}" if save.get("host") and len(times.get("hosts") or {}) > 1 else ""
        spread.append(
            (
                "slowest save (first to last checkpoint write)",
                f"rank {save['rank']}{where}: {human_ns(save['save_time_ns'])}",
            )
        )
    slowest = times.get("slowest_rank")
    if slowest and slowest.get("save_time_ns") is not None:
        spread.append((f"save time of the slowest rank (rank {slowest['rank']})", human_ns(slowest["save_time_ns"])))
    hosts = times.get("hosts") or {}
    host_table = ""
    if len(hosts) > 1:
        host_rows = [
            [
                str(h),
                format_ranges(e.get("ranks", [])),
                human_bytes(e["bytes_written"]),
                human_bytes(e["bytes_read"]),
                human_ns(e["io_time_ns"]),
                human_ns(e["save_time_ns"]) if e["save_time_ns"] is not None else "-",
            ]
            for h, e in hosts.items()
        ]
        host_table = "<h3>Hosts</h3>" + _table(
            ("host", "ranks", "written", "read", "I/O time", "first to last write"), host_rows
        )
    return (
        "<h2 id='ranks'>Ranks over time</h2>"
        + figures["Heat map"]
        + figures["Throughput over time"]
        + _facts(spread)
        + _table(("", "who", "written", "read", "data ops", "I/O time", "first to last op"), rows)
        + host_table
        + figures["I/O time per rank"]
        + figures["Timeline"]
    )


def _results_html(results: list[dict], fio: float | None) -> str:
    several = any(r.get("source") for r in results)
    rows = []
    for r in results:
        speedup = f"{r['speedup_vs_posix']:.2f}x" if r.get("speedup_vs_posix") else "-"
        rate = r.get("write_throughput_bytes_per_s", 0)
        cells = (
            ([r["source"]] if several else [])
            + [r["strategy"], f"{r.get('elapsed_s', 0):.3f} s", human_rate(rate)]
            + ([f"{rate / fio:.0%}"] if fio else [])
            + [human_ns(r.get("latency_ns", {}).get("p99", 0)), speedup]
        )
        rows.append(cells)
    headers = (
        (["results"] if several else [])
        + ["strategy", "elapsed", "write"]
        + (["of fio"] if fio else [])
        + ["p99", "vs posix"]
    )
    return _table(headers, rows)


def _storage_html(results: list[dict], fio: float | None, figure: str) -> str:
    if not results:
        return (
            "<h2 id='storage'>Storage</h2><p>No replay results given: <code>ckpt-trace replay TRACE --strategy "
            "all -o results.json</code>, then <code>ckpt-trace report TRACE results.json</code>.</p>"
        )
    limit = f" fio's write limit: {human_rate(fio)}." if fio else ""
    places = []
    for r in results:
        env, options = r.get("environment") or {}, r.get("options") or {}
        place = (
            f"{env.get('device', '?')} ({env.get('device_model') or 'model unknown'}), {env.get('filesystem', '?')} "
            f"at {env.get('mount_point', '?')} on {env.get('host', '?')}, kernel {env.get('kernel', '?')}; "
            + (
                "durable (fsync before the clock stops)"
                if options.get("durable")
                else "not --durable: the page cache may hold what was written"
            )
            if env
            else ""
        )
        if place and place not in places:
            places.append(place)
    where = "".join(f"<p>Replayed on {html.escape(p)}.</p>" for p in places)
    return (
        "<h2 id='storage'>Storage</h2><p>What <code>replay</code> measured for this trace."
        + limit
        + "</p>"
        + where
        + _results_html(results, fio)
        + figure
    )


def _recommendation_html(profile: dict, results: list[dict]) -> str:
    from ckpt_trace.writer.emit import choose

    documents = {}
    for r in results:
        documents.setdefault(r.get("source", ""), {"results": [], "options": r.get("options", {})})["results"].append(r)
    best = (
        min(
            documents.values(),
            key=lambda d: min(x["elapsed_s"] if x["elapsed_s"] > 0 else float("inf") for x in d["results"]),
        )
        if documents
        else None
    )
    choice = choose(profile["summary"]["writer_threads_per_rank"], best)
    values = choice.options.to_json()
    shown = {**values, "buffer_bytes": human_bytes(values["buffer_bytes"])}
    rows = [
        (name, shown[name], choice.reasons[name])
        for name in ("direct_io", "buffer_bytes", "queue_depth", "writer_threads", "load_direct_io")
    ]
    return (
        "<h2 id='recommendation'>Recommendation</h2><p>What <code>ckpt-trace emit</code> would choose for the "
        "writer"
        + (f" (fastest replayed strategy: {html.escape(choice.winner)})" if choice.winner else "")
        + ":</p>"
        + _table(("parameter", "value", "why"), rows, "why")
    )


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ckpt-trace report: {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.2em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; vertical-align: top; }}
th {{ background: #f3f3f3; text-align: left; }} td {{ text-align: right; }}
table.facts td, table.why td, table.files td:first-child {{ text-align: left; }}
table.facts td {{ overflow-wrap: anywhere; max-width: 850px; }}
img {{ max-width: 100%; display: block; margin: 0.4em 0 1.2em; }}
.pair {{ display: flex; gap: 3em; flex-wrap: wrap; }} .warning {{ color: #b00; }}
nav a {{ margin-right: 1em; }} code {{ background: #f3f3f3; padding: 0 3px; }}
</style></head>
<body data-images-ok="0">
<h1>ckpt-trace report</h1><p class="trace">{title}</p>
<nav>{nav}</nav>
<h2 id="job">Job</h2>{job}
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


def _img(title: str, data: str) -> str:
    return f"<img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>"


def build_report(profile: dict, results: list[dict], fio_limit_bytes_per_s: float | None, title: str) -> str:
    """The page's HTML text from ``profile_file``'s aggregates and replay results."""
    summary = profile["summary"]
    drawn = [
        ("Latency distribution", latency_png),
        ("Request sizes", lambda p: sizes_png(p["summary"])),
        ("Offset versus time", offsets_png),
    ]
    if profile["owners"]:
        drawn += [
            ("Heat map", heatmap_png),
            ("Throughput over time", throughput_png),
            ("I/O time per rank", ranks_png),
            ("Timeline", timeline_png),
        ]
    figures = {name: _img(name, draw(profile)) for name, draw in drawn}
    storage_figure = _img("Strategy comparison", strategies_png(results, fio_limit_bytes_per_s)) if results else ""
    gpu = _gpu_html(summary)
    sections = (
        gpu
        + _calls_html(profile, figures)
        + _ranks_html(profile, figures)
        + _storage_html(results, fio_limit_bytes_per_s, storage_figure)
        + _recommendation_html(profile, results)
    )
    nav = (
        [("job", "Job")]
        + ([("gpu", "GPU copies")] if gpu else [])
        + [
            ("calls", "Calls and requests"),
            ("ranks", "Ranks over time"),
            ("storage", "Storage"),
            ("recommendation", "Recommendation"),
        ]
    )
    return _PAGE.format(
        title=html.escape(title),
        job=_job_html(profile),
        sections=sections,
        nav="".join(f"<a href='#{anchor}'>{name}</a>" for anchor, name in nav),
    )


def write_report(
    trace_path: str | os.PathLike,
    output: str | os.PathLike,
    *,
    results_paths: Sequence = (),
    fio_limit_bytes_per_s: float | None = None,
    rank: int | None = None,
    overwrite: bool = False,
    progress=None,
) -> dict[str, Any]:
    """Build the page for ``trace_path`` (and replay results) and write it atomically to ``output``.

    ``rank`` is shown beside the slowest rank (default: the first); ``progress``: ``analysis.summary.Progress``. Returns {"output", "bytes" (of the file),
    "figures", "slowest", "chosen"}. Raises TraceFormatError for a bad trace, CkptTraceError for bad results,
    an unknown rank, an existing output without ``overwrite``, or missing matplotlib.
    """
    output = check_output_file(output, overwrite, inputs=(trace_path, *results_paths))
    results, fio = load_results(results_paths, trace_path)
    profile = profile_file(trace_path, rank=rank, progress=progress)
    profile["rank_times"] = rank_times_file(trace_path)  # per host, and the slowest rank's save time
    profile["layout"] = layout_report(os.fspath(trace_path), [f["path"] for f in profile["files"][:TOP_FILE_ROWS]])
    data = build_report(profile, results, fio_limit_bytes_per_s or fio, str(trace_path)).encode()
    write_bytes_atomic(output, data)
    labels = profile["owner_labels"]
    return {
        "output": str(output),
        "bytes": len(data),
        "figures": data.count(b"<img "),
        "slowest": labels.get(profile["slowest"]),
        "chosen": labels.get(profile["chosen"]),
    }
