"""DeepSpeed's JIT-built C++ ops (``async_io``, ``pin_memory``, ``deepspeed_shm_comm``) in the conformance runs:
built once, then loaded by every later process without a rebuild, and a stale build lock named, not waited on.

DeepSpeed builds an op the first time a process loads it (``torch.utils.cpp_extension.load``): it writes
``TORCH_EXTENSIONS_DIR/NAME/build.ninja`` and runs ``ninja``, found on ``PATH``. The build.ninja is the same
in every process here (under ``record``, strace or neither), but this machine has two ninjas: Debian's 1.11
(``/usr/bin``) and the 1.13 that pip installs into the venv with DeepSpeed. Their build logs do not mix:
1.13 writes log v7 with another command hash, where 1.11 finds "command line changed" for every object, and
1.13 reads 1.11's v5 log as "build log version is too old; starting over". So a process whose ``PATH`` found
the other ninja (a ``python -m pytest`` with the venv not activated, a shell with it activated) rebuilt the
whole op, 7-25 minutes on this 2-core machine. ``env`` pins one: the interpreter's own ``bin`` first.

torch serialises builds with a lock file (``torch/utils/file_baton.py``): the builder creates
``NAME/lock`` and keeps it open until it removes it; every other process waits while it exists, with no
time limit. A build killed midway leaves the file behind, held by nobody, and every later load waits
forever. ``stale_lock`` finds such a file (it exists and no process holds it open) so that the test can
fail with one line naming it; nothing here deletes it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

#: The ops DeepSpeed 0.19.8 builds for the conformance engines on the CPU accelerator.
OPS = ("async_io", "pin_memory", "deepspeed_shm_comm")


def extensions_dir(environ: Mapping[str, str]) -> Path:
    """Where torch builds the ops: ``TORCH_EXTENSIONS_DIR`` if set, else the project's own cache
    (``CKPT_TRACE_CACHE``, else ``$XDG_CACHE_HOME/ckpt-trace`` or ``~/.cache/ckpt-trace``, as the CUPTI build
    uses) ``/torch_extensions``: apart from torch's default, which other programs' builds (another ninja)
    share."""
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(environ["TORCH_EXTENSIONS_DIR"])
    cache = environ.get("CKPT_TRACE_CACHE") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckpt-trace"
    )
    return Path(cache) / "torch_extensions"


def env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a process that may build or load a DeepSpeed op: ``PATH`` led by this interpreter's
    ``bin`` (so ``ninja`` is always the one installed beside DeepSpeed) and ``TORCH_EXTENSIONS_DIR`` set
    (``extensions_dir``)."""
    out = dict(environ)
    out["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ.get('PATH', '')}"
    out["TORCH_EXTENSIONS_DIR"] = str(extensions_dir(environ))
    return out


def _holders(path: Path) -> list[int]:
    """Ids of the processes with ``path`` open (a walk of ``/proc/PID/fd``; processes we may not read are
    skipped)."""
    target = str(path.resolve())
    pids = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            fds = list(fd_dir.iterdir())
        except OSError:
            continue
        if any(_link(fd) == target for fd in fds):
            pids.append(int(fd_dir.parent.name))
    return pids


def _link(fd: Path) -> str | None:
    """What the descriptor ``/proc/PID/fd/N`` names, or None where it closed meanwhile (the listing's own)."""
    try:
        return os.readlink(fd)
    except OSError:
        return None


def stale_lock(root: Path, ops=OPS, settle_s: float = 2.0) -> Path | None:
    """The first ``root/OP/lock`` that exists and that no process holds open, or None.

    A lock whose builder is between closing and removing it (torch's ``FileBaton.release``) is not held
    either, so an unheld lock counts as stale only if it is still there ``settle_s`` seconds later (polled
    every 0.1 s: a lock that goes away or is taken in between is not stale)."""
    for op in ops:
        lock = root / op / "lock"
        deadline = time.monotonic() + settle_s
        while lock.exists() and not _holders(lock):
            if time.monotonic() >= deadline:
                return lock
            time.sleep(0.1)
    return None
