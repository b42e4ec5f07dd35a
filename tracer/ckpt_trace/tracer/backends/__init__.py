"""The tracer backends, by name: one module of this package per backend, one table of them.

Each module here (not starting with ``_``) defines ``BACKEND = Backend(...)``;
``table()`` imports every such module once (``pkgutil.iter_modules``, as the
replayer's strategies register) and ``record`` reads it: ``--backend``'s
choices, ``auto``'s choice (the first backend, in ``order``, that can run
here), what a backend will not capture, its clock, and how it runs a
command. ``record`` never branches on a backend's name; adding a backend is
one new module here plus its test (docs/ARCHITECTURE.md).

An unknown name is a TracerError (``get``, ``choose``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ckpt_trace import registry
from ckpt_trace.errors import TracerError

#: The name that picks the first backend that can run here.
AUTO = "auto"


@dataclass(frozen=True)
class BackendChoice:
    """The backend to use and, for ``auto``, why (one line for stderr).

    ``may_fall_back``: an ``auto`` choice of bcc that becomes strace when the
    kernel refuses the BPF program at load time.
    """

    name: str
    reason: str
    may_fall_back: bool = False


@dataclass(frozen=True)
class Backend:
    """One tracer backend's declaration.

    ``problem()``: None when it can run here, else why not (one line).
    ``auto_reason``: why ``auto`` picked it. ``capture_limits()``: what it
    will not capture here, one line each. ``run(choice, cmd, env,
    make_feeder, spool, path_filters)`` runs the command under it and returns
    (builder, extra metadata, the choice that ran: a backend may fall back
    to a later one, ``may_fall_back``). ``clock``: the clock its timestamps
    are on (``tracer.clock``). ``wrapped``: the command runs under a wrapper
    process of the backend's (signals go to the wrapper, not its children:
    ``tracer.children.forwarding``). ``order``: its place in ``auto``'s
    preference and in listings. ``attach(choice, ctx)``: ``record --pid``'s body for this backend
    (``tracer.attach.Attaching`` in, the same triple as ``run`` out); None: it cannot attach.
    """

    name: str
    problem: Callable[[], str | None]
    auto_reason: str
    capture_limits: Callable[[], list[str]]
    run: Callable[..., tuple]
    clock: str
    wrapped: bool = False
    order: int = 100
    attach: Callable[..., tuple] | None = None


@functools.cache
def table() -> dict[str, Backend]:
    """Every backend of this package by name, in ``order``. Raises TracerError for a module without a
    ``BACKEND`` or a name declared twice."""
    return registry.discover(__name__, __path__, "BACKEND", Backend, reserved=AUTO, error=TracerError)


def names() -> tuple[str, ...]:
    """Every backend's name, in ``auto``'s order of preference."""
    return tuple(table())


def choices() -> tuple[str, ...]:
    """What ``--backend`` accepts: ``auto``, then every name."""
    return (AUTO, *names())


def get(name: str) -> Backend:
    """The backend called ``name``. Raises TracerError for an unknown name."""
    spec = table().get(name)
    if spec is None:
        raise TracerError(f"unknown backend {name!r} (choose from {', '.join(choices())})")
    return spec


def choose(requested: str) -> BackendChoice:
    """Resolve ``requested`` (``auto`` or a name) to a backend that can run here; for ``auto`` the first in
    order that can, may falling back to a later one that can. Raises TracerError when the requested backend
    cannot run (with the reason), when none can, or for an unknown name."""
    if requested != AUTO:
        spec = get(requested)
        problem = spec.problem()
        if problem:
            raise TracerError(f"{spec.name} backend unavailable: {problem}")
        return BackendChoice(spec.name, "requested")
    problems: dict[str, str] = {}
    for spec in table().values():
        problem = spec.problem()
        if problem:
            problems[spec.name] = problem
            continue
        if not problems:
            later = [s for s in table().values() if s.order > spec.order]
            return BackendChoice(spec.name, spec.auto_reason, may_fall_back=any(s.problem() is None for s in later))
        first, why = next(iter(problems.items()))
        return BackendChoice(spec.name, f"{first} unavailable: {why}")
    raise TracerError(
        "no tracing backend: " + " and ".join(f"{name} unavailable ({why})" for name, why in problems.items())
    )
