"""Hatchling build hook: compile ckpt-trace's io_uring/POSIX issuing loops (iolayer/.../_ring.c).

The result is a plain shared library loaded with ctypes (``ckpt_trace.iolayer.ring``), not a
CPython extension, so one build serves every Python version. It is built next to its source
(so an editable install finds it on the path) and, for a wheel, packed as
``ckpt_trace/iolayer/libckpt_ring.so.1``. The compiling itself is
``ckpt_trace/iolayer/ring_build.py`` (loaded here by path: the build environment has no
ckpt_trace), the same function ``ring.library`` calls when the library is missing or stale.
Run as a script (``python scripts/build_ring.py``) it rebuilds the library of this tree.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PACKAGE = Path("iolayer/ckpt_trace/iolayer")
SOURCE = PACKAGE / "_ring.c"
LIBRARY = "libckpt_ring.so.1"


def _ring_build(root: Path):
    spec = importlib.util.spec_from_file_location("_ckpt_ring_build", root / PACKAGE / "ring_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_ring(
    root: str | os.PathLike, output: str | os.PathLike | None = None, defines: dict[str, str] | None = None
) -> Path:
    """Compile _ring.c beside itself (or into ``output``); return the library's path. Raises RuntimeError
    (ring_build.BuildFailed) with the compiler's reason."""
    root = Path(root)
    return _ring_build(root).compile_library(root / SOURCE, output, defines)


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
    from packaging.tags import sys_tags
except ImportError:  # run as a script (python scripts/build_ring.py): only the compiler is needed
    BuildHookInterface = object


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        library = compile_ring(self.root)
        if version != "editable":
            build_data["force_include"][str(library)] = f"ckpt_trace/iolayer/{LIBRARY}"
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{next(sys_tags()).platform}"  # ctypes-loaded: any Python 3


if __name__ == "__main__":
    print(compile_ring(Path(__file__).resolve().parent.parent))
