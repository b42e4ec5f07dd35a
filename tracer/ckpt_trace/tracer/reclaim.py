"""Proactive reclaim that evicts page cache while a command runs: the trace's ``proactive_reclaim`` metadata.

A page a recorded read finds missing counts as cold (``cold_bytes``, ``tracer.page_cache``) whoever evicted
it. Memory pressure is one cause; another is a DAMON-based reclaim scheme (Documentation/admin-guide/mm/
damon/usage.rst, the sysfs interface under /sys/kernel/mm/damon/admin): a running ``kdamond`` whose scheme's
action is ``pageout`` (reclaim at once), ``cold`` or ``lru_deprio`` (deactivate, reclaimed first under
pressure) on regions not accessed for ``access_pattern/age/min`` aggregation intervals, within a quota of
``quotas/bytes`` per ``quotas/reset_interval_ms``. It moves no reclaim counter of /proc/vmstat
(``pgscan_*``, ``pgsteal_*``). On the development VM such a scheme (``paddr``, ``pageout`` of unmapped file
pages idle for 12 intervals of 5 s, at most 128 MiB/s) left warm recordings of a 1.5 GB load with 0-18 MB
read cold. ``record`` reads the schemes when it starts (``schemes()``), says them in one line and stores them
in the trace, so a reader of ``cold_bytes`` knows why a recording of a warm load has some.
"""

from __future__ import annotations

from pathlib import Path

DAMON_ADMIN = Path("/sys/kernel/mm/damon/admin")
#: DAMOS actions that take pages out of the page cache, or put them first in line for reclaim.
EVICTING_ACTIONS = ("pageout", "cold", "lru_deprio")


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _numbered(directory: Path) -> list[Path]:
    """The numbered children of a DAMON sysfs directory (``0``, ``1``, ...), in order."""
    try:
        return sorted((p for p in directory.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError:
        return []


def _filters(scheme: Path) -> list[dict]:
    out = []
    for kind in ("ops_filters", "core_filters", "filters"):
        for f in _numbered(scheme / kind):
            entry = {"type": _text(f / "type"), "matching": _text(f / "matching") == "Y"}
            if (allow := _text(f / "allow")) is not None:
                entry["allow"] = allow == "Y"
            out.append(entry)
    return out


def schemes(root: Path = DAMON_ADMIN) -> list[dict]:
    """The running DAMON schemes that evict page cache (``EVICTING_ACTIONS``), one dict each:
    {"kdamond": index, "operations": "paddr" | "vaddr" | "fvaddr", "action", "min_age_s" (the least idle
    time a region must have, s: ``age/min`` aggregation intervals; None where unreadable), "quota_bytes",
    "quota_reset_interval_ms" (0: no quota), "filters": [{"type", "matching", "allow"}]}. Empty where DAMON's
    sysfs interface is missing or no kdamond is ``on``. Never raises: what cannot be read is left out."""
    found = []
    for kdamond in _numbered(root / "kdamonds"):
        if _text(kdamond / "state") != "on":
            continue
        for context in _numbered(kdamond / "contexts"):
            aggr_us = _int(context / "monitoring_attrs" / "intervals" / "aggr_us")
            for scheme in _numbered(context / "schemes"):
                action = _text(scheme / "action")
                if action not in EVICTING_ACTIONS:
                    continue
                age = _int(scheme / "access_pattern" / "age" / "min")
                found.append(
                    {
                        "kdamond": int(kdamond.name),
                        "operations": _text(context / "operations"),
                        "action": action,
                        "min_age_s": None if age is None or aggr_us is None else age * aggr_us / 1e6,
                        "quota_bytes": _int(scheme / "quotas" / "bytes"),
                        "quota_reset_interval_ms": _int(scheme / "quotas" / "reset_interval_ms"),
                        "filters": _filters(scheme),
                    }
                )
    return found


def describe(found: list[dict]) -> str | None:
    """One line naming the schemes of ``schemes()`` for ``record``'s output; None for none."""
    if not found:
        return None
    parts = []
    for s in found:
        quota = (
            f", at most {s['quota_bytes'] / 2**20:.0f} MiB per {s['quota_reset_interval_ms']} ms"
            if s.get("quota_bytes") and s.get("quota_reset_interval_ms")
            else ""
        )
        idle = f" idle for {s['min_age_s']:g} s or more" if s.get("min_age_s") is not None else ""
        filters = ", ".join(
            f"{'' if f['matching'] else 'non-'}{f['type']} {'allowed' if f.get('allow', True) else 'excluded'}"
            for f in s.get("filters") or ()
        )
        parts.append(
            f"kdamond {s['kdamond']} ({s['operations']}): {s['action']} of pages{idle}{quota}"
            + (f"; {filters}" if filters else "")
        )
    return (
        f"DAMON reclaim is running ({' | '.join(parts)}): pages it evicts during the recording count as read "
        "cold when read again"
    )


__all__ = ["DAMON_ADMIN", "EVICTING_ACTIONS", "describe", "schemes"]
