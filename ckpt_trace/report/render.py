"""Terminal rendering of summaries and replay results with rich (plain when not a terminal)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from ckpt_trace.analysis.diff import written_verdict
from ckpt_trace.units import human_bytes, human_ns, human_rate, parse_size  # noqa: F401  (parse_size: CLI)

#: The columns of the GPU-copies table (``gpu_copy_cells``), in the console and the HTML report alike.
GPU_COPY_COLUMNS = ("rank", "d2h", "d2h bytes", "pinned", "h2d", "h2d bytes", "copy time", "write time", "overlap")


def gpu_copy_cells(rank: object, entry: dict[str, Any]) -> tuple[str, ...]:
    """One rank's row of the GPU-copies table (``GPU_COPY_COLUMNS``) from its entry of the summary's ``gpu.ranks``
    (``analysis.gpu.copy_summary``): counts, bytes, the pinned share of device-to-host copies, and times."""
    d2h, h2d = entry["d2h"], entry["h2d"]
    return (
        str(rank),
        f"{d2h['count']:,}",
        human_bytes(d2h["bytes"]),
        f"{d2h['pinned_share']:.0%}",
        f"{h2d['count']:,}",
        human_bytes(h2d["bytes"]),
        human_ns(int(entry["copy_wall_s"] * 1e9)),
        human_ns(int(entry["write_time_s"] * 1e9)),
        human_ns(int(entry["copy_io_overlap_s"] * 1e9)),
    )


def _table(console: Console, title: str) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAVY if console.is_terminal else box.ASCII, title_justify="left")


def _fitted(
    console: Console, title: str, columns: list[tuple[str, int]], rows: list[list[str]], wide: bool = False
) -> tuple[Table, list[str]]:
    """A table of the columns that fit the console's width, chosen by priority (0 first), shown in their given
    order; with ``wide`` every column. Returns the table and the names of the columns left out (for a
    one-line hint: ``--wide`` or ``--json`` shows them), as fio's and Darshan's text outputs choose theirs."""
    widths = [max([len(name)] + [len(row[i]) for row in rows]) + 3 for i, (name, _) in enumerate(columns)]
    chosen: set[int] = set(range(len(columns))) if wide else set()
    if not wide:
        budget = console.width - 4
        for i in sorted(range(len(columns)), key=lambda i: (columns[i][1], i)):
            if columns[i][1] == 0 or budget - widths[i] >= 0:
                chosen.add(i)
                budget -= widths[i]
    table = _table(console, title)
    shown = [i for i in range(len(columns)) if i in chosen]
    for i in shown:
        # the first column (a name: strategy, trace) folds when the must-have columns overflow; figures never do
        table.add_column(
            columns[i][0],
            justify="left" if i == 0 else "right",
            no_wrap=i != 0,
            overflow="fold" if i == 0 else "ellipsis",
            min_width=min(widths[i] - 3, 12) if i == 0 else None,
        )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table, [columns[i][0] for i in range(len(columns)) if i not in chosen]


def _left_out(console: Console, names: list[str]) -> None:
    if names:
        console.print(f"(not shown at this width: {', '.join(names)}; --wide or --json show them)", highlight=False)


def _ranges(values: list[int]) -> str:
    """0-3,8 for [0, 1, 2, 3, 8]; none for []."""
    out, values = [], sorted(values)
    for value in values:
        if out and value == out[-1][1] + 1:
            out[-1][1] = value
        else:
            out.append([value, value])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in out) or "none"


def _reclaim(found: list) -> str:
    """The DAMON schemes that evicted page cache during a recording (its ``proactive_reclaim`` metadata), in
    words: action, least idle time and rate limit of each."""
    words = []
    for scheme in found:
        try:
            idle = f" idle >= {scheme['min_age_s']:g} s" if scheme.get("min_age_s") is not None else ""
            rate = (
                f", <= {human_bytes(scheme['quota_bytes'])} per {scheme['quota_reset_interval_ms']} ms"
                if scheme.get("quota_bytes") and scheme.get("quota_reset_interval_ms")
                else ""
            )
            words.append(f"{scheme['action']}{idle}{rate}")
        except (KeyError, TypeError):
            words.append("unreadable")
    return "; ".join(words)


def _writeback(found: dict) -> str:
    """The least writeback thresholds a recording saw (its ``writeback`` metadata), in words."""
    try:
        return (
            f"background {human_bytes(found['dirty_background_bytes']['min'])}, "
            f"throttle {human_bytes(found['dirty_bytes']['min'])}"
        )
    except (KeyError, TypeError):
        return "unreadable"


def render_summary(console: Console, summary: dict[str, Any]) -> None:
    overview = _table(console, "Trace summary")
    overview.add_column("what")
    overview.add_column("value", justify="right")
    ranks = summary["ranks"]
    for name, value in (
        ("command", " ".join(summary["command"] or [])),
        ("backend", summary["backend"]),
        ("rows", f"{summary['rows']:,}"),
        ("duration", human_ns(summary["duration_ns"])),
        ("bytes written", human_bytes(summary["bytes_written"])),
        ("bytes read", human_bytes(summary["bytes_read"])),
        ("files", str(summary["files"])),
        ("processes / threads", f"{summary['processes']} / {summary['threads']}"),
        ("ranks", ", ".join(map(str, ranks)) if ranks else "none"),
        ("time in data ops", human_ns(summary["data_time_ns"])),
        ("time in metadata ops", human_ns(summary["metadata_time_ns"])),
        ("unaligned offsets (4 KiB)", f"{summary['alignment']['unaligned_offset_share']:.1%}"),
        ("unaligned sizes (4 KiB)", f"{summary['alignment']['unaligned_size_share']:.1%}"),
        ("failed ops", str(summary["failed_ops"])),
        ("lost events", str(summary["lost_events"])),
        *((("dirty-page thresholds (least)", _writeback(summary["writeback"])),) if summary.get("writeback") else ()),
        *(
            (("page-cache reclaim (DAMON)", _reclaim(summary["proactive_reclaim"])),)
            if summary.get("proactive_reclaim")
            else ()
        ),
        *(
            (("interrupted", f"[yellow]{summary['interrupted']} cut the recording: the trace is partial[/]"),)
            if summary.get("interrupted")
            else ()
        ),
    ):
        overview.add_row(name, value)
    for label, key in (
        ("slowest rank (I/O time)", "slowest_rank"),
        ("slowest save (1st to last write)", "slowest_save"),
    ):
        who = summary.get(key)
        if who:
            where = f" on {who['host']}" if who.get("host") and len(summary.get("hosts") or {}) > 1 else ""
            overview.add_row(
                label,
                f"rank {who['rank']}{where}: {human_ns(who['io_time_ns'])} I/O, save "
                f"{human_ns(who['save_time_ns']) if who['save_time_ns'] is not None else '-'}",
            )
    console.print(overview)
    hosts = summary.get("hosts") or {}
    if len(hosts) > 1:
        table = _table(console, "Hosts")
        for column in ("host", "ranks", "written", "read", "I/O time", "save span"):
            table.add_column(column, justify="left" if column in ("host", "ranks") else "right")
        for host, entry in hosts.items():
            table.add_row(
                host,
                _ranges(entry.get("ranks", [])),
                human_bytes(entry["bytes_written"]),
                human_bytes(entry["bytes_read"]),
                human_ns(entry["io_time_ns"]),
                human_ns(entry["save_time_ns"]) if entry["save_time_ns"] is not None else "-",
            )
        console.print(table)

    ops = _table(console, "Operations")
    for column in ("op", "count", "bytes", "time"):
        ops.add_column(column, justify="left" if column == "op" else "right")
    for op, entry in summary["ops"].items():
        ops.add_row(
            op, f"{entry['count']:,}", human_bytes(entry["bytes"]) if entry["bytes"] else "", human_ns(entry["time_ns"])
        )
    console.print(ops)

    interfaces = _table(console, "I/O interfaces (data operations)")
    for column in ("interface", "ops", "written", "read", "p50 lat", "p99 lat", "in flight p50/max"):
        interfaces.add_column(column, justify="left" if column == "interface" else "right")
    for name, entry in summary.get("interfaces", {}).items():
        depth = entry.get("in_flight")
        interfaces.add_row(
            name,
            f"{entry['ops']:,}",
            human_bytes(entry["bytes_written"]),
            human_bytes(entry["bytes_read"]),
            human_ns(entry["latency_ns"]["p50"]),
            human_ns(entry["latency_ns"]["p99"]),
            f"{depth['p50']}/{depth['max']}" if depth else "-",
        )
    console.print(interfaces)
    for capture, entry in summary.get("unseen", {}).items():
        what = {
            "io_uring_requests": f"{entry['count']:,} io_uring requests",
            "mapped_pages": f"pages touched through {entry['count']:,} file mappings",
        }.get(capture, capture)
        console.print(f"warning: {what} are not in this trace: {entry['reason']}", highlight=False)
    if summary.get("mapped_uncovered_bytes"):
        from ckpt_trace.analysis.summary import mapped_uncovered_line

        console.print(
            f"warning: {mapped_uncovered_line(summary['mapped_uncovered_bytes'])}", highlight=False, soft_wrap=True
        )

    gpu = summary.get("gpu") or {}
    if gpu.get("copies"):
        copies = _table(console, "GPU copies (host<->device, per rank)")
        for column in GPU_COPY_COLUMNS:
            copies.add_column(column, justify="right")
        for rank, entry in gpu["ranks"].items():
            copies.add_row(*gpu_copy_cells(rank, entry))
        console.print(copies)
        for rank, entry in gpu["ranks"].items():
            if "fed_writes" in entry:
                console.print(
                    f"rank {rank}: {entry['fed_writes']:,} of {entry['writes_with_buffer']:,} writes with a "
                    f"known host buffer were fed by a device-to-host copy "
                    f"({human_bytes(entry['fed_write_bytes'])}); plain write syscalls carry no buffer "
                    f"address",
                    highlight=False,
                )

    hist = _table(console, "Request sizes (power-of-two buckets)")
    for column in ("size ≥", "writes", "reads", "bytes"):
        hist.add_column(column, justify="right")
    for entry in summary["size_histogram"]:
        hist.add_row(
            human_bytes(entry["bucket_bytes"]), f"{entry['write']:,}", f"{entry['read']:,}", human_bytes(entry["bytes"])
        )
    console.print(hist)
    if summary.get("layout"):
        render_layout(console, summary["layout"])


def render_layout(console: Console, layout: dict[str, Any]) -> None:
    """``summary``'s checkpoint layout: the split by kind and by object size class, the costliest objects."""
    directions = [
        (name, key)
        for name, key in (("written", "bytes_written"), ("read", "bytes_read"))
        if layout[f"attributed_{key}"]
    ] or [("written", "bytes_written")]  # only what moved: 80 columns
    for title, key, label in (
        ("Checkpoint objects by kind", "by_kind", "kind"),
        ("Checkpoint objects by size", "by_size_class", "size_class"),
    ):
        table = _table(console, title)
        # never cut the kind: exp_avg and exp_avg_sq must stay apart
        table.add_column(label.replace("_", " "), justify="left", no_wrap=True, min_width=len("optimizer.exp_avg_sq"))
        for column in ("objects", "size", *(name for name, _ in directions), "ops", "time"):
            table.add_column(column, justify="right", no_wrap=True)
        for entry in layout[key]:
            table.add_row(
                entry[label],
                f"{entry['objects']:,}",
                human_bytes(entry["object_bytes"]),
                *(human_bytes(entry[field]) for _, field in directions),
                f"{entry['write_ops'] + entry['read_ops']:,}",
                human_ns(entry["time_ns"]),
            )
        console.print(table)
    costliest = _table(console, "Costliest checkpoint objects")
    costliest.add_column("object", justify="left", overflow="fold")
    costliest.add_column("kind", justify="left", no_wrap=True, min_width=len("optimizer.exp_avg_sq"))
    for column in ("moved", "time"):
        costliest.add_column(column, justify="right", no_wrap=True)
    for entry in layout["costliest"][:5]:
        costliest.add_row(
            entry["name"] or entry["path"],
            entry["kind"],
            human_bytes(entry["bytes_written"] + entry["bytes_read"]),
            human_ns(entry["time_ns"]),
        )
    console.print(costliest)
    moved = layout["bytes_written"] + layout["bytes_read"]
    attributed = layout["attributed_bytes_written"] + layout["attributed_bytes_read"]
    console.print(
        f"layout: {layout['objects']:,} objects in {layout['files']} files "
        f"({', '.join(layout['formats'])}); {human_bytes(attributed)} of {human_bytes(moved)} moved are "
        f"attributed to objects; {layout['small_object_time_share']:.0%} of their time on objects under "
        f"{human_bytes(layout['small_object_bytes'])}",
        highlight=False,
    )
    if layout["unknown_files"]:
        shown = ", ".join(layout["unknown_files"][:5])
        more = len(layout["unknown_files"]) - 5
        console.print(f"layout: unknown files: {shown}{f' and {more} more' if more > 0 else ''}", highlight=False)


