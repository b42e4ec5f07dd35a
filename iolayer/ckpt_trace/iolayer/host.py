"""Facts about the machine and its storage, in one place: mounts, block sizes, free space, devices, caches.

Every command that records where it ran (trace metadata, replay results,
baselines, bench tables) takes its environment from ``environment``; every
free-space check from ``free_bytes``; every O_DIRECT alignment from
``block_bytes``. The mount table comes from /proc/self/mountinfo
(proc(5), "/proc/pid/mountinfo"); the device model from sysfs.
"""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ckpt_trace.errors import CkptTraceError

MOUNTINFO = Path("/proc/self/mountinfo")
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


@dataclass(frozen=True)
class Mount:
    """One mount: ``mount_point``, file system ``fs_type`` and ``source`` (the device or pseudo source)."""

    mount_point: str
    fs_type: str
    source: str


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(text: str | None = None) -> list[Mount]:
    """The mount table, longest mount point first (so the first match of a path is its mount).

    ``text`` is a mountinfo document (the running system's when None).
    """
    if text is None:
        try:
            text = MOUNTINFO.read_text()
        except OSError:
            return []
    found = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) > 4 and len(tail) >= 2:
            found.append(Mount(_unescape(fields[4]), tail[0], _unescape(tail[1])))
    return sorted(found, key=lambda m: len(m.mount_point), reverse=True)


def mount_of(path: str | os.PathLike, table: list[Mount] | None = None) -> Mount | None:
    """The mount holding ``path`` (absolute; resolved when it exists)."""
    path = os.path.realpath(path) if os.path.exists(path) else os.path.abspath(path)
    for mount in table if table is not None else mounts():
        prefix = mount.mount_point.rstrip("/") + "/"
        if path == mount.mount_point or path.startswith(prefix) or mount.mount_point == "/":
            return mount
    return None


def nearest_existing(path: str | os.PathLike) -> Path:
    """``path`` or its nearest existing ancestor (what a not-yet-created output will live on)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def block_bytes(path: str | os.PathLike) -> int:
    """The file system block size at ``path`` (statvfs f_bsize; the nearest existing ancestor):
    what O_DIRECT offsets and sizes are aligned to here."""
    return os.statvfs(nearest_existing(path)).f_bsize


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes free for an unprivileged writer on the file system holding ``path`` (statvfs f_bavail)."""
    return shutil.disk_usage(nearest_existing(path)).free


def require_free(path: str | os.PathLike, needed_bytes: int, what: str, hint: str = "") -> None:
    """Raise CkptTraceError before any work when ``path``'s file system has less than ``needed_bytes`` free."""
    free = free_bytes(path)
    if free < needed_bytes:
        raise CkptTraceError(
            f"{path} has {free / 2**20:,.0f} MiB free; {what} needs {needed_bytes / 2**20:,.0f} MiB"
            + (f" ({hint})" if hint else "")
        )


def filesystems_of(paths: Iterable[str]) -> dict[str, dict]:
    """File systems holding ``paths``: {mount point: {"type", "block_size" (statvfs f_bsize, bytes), "device"
    (the mount's source, /dev/nvme0n1p2), "device_model" (from sysfs, None if unknown)}}."""
    table = mounts()
    points = {m.mount_point for m in table}
    by_directory: dict[str, Mount | None] = {}  # a trace names thousands of files in a few directories
    found: dict[str, dict] = {}
    for path in {p for p in paths if p and p.startswith("/")}:
        path = os.path.abspath(path)
        if path in points or os.path.islink(path):  # a file mounted or linked elsewhere: resolved itself
            mount = mount_of(path, table)
        else:  # else on its directory's file system: one resolution per directory
            directory = os.path.dirname(path)
            if directory not in by_directory:
                by_directory[directory] = mount_of(directory, table)
            mount = by_directory[directory]
        if mount is None or mount.mount_point in found:
            continue
        try:
            size = os.statvfs(mount.mount_point).f_bsize
        except OSError:
            size = None
        found[mount.mount_point] = {
            "type": mount.fs_type,
            "block_size": size,
            "device": mount.source,
            "device_model": device_model(mount.source),
        }
    return found


@lru_cache(maxsize=64)
def device_model(source: str) -> str | None:
    """The model of the block device ``source`` (/dev/nvme0n1p2 -> its disk's model), from sysfs; None if unknown."""
    name = Path(source).name
    candidates = [name, name.rstrip("0123456789")]
    if name.startswith("nvme") and "p" in name[4:]:
        candidates.append(name[: name.rindex("p")])
    for candidate in candidates:
        model = Path(f"/sys/block/{candidate}/device/model")
        if model.exists():
            return model.read_text().strip()
        vendor = Path(f"/sys/block/{candidate}/device/vendor")
        if vendor.exists():
            return f"virtio/vendor {vendor.read_text().strip()}"
    return None


def environment(target: str | os.PathLike) -> dict:
    """Where a measurement runs: host, kernel, architecture, CPU count, and the file system and device
    of ``target`` (the nearest existing ancestor)."""
    mount = mount_of(nearest_existing(target))
    source = mount.source if mount else "unknown"
    return {
        "host": platform.node(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpu_count": os.cpu_count(),
        "filesystem": mount.fs_type if mount else "unknown",
        "mount_point": mount.mount_point if mount else None,
        "device": source,
        "device_model": device_model(source),
    }


def drop_page_cache() -> None:
    """sync(2), then drop the clean page cache, dentries and inodes (Documentation/admin-guide/sysctl/vm.rst).

    Raises CkptTraceError without root."""
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
    except OSError as err:
        raise CkptTraceError(f"cannot drop the page cache: {err.strerror} (needs root)") from None
