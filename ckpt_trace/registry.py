"""Plug-in tables: one module per entry, found by scanning a package (fio's ioengines, torchsnapshot's
storage plugins). The replay strategies (``replayer.strategies``) and the tracer backends
(``tracer.backends``) are such tables; each package says what its modules declare and which error
a packaging mistake raises.

Source: ``pkgutil.iter_modules`` and ``importlib.import_module`` (Python's library reference).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import Protocol, TypeVar

from ckpt_trace.errors import CkptTraceError

__all__ = ["Entry", "discover"]


class Entry(Protocol):
    """What a table's entries have: a name, and a place (``order``) in the table's listings."""

    @property
    def name(self) -> str: ...

    @property
    def order(self) -> int: ...


E_co = TypeVar("E_co", bound=Entry)


def discover(
    package: str, path: Iterable[str], attribute: str, kind: type[E_co], *, reserved: str, error: type[CkptTraceError]
) -> dict[str, E_co]:
    """Import every module of ``package`` (its ``__path__`` is ``path``) whose name does not start with
    ``_``; each must define ``attribute`` as an instance of ``kind``. Returns the entries by name, sorted by
    (``order``, name). Raises ``error`` for a module without the attribute, or a name declared twice or
    equal to ``reserved`` (the table's word for "every entry", such as ``all`` or ``auto``)."""
    found: dict[str, E_co] = {}
    for info in pkgutil.iter_modules(list(path)):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        spec = getattr(module, attribute, None)
        if not isinstance(spec, kind):
            raise error(f"module {module.__name__} defines no {attribute} = {kind.__name__}(...)")
        if spec.name in found or spec.name == reserved:
            raise error(f"name {spec.name!r} is declared twice ({module.__name__})")
        found[spec.name] = spec
    return dict(sorted(found.items(), key=lambda item: (item[1].order, item[0])))