def render_results(
    console: Console, results: list[dict[str, Any]], fio_bytes_per_s: float | None = None, wide: bool = False
) -> None:
    """One row per strategy, in the style of the paper's comparison table (arXiv 2512.24511); with fio's
    limit, each strategy's throughput as a share of it. Columns by priority: strategy, elapsed, throughput,
    vs posix and p99 latency first; the rest as the width allows (``wide``: all). A direction no strategy moved
    bytes in (reads of a save, writes of a load) comes last."""
    wrote = any(r["bytes_written"] for r in results)
    read = any(r["bytes_read"] for r in results)
    write_rank, read_rank = (0, 1) if wrote and read else (9, 0) if read else (0, 9)  # an idle direction: last
    columns = [
        ("strategy", 0),
        ("elapsed", 0),
        ("written", write_rank + 2),
        ("write tput", write_rank),
        ("read", read_rank + 2),
        ("read tput", read_rank),
        ("data ops", 4),
        ("meta ops", 5),
        ("avg lat", 6),
        ("p99 lat", 1),
        ("cpu user", 7),
        ("cpu sys", 7),
        ("unaligned", 8),
        ("vs posix", 0),
    ]
    rows = []
    for r in results:
        lat = r["latency_ns"]
        speedup = r.get("speedup_vs_posix")
        runs = r.get("runs_elapsed_s") or []
        elapsed = f"{r['elapsed_s']:.3f} s" + (f" ({min(runs):.3f}-{max(runs):.3f})" if len(runs) > 1 else "")
        rows.append(
            [
                r["strategy"] + ("*" if r.get("off_named_path") else ""),
                elapsed,
                human_bytes(r["bytes_written"]),
                human_rate(r["write_throughput_bytes_per_s"]),
                human_bytes(r["bytes_read"]),
                human_rate(r["read_throughput_bytes_per_s"]),
                f"{r['data_ops']:,}",
                f"{r['metadata_ops']:,}",
                human_ns(lat.get("mean", 0)),
                human_ns(lat["p99"]),
                f"{r['cpu_user_s']:.2f} s",
                f"{r['cpu_sys_s']:.2f} s",
                f"{r.get('unaligned_ops', 0):,}",
                _speedup_cell(r, speedup),
            ]
        )
    table, left_out = _fitted(console, "Replay results", columns, rows, wide)
    console.print(table)
    _left_out(console, left_out)
    for line in phase_lines(results):
        console.print(line, highlight=False, soft_wrap=True)
    for line in timing_lines(results):
        console.print(line, highlight=False, soft_wrap=True)
    for line in verdict_lines(results):
        console.print(line, highlight=False, soft_wrap=True)
    for r in results:
        if r.get("off_named_path"):
            for line in path_footnote(r):
                console.print(line, highlight=False, soft_wrap=True)
    if fio_bytes_per_s:
        shares = ", ".join(f"{r['strategy']} {_moved_rate(r) / fio_bytes_per_s:.0%}" for r in results)
        console.print(
            f"fio's sequential O_DIRECT write limit here: {human_rate(fio_bytes_per_s)}; reached: {shares}",
            highlight=False,
        )


