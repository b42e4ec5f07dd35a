"""The built-in workloads, by name: one module of this package per workload, one table of them.

Each module here (not starting with ``_``) defines ``WORKLOAD = Workload(...)``
(``workloads.engines.Workload`` documents its fields); ``table()`` imports
every such module once (``pkgutil.iter_modules``, as the replay strategies
and the tracer backends register) and the rest of the tree reads it: the
CLI's ``workload ENGINE`` choices and its options' help, ``run``'s checks of
which options apply, and the messages. Nothing outside this package
branches on a workload's name; what the workloads share (their state, DCP's
ranks, the byte-for-byte check) is ``workloads.engines``. Adding a workload
is one new module here plus its test (docs/ARCHITECTURE.md, "Adding a
workload").

An unknown name is a WorkloadError (``get``, ``run``), never a default.
"""

from __future__ import annotations

import functools
from pathlib import Path

from ckpt_trace import registry
from ckpt_trace.errors import Interrupted, WorkloadError

from ..engines import DEVICES, Workload, WorkloadArgs, load_writer_module, model_config, require_torch

__all__ = ["Workload", "WorkloadArgs", "get", "names", "run", "table", "takers"]


@functools.cache
def table() -> dict[str, Workload]:
    """Every workload of this package by name, in ``order``. Raises WorkloadError for a module without a
    ``WORKLOAD`` or a name declared twice (a packaging error, said at first use)."""
    return registry.discover(__name__, __path__, "WORKLOAD", Workload, reserved="", error=WorkloadError)


def names() -> tuple[str, ...]:
    """Every workload's name, in order (the CLI's choices)."""
    return tuple(table())


def get(name: str) -> Workload:
    """The workload called ``name``. Raises WorkloadError for an unknown name, listing the known ones."""
    spec = table().get(name)
    if spec is None:
        raise WorkloadError(f"unknown workload {name!r} (choose from {', '.join(names())})")
    return spec


def takers(option: str, *, bare: bool = False) -> str:
    """The workloads that take ``option`` (one of ``engines.OPTIONS``, or ``cuda``), for a message or a help
    text: 'the dcp and emitted workloads only' (``bare``: 'dcp and emitted')."""
    found = [name for name, w in table().items() if (w.cuda if option == "cuda" else option in w.options)]
    listed = ", ".join(found[:-1]) + (" and " if len(found) > 1 else "") + found[-1] if found else "no"
    return listed if bare else f"the {listed} workload{'s' if len(found) > 1 else ''} only"


def _check_cuda(spec: Workload, ranks: int) -> None:
    """Raise WorkloadError unless ``device="cuda"`` can run ``spec`` with ``ranks`` here."""
    if not spec.cuda:
        raise WorkloadError(f"--device cuda applies to {takers('cuda')}")
    torch = require_torch()
    if not torch.cuda.is_available():
        raise WorkloadError("--device cuda: no CUDA GPU here (torch.cuda.is_available() is false)")
    if ranks > torch.cuda.device_count():
        raise WorkloadError(
            f"--device cuda: {ranks} ranks need {ranks} GPUs (NCCL), this machine has {torch.cuda.device_count()}"
        )


def _check_options(spec: Workload, args: WorkloadArgs) -> None:
    """Raise WorkloadError for an option ``spec`` does not take, or a value out of range."""
    if args.file_per_layer and "file_per_layer" not in spec.options:
        raise WorkloadError(f"--file-per-layer applies to {takers('file_per_layer')}")
    if args.mmap and ("mmap" not in spec.options or not args.load):
        raise WorkloadError(f"--mmap applies to {takers('mmap', bare=True)} --load only")
    if args.writer is not None and "writer" not in spec.options:
        raise WorkloadError(f"--writer applies to {takers('writer')}")
    if args.ranks < 1:
        raise WorkloadError("--ranks must be at least 1")
    if args.device not in DEVICES:
        raise WorkloadError(f"unknown --device {args.device!r} (choose from {', '.join(DEVICES)})")
    if args.device == "cuda":
        _check_cuda(spec, args.ranks)
    if args.shards < 1:
        raise WorkloadError("--shards must be at least 1")
    if args.shards != 1 and "shards" not in spec.options:
        raise WorkloadError(f"--shards applies to {takers('shards')}")
    if args.ranks != 1 and "ranks" not in spec.options:
        raise WorkloadError(f"--ranks applies to {takers('ranks')}")
    if args.saves < 1:
        raise WorkloadError("{option} must be at least 1", option="saves")
    if args.saves != 1 and ("saves" not in spec.options or args.load):
        raise WorkloadError(f"{{option}} applies to a save of {takers('saves', bare=True)} only", option="saves")


def run(
    engine: str,
    out: Path,
    *,
    ranks: int = 1,
    model: str = "gpt2-small",
    with_optimizer: bool = False,
    file_per_layer: bool = False,
    load: bool = False,
    mmap: bool = False,
    writer: str | None = None,
    shards: int = 1,
    device: str = "cpu",
    saves: int = 1,
) -> tuple[Path, float]:
    """Run a built-in workload (a save, or with ``load`` a checked load of that save); returns the checkpoint
    directory and the seconds of the save(s) or load itself (for DCP, barrier to barrier; for torch.load and
    load_file, until every tensor's bytes were read).

    Raises WorkloadError for an unknown engine or model, ranks < 1, options
    another workload takes (each workload's ``options`` say which apply), a
    load with nothing saved, a failed save, an engine not installed, or a load
    that finds a tensor different from what was saved; Interrupted on Ctrl-C.
    """
    spec = get(engine)
    args = WorkloadArgs(
        Path(out), ranks, model, with_optimizer, file_per_layer, load, mmap, writer, shards, device, saves
    )
    _check_options(spec, args)
    model_config(model)
    if writer is not None:
        load_writer_module(writer)
    if load and spec.committed is not None and not (args.out / spec.committed).exists():
        raise WorkloadError(
            f"nothing to load: {args.out} holds no {engine} checkpoint ({spec.committed} is missing; "
            "run the save first)"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        io_s = spec.run(args)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; a partial checkpoint may remain in {args.out}") from None
    return args.out, io_s
