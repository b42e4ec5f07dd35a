"""The GPU hop: host<->device copies of a CUDA program, captured by a CUPTI subscriber and turned into trace rows.

Call order (``record`` does this): ``plan_capture(mode)`` decides before the
command starts (``--gpu auto|on|off``) and says why; ``GpuCapture.env()``
gives the variables that make the CUDA driver load the subscriber into every
process of the command (``CUDA_INJECTION64_PATH``, the CUDA driver's
documented injection hook); after the command, ``GpuCapture.collect()``
reads what each process wrote and ``copy_columns`` turns it into rows of the
trace's schema, on the trace's clock.

The subscriber (``cupti/ckpt_cupti.c``) is compiled here with the system C
compiler on first use and cached by the hash of its source; it binds to
libcupti at run time (``find_cupti``), so neither CUDA headers nor a GPU are
needed to build it. Raises TracerError when ``--gpu on`` cannot be honoured.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ckpt_trace.errors import TracerError
from ckpt_trace.formats import vocabulary

SOURCE = Path(__file__).with_name("cupti") / "ckpt_cupti.c"
GPU_MODES = ("auto", "on", "off")

#: One record of ``copies-<pid>.bin``: ``struct copy_record`` of ckpt_cupti.c, 64 bytes, little endian.
COPY_RECORD = np.dtype(
    [
        ("start_ns", "<u8"),
        ("end_ns", "<u8"),
        ("bytes", "<u8"),
        ("host_address", "<u8"),
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("device", "<u4"),
        ("stream", "<u4"),
        ("correlation", "<u4"),
        ("copy_kind", "u1"),
        ("src_kind", "u1"),
        ("dst_kind", "u1"),
        ("flags", "u1"),
        ("reserved", "<u8"),
    ]
)
assert COPY_RECORD.itemsize == 64

# CUpti_ActivityMemcpyKind (cupti_activity.h) -> the trace's op.
COPY_OPS = {
    1: vocabulary.COPY_H2D,
    2: vocabulary.COPY_D2H,
    8: vocabulary.COPY_D2D,
    9: vocabulary.COPY_H2H,
    10: vocabulary.COPY_P2P,
}
# CUpti_ActivityMemoryKind (cupti_activity.h) -> the trace's memory_kind.
MEMORY_KINDS = {
    1: vocabulary.MEMORY_PAGEABLE,
    2: vocabulary.MEMORY_PINNED,
    3: vocabulary.MEMORY_DEVICE,
    5: vocabulary.MEMORY_MANAGED,
    6: vocabulary.MEMORY_DEVICE,
    7: vocabulary.MEMORY_MANAGED,
}


def cache_dir() -> Path:
    """Where the compiled subscriber is kept: ``$CKPT_TRACE_CACHE``, else ``$XDG_CACHE_HOME/ckpt-trace``."""
    base = os.environ.get("CKPT_TRACE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckpt-trace"
    )
    return Path(base)


def build_injection(directory: Path | None = None) -> Path:
    """Compile ``ckpt_cupti.c`` into a shared library (once per source version) and return its path.

    Uses ``$CC`` or ``cc``; the library needs libc and libdl only. Raises
    TracerError when no compiler is found or the build fails (its first
    error line).
    """
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    directory = directory or cache_dir()
    target = directory / f"libckpt_cupti-{digest}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise TracerError("cannot build the CUPTI subscriber: no C compiler (install gcc, or set CC)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TracerError(f"cannot build the CUPTI subscriber: {directory}: {err.strerror}") from None
    fd, temporary = tempfile.mkstemp(prefix=".ckpt_cupti-", suffix=".so", dir=directory)
    os.close(fd)
    cmd = [compiler, "-O2", "-shared", "-fPIC", "-Wall", "-o", temporary, str(SOURCE), "-ldl", "-lpthread"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(temporary)
        first = next((line for line in proc.stderr.splitlines() if "error" in line), proc.stderr.strip()[:200])
        raise TracerError(f"cannot build the CUPTI subscriber: {first}")
    os.replace(temporary, target)
    return target


def find_cupti() -> Path | None:
    """The libcupti the traced program's CUDA will use, or None.

    Looked for in order: ``$CKPT_TRACE_CUPTI_LIB``; the NVIDIA wheels of this
    Python (``nvidia/cuda_cupti/lib``, ``nvidia/cu13/lib``: what PyTorch
    installs); ``$CUDA_HOME/extras/CUPTI/lib64`` and ``/usr/local/cuda``; the
    dynamic linker's cache.
    """
    named = os.environ.get("CKPT_TRACE_CUPTI_LIB")
    if named:
        return Path(named) if os.path.exists(named) else None
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    patterns = [
        os.path.join(root, "nvidia", sub, "lib", "libcupti.so*")
        for root in roots
        if root
        for sub in ("cuda_cupti", "cu13", "cu12")
    ]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            patterns += [
                os.path.join(home, "extras", "CUPTI", "lib64", "libcupti.so*"),
                os.path.join(home, "lib64", "libcupti.so*"),
            ]
    for pattern in patterns:
        found = sorted(glob.glob(pattern), key=len)
        if found:
            return Path(found[0])
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        return None
    for line in cache.splitlines():
        if "libcupti.so" in line and "=>" in line:
            return Path(line.split("=>", 1)[1].strip())
    return None


@dataclass(frozen=True)
class GpuPlan:
    """Whether copies are captured and why (one line for stderr); ``library`` and ``cupti`` when they are."""

    enabled: bool
    reason: str
    library: Path | None = None
    cupti: Path | None = None


def plan_capture(mode: str) -> GpuPlan:
    """Resolve ``--gpu auto|on|off`` before the command starts.

    ``auto`` captures when libcupti is found and the subscriber builds (a
    command that never initialises CUDA never loads it, so nothing changes
    for it); ``on`` raises TracerError where ``auto`` would say why not.
    """
    if mode not in GPU_MODES:
        raise TracerError(f"unknown --gpu {mode!r} (choose from {', '.join(GPU_MODES)})")
    if mode == "off":
        return GpuPlan(False, "--gpu off")
    if os.environ.get("CUDA_INJECTION64_PATH"):
        problem = (
            f"CUDA_INJECTION64_PATH is already set ({os.environ['CUDA_INJECTION64_PATH']}): another tool "
            "injects into CUDA"
        )
    else:
        cupti = find_cupti()
        problem = (
            None if cupti else "no libcupti found (pip install nvidia-cuda-cupti-cu12, or set CKPT_TRACE_CUPTI_LIB)"
        )
    if problem is None:
        try:
            library = build_injection()
        except TracerError as err:
            problem = str(err)
    if problem is not None:
        if mode == "on":
            raise TracerError(f"--gpu on: {problem}")
        return GpuPlan(False, problem)
    return GpuPlan(True, f"CUPTI subscriber injected ({cupti})", library, cupti)


@dataclass
class GpuCapture:
    """One recording's capture directory; ``env`` before the command, ``collect`` after it."""

    plan: GpuPlan
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix=f"ckpt-trace-gpu-{os.getpid()}-")))

    def env(self) -> dict[str, str]:
        """Variables to add to the command's environment."""
        return {
            "CUDA_INJECTION64_PATH": str(self.plan.library),
            "CKPT_TRACE_GPU_DIR": str(self.directory),
            "CKPT_TRACE_CUPTI_LIB": str(self.plan.cupti),
        }

    def collect(self) -> tuple[np.ndarray, dict]:
        """(every copy record of every process, sorted by start; a summary for the metadata).

        The summary: ``processes`` that loaded the subscriber, ``records``,
        ``dropped`` (records CUPTI dropped), ``clock_pairs`` {pid: [monotonic
        ns, realtime ns]}, ``errors`` {pid: reason} for processes whose
        copies are not all in the trace (another profiler held CUPTI, a
        CUPTI call failed, a write of the copies file failed: the subscriber's
        status says which, and how many records were lost).
        """
        parts, summary = [], {"processes": 0, "records": 0, "dropped": 0, "clock_pairs": {}, "errors": {}}
        for status in sorted(self.directory.glob("status-*.txt")):
            pid = status.stem.split("-", 1)[1]
            summary["processes"] += 1
            fields = dict(line.split(" ", 1) for line in status.read_text().splitlines() if " " in line)
            state = fields.get("state", "error no status")
            if state != "ok":
                summary["errors"][pid] = state.removeprefix("error ").strip()
            mono, real = (int(v) for v in fields.get("clock_pair", "0 0").split())
            summary["clock_pairs"][pid] = [mono, real]
            summary["dropped"] += int(fields.get("dropped", "0"))
            copies = self.directory / f"copies-{pid}.bin"
            if copies.exists():
                data = copies.read_bytes()
                whole = len(data) - len(data) % COPY_RECORD.itemsize  # a process killed mid-write
                parts.append(np.frombuffer(data[:whole], dtype=COPY_RECORD))
        records = np.concatenate(parts) if parts else np.zeros(0, COPY_RECORD)
        records = records[np.argsort(records["start_ns"], kind="stable")]
        summary["records"] = int(len(records))
        return records, summary

    def close(self) -> None:
        """Remove the capture directory (it was created by this run)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def copy_columns(
    records: np.ndarray,
    *,
    start_ns: int,
    realtime_offset_ns: int | None,
    ranks: Mapping[int, int],
    comms: Mapping[int, str | None],
) -> dict[str, list]:
    """Trace rows (column name -> list) for copy ``records`` (``COPY_RECORD``), one row per copy.

    Timestamps are CLOCK_MONOTONIC ns. With ``realtime_offset_ns`` None the
    trace's clock is monotonic (bcc) and ``start_ns`` is its start on that
    clock; otherwise the trace's clock is CLOCK_REALTIME (strace) and the
    offset (realtime - monotonic, from the subscriber's clock pair) is added
    first. ``ranks`` and ``comms`` map a pid to the rank and command name the
    tracer saw for it (-1 and null when it did not).

    Row meaning (formats/README.md): interface ``cuda``, syscall
    ``cuda_memcpy``, op ``copy_d2h``/``copy_h2d``/..., ``size`` and ``ret``
    the bytes, ``address`` the host buffer (null when unknown), ``queue_id``
    the CUDA stream, ``request_id`` CUPTI's correlation id, ``device``, and
    ``memory_kind`` the host side's memory (pinned or pageable; ``device``
    for device-to-device copies).
    """
    shift = (realtime_offset_ns or 0) - start_ns
    starts = records["start_ns"].astype(np.int64) + shift
    durations = (records["end_ns"].astype(np.int64) - records["start_ns"].astype(np.int64)).clip(min=0)
    pids = records["pid"].astype(np.int64)
    tids = np.where(records["tid"] > 0, records["tid"], records["pid"]).astype(np.int64)
    host_kind = np.where(records["copy_kind"] == 1, records["src_kind"], records["dst_kind"])
    rows = len(records)
    ops = [COPY_OPS.get(int(kind), vocabulary.COPY_OTHER) for kind in records["copy_kind"]]
    memory = [MEMORY_KINDS.get(int(kind), vocabulary.MEMORY_UNKNOWN) for kind in host_kind]
    return {
        "ts_ns": starts.tolist(),
        "dur_ns": durations.tolist(),
        "pid": pids.tolist(),
        "tid": tids.tolist(),
        "comm": [comms.get(int(p)) for p in pids],
        "rank": [ranks.get(int(p), -1) for p in pids],
        "syscall": [vocabulary.CUDA_MEMCPY] * rows,
        "op": ops,
        "fd": [None] * rows,
        "path": [None] * rows,
        "new_path": [None] * rows,
        "offset": [None] * rows,
        "offset_source": [None] * rows,
        "size": records["bytes"].astype(np.int64).tolist(),
        "ret": records["bytes"].astype(np.int64).tolist(),
        "flags": [None] * rows,
        "iov_count": [None] * rows,
        "interface": [vocabulary.CUDA] * rows,
        "queue_id": records["stream"].astype(np.int64).tolist(),
        "request_id": records["correlation"].astype(np.int64).tolist(),
        "in_flight": [None] * rows,
        "address": [int(a) if a else None for a in records["host_address"].astype(np.int64)],
        "prot": [None] * rows,
        "device": records["device"].astype(np.int64).tolist(),
        "memory_kind": memory,
    }