def _speedup_cell(result: dict[str, Any], speedup: float | None) -> str:
    if not speedup:
        return "-"
    noise = (result.get("speedup") or {}).get("verdict") == "within noise"
    return f"{speedup:.2f}x" + ("~" if noise else "")


def phase_lines(results: list[dict[str, Any]]) -> list[str]:
    """Per strategy, each phase (save: the writes, load: the reads) apart, with its slowest rank's time; only
    where a result has two phases or several ranks (otherwise the table says it all)."""
    if not any(
        len(r.get("phases") or {}) > 1 or any(len(p["ranks"]) > 1 for p in (r.get("phases") or {}).values())
        for r in results
    ):
        return []
    return [
        f"{r['strategy']} {phase}: {human_bytes(p['bytes'])} in {p['elapsed_s']:.3f} s, slowest rank "
        f"{p['slowest_rank']}: {p['slowest_rank_s']:.3f} s{_phase_speedup(p)}"
        for r in results
        for phase, p in (r.get("phases") or {}).items()
    ]


def _phase_speedup(phase: dict[str, Any]) -> str:
    """A phase's own speed-up over posix from paired rounds (a trace holding a save and a load), "~" within
    noise; empty where it has none."""
    versus = (phase.get("versus") or {}).get("posix")
    if not versus:
        return ""
    return f"; {versus['median']:.2f}x posix{'~' if versus['verdict'] == 'within noise' else ''}"


