"""Where and when a trace was recorded: host, boot, clock anchors and job, so traces of one job merge.

Every trace's ``ts_ns`` counts from an origin on the tracer's clock (bcc: ``CLOCK_MONOTONIC``, the clock of
``bpf_ktime_get_ns``; strace: ``CLOCK_REALTIME``). Monotonic clocks of two machines (or of two boots) share
nothing, so each trace also stores *anchors*: pairs of (``CLOCK_REALTIME``, tracer clock) read back to back,
one when the recording starts and one when it ends (``clock_gettime(2)``). ``ckpt-trace merge`` maps every
row onto ``CLOCK_REALTIME`` through them; the two anchors also measure the tracer clock's drift against the
realtime clock over the recording (NTP slewing), which the merge reports in its error bound.

The metadata keys (optional, version 5 additions; ``formats/README.md``):

- ``host``: the host name, or ``record --host LABEL`` (containers and simulated nodes share a host name);
- ``boot_id``: ``/proc/sys/kernel/random/boot_id`` (a monotonic clock is comparable only within one boot);
- ``clock``: ``{"name", "origin_ns", "anchors": [{"realtime_ns", "clock_ns", "uncertainty_ns"}, ...]}``:
  the tracer clock's name, the value of that clock at ``ts_ns`` 0, and the anchors (``clock_ns`` is the
  midpoint of two reads of the tracer clock around one realtime read, ``uncertainty_ns`` half their gap);
- ``job``: ``{"launcher", "variable", "id"}`` where a launcher names the job (``TORCHELASTIC_RUN_ID``,
  ``SLURM_JOB_ID``, or torchrun's ``--rdzv-id`` on the recorded command line, which torchrun hands its
  workers as ``TORCHELASTIC_RUN_ID``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence

CLOCK_IDS = {"CLOCK_MONOTONIC": time.CLOCK_MONOTONIC, "CLOCK_REALTIME": time.CLOCK_REALTIME}

# Environment variables naming the job, first found wins: (variable, launcher).
JOB_VARIABLES = (("TORCHELASTIC_RUN_ID", "torchelastic"), ("SLURM_JOB_ID", "slurm"))

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def anchor(clock: str) -> dict:
    """One anchor pair: ``{"realtime_ns", "clock_ns", "uncertainty_ns"}``, ``clock_ns`` the midpoint of two
    reads of ``clock`` around one ``CLOCK_REALTIME`` read and ``uncertainty_ns`` half their gap (the best of
    three tries). Raises KeyError for an unknown clock name."""
    clock_id = CLOCK_IDS[clock]
    best: tuple[int, int, int] | None = None
    for _ in range(3):
        before = time.clock_gettime_ns(clock_id)
        realtime = time.clock_gettime_ns(time.CLOCK_REALTIME)
        after = time.clock_gettime_ns(clock_id)
        if best is None or after - before < best[2] - best[0]:
            best = (before, realtime, after)
    assert best is not None  # three tries
    before, realtime, after = best
    return {"realtime_ns": realtime, "clock_ns": (before + after) // 2, "uncertainty_ns": (after - before + 1) // 2}


def boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), None where the kernel does not expose it."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def host_label(label: str | None = None) -> str:
    """``label`` when given (``record --host``), else the host name (``gethostname(2)``)."""
    return label if label else socket.gethostname()


def job_of(environ: Mapping[str, str], command: Sequence[str] = ()) -> dict | None:
    """``{"launcher", "variable", "id"}`` of the job ``environ`` (the recorder's environment) or the recorded
    ``command`` names, None when neither does. A torchrun command line's ``--rdzv-id``/``--rdzv_id`` is the
    ``TORCHELASTIC_RUN_ID`` torchrun gives its workers (torch.distributed.run)."""
    for variable, launcher in JOB_VARIABLES:
        if environ.get(variable):
            return {"launcher": launcher, "variable": variable, "id": environ[variable]}
    args = list(command)
    if (
        args
        and os.path.basename(args[0]) == "torchrun"
        or any(a in ("torch.distributed.run", "torch.distributed.launch") for a in args[:3])
    ):
        for i, arg in enumerate(args):
            for flag in ("--rdzv-id", "--rdzv_id"):
                if arg == flag and i + 1 < len(args):
                    return {"launcher": "torchelastic", "variable": "TORCHELASTIC_RUN_ID", "id": args[i + 1]}
                if arg.startswith(flag + "="):
                    return {"launcher": "torchelastic", "variable": "TORCHELASTIC_RUN_ID", "id": arg.split("=", 1)[1]}
    return None


def clock_metadata(clock: str, origin_ns: int, start: dict, end: dict) -> dict:
    """The ``clock`` metadata object: the tracer clock's name, its value at ``ts_ns`` 0, the two anchors."""
    return {"name": clock, "origin_ns": int(origin_ns), "anchors": [start, end]}


def to_realtime(clock: Mapping, ts_ns, *, offset_ns: int = 0):
    """``ts_ns`` (since the trace's origin; an int or a numpy array) on ``CLOCK_REALTIME``, through the
    trace's ``clock`` metadata: linear between the first and the last anchor (their ratio corrects the
    tracer clock's rate), the first anchor alone when there is one; plus ``offset_ns`` (a host's known
    realtime error, ``merge --clock-offset``). Integer arithmetic except the rate."""
    anchors = clock["anchors"]
    first, last = anchors[0], anchors[-1]
    at_origin = clock["origin_ns"] - first["clock_ns"]  # the origin, on the tracer clock, after the first anchor
    span = last["clock_ns"] - first["clock_ns"]
    rate = (last["realtime_ns"] - first["realtime_ns"]) / span if span > 0 else 1.0
    since_first = ts_ns + at_origin
    if span > 0 and abs(rate - 1.0) > 1e-12:
        return (
            first["realtime_ns"]
            + offset_ns
            + since_first
            + (
                (since_first * (rate - 1.0)).round().astype("int64")
                if hasattr(since_first, "astype")
                else round(since_first * (rate - 1.0))
            )
        )
    return first["realtime_ns"] + offset_ns + since_first


def alignment_error_ns(clock: Mapping) -> int:
    """How far a row mapped by ``to_realtime`` may be from the realtime clock of its host, in ns: the
    anchors' read uncertainty plus, when there are two anchors, the drift the end anchor shows against a
    rate of 1 (bounded by the rate correction only to first order, so it is counted whole)."""
    anchors = clock["anchors"]
    first, last = anchors[0], anchors[-1]
    drift = abs((last["realtime_ns"] - first["realtime_ns"]) - (last["clock_ns"] - first["clock_ns"]))
    return int(max(a["uncertainty_ns"] for a in anchors) + drift)
