"""The golden raw bcc stream (``tests/data/raw_stream.npz``, saved by ``scripts/save_raw_stream.py``) and the
recording pipeline that turns it into a trace, as ``record`` runs it: shared by test_stream.py and
test_datacalls.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ckpt_trace.tracer.bcc_backend import RINGS, BccRecording, feed_group
from ckpt_trace.tracer.spool import RowSpool
from ckpt_trace.tracer.state import EffectOrderFeeder, TraceBuilder
from ckpt_trace.tracer.stream import RawSpill, StreamDecoder

STREAM = Path(__file__).parent.parent / "data" / "raw_stream.npz"


def raw_stream(path: Path = STREAM) -> tuple[list[dict[str, list[np.ndarray]]], dict]:
    """The polls (ring name -> records) and the meta of a saved raw stream (``STREAM`` by default)."""
    saved = np.load(path)
    meta = json.loads(str(saved["meta"]))
    polls: dict[int, dict[str, list[np.ndarray]]] = {}
    for key in saved.files:
        if key != "meta":
            poll, name = key.split("_", 1)
            polls.setdefault(int(poll), {})[name] = [saved[key]]
    return [polls[i] for i in sorted(polls)], meta


def record_stream(tmp_path: Path, name: str, polls, meta, *, limit_bytes: int | None) -> Path:
    """Feed ``polls`` as ``record`` does (builder, effect-order feeder, rows spooled in runs of 16) and write
    the trace: streamed through a ``StreamDecoder`` holding ``limit_bytes``, or (None) the whole job decoded
    at once as after the command's exit."""
    args = dict(meta["builder"])
    args["inherited_fds"] = {int(fd): path for fd, path in args["inherited_fds"].items()}
    ranks = {int(pid): rank for pid, rank in meta["ranks"].items()}
    output = tmp_path / f"{name}.arrow"
    spool = RowSpool(output, run_rows=16)

    def spill_rows(builder: TraceBuilder) -> None:
        if builder.num_rows >= 16:
            spool.add(builder.take_rows())

    builder = TraceBuilder(**args)
    rec = BccRecording(feeder=EffectOrderFeeder(builder, slack_ns=10**9, on_rows=spill_rows, release_every=64))
    dtypes = {ring: chunks[0].dtype for poll in polls for ring, chunks in poll.items()}
    raw = RawSpill(tmp_path, dtypes)
    if limit_bytes is None:
        feed_group(rec, {ring: [c for poll in polls for c in poll.get(ring, [])] for ring in RINGS}, ranks)
    else:
        decoder = StreamDecoder(lambda group: feed_group(rec, group, ranks), raw, limit_bytes=limit_bytes)
        for poll in polls:
            decoder.put(poll)
        decoder.close()
        assert decoder.groups_fed >= 1 and decoder.queued_bytes == 0
    rec.spilled_raw_bytes = raw.bytes
    raw.close()
    builder, extra = rec.finish(spool)
    metadata = {
        "creator": "ckpt-trace",
        "creator_version": "test",
        "host": "h",
        "kernel": "k",
        "arch": "x86_64",
        "command": ["raw_stream"],
        "backend": "bcc",
        "start_wall_time_ns": 0,
        "filesystems": {},
        **extra,
        "untracked_fd_ops": builder.untracked_fd_ops,
        "unattributed": builder.unattributed,
        "unreaped_requests": builder.unreaped_requests,
        "filtered_rows": builder.filtered_rows,
        "spilled_runs": spool.spilled_runs,
        "paths": sorted(spool.paths),
        "counts": spool.counts,
    }
    try:
        spool.write(output, metadata, overwrite=False, batch_rows=32)
    finally:
        spool.close()
    return output