def timing_lines(results: list[dict[str, Any]]) -> list[str]:
    """``--timing original``'s accuracy per strategy: start error (median, p99) as a share of the recorded I/O
    window, and the slowest rank's replayed window against its recorded one."""
    lines = []
    for r in results:
        timing = r.get("timing")
        if not timing or timing.get("start_error_share_p50") is None:
            continue
        worst = max(timing["ranks"].items(), key=lambda kv: abs(kv[1]["window_error"] or 0))
        window = (
            f"; rank {worst[0]}: {worst[1]['replayed_window_s']:.3f} s for {worst[1]['recorded_window_s']:.3f} s "
            f"recorded ({worst[1]['window_error']:+.1%})"
            if worst[1]["window_error"] is not None  # None: every rank's window under 1 ms
            else ""
        )
        lines.append(
            f"{r['strategy']} paced: start error {timing['start_error_share_p50']:.1%} median, "
            f"{timing['start_error_share_p99']:.1%} p99 of the I/O window{window}" + _busy_clause(timing)
        )
    return lines


def _busy_clause(timing: dict[str, Any]) -> str:
    """Where ``--timing original``'s error comes from: operations whose thread was busy past their start (an
    earlier operation slower than recorded, or closer than the replayer's own work per operation), and how
    late the others woke up."""
    if timing.get("busy_share") is None:
        return ""
    woken = timing.get("waited_error_p50_ns")
    return f"; {timing['busy_share']:.0%} of operations found their thread busy past their start" + (
        f", the others woke {human_ns(woken)} late (median)" if woken is not None else ""
    )


