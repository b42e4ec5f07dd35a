"""Hatchling build hook: compile ckpt-trace's io_uring/POSIX issuing loops (iolayer/.../_ring.c).

The result is a plain shared library loaded with ctypes (``ckpt_trace.iolayer.ring``), not a
CPython extension, so one build serves every Python version. It is built next to its source
(so an editable install finds it on the path) and, for a wheel, packed as
``ckpt_trace/iolayer/libckpt_ring.so.1``. Needs a C compiler (``CC``, default ``cc``) and
``<linux/io_uring.h>`` (Debian: linux-libc-dev); without them the build fails with that reason.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

SOURCE = Path("iolayer/ckpt_trace/iolayer/_ring.c")
# A versioned name, so Python never takes it for an extension module (it is loaded with ctypes).
LIBRARY = "libckpt_ring.so.1"


def compile_ring(root: str | os.PathLike, output: str | os.PathLike | None = None,
                 defines: dict[str, str] | None = None) -> Path:
    """Compile _ring.c beside itself (or into ``output``); return the library's path. ``defines``: extra
    ``-D`` macros (the tests build a library of another ABI version with ``CKR_ABI_VERSION``). Raises
    RuntimeError with the compiler's reason."""
    source = Path(root) / SOURCE
    output = Path(output) if output is not None else source.with_name(LIBRARY)
    macros = [f"-D{name}={value}" for name, value in (defines or {}).items()]
    command = [*shlex.split(os.environ.get("CC", "cc")), "-O2", "-Wall", "-shared", "-fPIC", *macros, "-o",
               str(output), str(source)]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"ckpt-trace needs a C compiler to build its io_uring loop ({command[0]} not found; "
                           "Debian: apt-get install gcc linux-libc-dev)") from None
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"compiling {source} failed:\n{err.stderr}") from None
    return output


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
