"""The slim runtime (issue 36): the emitted writer and reader import without pyarrow, typer, rich or
matplotlib, and fall back to os.preadv/os.pwritev with one line when the io_uring ring cannot be used."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from conftest import cli
from writer_state import objects_equal_bitwise, plain_state, zeros_like_state

import ckpt_trace.formats as formats
from ckpt_trace.iolayer import ring as rings
from ckpt_trace.iolayer.buffers import AlignedBuffer
from ckpt_trace.iolayer.posix_ring import PosixRing

REPO = Path(__file__).resolve().parent.parent
#: What the emitted module must not need (issue 36): the analysis and CLI dependencies of the full package.
HEAVY = ("pyarrow", "typer", "rich", "matplotlib")


def test_formats_imports_no_pyarrow_and_resolves_every_name_on_first_use():
    eager = {"CkptTraceError", "TraceFormatError", "fsync_directory", "OFFSET_SOURCES", "vocabulary"}
    assert set(formats._LAZY) | eager == set(formats.__all__)
    for name in formats._LAZY:
        assert getattr(formats, name) is getattr(__import__(f"ckpt_trace.formats.{formats._LAZY[name]}").formats, name)
    with pytest.raises(AttributeError):
        formats.no_such_name  # noqa: B018


@pytest.mark.slow
def test_the_writer_and_reader_import_with_the_heavy_dependencies_blocked():
    """A finder that refuses pyarrow, typer, rich and matplotlib: importing the writer and reader must not
    ask for any of them (an import of one would raise ImportError here)."""
    code = textwrap.dedent(
        f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {HEAVY!r}:
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        from ckpt_trace.writer import CheckpointReader, CheckpointWriter, WriterOptions
        print(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_full_package_leaves_out_exactly_what_the_runtime_holds():
    """One copy of each module: the full wheel's excludes are the runtime's files plus the ring's source and
    library (the runtime's wheel carries it prebuilt), and every runtime file exists."""
    build_ring = _build_ring()
    with open(REPO / "pyproject.toml", "rb") as file:
        project = tomllib.load(file)
    excluded = project["tool"]["hatch"]["build"]["targets"]["wheel"]["exclude"]
    ring = ["/iolayer/ckpt_trace/iolayer/_ring.c", f"/iolayer/ckpt_trace/iolayer/{build_ring.LIBRARY}"]
    assert excluded == [f"/{path}" for path in build_ring.RUNTIME_FILES] + ring
    assert all((REPO / path).is_file() for path in build_ring.RUNTIME_FILES)
    from ckpt_trace.version import __version__

    assert f"ckpt-trace-runtime=={__version__}" in project["project"]["dependencies"]


def _module_name(path: str) -> str:
    """The import name of a ``RUNTIME_FILES`` path (``iolayer/ckpt_trace/iolayer/ring.py``: ckpt_trace.iolayer.ring)."""
    parts = path.removesuffix(".py").split("/")
    parts = parts[1:] if parts[0] in ("formats", "iolayer") else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_import_of_the_runtime_stays_in_the_runtime():
    """Every ckpt_trace import in a runtime file (at the top or in a function; type-checking imports apart)
    names a module of the runtime, and none takes a name ``formats`` loads with pyarrow; the writer and
    reader open their rings with ``open_ring`` (so they fall back), never ``Ring`` directly. Caught here, a
    new import would otherwise break the runtime's wheel only where it is installed alone."""
    import ast

    build_ring = _build_ring()
    modules = {_module_name(path) for path in build_ring.RUNTIME_FILES} | {"ckpt_trace"}  # a namespace: no file
    for path in build_ring.RUNTIME_FILES:
        name = _module_name(path)
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        tree = ast.parse((REPO / path).read_text(), path)
        typing_only = {  # imports under ``if TYPE_CHECKING:`` never run
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
                if base == "ckpt_trace.formats":
                    lazy = [alias.name for alias in node.names if alias.name in formats._LAZY]
                    assert not lazy, f"{path} imports {lazy} from ckpt_trace.formats: pyarrow"
            else:
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Ring":
                    assert not path.startswith("ckpt_trace/writer/"), f"{path}:{node.lineno}: use open_ring"
                continue
            for target in targets:
                if target.split(".")[0] == "ckpt_trace":
                    assert target in modules, f"{path} imports {target}, not part of ckpt-trace-runtime"


def _build_ring():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import build_ring
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return build_ring


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump (binutils)")
def test_the_wheel_tag_reads_the_rings_needs_as_objdump_does():
    """The manylinux tag comes from the ring library's ELF version needs; objdump -p (binutils) is the
    independent reading of the same sections."""
    import re

    build_ring = _build_ring()
    library = rings.library()._name
    arch, needed, versions = build_ring.elf_needs(library)
    dump = subprocess.run(["objdump", "-p", library], capture_output=True, text=True, check=True).stdout
    assert needed == re.findall(r"NEEDED\s+(\S+)", dump)
    assert sorted(versions) == sorted(re.findall(r"0x[0-9a-f]+ 0x[0-9a-f]+ \d+ (\S+)", dump))
    tag = build_ring.platform_tag(library)
    newest = max(int(v.split(".")[1]) for v in versions if v.startswith("GLIBC_2."))
    assert tag.startswith(f"manylinux_2_{max(17, newest)}_{arch}"), tag


def test_posix_ring_writes_and_reads_back_with_the_rings_failure_rule(tmp_path):
    path = tmp_path / "data"
    out, back = AlignedBuffer(8192), AlignedBuffer(8192)
    out.mmap[:] = bytes(range(256)) * 32
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        ring = PosixRing(2)
        ring.submit("write", fd, out.ptr, 4096, 4096, key="w", tag=1)
        ring.submit("write", fd, out.ptr + 4096, 4096, 0, key="w", tag=2)
        ring.submit("fdatasync", fd, 0, 0, 0, key="w")
        assert ring.pending == 3
        ring.drain("w")
        assert ring.pending == 0
        ring.submit("read", fd, back.ptr, 8192, 0, tag="all")
        ring.submit("read", fd, back.ptr, 4096, 6144, tag="tail")  # 2048 bytes left: a short read, no error
        assert ring.wait_result()[1] == 8192
        request, moved = ring.wait_result()
        assert (request.tag, moved) == ("tail", 2048)
        ring.close()
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(out.mmap[4096:]) + bytes(out.mmap[:4096])
    assert bytes(back.mmap[:2048]) == bytes(out.mmap[2048:4096])
    ring = PosixRing(1)
    ring.submit("write", fd, out.ptr, 4096, 0)  # fd is closed now: EBADF, raised by wait
    with pytest.raises(OSError) as caught:
        ring.wait()
    assert caught.value.errno == errno.EBADF
    with pytest.raises(RuntimeError):
        ring.wait()


def test_posix_ring_keeps_queue_depth_requests_in_flight_and_close_waits_for_them():
    """Reads of an empty pipe block: two of them are in flight at queue depth 2 (no room for a third), each
    completes when its bytes arrive, and ``close`` returns only once the last is done."""
    readable, writable = os.pipe()
    into = AlignedBuffer(4096)
    ring = PosixRing(2)
    try:
        ring.submit("read", readable, into.ptr, 4, -1, tag="a")
        ring.submit("read", readable, into.ptr + 4, 4, -1, tag="b")
        assert ring.pending == 2 and not ring.has_room
        os.write(writable, b"1234")
        deadline = time.monotonic() + 60
        while not ring.has_room:  # one of the two reads took the bytes (which one: the threads decide)
            assert time.monotonic() < deadline, "no read completed"
            time.sleep(0.001)
        assert ring.pending == 2  # completed, not yet waited for: still pending, as on the ring
        os.write(writable, b"5678")
        assert sorted((ring.wait_result()[1], ring.wait_result()[1])) == [4, 4]
        ring.submit("read", readable, into.ptr + 8, 4, -1, tag="c")
        os.write(writable, b"9abc")
        ring.close()  # waits for c
        assert ring.pending == 0
        assert sorted([bytes(into.mmap[:4]), bytes(into.mmap[4:8])]) == [b"1234", b"5678"]
        assert bytes(into.mmap[8:12]) == b"9abc"
    finally:
        os.close(readable)
        os.close(writable)


@pytest.mark.torch
@pytest.mark.parametrize("direct", [True, False], ids=["o-direct", "buffered"])
def test_the_writer_and_reader_fall_back_with_one_line_when_the_ring_cannot_load(
    tmp_path, torch_installed, monkeypatch, capfd, direct
):
    import torch.distributed.checkpoint as dcp

    from ckpt_trace.writer import CheckpointReader, CheckpointWriter, WriterOptions

    def refuse():
        raise rings.RingUnavailable(errno.ELIBBAD, "libckpt_ring.so.1 is stale (forced by the test)")

    monkeypatch.setattr(rings, "library", refuse)
    monkeypatch.setattr(rings, "_notice_given", False)
    options = WriterOptions(direct_io=direct, load_direct_io=direct, buffer_bytes=8192, queue_depth=2)
    state = plain_state()
    dcp.save(state, storage_writer=CheckpointWriter(tmp_path / "ckpt", options))
    target = zeros_like_state(state)
    dcp.load(target, storage_reader=CheckpointReader(tmp_path / "ckpt", options))
    assert objects_equal_bitwise(state, target)
    notices = [line for line in capfd.readouterr().err.splitlines() if "io_uring" in line]
    assert notices == [
        "ckpt-trace: io_uring ring unavailable (libckpt_ring.so.1 is stale (forced by the test)); "
        "using os.preadv/os.pwritev"
    ]


#: A save and a load through the emitted module, run by the fresh venv's python: every dtype class, a
#: 0-d and an empty tensor, a non-contiguous view, nested objects; compared byte for byte in the same process.
_ROUND_TRIP = """
import sys
import torch
import torch.distributed.checkpoint as dcp
import emitted_writer

gen = torch.Generator().manual_seed(7)
base = torch.randn(64, 40, generator=gen)
state = {
    "f32": torch.randn(300, 257, generator=gen),
    "bf16": torch.randn(129, 31, generator=gen).to(torch.bfloat16),
    "i64": torch.randint(-(2**62), 2**62, (513,), generator=gen, dtype=torch.int64),
    "view": base.t(),
    "scalar": torch.tensor(3.5),
    "empty": torch.zeros(0, 4),
    "nested": {"layer": {"w": torch.randn(1000, generator=gen)}, "step": 11, "betas": (0.9, 0.95)},
}
dcp.save(state, storage_writer=emitted_writer.make_writer(sys.argv[1]))
target = {
    "f32": torch.zeros(300, 257),
    "bf16": torch.zeros(129, 31, dtype=torch.bfloat16),
    "i64": torch.zeros(513, dtype=torch.int64),
    "view": torch.zeros(40, 64),
    "scalar": torch.tensor(0.0),
    "empty": torch.zeros(0, 4),
    "nested": {"layer": {"w": torch.zeros(1000)}, "step": 0, "betas": (0.0, 0.0)},
}
dcp.load(target, storage_reader=emitted_writer.make_reader(sys.argv[1]))

def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8)

pairs = [(state[k], target[k]) for k in ("f32", "bf16", "i64", "view", "scalar", "empty")]
pairs.append((state["nested"]["layer"]["w"], target["nested"]["layer"]["w"]))
assert all(torch.equal(raw(a), raw(b)) for a, b in pairs), "tensors differ"
assert target["nested"]["step"] == 11 and tuple(target["nested"]["betas"]) == (0.9, 0.95)
tensors = {"f32": torch.zeros(300, 257), "nested": {"layer": {"w": torch.zeros(1000)}}}
assert emitted_writer.load(tensors, sys.argv[1]).last_load_stats["planner"] == "direct"
assert torch.equal(raw(tensors["f32"]), raw(state["f32"]))
assert torch.equal(raw(tensors["nested"]["layer"]["w"]), raw(state["nested"]["layer"]["w"]))
import ckpt_trace.writer
heavy = sorted({name.split(".")[0] for name in sys.modules} & {"pyarrow", "typer", "rich", "matplotlib"})
print("ok", ckpt_trace.writer.__file__, heavy)
"""


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.io_uring
def test_a_fresh_venv_with_only_torch_numpy_and_the_runtime_saves_and_loads_with_the_emitted_module(
    tmp_path, torch_installed, io_uring
):
    """Issue 36's done-when: build the runtime's wheel from this repository, install it into a new venv beside
    the torch wheel ``make setup`` installs (pip's find-links, /opt/wheels here) and numpy, nothing else;
    none of pyarrow, typer, rich, matplotlib is importable there; the module ``ckpt-trace emit`` wrote (in
    this environment) saves and loads through io_uring, and again with the ring library removed, through
    os.preadv/os.pwritev after one line on stderr. 90 s measured on the 2-core VM, most of it installing torch."""
    import platform

    import torch

    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO / "runtime")]
    subprocess.run(build, check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("ckpt_trace_runtime-*.whl")
    if platform.machine() == "x86_64":
        assert wheel.name.endswith("-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"), wheel.name
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"  # the release this environment has, never unpinned
    install = [str(python), "-m", "pip", "install", "-q", "--no-compile", torch_pin, "numpy", str(wheel)]
    subprocess.run(install, check=True, capture_output=True, env=env, timeout=900)
    found = subprocess.run(
        [str(python), "-c", f"import importlib.util; print([m for m in {HEAVY!r} if importlib.util.find_spec(m)])"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    assert found.stdout.strip() == "[]"
    golden = REPO / "traces" / "golden" / "v5-dcp-gpt2-tiny-2ranks-bcc.arrow"
    cli("emit", str(golden), "-o", str(tmp_path / "emitted_writer.py"))
    (tmp_path / "round_trip.py").write_text(_ROUND_TRIP)

    def round_trip(name: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(python), "round_trip.py", str(tmp_path / name)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        return done

    with_ring = round_trip("ckpt-ring")
    assert with_ring.stdout.startswith(f"ok {venv}") and with_ring.stdout.rstrip().endswith("[]")
    assert "io_uring" not in with_ring.stderr
    (library,) = venv.glob("lib/python*/site-packages/ckpt_trace/iolayer/libckpt_ring.so.1")
    library.rename(library.with_name("moved-away"))
    without = round_trip("ckpt-posix")
    assert without.stdout.startswith(f"ok {venv}")
    notices = [line for line in without.stderr.splitlines() if "io_uring" in line]
    assert len(notices) == 1 and "libckpt_ring.so.1 is not built" in notices[0], without.stderr
    assert notices[0].endswith("using os.preadv/os.pwritev")