def verdict_lines(results: list[dict[str, Any]]) -> list[str]:
    """One line per strategy compared with posix over paired rounds: the median speed-up, its interval and
    coverage, the verdict ("within noise" where the interval includes 1.0 or covers under 90 %)."""
    lines = []
    for r in results:
        entry = r.get("speedup")
        if not entry or entry.get("verdict") == "reference" or not entry.get("n"):
            continue
        interval = f"{entry['low']:.2f}-{entry['high']:.2f}x, {entry['coverage']:.0%} interval over {entry['n']} rounds"
        verdict = entry["verdict"] if entry["verdict"] == "within noise" else f"{entry['verdict']} than posix"
        lines.append(f"{r['strategy']}: {entry['median']:.2f}x ({interval}): {verdict}")
    if any("~" in _speedup_cell(r, r.get("speedup_vs_posix")) for r in results):
        lines.append("~ within noise: its interval includes 1.0x, or under 5 rounds")
    return lines


def path_footnote(result: dict[str, Any]) -> list[str]:
    """Two short lines on what carried a strategy's bytes when its named path carried too few of them."""
    shares = {name: entry["bytes"] for name, entry in (result.get("data_paths") or {}).items() if entry["bytes"]}
    total = sum(shares.values()) or 1
    carried = ", ".join(
        f"{name.replace('_', ' ').replace('io uring', 'io_uring')} {moved / total:.0%}"
        for name, moved in sorted(shares.items(), key=lambda kv: -kv[1])
    )
    named = result.get("named_path_bytes_share") or 0.0
    why = f" ({result['unaligned_ops']:,} ops unaligned)" if result.get("unaligned_ops") else ""
    return [
        f"* {result['strategy']}: {result.get('named_path')} carried {named:.0%} of the bytes{why};",
        f"  they went by {carried}",
    ]


