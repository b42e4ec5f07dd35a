"""Replay a trace with posix in this process and say what it read from storage while the run's clock ran.

    python tests/helpers/replay_io.py TRACE TARGET OUT.json [CACHE] [READ_MEMORY]

Prepares the run as ``ckpt-trace replay`` does (pre-creation, then the page cache as ``CACHE`` says: recorded by
default; reads land in ``READ_MEMORY``, malloc by default, as in ``replay``: ``replayer.engine``), opens and closes
``TARGET/clock-start`` just before the clock (a mark for a recording of this process: the run's rows are the
ones after it), runs, and writes OUT.json: the bytes read from the target's block device (``/proc/diskstats``, every process of the machine; null where no device holds it) and by this
process (``/proc/self/io`` ``read_bytes``, its threads included) during the run, the state prepared, the
state's note and the run's load phase."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ckpt_trace.formats import read_trace
from ckpt_trace.replayer import build_plan
from ckpt_trace.replayer.paths import TargetRoot
from ckpt_trace.replayer.posix import posix_executor
from ckpt_trace.replayer.replay import prepare_cache, resolve_cache


def device_read_bytes(path) -> int | None:
    """Bytes read so far from the block device holding ``path`` (/proc/diskstats sectors read, 512 B each),
    None when no device of /proc/diskstats holds it (tmpfs, overlay...)."""
    st_dev = os.stat(path).st_dev
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        if (int(fields[0]), int(fields[1])) == (os.major(st_dev), os.minor(st_dev)):
            return int(fields[5]) * 512
    return None


def process_read_bytes() -> int:
    """Bytes this process (all its threads) caused to be read from storage: /proc/self/io ``read_bytes``."""
    line = next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("read_bytes:"))
    return int(line.split()[1])


def main(trace: str, target: str, out: str, cache: str = "recorded", read_memory: str = "malloc") -> None:
    loaded = read_trace(trace)
    plan = build_plan(loaded.table, "posix")
    Path(target).mkdir(parents=True, exist_ok=True)
    root = TargetRoot(Path(target))
    executor = posix_executor(root, 1 << 20)
    executor.read_memory = read_memory
    executor.prepare(plan)
    state, note, recorded = resolve_cache(cache, plan, loaded)
    prepare_cache(root, plan, state, recorded)
    os.close(os.open(Path(target) / "clock-start", os.O_CREAT | os.O_WRONLY, 0o644))
    device, mine = device_read_bytes(target), process_read_bytes()
    result = executor.run(plan)
    after = device_read_bytes(target)
    figures = {
        "device_read_bytes": None if device is None or after is None else after - device,
        "process_read_bytes": process_read_bytes() - mine,
        "state": state,
        "note": note,
        "cold_bytes": None if recorded is None else recorded.cold_bytes,
        "load": result.phases.get("load"),
        "read_time_s": result.latency_ns["mean"] * result.data_ops / 1e9,
        "data_ops": result.data_ops,
    }
    Path(out).write_text(json.dumps(figures))


if __name__ == "__main__":
    main(*sys.argv[1:])
