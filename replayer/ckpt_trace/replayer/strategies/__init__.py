"""The replay strategies, by name: one module of this package per strategy, one table of them.

A strategy is what a replay varies: how the recorded operations are planned
(its ``derive`` step, pure: the as-recorded plan in, its own plan out) and
submitted (its executor), plus what ``emit`` may take from its verdict and
what its name promises. Each module here (not starting with ``_``) defines
``STRATEGY = Strategy(...)``; ``table()`` imports every such module once
(``pkgutil.iter_modules`` over this package, as fio's ioengines and
torchsnapshot's storage plugins register by name) and the rest of the tree
reads it: the CLI's ``--strategy`` choices, ``all``, replay's executor,
``emit``'s defaults, ``verify``'s pattern, the named data path of a result
and the benchmarks. No module outside this package branches on a strategy's
name. Adding a strategy is one new module here plus its test
(docs/ARCHITECTURE.md, "Adding a strategy").

An unknown name is a ReplayError everywhere (``get``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckpt_trace import registry
from ckpt_trace.errors import ReplayError

if TYPE_CHECKING:
    from ..engine import Executor
    from ..paths import TargetRoot
    from ..plan import ReplayPlan

#: The name that replays every strategy whose ``in_all`` is set.
ALL = "all"


def as_recorded(base: ReplayPlan, *, buffer_bytes: int, block_bytes: int, pack_files: bool) -> ReplayPlan:
    """The plan derivation of strategies that replay the recorded operations as they are. Pure."""
    del buffer_bytes, block_bytes, pack_files  # part of every derivation's signature; unused here
    return base


@dataclass(frozen=True)
class Strategy:
    """One replay strategy's declaration.

    ``executor(root, queue_depth)`` makes its executor, the one engine
    composed with its data path (``engine.Executor(root, max_io_bytes,
    path)``, ``path`` a ``datapath.DataPath``; raises ReplayError when the
    machine cannot run it); ``derive(base, buffer_bytes=,
    block_bytes=, pack_files=)`` its plan from the as-recorded plan (pure;
    the name is set by the caller). ``in_all``: replayed by ``--strategy
    all`` (else only when named, ``only_when_named`` saying why);
    ``order``: its place in listings and in ``all`` (posix, the reference,
    first). Emit's defaults (``ckpt_trace.writer.emit``): ``direct_io``,
    whether its bytes bypass the page cache where the results do not say;
    ``uses_queue_depth`` (the replay's ``--queue-depth`` applies, and the
    ring is probed before a replay); ``uses_buffer_bytes`` (the replay's
    ``--buffer-size`` applies); ``packs_files`` (``--pack-files`` applies).
    ``named_path``: the data path its name promises (``ReplayResult.
    named_path``, checked by ``--strict``) and ``named_path_members`` the
    ``datapath.DATA_PATHS`` that count as it. ``fio_args``: fio options doing the same I/O, with
    ``{depth}`` for the queue depth (``benchmarks/engine_rate.py``; empty:
    none).
    """

    name: str
    summary: str
    executor: Callable[[TargetRoot, int], Executor]
    derive: Callable[..., ReplayPlan] = as_recorded
    in_all: bool = True
    only_when_named: str = ""
    order: int = 100
    direct_io: bool = False
    uses_queue_depth: bool = False
    uses_buffer_bytes: bool = False
    packs_files: bool = False
    named_path: str | None = None
    named_path_members: tuple[str, ...] = ()
    fio_args: tuple[str, ...] = ()

    def plan(self, base: ReplayPlan, *, buffer_bytes: int, block_bytes: int, pack_files: bool) -> ReplayPlan:
        """This strategy's plan from the as-recorded plan ``base`` (named after it). Pure."""
        base = dataclasses.replace(base, strategy=self.name)
        plan = self.derive(base, buffer_bytes=buffer_bytes, block_bytes=block_bytes, pack_files=pack_files)
        return plan if plan.strategy == self.name else dataclasses.replace(plan, strategy=self.name)


@functools.cache
def table() -> dict[str, Strategy]:
    """Every strategy of this package by name, in ``order``. Raises ReplayError for a module without a
    ``STRATEGY`` or two modules declaring one name (a packaging error, said at first use)."""
    return registry.discover(__name__, __path__, "STRATEGY", Strategy, reserved=ALL, error=ReplayError)


def names() -> tuple[str, ...]:
    """Every strategy's name, in order."""
    return tuple(table())


def in_all() -> tuple[str, ...]:
    """The strategies ``all`` replays, in order (posix first)."""
    return tuple(name for name, spec in table().items() if spec.in_all)


def choices() -> tuple[str, ...]:
    """What ``--strategy`` accepts: every name, then ``all``."""
    return (*names(), ALL)


def find(name: str) -> Strategy | None:
    """The strategy called ``name``, or None."""
    return table().get(name)


def get(name: str) -> Strategy:
    """The strategy called ``name``. Raises ReplayError for an unknown name, listing the known ones."""
    spec = table().get(name)
    if spec is None:
        raise ReplayError(f"unknown strategy {name!r} (available: {', '.join(choices())})")
    return spec


def expand(name: str) -> tuple[str, ...]:
    """The strategies ``name`` replays: ``all``'s, or the one named. Raises ReplayError for an unknown name."""
    return in_all() if name == ALL else (get(name).name,)


def help_text() -> str:
    """``--strategy``'s help: what ``all`` does and which strategies run only when named, and why."""
    optional = [f"{spec.name}: {spec.only_when_named}" for spec in table().values() if not spec.in_all]
    return (
        "all: each into TARGET/<strategy>/" + (f" (only when named: {'; '.join(optional)})" if optional else "") + "."
    )