def _moved_rate(result: dict[str, Any]) -> float:
    return result["write_throughput_bytes_per_s"] + result["read_throughput_bytes_per_s"]


def render_plans(console: Console, plans: list[dict[str, Any]], wide: bool = False) -> None:
    """The ``--dry-run`` table: what each strategy's plan would issue (columns by priority, as ``render_results``)."""
    columns = [
        ("strategy", 0),
        ("workers", 3),
        ("writes", 0),
        ("write bytes", 0),
        ("reads", 2),
        ("read bytes", 1),
        ("largest op", 4),
        ("aligned", 5),
        ("unaligned", 1),
        ("unknown offset", 6),
        ("metadata ops", 2),
    ]
    rows = []
    for plan in plans:
        ops, align = plan["ops"], plan["alignment"]
        metadata = sum(count for kind, count in ops.items() if kind not in ("read", "write"))
        rows.append(
            [
                plan["strategy"],
                str(plan["workers"]),
                f"{ops.get('write', 0):,}",
                human_bytes(plan["write_bytes"]),
                f"{ops.get('read', 0):,}",
                human_bytes(plan["read_bytes"]),
                human_bytes(plan["largest_op_bytes"]),
                f"{align['aligned']:,}",
                f"{align['unaligned']:,}",
                f"{align['unknown_offset']:,}",
                f"{metadata:,}",
            ]
        )
    table, left_out = _fitted(console, "Replay plans (dry run)", columns, rows, wide)
    console.print(table)
    _left_out(console, left_out)


