"""A recording's fixed costs: when this process was invoked, and the kernel view cached per kernel.

``record --json`` reports two fixed costs beside the command's own time:

- ``start_s``: from this process's start (its ``starttime`` in /proc/self/stat, proc(5), in clock ticks
  since boot, so 10 ms resolution) to the probes being live (bcc: the program attached and the command
  released; strace: the first event in strace's log);
- ``finish_s``: from the command's exit to the trace being complete (written, layout added).

What bcc's start costs besides compiling the program: the running kernel's BTF parsed in Python (0.5-0.7 s
here) for a dozen member offsets (``bcc_backend.kernel_view``). ``cached_view`` keeps what that yields in a
small JSON file per BTF digest under ``config.CACHE_DIR``: the same BTF bytes give the same offsets, so a
new kernel (or a changed BTF) is parsed afresh. The digest of the BTF, not the build id of
/sys/kernel/notes, is the key: on this VM the notes name another kernel than uname(2) does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from ckpt_trace import config

_CACHE_VERSION = 1
_MACRO = re.compile(r"__[A-Z0-9_]+__")
_NUMBER = re.compile(r"-?[0-9]+")


def invoked_monotonic_s() -> float:
    """CLOCK_MONOTONIC seconds at which this process started (exec'd), from /proc/self/stat's starttime
    (CLOCK_BOOTTIME ticks, converted through the two clocks' present offset). 10 ms resolution."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22, counting after "(comm)"
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    boot_now = time.clock_gettime(time.CLOCK_BOOTTIME)
    mono_now = time.monotonic()
    return mono_now - (boot_now - ticks / os.sysconf("SC_CLK_TCK"))


def since_invocation_s(monotonic_s: float) -> float:
    """Seconds from this process's start to ``monotonic_s`` (a ``time.monotonic()`` value)."""
    return max(0.0, monotonic_s - invoked_monotonic_s())


def _cache_file(btf_bytes: bytes) -> Path:
    digest = hashlib.sha256(btf_bytes).hexdigest()[:32]
    return Path(config.CACHE_DIR) / f"kernel-view-{digest}.json"


def _trusted(path: Path) -> bool:
    """A cache file this user owns that nobody else may write (its numbers go into a program run as root)."""
    try:
        info = path.stat()
        parent = path.parent.stat()
    except OSError:
        return False
    return (
        info.st_uid == os.geteuid()
        and not info.st_mode & 0o022
        and parent.st_uid == os.geteuid()
        and not parent.st_mode & 0o022
    )


def load_view(btf_path: str | os.PathLike) -> tuple[dict, str | None, str | None] | None:
    """(macros, uring reason, mapped reason) cached for the BTF at ``btf_path``, or None (no cache, not
    trusted, unreadable, or anything but integers in its macros)."""
    try:
        path = _cache_file(Path(btf_path).read_bytes())
    except OSError:
        return None
    if not _trusted(path):
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    macros = data.get("macros") if isinstance(data, dict) and data.get("version") == _CACHE_VERSION else None
    if not isinstance(macros, dict) or not all(
        isinstance(k, str) and _MACRO.fullmatch(k) and isinstance(v, str) and _NUMBER.fullmatch(v)
        for k, v in macros.items()
    ):
        return None
    uring, mapped = data.get("uring"), data.get("mapped")
    if not all(reason is None or isinstance(reason, str) for reason in (uring, mapped)):
        return None
    return macros, uring, mapped


def store_view(btf_path: str | os.PathLike, macros: dict, uring: str | None, mapped: str | None) -> Path | None:
    """Write the cache entry (atomically, mode 0600, in a 0700 directory); None when it cannot be written
    (a read-only home: the next start parses the BTF again, nothing else changes)."""
    try:
        path = _cache_file(Path(btf_path).read_bytes())
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"version": _CACHE_VERSION, "macros": macros, "uring": uring, "mapped": mapped}, handle)
        os.replace(temporary, path)
        return path
    except OSError:
        return None


def cached_view(
    btf_path: str | os.PathLike,
    compute: Callable[[], tuple[dict, str | None, str | None]],
) -> tuple[dict, str | None, str | None]:
    """``compute()``'s (macros, uring, mapped) for this BTF, from the cache when there, else computed and
    stored (only when BTF was readable: a missing BTF is not cached)."""
    found = load_view(btf_path)
    if found is not None:
        return found
    macros, uring, mapped = compute()
    if Path(btf_path).exists():
        store_view(btf_path, macros, uring, mapped)
    return macros, uring, mapped


_prewarming: list[bool] = []


def prewarm_in_background() -> None:
    """Import, in a daemon thread, what writing the trace will import anyway: pyarrow builds its first array
    (from lists or numpy arrays alike) only after importing pandas when it is installed (0.3-0.7 s here),
    which otherwise falls after the command's exit, into ``finish_s``. Called by the backends where a core is
    free of the start's own work: under bcc while clang compiles the program (a foreign call, without the
    GIL), else once the probes are live and the command runs (during a start from the program cache it took
    the GIL and a core from the loading, 0.15-0.2 s of ``start_s``, 2026-11-30); under strace, while strace
    starts and the command runs. Once per process."""
    import importlib.util
    import threading

    try:
        if _prewarming or "pandas" in __import__("sys").modules or importlib.util.find_spec("pandas") is None:
            return
    except (ImportError, ValueError):  # refused by an import hook (the CLI's record keeps pandas out)
        return
    _prewarming.append(True)

    def warm() -> None:
        try:
            import pandas  # noqa: F401
        except Exception:  # noqa: BLE001 - a broken optional install only costs the time it saves
            pass

    threading.Thread(target=warm, name="ckpt-trace-prewarm", daemon=True).start()
