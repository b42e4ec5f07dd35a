"""The compiled BPF program kept per kernel, so that a later ``record`` starts without clang.

bcc compiles ``bcc_program.c`` with clang at every start (about 3.7 s of the 4.4 s of
``record --backend bcc -- true`` on this machine) and has no way to reuse what it compiled. After a
compile, ``capture`` takes what bcc loaded: each function it attached (its instructions, with the map
references bcc patched in as ``BPF_PSEUDO_MAP_FD`` ld_imm64 immediates turned back into map indices),
each map's definition (type, key and value sizes, entries, flags) and the ring records' layouts. On a
later start ``attach`` creates the maps anew, writes their descriptors into the instructions, loads
each program (BPF_PROG_LOAD: the kernel's verifier checks it as it checked bcc's) and attaches it to
the same tracepoint, through the calls bcc itself makes (libbcc_bpf: ``bcc_create_map``,
``bcc_prog_load``, ``bpf_attach_tracepoint``, ``bpf_attach_raw_tracepoint``).

An entry is keyed by the sha256 of this cache's format, the program text (every offset, size and
filter is in it), the kernel release, the digest of the kernel's BTF and bcc's version: anything that
could change what clang makes of the text gives another key. It lives in ``config.CACHE_DIR``/bpf as
one file: the sha256 of its JSON body, then the body. It is used only when this user owns it and
nobody else may write it or its directory (the kernel runs its instructions), and only when the
digest matches; anything else is a miss, and the compile that follows rewrites it (atomically). The
kernel refusing a cached program is the same: ``attach`` raises ``CachedProgramRefused`` having
closed what it opened, and the caller compiles.

Formats: the kernel's BPF instruction encoding (Documentation/bpf/standardization/instruction-set.rst:
8-byte instructions, ld_imm64 = opcode 0x18 over two slots, ``src_reg`` 1 = BPF_PSEUDO_MAP_FD) and
bcc's libbpf.h for the calls.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import functools
import hashlib
import json
import os
import resource
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ckpt_trace import config
from ckpt_trace.errors import TracerError

from . import btf

#: Bumped whenever what an entry holds or means changes: old entries then miss.
CACHE_FORMAT = 1
PROG_TRACEPOINT, PROG_RAW_TRACEPOINT = 5, 17  # enum bpf_prog_type
_PREFIXES = {b"tracepoint__": PROG_TRACEPOINT, b"raw_tracepoint__": PROG_RAW_TRACEPOINT}
_LD_IMM64 = 0x18
_PSEUDO_MAP_FD = 1
_INSN = struct.Struct("<BBhi")  # opcode, dst_reg | src_reg << 4, offset, immediate
_ENTRY_FILE = "program-{machine}-{key}.json"
OLD_NAMING_S = 7 * 86400  # an entry named program-{key}.json (no machine) is stale once this old


class NotCacheable(TracerError):
    """What bcc loaded cannot be kept (an instruction or program kind this cache does not relocate)."""


class CachedProgramRefused(TracerError):
    """A cached program could not be loaded or attached (the library missing, a map or program refused)."""


@dataclass(frozen=True)
class MapSpec:
    """One BPF map as bcc created it (``bpf_table_*`` of the compiled module)."""

    name: str
    map_type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


@dataclass(frozen=True)
class Entry:
    """A compiled program: its maps, its functions (name, prog type, instructions with map indices as
    ld_imm64 immediates), its license and the numpy layouts of the ring records (``ring name -> dtype``)."""

    maps: tuple[MapSpec, ...]
    functions: tuple[tuple[str, int, bytes], ...]
    license: str
    dtypes: dict[str, np.dtype]


@dataclass
class Attached:
    """A cached program loaded and attached: map name -> fd, function name -> program fd, and the
    attachments' fds (perf events, raw tracepoints). ``close`` detaches and frees them all; left open,
    they go when the process exits, as bcc's BPF object's do (each detach waits for an RCU grace
    period: closing them while the trace is written would lengthen ``finish_s``)."""

    map_fds: dict[str, int] = field(default_factory=dict)
    prog_fds: dict[str, int] = field(default_factory=dict)
    link_fds: list[int] = field(default_factory=list)

    def detach_soon(self) -> None:
        """Detach the probes without anyone waiting for it; the maps and programs stay open (rings, counters
        and run times can still be read). Each detach waits for RCU grace periods (tracepoint unregistration,
        Documentation/RCU/whatisRCU.rst), and concurrent waits share them: the 12 probes here took 0.63 s
        one after the other, 0.35 s at once (2026-11-29). A process exits only once each of its threads has
        left its close(2), so closing them in threads of this process made ``record -- true`` end 0.3 s
        after writing its trace. So each attachment is handed to a child process of its own (``cat``, the
        descriptor dup2'ed into it by posix_spawn(3), reading a pipe from this process): this process's
        close only drops its reference and returns at once, because every child is still waiting on the
        pipe; then the pipe is closed, the children see its end and exit, and their exits drop the last
        references and wait out the detaches side by side, reaped by a daemon thread (or by init once this
        process has exited). A child that could exit first (``true`` did) would leave this process's close
        the last one, and it would wait: 0.12-0.38 s in 2 of 4 runs. Where no child can be started, threads
        of this process close them. The recorder calls it when the command has exited, or when an attached
        job's recording window ends."""
        links, self.link_fds = self.link_fds, []
        program = next((p for p in ("/bin/cat", "/usr/bin/cat") if os.access(p, os.X_OK)), None)
        inherited = _inheritable_fds() if links and program is not None else []
        gate_r, gate_w = os.pipe()  # the children's stdin; both ends close-on-exec here
        children, held = [], []
        try:
            for fd in links:
                child = _spawn_holder(program, fd, gate_r, inherited) if program is not None else None
                if child is not None:
                    children.append(child)
                    held.append(fd)
                else:
                    threading.Thread(target=_close_quietly, args=(fd,), name="ckpt-trace-detach", daemon=True).start()
            for fd in held:
                _close_quietly(fd)  # not the last reference: its child is waiting on the pipe
        finally:
            os.close(gate_r)
            os.close(gate_w)  # the children see the pipe's end and exit
        if children:
            threading.Thread(target=_reap, args=(children,), name="ckpt-trace-detach", daemon=True).start()

    def close(self) -> None:
        for fd in [*self.link_fds, *self.prog_fds.values(), *self.map_fds.values()]:
            try:
                os.close(fd)
            except OSError:
                pass
        self.link_fds, self.prog_fds, self.map_fds = [], {}, {}


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _spawn_holder(program: str, fd: int, gate: int, inherited: list[int]) -> int | None:
    """The pid of ``program`` (``cat``) holding a copy of ``fd``, reading ``gate`` as its stdin (it exits at
    the pipe's end), and holding nothing else of this process's: the ``inherited`` descriptors
    (``_inheritable_fds``) closed, stdout and stderr on /dev/null (a pipe the caller reads, left open in it,
    would make whoever waits for the pipe's end wait for the detach); None when it cannot be started."""
    if not hasattr(os, "posix_spawn"):
        return None
    held = max(fd, 2) + 1
    actions: list[tuple] = [(os.POSIX_SPAWN_DUP2, gate, 0), (os.POSIX_SPAWN_DUP2, fd, held)]
    actions += [(os.POSIX_SPAWN_CLOSE, other) for other in inherited if other > 2 and other != held]
    actions += [(os.POSIX_SPAWN_OPEN, stream, os.devnull, os.O_WRONLY, 0) for stream in (1, 2)]
    try:
        return os.posix_spawn(program, [program], {}, file_actions=actions)
    except OSError:
        return None


def _inheritable_fds() -> list[int]:
    """This process's descriptors that an exec would keep (no FD_CLOEXEC)."""
    import fcntl

    kept = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            if not fcntl.fcntl(int(name), fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                kept.append(int(name))
    return kept


def _reap(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


@functools.cache
def _library() -> Any:
    """bcc's own BPF syscall wrappers (libbcc_bpf.so.0, shipped with libbcc). Raises OSError."""
    lib = ctypes.CDLL("libbcc_bpf.so.0", use_errno=True)
    c_int, c_char_p, c_void_p, c_uint = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_uint
    lib.bcc_create_map.argtypes = [c_int, c_char_p, c_int, c_int, c_int, c_int]
    lib.bcc_prog_load.argtypes = [c_int, c_char_p, c_void_p, c_int, c_char_p, c_uint, c_int, c_char_p, c_uint]
    lib.bpf_attach_tracepoint.argtypes = [c_int, c_char_p, c_char_p]
    lib.bpf_attach_raw_tracepoint.argtypes = [c_int, c_char_p]
    lib.bpf_update_elem.argtypes = [c_int, c_void_p, c_void_p, ctypes.c_ulonglong]
    lib.bpf_lookup_elem.argtypes = [c_int, c_void_p, c_void_p]
    for name in ("bcc_create_map", "bcc_prog_load", "bpf_attach_tracepoint", "bpf_attach_raw_tracepoint"):
        getattr(lib, name).restype = c_int
    lib.bpf_update_elem.restype = lib.bpf_lookup_elem.restype = c_int
    return lib


def update_elem(map_fd: int, key: Any, value: Any) -> None:
    """Set ``key`` to ``value`` (ctypes objects of the map's key and value sizes) in map ``map_fd``.
    Raises TracerError with the errno."""
    if _library().bpf_update_elem(map_fd, ctypes.byref(key), ctypes.byref(value), 0) < 0:
        err = ctypes.get_errno()
        raise TracerError(f"cannot update BPF map {map_fd}: {os.strerror(err)}")


def lookup_u64(map_fd: int, index: int) -> int:
    """Slot ``index`` of a BPF array of u64 (key: int), 0 where the lookup fails."""
    value = ctypes.c_uint64(0)
    key = ctypes.c_int(index)
    if _library().bpf_lookup_elem(map_fd, ctypes.byref(key), ctypes.byref(value)) < 0:
        return 0
    return int(value.value)


@functools.cache
def _bcc_version() -> str:
    """bcc's version, read from its ``bcc/version.py`` without importing bcc (whose import, 45 ms here, a
    start from the cache does not need: it loads through libbcc_bpf alone)."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("bcc")
        if spec is None or not spec.submodule_search_locations:
            return "unknown"
        for directory in spec.submodule_search_locations:
            version = Path(directory) / "version.py"
            if version.is_file():
                found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", version.read_text())
                if found:
                    return found.group(1)
    except (ImportError, OSError, ValueError):
        pass
    return "unknown"


@functools.cache
def _btf_digest() -> str:
    try:
        return hashlib.sha256(btf.VMLINUX.read_bytes()).hexdigest()
    except OSError:
        return "no-btf"


def cache_key(text: str) -> str:
    """The entry's key for program ``text`` on this kernel (hex sha256; see the module docstring)."""
    parts = (str(CACHE_FORMAT), os.uname().release, _btf_digest(), _bcc_version(), text)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def machine_key() -> str:
    """What every entry usable here shares (16 hex digits of the sha256 of the cache's format, the kernel
    release, the BTF's digest and bcc's version): an entry named with another one can never hit again."""
    parts = (str(CACHE_FORMAT), os.uname().release, _btf_digest(), _bcc_version())
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def entry_path(text: str) -> Path:
    """Where the entry for program ``text`` lives (it may not exist)."""
    name = _ENTRY_FILE.format(machine=machine_key(), key=cache_key(text)[:40])
    return Path(config.CACHE_DIR) / "bpf" / name


def prune(kept: Path) -> list[Path]:
    """Remove the entries beside ``kept`` (a new entry) that are stale: named for another kernel, BTF, bcc
    or cache format (``machine_key``), or in the naming before it once a week old (``OLD_NAMING_S``: a
    recorder of an older version may still be using it); and of this machine's, all but the
    ``config.BPF_CACHE_ENTRIES`` last used (modification time: written, or hit by ``load``), ``kept``
    always among them. Only ``program-*.json`` regular files this user owns are touched (an entry is
    about 70 KB). Returns the paths removed; a file that cannot be removed stays (OSError is not raised)."""
    mine, removed, euid = [], [], os.geteuid()
    current = f"program-{machine_key()}-"
    try:
        candidates = list(kept.parent.glob("program-*.json"))
    except OSError:
        return []
    for path in candidates:
        try:
            info = path.lstat()
        except OSError:
            continue
        if path == kept or info.st_uid != euid or not path.is_file() or path.is_symlink():
            continue
        if path.name.startswith(current):
            mine.append((info.st_mtime_ns, path))
            continue
        if path.name.count("-") == 1 and time.time() - info.st_mtime < OLD_NAMING_S:
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    mine.sort(reverse=True)
    for _, path in mine[max(0, config.BPF_CACHE_ENTRIES - 1) :]:
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def _trusted(path: Path) -> bool:
    """A file this user owns, in a directory this user owns, that nobody else may write."""
    try:
        info, parent = path.stat(), path.parent.stat()
    except OSError:
        return False
    euid = os.geteuid()
    return all(st.st_uid == euid and not st.st_mode & 0o022 for st in (info, parent))


def _dtype_to_json(dtype: np.dtype) -> dict:
    fields: dict[str, Any] = {str(name): spec for name, spec in (dtype.fields or {}).items()}
    formats: list[Any] = []
    for name in dtype.names or ():
        sub = fields[name][0]
        formats.append([sub.subdtype[0].str, list(sub.subdtype[1])] if sub.subdtype else sub.str)
    return {
        "names": list(dtype.names or ()),
        "formats": formats,
        "offsets": [int(fields[name][1]) for name in dtype.names or ()],
        "itemsize": dtype.itemsize,
    }


def _dtype_from_json(data: dict) -> np.dtype:
    formats = [(f[0], tuple(f[1])) if isinstance(f, list) else f for f in data["formats"]]
    return np.dtype(
        {"names": data["names"], "formats": formats, "offsets": data["offsets"], "itemsize": data["itemsize"]}
    )


def _instructions(code: bytes) -> list[list[int]]:
    if len(code) % _INSN.size:
        raise NotCacheable(f"{len(code)} bytes of code is not a whole number of instructions")
    return [list(_INSN.unpack_from(code, i)) for i in range(0, len(code), _INSN.size)]


def relocate(code: bytes, fd_to_index: dict[int, int]) -> bytes:
    """``code`` with each map reference (ld_imm64, BPF_PSEUDO_MAP_FD) rewritten through ``fd_to_index``
    (old immediate -> new). Raises NotCacheable on any other pseudo ld_imm64 (map values, BTF ids,
    functions), which this cache does not relocate, and on an immediate not in ``fd_to_index``."""
    insns = _instructions(code)
    i = 0
    while i < len(insns):
        opcode, regs, _, imm = insns[i]
        if opcode == _LD_IMM64:
            source = regs >> 4
            if source == _PSEUDO_MAP_FD:
                if imm not in fd_to_index:
                    raise NotCacheable(f"instruction {i} names map fd {imm}, which is no map of the program")
                insns[i][3] = fd_to_index[imm]
            elif source != 0:
                raise NotCacheable(f"instruction {i} is a ld_imm64 of pseudo source {source}")
            i += 2
        else:
            i += 1
    return b"".join(_INSN.pack(*insn) for insn in insns)


def _module_lib() -> Any:
    """libbcc (through bcc's module), with the table accessors bcc's Python leaves undeclared."""
    from bcc.libbcc import lib  # pyright: ignore[reportMissingImports]

    lib.bpf_num_tables.restype, lib.bpf_num_tables.argtypes = ctypes.c_ulonglong, [ctypes.c_void_p]
    lib.bpf_table_name.restype, lib.bpf_table_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_ulonglong]
    for name in ("bpf_table_key_size_id", "bpf_table_leaf_size_id"):
        getattr(lib, name).restype = ctypes.c_size_t
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
    return lib


def compiled_maps(bpf: Any) -> tuple[list[MapSpec], dict[str, int]]:
    """The maps of the compiled bcc.BPF ``bpf``: their definitions, in bcc's order, and name -> fd."""
    lib, module = _module_lib(), bpf.module
    specs, fds = [], {}
    for index in range(lib.bpf_num_tables(module)):
        name = lib.bpf_table_name(module, index)
        specs.append(
            MapSpec(
                name.decode(),
                int(lib.bpf_table_type_id(module, index)),
                int(lib.bpf_table_key_size_id(module, index)),
                int(lib.bpf_table_leaf_size_id(module, index)),
                int(lib.bpf_table_max_entries_id(module, index)),
                int(lib.bpf_table_flags_id(module, index)),
            )
        )
        fds[name.decode()] = int(lib.bpf_table_fd(module, name))
    return specs, fds


def capture(bpf: Any, dtypes: dict[str, np.dtype]) -> Entry:
    """What the compiled bcc.BPF ``bpf`` loaded, as an Entry (map references as map indices). ``dtypes``:
    the ring records' layouts. Raises NotCacheable when bcc attached something other than tracepoints and
    raw tracepoints, or the code holds references this cache cannot relocate."""
    specs, fds = compiled_maps(bpf)
    fd_to_index = {fds[spec.name]: index for index, spec in enumerate(specs)}
    functions = []
    for name in bpf.funcs:
        kind = next((kind for prefix, kind in _PREFIXES.items() if name.startswith(prefix)), None)
        if kind is None:
            raise NotCacheable(f"bcc loaded {name.decode()}, which is not a tracepoint program")
        functions.append((name.decode(), kind, relocate(bpf.dump_func(name), fd_to_index)))
    license = (_module_lib().bpf_module_license(bpf.module) or b"GPL").decode()
    return Entry(tuple(specs), tuple(functions), license, dict(dtypes))


def _body(entry: Entry) -> bytes:
    return json.dumps(
        {
            "format": CACHE_FORMAT,
            "license": entry.license,
            "maps": [vars(spec) for spec in entry.maps],
            "functions": [[name, kind, base64.b64encode(code).decode()] for name, kind, code in entry.functions],
            "dtypes": {name: _dtype_to_json(dtype) for name, dtype in entry.dtypes.items()},
        },
        sort_keys=True,
    ).encode()


def store(text: str, entry: Entry) -> Path | None:
    """Write ``entry`` for program ``text`` (atomically: a temporary file renamed over the entry; mode 0600
    in a 0700 directory), then ``prune`` the stale entries beside it. None when it cannot be written (a
    read-only cache directory: the next start compiles again, nothing else changes)."""
    body = _body(entry)
    path = entry_path(text)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
        os.replace(temporary, path)
    except OSError:
        return None
    prune(path)
    return path


def load(text: str) -> tuple[Entry | None, str]:
    """(the entry for program ``text``, "hit") or (None, why not: "miss", "untrusted", "corrupt (...)")."""
    path = entry_path(text)
    if not path.exists():
        return None, "miss"
    if not _trusted(path):
        return None, "untrusted (owned or writable by another user)"
    try:
        digest, _, body = path.read_bytes().partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            return None, "corrupt (digest mismatch)"
        data = json.loads(body)
        if data["format"] != CACHE_FORMAT:
            return None, "corrupt (another format)"
        maps = tuple(MapSpec(**spec) for spec in data["maps"])
        functions = tuple((str(name), int(kind), base64.b64decode(code)) for name, kind, code in data["functions"])
        dtypes = {str(name): _dtype_from_json(spec) for name, spec in data["dtypes"].items()}
        with contextlib.suppress(OSError):
            os.utime(path)  # last used: what ``prune`` keeps
        return Entry(maps, functions, str(data["license"]), dtypes), "hit"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return None, f"corrupt ({type(err).__name__})"


def _refused(what: str) -> CachedProgramRefused:
    return CachedProgramRefused(f"{what}: {os.strerror(ctypes.get_errno())}")


def attach(entry: Entry) -> Attached:
    """Create ``entry``'s maps, load its functions with their fds and attach each to its tracepoint, in
    the entry's order (bcc's). Raises CachedProgramRefused (everything opened is closed again)."""
    try:
        lib = _library()
    except OSError as err:
        raise CachedProgramRefused(f"libbcc_bpf is not loadable ({err})") from None
    try:  # as bcc does before it loads: kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (OSError, ValueError):
        pass
    done = Attached()
    workers = max(1, min(len(entry.functions), os.cpu_count() or 1))
    try:

        def create_one(spec: MapSpec) -> tuple[int, int]:
            fd = lib.bcc_create_map(
                spec.map_type, spec.name.encode(), spec.key_size, spec.value_size, spec.max_entries, spec.flags
            )
            return fd, ctypes.get_errno()

        # Creating a map allocates it whole (the rings, the preallocated hash tables: about 60 ms for all of
        # them one after the other, 2026-11-30): they are created in parallel too.
        with ThreadPoolExecutor(workers) as pool:
            created = list(pool.map(create_one, entry.maps))
        for spec, (fd, _) in zip(entry.maps, created):
            if fd >= 0:
                done.map_fds[spec.name] = fd  # closed with the rest should one be refused
        for spec, (fd, errno) in zip(entry.maps, created):
            if fd < 0:
                raise CachedProgramRefused(f"map {spec.name} not created: {os.strerror(errno)}")
        fds = [fd for fd, _ in created]

        def load_one(function: tuple[str, int, bytes]) -> tuple[int, int]:
            name, kind, code = function
            insns = relocate(code, dict(enumerate(fds)))
            buffer = ctypes.create_string_buffer(insns, len(insns))
            prog = lib.bcc_prog_load(
                kind, name.encode()[:15], buffer, len(insns), entry.license.encode(), 0, 0, None, 0
            )
            return prog, ctypes.get_errno()  # errno is this thread's (ctypes keeps one per thread)

        # The verifier's work is CPU: the programs load in parallel (ctypes lets the GIL go during the call);
        # 12 programs took 0.155 s one after the other, 0.087 s on 2 threads (2 cores, 2026-11-29).
        # the largest first (the syscall programs: most of the verifier's work), the small ones beside them
        order = sorted(range(len(entry.functions)), key=lambda i: -len(entry.functions[i][2]))
        with ThreadPoolExecutor(workers) as pool:
            by_size = list(pool.map(load_one, [entry.functions[i] for i in order]))
        loaded: list[tuple[int, int]] = [(-1, 0)] * len(order)
        for i, result in zip(order, by_size):
            loaded[i] = result
        for (name, _, _), (prog, _) in zip(entry.functions, loaded):
            if prog >= 0:
                done.prog_fds[name] = prog  # closed with the rest should one be refused
        for (name, kind, _), (prog, errno) in zip(entry.functions, loaded):
            if prog < 0:
                raise CachedProgramRefused(f"program {name} refused: {os.strerror(errno)}")
            if kind == PROG_TRACEPOINT:
                category, _, event = name.removeprefix("tracepoint__").partition("__")
                link = lib.bpf_attach_tracepoint(prog, category.encode(), event.encode())
            else:
                link = lib.bpf_attach_raw_tracepoint(prog, name.removeprefix("raw_tracepoint__").encode())
            if link < 0:
                raise _refused(f"program {name} not attached")
            done.link_fds.append(link)
    except BaseException:
        done.close()
        raise
    return done