def render_diff(console: Console, data: dict[str, Any]) -> None:
    """Two recordings side by side, with changes."""
    table = _table(console, f"Trace diff: A = {data['a']}, B = {data['b']}")
    for column in ("figure", "A", "B", "change"):
        table.add_column(column, justify="left" if column == "figure" else "right")

    def fmt(key: str, value: float) -> str:
        if key.endswith("_ns"):
            return human_ns(value)
        if key.startswith("bytes"):
            return human_bytes(value)
        return f"{value:,.0f}" if isinstance(value, (int, float)) else str(value)

    for key, entry in data["totals"].items():
        ratio = f" ({entry['ratio']:.2f}x)" if entry["ratio"] not in (None, 1.0) else ""
        table.add_row(key, fmt(key, entry["a"]), fmt(key, entry["b"]), f"{entry['change']:+,.0f}{ratio}")
    for op, entry in data["ops"].items():
        table.add_row(f"ops: {op}", f"{entry['a']:,}", f"{entry['b']:,}", f"{entry['change']:+,}")
    for bucket, entry in data["size_histogram"].items():
        table.add_row(
            f"requests ≥ {human_bytes(bucket)}", f"{entry['a']:,}", f"{entry['b']:,}", f"{entry['change']:+,}"
        )
    share = data["unaligned_offset_share"]
    table.add_row("unaligned offsets", f"{share['a']:.1%}", f"{share['b']:.1%}", f"{share['change']:+.1%}")
    console.print(table)
    for side in ("a", "b"):
        files = data[f"files_only_in_{side}"]
        if files:
            shown = ", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")
            console.print(f"files only in {side.upper()}: {shown}", highlight=False)
    if data.get("layout"):
        render_layout_diff(console, data["layout"])
    console.print(written_verdict(data["data_written"]), highlight=False)  # the verdicts end the output
    if "data_read" in data:
        console.print(written_verdict(data["data_read"], "read"), highlight=False)


def render_layout_diff(console: Console, layout: dict[str, Any]) -> None:
    """``diff``'s checkpoint objects: per kind, then the objects that moved differently."""
    if layout["missing"]:
        console.print(
            f"layout: only in {'B' if layout['missing'] == ['a'] else 'A'} (annotate the other trace "
            "to compare objects)",
            highlight=False,
        )
        return
    kinds = _table(console, "Checkpoint objects by kind (A -> B)")
    for column in ("kind", "objects", "bytes", "ops", "time"):
        kinds.add_column(column, justify="left" if column == "kind" else "right")
    for kind, sides in layout["by_kind"].items():
        a, b = sides["a"], sides["b"]
        kinds.add_row(
            kind,
            f"{a['objects']:,} -> {b['objects']:,}",
            f"{human_bytes(a['bytes'])} -> {human_bytes(b['bytes'])}",
            f"{a['ops']:,} -> {b['ops']:,}",
            f"{human_ns(a['time_ns'])} -> {human_ns(b['time_ns'])}",
        )
    console.print(kinds)
    if layout["moved_differently_count"]:
        moved = _table(console, f"Objects that moved differently ({layout['moved_differently_count']:,})")
        for column in ("object", "kind", "bytes A -> B", "ops A -> B", "time A -> B"):
            moved.add_column(column, justify="left" if column in ("object", "kind") else "right")
        for entry in layout["moved_differently"][:10]:
            a, b = entry["a"], entry["b"]
            moved.add_row(
                entry["name"],
                entry["kind"],
                f"{human_bytes(a['bytes'])} -> {human_bytes(b['bytes'])}",
                f"{a['ops']:,} -> {b['ops']:,}",
                f"{human_ns(a['time_ns'])} -> {human_ns(b['time_ns'])}",
            )
        console.print(moved)
    else:
        console.print(
            "layout: every object common to both moved the same bytes in the same number of operations", highlight=False
        )
    for side in ("a", "b"):
        if layout[f"only_in_{side}_count"]:
            console.print(
                f"objects only in {side.upper()}: {layout[f'only_in_{side}_count']:,} "
                f"({', '.join(layout[f'only_in_{side}'][:5])})",
                highlight=False,
            )


