"""Compiling ``_ring.c`` into ``libckpt_ring.so.1``: the one build of the ring library.

Used by the package build (``scripts/build_ring.py``, the hatchling hook, which
loads this file by path: it imports nothing but the standard library), by
``python scripts/build_ring.py`` in a source tree, and by ``ring.library`` when
the library beside the source is missing or stale (built for another
``ABI_VERSION``). Needs a C compiler (``$CC``, default ``cc``) and
``<linux/io_uring.h>`` (Debian: linux-libc-dev).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path

SOURCE_NAME = "_ring.c"
# A versioned name, so Python never takes it for an extension module (it is loaded with ctypes).
LIBRARY_NAME = "libckpt_ring.so.1"


class BuildFailed(RuntimeError):
    """The compiler is missing or refused the source; the message says which (first error line)."""


def compile_library(
    source: str | os.PathLike, output: str | os.PathLike | None = None, defines: dict[str, str] | None = None
) -> Path:
    """Compile ``source`` (``_ring.c``) into ``output`` (default: ``libckpt_ring.so.1`` beside it); return
    ``output``. The library is written to a temporary name and renamed over ``output``, so a process that
    has the old one loaded, or another process building at the same time, never sees half a file.
    ``defines``: extra ``-D`` macros (the tests build a library of another ABI with ``CKR_ABI_VERSION``).
    Raises BuildFailed."""
    source = Path(source)
    output = Path(output) if output is not None else source.with_name(LIBRARY_NAME)
    macros = [f"-D{name}={value}" for name, value in (defines or {}).items()]
    fd, temporary = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    command = [
        *shlex.split(os.environ.get("CC", "cc")),
        "-O2",
        "-Wall",
        "-shared",
        "-fPIC",
        *macros,
        "-o",
        temporary,
        str(source),
    ]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
        os.chmod(temporary, 0o755)
        os.replace(temporary, output)
    except FileNotFoundError:
        raise BuildFailed(
            f"building {output.name} needs a C compiler ({command[0]} not found; "
            "Debian: apt-get install gcc linux-libc-dev)"
        ) from None
    except subprocess.CalledProcessError as err:
        first = next((line for line in err.stderr.splitlines() if "error" in line), err.stderr.strip()[:200])
        raise BuildFailed(f"compiling {source} failed: {first}") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return output
