"""The README's engine table from the conformance suite's report (``make test-engines``).

    python scripts/engines_table.py .scratch/engines.jsonl

Reads one JSON line per engine, backend and phase (tests/engines/conformance.py) and prints a Markdown
table: engine, version, phase, and per backend whether the capture equals the reference (with the calls
and bytes compared, io_uring requests against perf, mapped bytes left uncovered) and whether the replay
under every strategy left the engine's files with their sizes.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def cell(line: dict | None) -> str:
    if line is None:
        return "not run"
    if "capture" in line:
        text = line["capture"]
    else:
        exact = line.get("bytes_exact") and line.get("calls_exact")
        text = f"{'exact' if exact else 'DIFFERS'}: {line.get('calls', 0):,} calls, {line.get('bytes', 0):,} B"
    if "io_uring_requests" in line:
        text += f"; io_uring {line['io_uring_requests']}/{line['perf_requests']} (perf)"
    if line.get("mapped_uncovered_bytes") is not None:
        text += f"; mapped uncovered {line['mapped_uncovered_bytes']:,} B"
    return text


def main(path: str) -> int:
    rows: dict[tuple, dict] = defaultdict(dict)
    for raw in Path(path).read_text().splitlines():
        line = json.loads(raw)
        rows[(line["engine"], line["version"], line["phase"])][line["backend"]] = line
    print("| engine | version | phase | capture, bcc | capture, strace | replay (every strategy, --verify) |")
    print("|---|---|---|---|---|---|")
    for (engine, version, phase), by in sorted(rows.items()):
        replay = all(line.get("replay_exact") for line in by.values())
        print(
            f"| {engine} | {version} | {phase} | {cell(by.get('bcc'))} | {cell(by.get('strace'))} | "
            f"{'exact' if replay else 'FAILED'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