def render_check(console: Console, rows: list[dict[str, Any]], tolerance: float, wide: bool = False) -> None:
    """old / new / change per trace, strategy and figure, with the measurements' noise and the verdict."""
    columns = [
        ("trace", 0),
        ("strategy", 0),
        ("figure", 0),
        ("old", 1),
        ("new", 1),
        ("change", 0),
        ("noise", 2),
        ("status", 0),
    ]
    cells = []
    for row in rows:
        is_rate = row["metric"] == "throughput_bytes_per_s"
        show = human_rate if is_rate else human_ns
        status = {"regressed": "REGRESSED", "noisy": "too noisy"}.get(row["status"], "ok")
        cells.append(
            [
                row["trace"],
                row["strategy"],
                "throughput" if is_rate else "p99 latency",
                show(row["old"]),
                show(row["new"]),
                f"{row['change']:+.1%}",
                f"±{max(row['old_noise'], row['new_noise']):.1%}",
                status,
            ]
        )
    table, left_out = _fitted(console, f"Storage check (tolerance {tolerance:.0%})", columns, cells, wide)
    for i, column in enumerate(table.columns):
        if column.header in ("trace", "strategy", "figure", "status"):
            table.columns[i].justify = "left"
    console.print(table)
    _left_out(console, left_out)


def render_bench(console: Console, data: dict[str, Any]) -> None:
    """Per direction swept: what matters on this storage (one dimension varied from the baseline), the
    fastest configurations and the best one in words; then what the storage refused."""
    for direction, section in data["directions"].items():
        _render_bench_direction(console, data, direction, section)
    for refused in data["refused"][:5]:
        console.print(f"refused: {refused['description']}: {refused['error']}", highlight=False)
    if len(data["refused"]) > 5:
        console.print(f"... and {len(data['refused']) - 5} more refused points", highlight=False)
    for direction, section in data["directions"].items():
        best = section["best"]
        if best is None:
            console.print(f"best {direction}: none (the storage refused every configuration)", highlight=False)
            continue
        fio = (
            f", {best['fraction_of_fio']:.0%} of fio's {human_rate(section['fio_bytes_per_s'])}"
            if best.get("fraction_of_fio")
            else ""
        )
        ties = (
            (
                f" ({best['near_best']} other configurations within {best['near_fraction']:.0%}; one run cannot "
                "rank those, --repeat narrows it)"
            )
            if best.get("near_best")
            else ""
        )
        console.print(
            f"best {direction}: {best['description']}: {human_rate(best['throughput_bytes_per_s'])}{fio}{ties}",
            highlight=False,
        )


def _render_bench_direction(console: Console, data: dict[str, Any], direction: str, section: dict) -> None:
    effects = _table(console, f"What matters for {direction}s here (one dimension varied, the others at the baseline)")
    for column in ("dimension", "fastest", "slowest", "ratio", "MB/s per value"):
        effects.add_column(column, justify="right" if column == "ratio" else "left")
    for effect in section["effects"]:
        speeds = ", ".join(
            f"{v['label']} {v['throughput_bytes_per_s'] / 1e6:,.0f}"
            if v["throughput_bytes_per_s"]
            else f"{v['label']} refused"
            for v in effect["values"]
        )
        effects.add_row(
            effect["title"],
            effect["fastest"] or "-",
            effect["slowest"] or "-",
            f"{effect['ratio']:.2f}x" if effect["ratio"] else "-",
            speeds,
        )
    console.print(effects)
    table = _table(
        console, f"Fastest {direction}s of {data['points']} configurations ({human_bytes(data['volume_bytes'])} each)"
    )
    for column in ("configuration", f"{direction} tput", "p50 lat", "p99 lat", "cpu"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for row in section["top"]:
        table.add_row(
            row["description"],
            human_rate(row["throughput_bytes_per_s"]),
            human_ns(row["latency_p50_ns"]),
            human_ns(row["latency_p99_ns"]),
            f"{row['cpu_s']:.2f} s",
        )
    console.print(table)
