"""The runtime's package build (hatchling hook of ``runtime/pyproject.toml``): compile the io_uring ring and pack
the modules the emitted writer and reader run on into the ``ckpt-trace-runtime`` wheel.

The ring (``iolayer/.../_ring.c``) is a plain shared library loaded with
ctypes (``ckpt_trace.iolayer.ring``), not a CPython extension, so one build
serves every Python 3: the wheel is tagged ``py3-none-<platform>``, the
platform being the manylinux tag the library qualifies for (PEP 600: the
newest glibc symbol version it needs, read from its ELF version
requirements, and no library but the manylinux policy's; else plain
``linux_<arch>``). The library is built next to its source (so a source
tree and an editable install find it on the path) and, for a wheel, packed
as ``ckpt_trace/iolayer/libckpt_ring.so.1``. The compiling itself is
``ckpt_trace/iolayer/ring_build.py`` (loaded here by path: the build
environment has no ckpt_trace), the same function ``ring.library`` calls in
a source tree when the library is missing or stale. ``RUNTIME_FILES`` is the
one list of what the runtime holds; the full package (``pyproject.toml``)
excludes exactly these and depends on ``ckpt-trace-runtime`` (tests/test_runtime.py
checks both lists agree). Run as a script (``python scripts/build_ring.py``)
it rebuilds the library of this tree.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import struct
from pathlib import Path

PACKAGE = Path("iolayer/ckpt_trace/iolayer")
SOURCE = PACKAGE / "_ring.c"
LIBRARY = "libckpt_ring.so.1"

#: What the emitted module imports at run time (``python -X importtime`` of ``ckpt_trace.writer``'s
#: CheckpointWriter and CheckpointReader), by path in this repository; each lands at the same path under
#: ``ckpt_trace/`` in the wheel (the stage folders ``formats/`` and ``iolayer/`` drop their prefix).
RUNTIME_FILES = (
    "ckpt_trace/config.py",
    "ckpt_trace/errors.py",
    "ckpt_trace/writer/__init__.py",
    "ckpt_trace/writer/checksum.py",
    "ckpt_trace/writer/format.py",
    "ckpt_trace/writer/layout.py",
    "ckpt_trace/writer/load.py",
    "ckpt_trace/writer/options.py",
    "ckpt_trace/writer/save.py",
    "ckpt_trace/writer/staging.py",
    "formats/ckpt_trace/formats/__init__.py",
    "formats/ckpt_trace/formats/atomic.py",
    "formats/ckpt_trace/formats/errors.py",
    "formats/ckpt_trace/formats/vocabulary.py",
    "iolayer/ckpt_trace/iolayer/__init__.py",
    "iolayer/ckpt_trace/iolayer/buffers.py",
    "iolayer/ckpt_trace/iolayer/files.py",
    "iolayer/ckpt_trace/iolayer/pagecache.py",
    "iolayer/ckpt_trace/iolayer/pattern.py",
    "iolayer/ckpt_trace/iolayer/posix_ring.py",
    "iolayer/ckpt_trace/iolayer/ring.py",
    "iolayer/ckpt_trace/iolayer/ring_build.py",
)

#: The libraries PEP 600's manylinux policy lets a wheel link against (auditwheel's policy list, the
#: ones a C file of ours could need), and the architectures named by ELF's e_machine.
MANYLINUX_LIBRARIES = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "ld-linux-x86-64.so.2"}
_MACHINES = {62: "x86_64", 183: "aarch64", 21: "ppc64le", 22: "s390x"}
_SHT_DYNAMIC, _SHT_GNU_VERNEED, _DT_NEEDED = 6, 0x6FFFFFFE, 1


def wheel_path(source: str) -> str:
    """Where ``source`` (a path of ``RUNTIME_FILES``) lands in the wheel."""
    first, _, rest = source.partition("/")
    return rest if first in ("formats", "iolayer") else source


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


def elf_needs(path: str | os.PathLike) -> tuple[str, list[str], list[str]]:
    """A 64-bit little-endian ELF shared library's architecture, the libraries it needs (DT_NEEDED) and the
    symbol versions it needs from them (``.gnu.version_r``: "GLIBC_2.17", ...). Sources: elf(5), the
    System V gABI and the LSB's symbol versioning chapter. Raises ValueError for another kind of file."""
    data = Path(path).read_bytes()
    if data[:6] != b"\x7fELF\x02\x01":
        raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
    (machine,) = struct.unpack_from("<H", data, 0x12)
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(table: int, at: int) -> str:
        start = sections[table][4] + at
        return data[start : data.index(b"\0", start)].decode()

    needed, versions = [], []
    for _, kind, _, _, offset, size, link, info, _, _ in sections:
        if kind == _SHT_DYNAMIC:
            for at in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, at)
                if tag == _DT_NEEDED:
                    needed.append(string(link, value))
        elif kind == _SHT_GNU_VERNEED:
            at = offset
            for _ in range(info):
                _, count, _, aux, following = struct.unpack_from("<HHIII", data, at)
                entry = at + aux
                for _ in range(count):
                    _, _, _, name, step = struct.unpack_from("<IHHII", data, entry)
                    versions.append(string(link, name))
                    entry += step
                at += following
    return _MACHINES.get(machine, f"machine-{machine}"), needed, versions


def platform_tag(library: str | os.PathLike) -> str:
    """The wheel platform tag ``library`` qualifies for: ``manylinux_2_<minor>_<arch>`` with ``minor`` the
    newest ``GLIBC_2.<minor>`` it needs (plus the legacy alias pip before 20.3 reads, manylinux2014 for
    glibc 2.17), or ``linux_<arch>`` when it links a library outside the manylinux policy."""
    arch, needed, versions = elf_needs(library)
    if any(name not in MANYLINUX_LIBRARIES for name in needed) or arch.startswith("machine-"):
        return f"linux_{arch if not arch.startswith('machine-') else platform.machine()}"
    minors = [int(v.split(".")[1]) for v in versions if v.startswith("GLIBC_2.")]
    minor = max([17, *minors])  # 2.17 (manylinux2014): the oldest policy pip still serves for every arch
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(minor)
    tag = f"manylinux_2_{minor}_{arch}"
    return f"{tag}.{legacy}_{arch}" if legacy else tag


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script (python scripts/build_ring.py): only the compiler is needed
    BuildHookInterface = object


class CustomBuildHook(BuildHookInterface):
    """The runtime's build (``runtime/pyproject.toml``; its root is ``runtime/``, the sources one level up)."""

    def initialize(self, version: str, build_data: dict) -> None:
        repository = Path(self.root).resolve().parent
        library = compile_ring(repository)
        build_data["pure_python"] = False
        if version == "editable":  # the source tree is on the path already (the full package's editable install)
            return
        for source in RUNTIME_FILES:
            build_data["force_include"][str(repository / source)] = wheel_path(source)
        build_data["force_include"][str(library)] = f"ckpt_trace/iolayer/{LIBRARY}"
        build_data["tag"] = f"py3-none-{platform_tag(library)}"  # ctypes-loaded: any Python 3


if __name__ == "__main__":
    print(compile_ring(Path(__file__).resolve().parent.parent))
