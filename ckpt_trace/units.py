"""Units, one convention for every command: sizes in IEC binary units, rates in decimal MB/s.

Sizes a person types are read the way dd(1) and GNU coreutils read them:
``KiB``/``MiB``/``GiB``/``TiB`` (and the bare ``K``/``M``/``G``/``T``) are powers
of 1024; ``KB``/``MB``/``GB``/``TB`` are powers of 1000; a plain number is bytes.
Fractions are allowed where they give whole bytes (``4.5MiB``). Sizes are
printed in IEC units (``4.0 GiB``), throughput in decimal megabytes per second
(``1,629.0 MB/s``, as fio and the papers report it), durations in s, ms or µs.
"""

from __future__ import annotations

import re
from fractions import Fraction

from ckpt_trace.errors import CkptTraceError

SIZE_HELP = "IEC units (4KiB, 4.5MiB, 1TiB; K, M, G, T mean the same) or decimal ones (4MB = 4,000,000 bytes)"

_FACTORS = {"": 1, "b": 1}
for _power, _letter in enumerate("kmgtp", start=1):
    _FACTORS[_letter] = _FACTORS[_letter + "ib"] = 1024**_power
    _FACTORS[_letter + "b"] = 1000**_power
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str, *, what: str = "size") -> int:
    """'4MiB' -> 4194304, '4MB' -> 4000000, '4.5MiB' -> 4718592, '512' -> 512 (see the module docstring).

    Raises CkptTraceError (one line naming ``what``) for anything else, or a fraction of a byte.
    """
    match = _SIZE.fullmatch(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _FACTORS:
        raise CkptTraceError(f"not a {what}: {text!r} (use e.g. 4MiB, 512KiB or 4MB; {SIZE_HELP})")
    value = Fraction(match.group(1)) * _FACTORS[unit]
    if value.denominator != 1:
        raise CkptTraceError(f"not a {what}: {text!r} is not a whole number of bytes")
    return int(value)


def human_bytes(value: float) -> str:
    """Bytes in IEC units: 1536 -> '1.5 KiB', 4294967296 -> '4.0 GiB'."""
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def human_rate(bytes_per_s: float) -> str:
    """Throughput in decimal megabytes per second: '1,629.0 MB/s'."""
    return f"{bytes_per_s / 1e6:,.1f} MB/s"


def human_ns(value: float) -> str:
    """A duration given in nanoseconds: '2.35 s', '1.20 ms', '15.0 µs'."""
    if value >= 1e9:
        return f"{value / 1e9:.2f} s"
    if value >= 1e6:
        return f"{value / 1e6:.2f} ms"
    return f"{value / 1e3:.1f} µs"
