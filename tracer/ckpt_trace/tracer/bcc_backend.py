"""bcc backend: eBPF programs on the ``syscalls:sys_{enter,exit}_*`` tracepoints.

Needs root, the ``bcc`` Python module (Debian: python3-bpfcc), kernel
headers for bcc's compiler, tracefs at /sys/kernel/tracing and BPF ring
buffers (Linux >= 5.8). ``probe()`` checks each up front and says which is
missing, so ``auto`` can name the fallback it takes.

One program on ``raw_syscalls:sys_enter`` dispatches on the syscall number
(``__NR_*`` from the kernel headers) into code generated per traced call;
``raw_syscalls:sys_exit`` completes the event. Two tracepoints rather than a
pair per syscall: each detach waits for an RCU grace period, which for ninety
tracepoints cost seconds at exit. Calls the builder would not record are
dropped in the kernel (see bcc_program.c). Descendants are followed through the
``sched:sched_process_fork`` tracepoint, which fires in the parent before
the child first runs. File positions are reconstructed in user space by
``TraceBuilder`` (kprobes and fentry are unavailable on the target kernels).

Records are read from the rings (system calls with and without strings;
requests and pages) in bulk by ``ringbuf.RingReader``, not by bcc's
per-record Python callbacks: the consumer thread only copies them, and a
decoder thread (``stream.StreamDecoder``) decodes them column by column and
feeds the builder while the command runs, so that little is left to do
after it exits. Only the rank of a process that exec'd is read at once by
the consumer, while it lives.

Reference: bcc reference guide (TRACEPOINT_PROBE, BPF_RINGBUF_OUTPUT);
Documentation/bpf/ringbuf.rst; Documentation/trace/events.rst.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import resource
import select
import signal
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, cast

import numpy as np

from ckpt_trace import config
from ckpt_trace.errors import TracerError
from ckpt_trace.formats import vocabulary

from . import bpfcache, btf, costs, datacalls, page_cache, ringcalls
from . import syscalls as sc
from .children import set_parent_death_signal, sigint_handler
from .ringbuf import RingReader, sample_dtype
from .state import AUX_CACHE_INSERT, AUX_URING_REQ, AuxEvent, EffectOrderFeeder, SyscallEvent, rank_from_environ
from .stream import Group, RawSpill, StreamDecoder

TRACEFS = Path("/sys/kernel/tracing")
_EVENTS = TRACEFS / "events" / "raw_syscalls"
_NAMES = list(sc.SYSCALLS)
_POINTER_ARGS = {
    "path",
    "path2",
    "iov",
    "how",
    "uargs",
    "argv",
    "envp",
    "buf",
    "params",
    "sig",
    "stack",
    "ptid",
    "ctid",
    "tls",
    "offset_ptr",
    "off_in_ptr",
    "off_out_ptr",
}


def _mount_tracefs() -> None:
    if (_EVENTS).is_dir():
        return
    if os.geteuid() == 0 and TRACEFS.is_dir():
        os.system(f"mount -t tracefs tracefs {TRACEFS} >/dev/null 2>&1")


def probe() -> str | None:
    """Return None when the bcc backend can be tried here, else why it cannot."""
    if os.geteuid() != 0:
        return "not root (eBPF needs CAP_BPF and CAP_PERFMON)"
    import importlib.util

    # found, not imported: bcc's import loads libbcc with its LLVM (35-45 ms), which a start from the
    # program cache never needs (_compiled imports it, and says so if it then fails)
    if importlib.util.find_spec("bcc") is None:
        return "the bcc Python module is not importable (Debian: apt-get install python3-bpfcc)"
    _mount_tracefs()
    if not _EVENTS.is_dir():
        return f"tracefs raw_syscalls events not found under {TRACEFS} (mount -t tracefs tracefs {TRACEFS})"
    build = Path("/lib/modules") / os.uname().release / "build"
    if not build.exists():
        return f"no kernel headers at {build} (see scripts/setup-system.sh)"
    return None


_OPENS = frozenset({"open", "openat", "openat2", "creat"})
_DUPS = frozenset({"dup", "dup2", "dup3"})
_PATH_ONLY = frozenset({"unlink", "unlinkat", "mkdir", "mkdirat", "rmdir"})
_RENAMES = frozenset({"rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat"})  # two paths
# Calls with an fd argument that must reach the builder even on an ignored descriptor
# (or that _early_checks handles itself).
_KEEP_ON_MARKED_FD = frozenset({"fchdir", "close_range", "io_uring_enter", "fcntl", "close"}) | _DUPS
_CREATES_FD = _OPENS | _DUPS | {"io_uring_setup"}
_SPECIAL_PREFIXES = ("/proc/", "/sys/", "/dev/")


#: Path prefixes the BPF program compares (``path_prefixes`` in bcc_program.c); more filters: judged in user space.
MAX_KERNEL_FILTERS = 8
MODE_SPECIAL, MODE_FILTERS, MODE_NONE = 0, 1, 2  # filter_mode in bcc_program.c


def kernel_filters(path_filters: list[str]) -> tuple[int, list[bytes]]:
    """(filter_mode, prefixes) of the BPF ``excluded(path)`` test, as ``TraceBuilder._keep`` decides: with path
    filters, a path is kept when one matches (pseudo files included); without, pseudo files are excluded.

    More than ``MAX_KERNEL_FILTERS`` filters, or one longer than the BPF path copy, cannot be judged in the
    kernel; then nothing is excluded there (``MODE_NONE``) and user space decides alone.
    """
    if not path_filters:
        return MODE_SPECIAL, [prefix.encode() for prefix in _SPECIAL_PREFIXES]
    limit = min(config.BPF_PATH_BYTES - 1, 8 * (config.BPF_PATH_BYTES // 8))
    prefixes = [path.encode() for path in path_filters]
    if len(prefixes) > MAX_KERNEL_FILTERS or any(len(prefix) >= limit for prefix in prefixes):
        return MODE_NONE, []
    return MODE_FILTERS, prefixes


def fill_filters(map_fds: dict[str, int], path_filters: list[str]) -> None:
    """Write ``kernel_filters(path_filters)`` into the loaded program's ``path_prefixes`` and ``filter_mode``
    maps: each prefix as little-endian 8-byte words and a mask of its bytes. Raises TracerError."""
    words = config.BPF_PATH_BYTES // 8

    class Prefix(ctypes.Structure):  # struct prefix_t
        _fields_ = [
            ("word", ctypes.c_uint64 * words),
            ("mask", ctypes.c_uint64 * words),
            ("words", ctypes.c_uint32),
            ("used", ctypes.c_uint32),
        ]

    mode, prefixes = kernel_filters(path_filters)
    for index in range(MAX_KERNEL_FILTERS):
        value = Prefix()
        if index < len(prefixes):
            data = prefixes[index]
            count = -(-len(data) // 8)
            padded = data.ljust(8 * count, b"\0")
            value.words, value.used = count, 1
            for i in range(count):
                value.word[i] = int.from_bytes(padded[8 * i : 8 * i + 8], "little")
                value.mask[i] = int.from_bytes(bytes(0xFF if 8 * i + k < len(data) else 0 for k in range(8)), "little")
        bpfcache.update_elem(map_fds["path_prefixes"], ctypes.c_int(index), value)
    bpfcache.update_elem(map_fds["filter_mode"], ctypes.c_int(0), ctypes.c_uint32(mode))


_SIGNED32 = frozenset({"fd", "dirfd", "dirfd2", "newfd", "in_fd", "out_fd"})
_UNSIGNED32 = frozenset({"flags", "rwflags", "mode", "cmd", "whence", "iov_count"})


def _arg_expressions(name: str) -> dict[str, str]:
    """C expressions of each argument of ``name`` from the raw register array ``a``."""
    exprs = {}
    for i, arg in enumerate(sc.SYSCALLS[name].args):
        exprs[arg] = f"(s32)a[{i}]" if arg in _SIGNED32 else f"(u32)a[{i}]" if arg == "cmd" else f"a[{i}]"
    return exprs


def _early_checks(name: str, arg: dict[str, str]) -> list[str]:
    """C statements run before an event is started: drop calls the builder would not record."""
    lines = []
    if name == "ioctl":
        cmds = (sc.FIOCLEX, sc.FIONCLEX, sc.FICLONE, sc.FICLONERANGE)
        lines.append("if (" + " && ".join(f"{arg['cmd']} != {c}" for c in cmds) + ") return 0;")
    if name in sc.COPY_CALLS:  # a copy between two ignored descriptors (a file outside the filters: no row)
        lines.append(f"if (fd_marked(tgid, {arg['in_fd']}) && fd_marked(tgid, {arg['out_fd']})) return 0;")
    if name == "fcntl":
        wanted = (sc.F_DUPFD, sc.F_DUPFD_CLOEXEC, sc.F_SETFD, sc.F_SETFL)
        lines.append("if (" + " && ".join(f"{arg['cmd']} != {c}" for c in wanted) + ") return 0;")
        lines.append(
            f"if (({arg['cmd']} == {sc.F_SETFD} || {arg['cmd']} == {sc.F_SETFL}) && fd_marked(tgid, {arg['fd']})) return 0;"
        )
    if name == "close":
        lines.append(f"if (fd_marked(tgid, {arg['fd']})) {{ set_mark(tgid, {arg['fd']}, 0); return 0; }}")
    elif "fd" in arg and name not in _KEEP_ON_MARKED_FD:
        lines.append(f"if (fd_marked(tgid, {arg['fd']})) return 0;")
    if name == "mmap":  # as TraceBuilder._on_mmap: an anonymous mapping is no row (malloc makes thousands)
        lines.append(f"if ({arg['fd']} < 0 || ({arg['mmap_flags']} & {sc.MAP_ANONYMOUS})) return 0;")
    return lines


_PATH_CHECK = {**dict.fromkeys(_OPENS, 1), **dict.fromkeys(_PATH_ONLY, 2), **dict.fromkeys(_RENAMES, 3)}


def _late_checks(name: str, arg: dict[str, str]) -> list[str]:
    """C statements run once arguments are copied: mark dups of ignored descriptors, choose the path check.

    ``check`` selects the one shared path test after the switch (bcc_program.c):
    1 marks an open of an excluded path, 2 drops an unlink/mkdir of one, 3 drops
    a rename between two. With path filters (FOLLOW_RENAMES), opens for writing
    or creating are not marked and 2 and 3 drop nothing: a rename may yet bring
    such a file into the filters (``tracer.renames``).
    """
    lines = []
    if name in _DUPS:
        lines.append(f"e->ignore = fd_marked(tgid, {arg['fd']});")
    if name == "fcntl":
        cmd = arg["cmd"]
        lines.append(
            f"e->ignore = ({cmd} == {sc.F_DUPFD} || {cmd} == {sc.F_DUPFD_CLOEXEC}) && fd_marked(tgid, {arg['fd']});"
        )
    if name in _PATH_CHECK:
        lines.append(f"check = {_PATH_CHECK[name]};")
    if name in _OPENS:  # (openat2's flags: the first field of its struct open_how, read into e->extra)
        flags = "1" if name == "creat" else "e->extra" if name == "openat2" else arg["flags"]
        lines.append(f"writes = ({flags}) & {sc.O_ACCMODE | sc.O_CREAT};")
    return lines


_COPY_OFFSETS = """
e->extra = -1;
if (a[__IN__] && bpf_probe_read_user(&e->extra, 8, (const void *)a[__IN__]) != 0)
    e->extra = -2;
"""
# Extra C for some calls' entries. In-kernel copies: the offsets their pointers point to, read before the call
# moves them: *off_in into e->extra, *off_out into e->size (-1: NULL, -2: unreadable). ioctl FICLONERANGE: its
# struct file_clone_range (include/uapi/linux/fs.h: src_fd, src_offset, src_length, dest_offset) into e->extra
# and e->a[3..5], which ioctl's three arguments leave free. io_uring_register's fixed-file tables (include/uapi/linux/io_uring.h:
# IORING_REGISTER_FILES takes an int array, FILES_UPDATE a struct io_uring_files_update, FILES2 an
# io_uring_rsrc_register, FILES_UPDATE2 an io_uring_rsrc_update2), up to MAX_FIXED_FDS descriptors into e->path.
_ENTER_EXTRA = {
    "sendfile": _COPY_OFFSETS.replace("__IN__", "2"),
    "copy_file_range": _COPY_OFFSETS.replace("__IN__", "1")
    + """
if (a[3] && bpf_probe_read_user(&e->size, 8, (const void *)a[3]) != 0)
    e->size = -2;
""",
    "ioctl": f"""
if ((u32)a[1] == {sc.FICLONERANGE}) {{
    u64 range[4] = {{}};
    if (bpf_probe_read_user(range, sizeof(range), (const void *)a[2]) == 0) {{
        e->extra = range[0];
        e->a[3] = range[1];
        e->a[4] = range[2];
        e->a[5] = range[3];
    }} else {{
        e->extra = -1;
    }}
}}
""",
    "io_uring_register": """
u64 fds = 0;
u32 count = 0;
u32 op = (u32)a[1];
if (op == 2) {
    fds = a[2];
    count = (u32)a[3];
} else if (op == 6 || op == 14) {
    u32 first = 0;
    bpf_probe_read_user(&first, 4, (const void *)a[2]);
    bpf_probe_read_user(&fds, 8, (const void *)(a[2] + 8));
    e->extra = first;
    count = (u32)a[3];
    if (op == 14)
        bpf_probe_read_user(&count, 4, (const void *)(a[2] + 24));
} else if (op == 13) {
    bpf_probe_read_user(&count, 4, (const void *)a[2]);
    bpf_probe_read_user(&fds, 8, (const void *)(a[2] + 16));
}
e->nfds = count;
if (fds) {
    for (int i = 0; i < MAX_FIXED_FDS; i++) {
        if (i >= count)
            break;
        bpf_probe_read_user(&e->path[i * 4], 4, (const void *)(fds + i * 4));
    }
}
""",
}


_ENTER_EXTRA["splice"] = _ENTER_EXTRA["copy_file_range"]  # the same arguments


def _enter_case(nr: int, name: str) -> str:
    """The ``case __NR_name:`` block of the raw sys_enter program for one syscall."""
    call = sc.SYSCALLS[name]
    arg = _arg_expressions(name)
    body = _early_checks(name, arg) + [f"e = enter_begin({nr});", "if (!e) return 0;"]
    for i, name_i in enumerate(call.args):
        body.append(f"e->a[{i}] = (s64)a[{i}];")
        if name_i in ("path", "path2"):
            dest = "e->path" if name_i == "path" else "e->path2"
            body.append(f"read_path({dest}, (const char *)a[{i}], &e->truncated);")
        elif name_i in ("how", "uargs"):
            body.append(f"bpf_probe_read_user(&e->extra, sizeof(e->extra), (const void *)a[{i}]);")
    if "iov" in call.args:
        body.append(f"iov = (const void *){arg['iov']};")
        body.append(f"iov_count = {arg['iov_count']};")
    body += [line for line in _ENTER_EXTRA.get(name, "").strip().splitlines()]
    body += _late_checks(name, arg)
    creates = 2 if name == "fcntl" else int(name in _CREATES_FD)
    body += [f"e->creates = {creates};", "break;"]
    inner = "\n".join(f"        {line}" for line in body)
    return f"#ifdef __NR_{name}\n    case __NR_{name}: {{\n{inner}\n    }}\n#endif"


# What the kernel-side capture reads, by BTF member path: (macro, struct, member, ...).
_URING_OFFSETS = (
    ("__OFF_REQ_FLAGS__", "io_kiocb", "flags"),
    ("__OFF_CQE_FD__", "io_kiocb", "cqe", "fd"),
    ("__OFF_SYNC_LEN__", "io_sync", "len"),
    ("__OFF_SYNC_OFF__", "io_sync", "off"),
    ("__OFF_SYNC_FLAGS__", "io_sync", "flags"),
    ("__OFF_SYNC_MODE__", "io_sync", "mode"),
)
_MAPPED_OFFSETS = (
    ("__OFF_TASK_FILES__", "task_struct", "files"),
    ("__OFF_FILES_FDT__", "files_struct", "fdt"),
    ("__OFF_FDT_FD__", "fdtable", "fd"),
    ("__OFF_FILE_INODE__", "file", "f_inode"),
    ("__OFF_INODE_INO__", "inode", "i_ino"),
    ("__OFF_INODE_SB__", "inode", "i_sb"),
    ("__OFF_SB_DEV__", "super_block", "s_dev"),
)


_FOLIO_OFFSETS = (
    ("__OFF_MAPPING_HOST__", "address_space", "host"),
    ("__OFF_XA_NODE_SHIFT__", "xa_node", "shift"),
    ("__OFF_XA_NODE_SLOTS__", "xa_node", "slots"),
    ("__OFF_FOLIO_FLAGS__", "folio", "flags"),
    ("__OFF_FOLIO_FLAGS1__", "folio", "_flags_1"),
    ("__OFF_FOLIO_INDEX__", "folio", "index"),
)
#: The page tracepoints a recording may leave out (``CKPT_TRACE_BPF_OMIT_TRACEPOINTS``, comma-separated), as an
#: older kernel without them would: the trace then counts what it could not cover (``mapped_uncovered_bytes``).
#: ``rss_stat`` and ``page_fault_user`` go together (either name leaves both out): without them, mapped bytes
#: that no page event covers are not counted.
OMITTABLE = {
    "mm_filemap_fault": "__OMIT_FAULT__",
    "mm_filemap_map_pages": "__OMIT_MAP_PAGES__",
    "writeback_dirty_folio": "__OMIT_DIRTY__",
    "rss_stat": "__OMIT_RSS__",
    "page_fault_user": "__OMIT_RSS__",
}
#: All of them: the tracer as it was before the mapped-I/O probes (benchmarks/tracer_overhead.py --probes).
PAGE_PROBES = ",".join(OMITTABLE)
_RSS_EVENTS = ("exceptions/page_fault_user", "kmem/rss_stat")


def omitted_tracepoints() -> list[str]:
    """The page tracepoints ``CKPT_TRACE_BPF_OMIT_TRACEPOINTS`` leaves out (names of ``OMITTABLE``, with or
    without their category). Raises TracerError for a name it does not know."""
    names = [name.strip().rpartition(":")[2] for name in config.BPF_OMIT_TRACEPOINTS.split(",") if name.strip()]
    unknown = [name for name in names if name not in OMITTABLE]
    if unknown:
        raise TracerError(
            f"CKPT_TRACE_BPF_OMIT_TRACEPOINTS: unknown tracepoint {unknown[0]!r} (choose from {', '.join(OMITTABLE)})"
        )
    return names


@dataclass(frozen=True)
class KernelView:
    """What the BPF program can read on this kernel: the C macros of the offsets it uses, and for each
    capture left out (io_uring requests, mapped pages) the reason (BTF lacking a type or member)."""

    macros: dict
    uring: str | None  # None: io_uring requests are captured; else why not
    mapped: str | None  # None: pages touched through mappings are captured; else why not


@functools.cache
def kernel_view() -> KernelView:
    """Offsets for the BPF program from the running kernel's BTF (``tracer.btf``), never from headers.
    Computed once per process, and kept per BTF digest under ``config.CACHE_DIR`` (``costs.cached_view``):
    parsing the BTF in Python cost 0.5-0.7 s of every start."""
    macros, uring, mapped = costs.cached_view(btf.VMLINUX, _kernel_macros)
    macros = dict(macros)
    if macros.get("__FOLIOS__") == "1":  # tracefs, not BTF: looked at every time
        macros["__RSS__"] = str(int(all((TRACEFS / "events" / name).is_dir() for name in _RSS_EVENTS)))
    macros.update(_insert_macros())
    return KernelView(macros, uring, mapped)


#: The tracepoint of pages entering the page cache (``tracer.page_cache``): its format file says whether the
#: kernel gives the folio's order (6.x) or one page per event.
INSERT_EVENT = "filemap/mm_filemap_add_to_page_cache"


def _insert_macros() -> dict:
    """``__CACHE_INSERT__`` (the tracepoint exists) and ``__INSERT_ORDER__`` (its events carry ``order``),
    from tracefs, looked at every time."""
    try:
        text = (TRACEFS / "events" / INSERT_EVENT / "format").read_text()
    except OSError:
        return {"__CACHE_INSERT__": "0", "__INSERT_ORDER__": "0"}
    has_order = any(line.split(";")[0].strip().endswith(" order") for line in text.splitlines())
    return {"__CACHE_INSERT__": "1", "__INSERT_ORDER__": str(int(has_order))}


def _kernel_macros() -> tuple[dict, str | None, str | None]:
    """(macros, uring reason, mapped reason) of ``kernel_view``, from the BTF parsed now."""
    macros = {
        "__URING__": "0",
        "__MAPPED__": "0",
        "__FOLIOS__": "0",
        "__RSS__": "0",
        **dict.fromkeys(OMITTABLE.values(), "0"),
    }
    try:
        kernel = btf.kernel()
    except btf.BtfMissing as err:
        return macros, str(err), str(err)
    uring = mapped = None
    try:
        for macro, *where in _URING_OFFSETS:
            macros[macro] = str(kernel.offset(*where))
        macros["__REQ_FLAGS_SIZE__"] = str(kernel.member_size("io_kiocb", "flags"))
        macros["__FIXED_BIT__"] = str(kernel.enum_value("REQ_F_FIXED_FILE_BIT"))
        rw = kernel.offset("io_kiocb", "cmd")  # the opcode's own data (struct io_rw) overlays io_kiocb.cmd
        macros["__OFF_RW_POS__"] = str(rw + kernel.offset("io_rw", "kiocb") + kernel.offset("kiocb", "ki_pos"))
        macros["__OFF_RW_ADDR__"] = str(rw + kernel.offset("io_rw", "addr"))
        macros["__OFF_RW_LEN__"] = str(rw + kernel.offset("io_rw", "len"))
        macros["__OFF_SYNC_LEN__"] = str(rw + int(macros["__OFF_SYNC_LEN__"]))
        macros["__OFF_SYNC_OFF__"] = str(rw + int(macros["__OFF_SYNC_OFF__"]))
        macros["__OFF_SYNC_FLAGS__"] = str(rw + int(macros["__OFF_SYNC_FLAGS__"]))
        macros["__OFF_SYNC_MODE__"] = str(rw + int(macros["__OFF_SYNC_MODE__"]))
        macros["__URING__"] = "1"
    except btf.BtfMissing as err:
        uring = f"io_uring requests are not recorded: {err}"
    try:
        for macro, *where in _MAPPED_OFFSETS:
            macros[macro] = str(kernel.offset(*where))
        macros["__MAPPED__"] = "1"
    except btf.BtfMissing as err:
        mapped = f"pages touched through mappings are not recorded: {err}"
    if mapped is None:
        try:  # whole folios (raw tracepoints): else the formatted events' page indices alone
            for macro, *where in _FOLIO_OFFSETS:
                macros[macro] = str(kernel.offset(*where))
            macros["__OFF_MAPPING_XA_HEAD__"] = str(
                kernel.offset("address_space", "i_pages") + kernel.offset("xarray", "xa_head")
            )
            macros["__PG_HEAD__"] = str(kernel.enum_value("PG_head"))
            macros["__FOLIOS__"] = "1"
            macros["__RSS__"] = str(int(all((TRACEFS / "events" / name).is_dir() for name in _RSS_EVENTS)))
        except btf.BtfMissing:
            pass
    return macros, uring, mapped


#: The calls whose records carry strings (the ``events`` ring, full records); every other call's record is
#: the fixed header alone (the ``compact`` ring).
STRING_CALLS = tuple(
    name
    for name, call in sc.SYSCALLS.items()
    if any(arg in sc.PATH_ARGS for arg in call.args) or name == "io_uring_register"
)
#: The rings and their sizes in pages (``config``): system calls with strings, without, requests and pages.
RINGS = {"events": "BPF_RINGBUF_PAGES", "compact": "BPF_COMPACT_RINGBUF_PAGES", "aux": "BPF_AUX_RINGBUF_PAGES"}


def compact_dtype(events: np.dtype) -> np.dtype:
    """The layout of a ``compact`` ring record: the ``events`` record (``event_t``) up to its strings."""
    fields: dict[str, Any] = {str(k): v for k, v in (events.fields or {}).items()}  # each name: (dtype, offset)
    end = fields["path"][1]
    names = [name for name in events.names or () if fields[name][1] < end]
    return np.dtype(
        {
            "names": names,
            "formats": [fields[name][0] for name in names],
            "offsets": [fields[name][1] for name in names],
            "itemsize": end,
        }
    )


def wake_every() -> int:
    """Records pushed between two forced wakeups of the reader: ``config.BPF_WAKE_EVERY``, but at most a
    sixteenth of what the smallest ring holds (records of at most 2 paths + 160 bytes), so a small ring is
    read long before it fills. Between wakeups the reader still polls every ``config.BPF_POLL_MS``. Each
    wakeup costs the reader a pass over the rings: at 64 records the DCP demo's reader took 0.41 s of CPU
    while the command ran, at 512 0.25 s (ad hoc), with no event lost in the storm either way."""
    record_bytes = 2 * config.BPF_PATH_BYTES + 160
    smallest = min(getattr(config, pages) for pages in RINGS.values()) * mmap.PAGESIZE
    return max(1, min(config.BPF_WAKE_EVERY, smallest // record_bytes // 16))


def consume_gap_s() -> float:
    """The least time between two passes of the reader over the rings: ``config.BPF_CONSUME_GAP_MS``, or 0
    where the smallest ring holds under 4 MiB (it could fill within the gap). A pass has a fixed cost per
    ring whatever it finds: on a storm of 2 M writes of 512 B from 2 threads the reader woke 27,367 times
    for 73 records a pass on average (wakeups come per CPU and ring), and the passes took about 0.8 s of
    its CPU. At 2 ms, the rings fill by 4 MiB only at 2 GB/s of records."""
    smallest = min(getattr(config, pages) for pages in RINGS.values()) * mmap.PAGESIZE
    return config.BPF_CONSUME_GAP_MS / 1000 if smallest >= 4 << 20 else 0.0


def cgroup_ancestors() -> bool:
    """Whether the BPF program may call ``bpf_get_current_ancestor_cgroup_id`` (tracing programs may since
    Linux 5.10), so that ``record --cgroup`` also traces the cgroups below the one named; before, it traces
    the processes of that directory only."""
    release = os.uname().release.split("-")[0].split(".")
    try:
        return (int(release[0]), int(release[1])) >= (5, 10)
    except (IndexError, ValueError):
        return True


def program_text(view: KernelView | None = None) -> str:
    """The full BPF C program for the kernel ``view`` describes. The path filters are not in it (they are
    data: ``fill_filters``), so one compile serves every ``--path-filter`` (``tracer.bpfcache``)."""
    base = resources.files("ckpt_trace.tracer").joinpath("bcc_program.c").read_text()
    cases = "\n".join(_enter_case(nr, name) for nr, name in enumerate(_NAMES))
    text = (
        base.replace("__PATH_BYTES__", str(config.BPF_PATH_BYTES))
        .replace("__MAX_IOVECS__", str(config.BPF_MAX_IOVECS))
        .replace("__PAGE_SHIFT__", str(mmap.PAGESIZE.bit_length() - 1))
        .replace("__MAX_IOCBS__", str(max(1, config.BPF_MAX_IOCBS)))
        .replace("__RINGBUF_PAGES__", str(config.BPF_RINGBUF_PAGES))
        .replace("__AUX_PAGES__", str(config.BPF_AUX_RINGBUF_PAGES))
        .replace("__COMPACT_PAGES__", str(config.BPF_COMPACT_RINGBUF_PAGES))
        .replace("__CARRIES_STRINGS__", " || ".join(f"nr == {_NAMES.index(name)}" for name in STRING_CALLS))
        .replace("__WAKE_EVERY__", str(wake_every()))
        .replace("__INFLIGHT__", str(config.BPF_INFLIGHT_ENTRIES))
        .replace("__URING_INFLIGHT__", str(config.BPF_URING_INFLIGHT_ENTRIES))
        .replace("__IGNORED_ENTRIES__", str(config.BPF_IGNORED_FDS))
        .replace("__MAX_FILTERS__", str(MAX_KERNEL_FILTERS))
        .replace("__INDEX_DEFINES__", "\n".join(f"#define IDX_{name} {index}" for index, name in enumerate(_NAMES)))
        .replace("__ENTER_CASES__", cases)
        .replace("__CGROUP_ANCESTOR__", "1" if cgroup_ancestors() else "0")
    )
    for macro, value in {"__CACHE_INSERT__": "0", "__INSERT_ORDER__": "0", **(view or kernel_view()).macros}.items():
        text = text.replace(macro, value)
    for name in omitted_tracepoints():
        text = text.replace(f"#define {OMITTABLE[name].strip('_')} 0", f"#define {OMITTABLE[name].strip('_')} 1")
    return text


def _environ_rank(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return rank_from_environ(item.decode("utf-8", "replace") for item in raw.split(b"\0") if item)


def _strings(column: np.ndarray) -> list[str]:
    """C strings of a (n, bytes) uint8 array: each up to its first NUL (what follows is stale). Each distinct
    row is decoded once (a chunk's command names and paths repeat)."""
    if not len(column):
        return []
    column = np.ascontiguousarray(column)
    if (column == column[0]).all():  # one command's chunk: the common case, a compare instead of a sort
        return [_c_string(column[0])] * len(column)
    rows = column.view(f"V{column.shape[1]}").ravel()
    distinct, inverse = np.unique(rows, return_inverse=True)
    decoded = [_c_string(row) for row in distinct]
    return [decoded[i] for i in inverse.ravel().tolist()]


def _c_string(row) -> str:
    """One C string: the bytes up to the first NUL, as UTF-8 (undecodable bytes kept, surrogateescape)."""
    return row.tobytes().split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


_RAW, _S32, _U32 = range(3)


@functools.cache
def _arg_spec(nr: int) -> tuple[str, tuple[tuple[str, int, int], ...], tuple[str, ...]]:
    """(name, the register arguments as (arg, register, conversion), the path arguments) of syscall ``nr``."""
    name = _NAMES[nr]
    regs, paths = [], []
    for j, arg in enumerate(sc.SYSCALLS[name].args):
        if arg in sc.PATH_ARGS:
            paths.append(arg)
        elif arg not in _POINTER_ARGS:
            regs.append((arg, j, _S32 if arg in _SIGNED32 else _U32 if arg in _UNSIGNED32 else _RAW))
    return name, tuple(regs), tuple(paths)


def _convert(values: np.ndarray, conversion: int) -> np.ndarray:
    """One argument's registers (int64) as the C prototype types it: s32 sign-extended, u32 masked."""
    if conversion == _U32:
        return values & 0xFFFFFFFF
    if conversion == _S32:
        return ((values & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000
    return values


def _register_column(values: np.ndarray, conversion: int) -> list[int]:
    """``_convert``'s values as Python ints."""
    return _convert(values, conversion).tolist()


_DATA_NRS = np.array([_NAMES.index(name) for name in datacalls.CALLS])
# syscall nr -> index into datacalls.CALLS (-1: not one of them); its last entry stands for every larger nr
_DATA_CODE = np.full(len(_NAMES) + 1, -1, dtype=np.int64)
_DATA_CODE[_DATA_NRS] = np.arange(len(_DATA_NRS))


def decode_data_calls(records: np.ndarray) -> datacalls.DataCalls:
    """The read/write-family records of a chunk (``_DATA_NRS``) as one ``DataCalls``, column by column: no
    Python object per call. Arguments a call does not have are 0 (``offset``, ``rwflags``, ``iov_count``)."""
    count = len(records)
    nrs = records["nr"]
    regs = records["a"]
    columns = {name: np.zeros(count, dtype=np.int64) for name in ("fd", "offset", "size", "iov_count", "rwflags")}
    for nr in np.unique(nrs).tolist():
        where = np.flatnonzero(nrs == nr)
        _, reg_args, _ = _arg_spec(nr)
        for arg, j, conversion in reg_args:
            target = "size" if arg == "count" else arg
            if target in columns:
                columns[target][where] = _convert(regs[where, j].astype(np.int64), conversion)
        if _DATA_CODE[nr] >= 0 and datacalls.CALLS[_DATA_CODE[nr]] in sc.VECTORED:
            columns["size"][where] = records["size"][where]  # the iovecs' lengths, summed by the program
    return datacalls.DataCalls(
        ts_ns=records["ts_ns"].astype(np.int64),
        dur_ns=records["dur_ns"].astype(np.int64),
        pid=records["pid"].astype(np.int64),
        tid=records["tid"].astype(np.int64),
        ret=records["ret"].astype(np.int64),
        fd=columns["fd"],
        call=_DATA_CODE[nrs],
        offset=columns["offset"],
        size=columns["size"],
        iov_count=columns["iov_count"],
        rwflags=columns["rwflags"],
        comm=np.array(_strings(records["comm"]), dtype=object),
    )


_ENTER_NR = _NAMES.index("io_uring_enter")


def decode_ring_enters(records: np.ndarray) -> ringcalls.RingCalls:
    """The ``io_uring_enter`` records of a chunk as one ``RingCalls`` (``enter`` true), column by column, with
    the arguments ``decode_events`` gives them (``ringcalls.ENTER_ARGS``). Raises TracerError where the
    program's argument list for the call is not that one (a change to keep both in step)."""
    _, reg_args, _ = _arg_spec(_ENTER_NR)
    if tuple(arg for arg, _, _ in reg_args) != ringcalls.ENTER_ARGS:
        raise TracerError(f"io_uring_enter's arguments are {reg_args}, ringcalls.ENTER_ARGS says otherwise")
    regs = records["a"]
    args = {arg: _convert(regs[:, j].astype(np.int64), conversion) for arg, j, conversion in reg_args}
    return ringcalls.RingCalls.of(
        len(records),
        enter=np.ones(len(records), dtype=bool),
        ts_ns=records["ts_ns"].astype(np.int64),
        dur_ns=records["dur_ns"].astype(np.int64),
        pid=records["pid"].astype(np.int64),
        tid=records["tid"].astype(np.int64),
        ret=records["ret"].astype(np.int64),
        fd=args["fd"],
        to_submit=args["to_submit"],
        min_complete=args["min_complete"],
        enter_flags=args["flags"],
        sigsz=args["sigsz"],
        size=records["size"].astype(np.int64),
        comm=np.array(_strings(records["comm"]), dtype=object),
    )


def decode_ring_requests(records: np.ndarray) -> ringcalls.RingCalls:
    """The ``AUX_URING_REQ`` records of an aux chunk as one ``RingCalls`` (``enter`` false), with the values
    ``decode_aux`` gives their ``AuxEvent``s."""
    return ringcalls.RingCalls.of(
        len(records),
        ts_ns=records["ts_ns"].astype(np.int64),
        dur_ns=records["dur_ns"].astype(np.int64),
        pid=records["pid"].astype(np.int64),
        tid=records["tid"].astype(np.int64),
        ret=records["res"].astype(np.int64),
        fd=records["fd"].astype(np.int64),
        ctx=records["ctx"].astype(np.uint64),
        user_data=records["user_data"].astype(np.uint64),
        addr=records["addr"].astype(np.uint64),
        offset=records["offset"].astype(np.int64),
        length=records["len"].astype(np.int64),
        opcode=records["opcode"].astype(np.int64),
        flags=records["flags"].astype(np.int64),
        in_flight=records["in_flight"].astype(np.int64),
        vectored=records["vectored"].astype(np.int64),
        fixed=records["fixed"] != 0,
        comm=np.array(_strings(records["comm"]), dtype=object),
    )


def decode_events(records: np.ndarray, ranks: dict[int, int | None]) -> list[SyscallEvent]:
    """SyscallEvents of a chunk of ``event_t`` records (``RingReader.read``), in the chunk's order. ``ranks``:
    pid -> the rank in the environment of its new image, for the execve records of the chunk (read while it
    ran). Decoded one syscall at a time: each argument a numpy column, each path column only where the call
    has a path."""
    count = len(records)
    events: list[SyscallEvent | None] = [None] * count
    if not count:
        return []
    ts, dur, pid, tid, ret = (records[name].tolist() for name in ("ts_ns", "dur_ns", "pid", "tid", "ret"))
    size = records["size"].tolist()
    comms = _strings(records["comm"])
    nrs = records["nr"]
    for nr in np.unique(nrs).tolist():
        where = np.flatnonzero(nrs == nr)
        name, reg_args, path_args = _arg_spec(nr)
        names = [arg for arg, _, _ in reg_args] + list(path_args)
        regs = records["a"][where]
        columns = [_register_column(regs[:, j], conversion) for _, j, conversion in reg_args]
        columns += [_strings(records[arg][where]) for arg in path_args]
        extra = _extra_args(name, records[where]) if name in _EXTRA_ARGS else None
        rows = where.tolist()
        arguments = [dict(zip(names, values)) for values in zip(*columns)] if columns else [{} for _ in rows]
        if extra is not None:
            for args, more in zip(arguments, extra):
                args.update(more)
        for i, args in zip(rows, arguments):  # positional: SyscallEvent's field order
            events[i] = SyscallEvent(
                ts[i], dur[i], tid[i], name, args, ret[i], pid[i], comms[i], size[i] if size[i] >= 0 else None
            )
        if name in ("execve", "execveat"):
            for i in rows:
                event = events[i]
                if event is not None and event.ret == 0 and event.pid is not None:
                    event.rank = ranks.get(event.pid)
    return cast(list[SyscallEvent], events)  # every row's nr is one of np.unique(nrs): each row was filled


_EXTRA_ARGS = frozenset({"openat2", "clone3", "io_setup", "mmap", "io_uring_register", "ioctl"}) | sc.COPY_CALLS


def _extra_args(name: str, records: np.ndarray) -> list[dict]:
    """The arguments a call's record carries beside its registers (``extra``, ``ino``/``dev``, the fds of
    io_uring_register in the path buffer), one dict per record."""
    out = []
    for record in records:
        extra = int(record["extra"])
        if name == "openat2":
            out.append({"flags": extra})
        elif name == "clone3":
            out.append({"clone_flags": extra})
        elif name == "io_setup":
            out.append({"ctx_id": extra & 0xFFFFFFFFFFFFFFFF})
        elif name == "mmap":
            out.append({"ino": int(record["ino"]), "dev": int(record["dev"])} if record["ino"] else {})
        elif name in sc.COPY_CALLS:
            offsets = {"in_offset": None if extra == -1 else extra}
            if name != "sendfile":
                out_offset = int(record["size"])
                offsets["out_offset"] = None if out_offset == -1 else out_offset
            out.append(offsets)
        elif name == "ioctl":
            regs = record["a"]
            out.append(
                {"src_fd": extra, "src_offset": int(regs[3]), "src_length": int(regs[4]), "dest_offset": int(regs[5])}
                if int(regs[1]) & 0xFFFFFFFF == sc.FICLONERANGE and extra != -1
                else {}
            )
        else:  # io_uring_register
            nfds = int(record["nfds"])
            count = min(nfds, config.BPF_PATH_BYTES // 4)
            raw = record["path"].tobytes()[: 4 * count]  # fds, not a string: not up to the first NUL
            out.append(
                {
                    "fds": list(struct.unpack_from(f"<{count}i", raw)) if count else [],
                    "files_offset": extra,
                    "fds_truncated": nfds > count,
                }
            )
    return out


def exec_ranks(records: np.ndarray) -> dict[int, int | None]:
    """pid -> rank from /proc/PID/environ for the successful execve records of a chunk: read at once, while
    the process lives (vectorised selection; one /proc read per exec)."""
    execs = np.isin(records["nr"], [_NAMES.index(n) for n in ("execve", "execveat") if n in _NAMES])
    pids = records["pid"][execs & (records["ret"] == 0)]
    return {int(pid): _environ_rank(int(pid)) for pid in np.unique(pids)}


_AUX_FIELDS = (
    "kind",
    "ts_ns",
    "dur_ns",
    "pid",
    "tid",
    "fd",
    "ctx",
    "obj",
    "user_data",
    "offset",
    "len",
    "res",
    "addr",
    "ino",
    "dev",
    "index",
    "last_index",
    "opcode",
    "flags",
    "in_flight",
    "fixed",
    "vectored",
)


def decode_aux(records: np.ndarray) -> list[AuxEvent]:
    """AuxEvents of ``aux_t`` records, column by column."""
    columns = [records[name].tolist() for name in _AUX_FIELDS]
    comms = _strings(records["comm"])
    return [
        AuxEvent(
            kind=k,
            ts_ns=ts,
            dur_ns=dur,
            pid=pid,
            tid=tid,
            fd=fd,
            ctx=ctx,
            obj=obj,
            user_data=ud,
            offset=off,
            length=length,
            res=res,
            addr=addr,
            ino=ino,
            dev=dev,
            index=index,
            last_index=last,
            opcode=op,
            flags=flags,
            in_flight=depth,
            fixed=bool(fixed),
            vectored=vec,
            comm=comm,
        )
        for (
            k,
            ts,
            dur,
            pid,
            tid,
            fd,
            ctx,
            obj,
            ud,
            off,
            length,
            res,
            addr,
            ino,
            dev,
            index,
            last,
            op,
            flags,
            depth,
            fixed,
            vec,
        ), comm in zip(zip(*columns), comms)
    ]


#: What each slot of the BPF ``lost`` array counts (bcc_program.c), as the metadata's ``lost_reasons`` names it.
LOST_REASONS = ("syscall_events", "aux_events", "io_uring_table_full", "iocbs_unread", "io_events_unread")


@dataclass
class BccRecording:
    """What a bcc recording produced besides its events, which went to ``feeder``: counts, the root
    process, and what the kernel view left out (``unseen``: capture -> reason)."""

    feeder: EffectOrderFeeder | None = None
    unseen: dict = field(default_factory=dict)
    uring_other_ops: dict = field(default_factory=dict)
    lost_events: int = 0
    lost_reasons: dict = field(default_factory=dict)
    truncated_paths: int = 0
    root_pid: int = -1
    exit_code: int = 0
    exit_signal: int | None = None
    start_ns: int = 0
    command_elapsed_ns: int = 0
    recorder_cpu_ns: int = 0
    bpf_run_ns: int | None = None
    spilled_raw_bytes: int = 0
    decode_backlog_bytes: int | None = None  # streaming: raw bytes not yet decoded at the command's exit
    released_s: float | None = None  # time.monotonic() when the probes were live and the command released
    bpf_program: dict = field(default_factory=dict)  # how the program started (LoadedProgram.started)
    exited_s: float | None = None  # time.monotonic() when the command's exit was seen
    cache_inserts: page_cache.Inserts = field(default_factory=page_cache.Inserts)
    cache_probe: bool = False  # page-cache insertions were recorded (the tracepoint exists)

    def finish(self, spool) -> tuple:
        """End the feeding, move the rows into ``spool`` and return (trace builder, the trace's extra metadata:
        counts of lost, truncated, unseen and late events, timings). Raises TracerError when the recording
        fed nothing (the command never started)."""
        feeder = self.feeder
        if feeder is None:
            raise TracerError("the bcc recording made no event feeder")
        feeder.finish()
        spool.add(feeder.builder.take_rows())
        if self.cache_probe:
            spool.annotate = self.cache_inserts.annotate
        extra = {
            "lost_events": self.lost_events,
            **({"lost_reasons": self.lost_reasons} if self.lost_reasons else {}),
            "truncated_paths": self.truncated_paths,
            "exit_code": self.exit_code,
            "exit_signal": self.exit_signal,
            "command_elapsed_ns": self.command_elapsed_ns,
            "recorder_cpu_ns": self.recorder_cpu_ns,
            **({"bpf_run_ns": self.bpf_run_ns} if self.bpf_run_ns is not None else {}),
            "unseen": self.unseen,
            "io_uring_unrecorded_ops": self.uring_other_ops,
            "late_events": feeder.late_events,
            "spilled_raw_bytes": self.spilled_raw_bytes,
            **({"decode_backlog_bytes": self.decode_backlog_bytes} if self.decode_backlog_bytes is not None else {}),
            "bpf_program": self.bpf_program,
            "released_s": self.released_s,
            "exited_s": self.exited_s,
            "page_cache": (
                {"insert_events": self.cache_inserts.events, "pages_inserted": self.cache_inserts.pages()}
                if self.cache_probe
                else {"reason": f"the kernel has no {INSERT_EVENT} tracepoint: cold_bytes is null"}
            ),
        }
        if feeder.builder.mapped_uncovered_bytes is not None:
            extra["mapped_uncovered_bytes"] = feeder.builder.mapped_uncovered_bytes
        return feeder.builder, extra


def _cpu_ns() -> int:
    """User and system CPU time of this process, every thread (getrusage(2) RUSAGE_SELF), in ns."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round((usage.ru_utime + usage.ru_stime) * 1e9)


_SPILL_STEP_BYTES = 8 << 20  # raw records compressed at a time once spilling has begun


def _exit_wakeup(wakeups: select.epoll, pid: int) -> int | None:
    """A pidfd of ``pid`` (pidfd_open(2), Linux >= 5.3) registered in ``wakeups``: it becomes readable when
    the process exits, so the end is seen at once rather than at the next ``config.BPF_POLL_MS`` poll
    (up to 50 ms of every recording's finish). None where pidfds are not available."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    wakeups.register(fd, select.EPOLLIN)
    return fd


class _Rings:
    """The BPF program's ring buffers while a recording runs: ``consume`` copies what they hold. Streaming
    (``stream``, after ``start_stream``), each copy goes to a ``stream.StreamDecoder`` that decodes and feeds
    it while the command runs; otherwise (``record --pid``, whose window's end is known only at the end, or
    ``CKPT_TRACE_RECORD_STREAM=0``) copies are held, spilled past ``config.RECORD_RAW_BYTES``, and
    ``drain_all`` decodes them all once the command has ended.

    Call order: ``start_stream`` (optional), ``consume`` (any number of times), ``close_readers``,
    ``drain_all`` (once).
    """

    def __init__(self, program: LoadedProgram, scratch_dir, on_records=None) -> None:
        self.dtypes = dict(program.dtypes)
        self.dtypes["compact"] = compact_dtype(self.dtypes["events"])
        self.readers = {
            name: RingReader(program.map_fds[name], getattr(config, pages) * mmap.PAGESIZE, self.dtypes[name])
            for name, pages in RINGS.items()
        }
        self.chunks: dict[str, list[np.ndarray]] = {name: [] for name in self.readers}
        self.held_bytes = 0  # bytes in chunks, kept as they come: summing every chunk at every poll grew quadratically
        self.ranks: dict[int, int | None] = {}
        self.spill = RawSpill(scratch_dir, self.dtypes)
        self.on_records = on_records
        self.decoder: StreamDecoder | None = None

    def start_stream(self, rec: BccRecording) -> None:
        """Decode and feed ``rec.feeder`` from now on, in a background thread, as records are copied."""
        self.decoder = StreamDecoder(
            lambda group: feed_group(rec, group, self.ranks),
            self.spill,
            limit_bytes=config.RECORD_RAW_BYTES,
            batch_bytes=config.RECORD_DECODE_BATCH_BYTES,
            batch_wait_s=config.RECORD_DECODE_BATCH_WAIT_MS / 1000,
        )

    def consume(self) -> None:
        """Copy what every ring holds; read the rank of each process that just exec'd while it lives."""
        copied: Group = {}
        for name, reader in self.readers.items():
            records = reader.read()
            if len(records):
                if self.on_records is not None:
                    self.on_records(name, records)
                copied[name] = [records]
                if name == "events":
                    self.ranks.update(exec_ranks(records))
        if self.decoder is not None:
            if copied:
                self.decoder.put(copied)
            return
        for name, chunks in copied.items():
            self.chunks[name] += chunks
            self.held_bytes += chunks[0].nbytes
        # Once spilling, in small steps: compressing stalls the consumer while the rings fill.
        limit = min(config.RECORD_RAW_BYTES, _SPILL_STEP_BYTES) if self.spill.bytes else config.RECORD_RAW_BYTES
        if self.held_bytes > limit:
            self.spill.write(self.chunks)
            for name in self.chunks:
                self.chunks[name] = []
            self.held_bytes = 0

    def close_readers(self) -> None:
        for reader in self.readers.values():
            reader.close()

    def drain_all(self, rec, keep=None) -> None:
        """Feed what is left: streaming, what the decoder has queued; else every spilled group, then what is
        held (``keep`` filters records)."""
        try:
            if self.decoder is not None:
                self.decoder.close()
            else:
                for group in self.spill.groups():
                    feed_group(rec, group, self.ranks, keep)
                feed_group(rec, self.chunks, self.ranks, keep)
            rec.spilled_raw_bytes = self.spill.bytes
        finally:
            self.spill.close()


def _runs(slices: list, step: int) -> Iterator[list[tuple[str, np.ndarray]]]:
    """Runs of ``slices`` (sorted by first time) as [(ring, records), ...], in that order, each run at most
    ``step`` records (or one slice): fed as one chunk, so each ring's records of a run are decoded at once
    and the feeder takes one call, however the rings' slices alternate (an io_uring storm's calls and
    requests alternate every few hundred records: a decode and a feeding per slice cost more than the
    records did)."""
    run: list[tuple[str, np.ndarray]] = []
    held = 0
    for _, _, name, part in slices:
        if run and held + len(part) > step:
            yield run
            run, held = [], 0
        run.append((name, part))
        held += len(part)
    if run:
        yield run


def _concat_records(parts: list[np.ndarray]) -> np.ndarray:
    """Records of one layout, one after the other, joined as bytes: ``np.concatenate`` of structured arrays
    promotes their fields first (115 us against 17 us for 10 slices of 400 records, measured here)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([np.ascontiguousarray(part).view(np.uint8) for part in parts]).view(parts[0].dtype)


def feed_group(rec: BccRecording, held: Group, ranks: dict[int, int | None], keep=None) -> None:
    """Decode one group of raw records (ring name -> chunks) and feed ``rec.feeder``, a run of slices of
    at most ``config.RECORD_DECODE_EVENTS`` records at a time (``_runs``), the rings' slices in the order of
    their first records' times (each ring is in about the order calls ended); ``keep(records)`` masks the
    records to decode; ``ranks`` as ``decode_events`` takes them. Counts truncated paths into ``rec``."""
    feeder = rec.feeder
    if feeder is None:
        raise TracerError("the bcc recording has no event feeder")
    step = max(1, config.RECORD_DECODE_EVENTS)
    slices = []
    for name in RINGS:
        for records in held.get(name, ()):
            if keep is not None:
                records = records[keep(records)]
                if not len(records):
                    continue
            if name == "events":
                rec.truncated_paths += int(records["truncated"].sum())
            if name == "aux":
                inserted = records["kind"] == AUX_CACHE_INSERT  # page-cache insertions: kept as arrays
                if inserted.any():
                    rec.cache_inserts.add(records[inserted], rec.start_ns)
                    records = records[~inserted]
                    if not len(records):
                        continue
            for start in range(0, len(records), step):
                part = records[start : start + step]
                slices.append((int(part["ts_ns"][0]), len(slices), name, part))
    for run in _runs(sorted(slices, key=lambda item: item[:2]), step):
        _feed_run(feeder, run, ranks)


def _decoded(name: str, part: np.ndarray, ranks: dict[int, int | None]) -> tuple[list, list[tuple[Any, np.ndarray]]]:
    """(events, [(calls, mask), ...]) of one ring's records ``part``, as ``EffectOrderFeeder.add_split`` takes
    them: the calls kept as columns, each with its mask over ``part``, the other records as events in order."""
    if name == "aux":
        requests = part["kind"] == AUX_URING_REQ if config.RECORD_RING_COLUMNS else None
        if requests is None or not requests.any():
            return decode_aux(part), []
        return decode_aux(part[~requests]), [(decode_ring_requests(part[requests]), requests)]  # tracer.ringcalls
    parts: list[tuple[Any, np.ndarray]] = []
    nrs = part["nr"]
    if config.RECORD_DATA_COLUMNS:  # read/write calls stay columns (tracer.datacalls)
        # a table lookup, not np.isin (a pass per call number); a storm's chunk is all calls: no copy
        is_call = _DATA_CODE[np.minimum(nrs, len(_DATA_CODE) - 1)] >= 0
        if is_call.all():
            parts.append((decode_data_calls(part), is_call))
        elif is_call.any():
            parts.append((decode_data_calls(part[is_call]), is_call))
    if config.RECORD_RING_COLUMNS:  # so do io_uring_enter calls, beside their requests (tracer.ringcalls)
        is_enter = nrs == _ENTER_NR
        if is_enter.any():
            parts.append((decode_ring_enters(part[is_enter]), is_enter))
    if not parts:
        return decode_events(part, ranks), []
    taken = parts[0][1] if len(parts) == 1 else parts[0][1] | parts[1][1]
    return decode_events(part[~taken], ranks), parts


def _feed_run(feeder: EffectOrderFeeder, run: list[tuple[str, np.ndarray]], ranks: dict[int, int | None]) -> None:
    """Feed one run of slices (``_runs``) as one chunk in the slices' order: each ring's slices joined and
    decoded once; its calls' masks and its events placed at the ring's places in the run (the same arrival
    order as feeding the slices one after the other)."""
    places: dict[str, list[np.ndarray]] = {}
    joined: dict[str, list[np.ndarray]] = {}
    at = 0
    for name, part in run:
        places.setdefault(name, []).append(np.arange(at, at + len(part)))
        joined.setdefault(name, []).append(part)
        at += len(part)
    if len(joined) == 1:  # one ring: its places are the run's
        name, parts = next(iter(joined.items()))
        events, calls = _decoded(name, _concat_records(parts), ranks)
        if calls:
            feeder.add_split(events, calls)
        else:
            feeder.add(events)
        return
    all_events: list = []
    event_places: list[np.ndarray] = []
    all_calls: list[tuple[Any, np.ndarray]] = []
    for name, parts in joined.items():
        where = np.concatenate(places[name])
        events, calls = _decoded(name, _concat_records(parts), ranks)
        taken = np.zeros(len(where), dtype=bool)
        for columns, mask in calls:
            spread = np.zeros(at, dtype=bool)
            spread[where[mask]] = True
            all_calls.append((columns, spread))
            taken |= mask
        all_events += events
        event_places.append(where[~taken])
    order = np.argsort(np.concatenate(event_places), kind="stable").tolist()
    all_events = [all_events[i] for i in order]
    if all_calls:
        feeder.add_split(all_events, all_calls)
    else:
        feeder.add(all_events)


@dataclass
class LoadedProgram:
    """The BPF program loaded and attached, however it started: its maps (name -> fd), the ring records'
    layouts (``events`` and ``aux`` -> numpy dtype), its programs' fds, and what holds the probes
    (a bcc.BPF or a ``bpfcache.Attached``: dropping it detaches them). ``started``: how it started, as
    the trace's metadata says it (``bpf_program``: ``source`` "cache" or "compiled", ``cache``: what the
    cache did, ``load_s``: seconds from the program's text to the probes attached)."""

    map_fds: dict[str, int]
    dtypes: dict[str, np.dtype]
    prog_fds: list[int]
    holder: Any
    started: dict

    def detach_soon(self) -> None:
        """Start detaching the probes (``bpfcache.Attached.detach_soon``); the maps stay readable. A program
        bcc compiled here keeps its probes until the process exits (bcc detaches one at a time)."""
        if isinstance(self.holder, bpfcache.Attached):
            self.holder.detach_soon()


@contextmanager
def _quiet_stderr():
    """fd 2 sent to /dev/null meanwhile: bcc and libbcc_bpf print compiler warnings and verifier logs there."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _from_cache(text: str) -> tuple[LoadedProgram | None, str]:
    """The program ``text`` loaded from its cached compile (``bpfcache``), or (None, why not)."""
    if not config.BPF_PROGRAM_CACHE:
        return None, "off (CKPT_TRACE_BPF_PROGRAM_CACHE=0)"
    entry, why = bpfcache.load(text)
    if entry is None:
        return None, why
    if set(entry.dtypes) != {"events", "aux"}:
        return None, "corrupt (ring layouts missing)"
    try:
        attached = bpfcache.attach(entry)
    except TracerError as err:
        return None, f"refused ({err})"
    program = LoadedProgram(attached.map_fds, entry.dtypes, list(attached.prog_fds.values()), attached, {})
    return program, "hit"


def _compiled(text: str, cache: str) -> LoadedProgram:
    """The program ``text`` compiled by bcc (clang) and attached; kept in the cache for the next start unless
    the cache is off. Raises TracerError when the kernel refuses it."""
    try:
        from bcc import BPF
        from bcc.table import _get_event_class
    except ImportError as err:
        raise TracerError(f"the bcc Python module is not importable ({err})") from None
    costs.prewarm_in_background()  # beside clang, which holds no GIL
    try:
        bpf = BPF(text=text)
    except Exception as err:  # noqa: BLE001 - bcc raises bare Exception on compile/load failure
        raise TracerError(f"the kernel refused the BPF program ({str(err).splitlines()[0]})") from None
    dtypes = {name: sample_dtype(_get_event_class(bpf[name])) for name in ("events", "aux")}
    _, map_fds = bpfcache.compiled_maps(bpf)
    if config.BPF_PROGRAM_CACHE:
        try:
            stored = bpfcache.store(text, bpfcache.capture(bpf, dtypes))
            cache = f"{cache}; {'stored' if stored else 'not stored (cache directory not writable)'}"
        except bpfcache.NotCacheable as err:
            cache = f"{cache}; not stored ({err})"
    return LoadedProgram(map_fds, dtypes, [function.fd for function in bpf.funcs.values()], bpf, {"cache": cache})


class BccTracer:
    """Loads the BPF program, runs a command under it, collects events.

    Call order: ``load()`` (raises TracerError when the kernel refuses the
    program), then ``run(cmd, env)`` once. Called by ``tracer.record``.
    """

    def __init__(self, path_filters: list[str] | None = None) -> None:
        self._program: LoadedProgram | None = None
        self._path_filters = list(path_filters or [])
        self._view: KernelView | None = None

    @property
    def program(self) -> LoadedProgram:
        """The loaded program (``load``). Raises TracerError before."""
        if self._program is None:
            raise TracerError("the BPF program is not loaded (BccTracer.load first)")
        return self._program

    @property
    def view(self) -> KernelView:
        """What this kernel lets the program see (``kernel_view``), known once ``load`` ran."""
        if self._view is None:
            raise TracerError("the BPF program is not loaded (BccTracer.load first)")
        return self._view

    def load(self) -> None:
        """Load and attach the program: its cached compile for this text and kernel when there is one
        the kernel accepts (``bpfcache``), else bcc's compile (which then fills the cache). Raises
        TracerError when the kernel refuses the compiled program too."""
        self._view = kernel_view()
        text = program_text(self._view)
        started = time.monotonic()
        with _quiet_stderr():
            program, cache = _from_cache(text)
            if program is None:
                program = _compiled(text, cache)
            else:
                program.started["cache"] = cache
            fill_filters(program.map_fds, self._path_filters)  # before any process is traced
        program.started = {
            "source": "cache" if program.started["cache"] == "hit" else "compiled",
            "cache": program.started["cache"],
            "load_s": round(time.monotonic() - started, 3),
        }
        self._program = program

    def bpf_run_ns(self) -> int | None:
        """Time the loaded BPF programs have run, every CPU and every process they fired for, in ns
        (``run_time_ns`` of each program's /proc/self/fdinfo), or None unless the kernel counts it
        (sysctl kernel.bpf_stats_enabled=1, which costs each run two clock reads; off by default)."""
        try:
            if Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip() != "1":
                return None
            total = 0
            for fd in self.program.prog_fds:
                for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
                    if line.startswith("run_time_ns:"):
                        total += int(line.split()[1])
            return total
        except (OSError, ValueError):
            return None

    def _spawn(self, cmd: list[str], env: dict[str, str]) -> tuple[int, int]:
        gate_r, gate_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(gate_w)
            set_parent_death_signal()  # SIGKILL when the recorder dies, even by SIGKILL (children.py)
            os.read(gate_r, 1)
            try:
                os.execvpe(cmd[0], cmd, env)
            except OSError as err:
                os.write(2, f"ckpt-trace: cannot run {cmd[0]}: {err.strerror}\n".encode())
            os._exit(127)
        os.close(gate_r)
        return pid, gate_w

    def run(
        self,
        cmd: list[str],
        env: dict[str, str],
        make_feeder: Callable[[int, int], EffectOrderFeeder],
        scratch_dir: str | os.PathLike,
    ) -> BccRecording:
        """Run ``cmd`` with ``env`` traced, with its descendants; return when it exits and every event has
        gone to the feeder ``make_feeder(root pid, start ns)`` makes once the command is spawned.

        While the command runs, the consumer only copies the rings' records (numpy, no Python object per
        event: it must keep up with a storm of system calls on the cores the command also uses) and hands
        them to a decoder thread (``stream.StreamDecoder``), which decodes them
        ``config.RECORD_DECODE_EVENTS`` records at a time and feeds them (``CKPT_TRACE_RECORD_STREAM=0``:
        only once the command has exited). Past ``config.RECORD_RAW_BYTES`` waiting, the records are
        zstd-compressed (mostly the unused tails of the path buffers) into a scratch file in
        ``scratch_dir``, unlinked from the start (nothing is left behind, even after SIGKILL), and read
        back in their turn: memory stays bounded however long the command runs, and no event is lost to a
        slow decoder."""
        started: dict = {}

        def begin(rec: BccRecording, wakeups: select.epoll) -> None:
            pid, started["gate"] = self._spawn(cmd, env)
            rec.root_pid = pid
            started["exited"] = _exit_wakeup(wakeups, pid)
            bpfcache.update_elem(self.program.map_fds["traced"], ctypes.c_uint32(pid), ctypes.c_uint8(1))

        def release() -> None:
            os.write(started["gate"], b"x")
            os.close(started["gate"])

        def finished(rec: BccRecording) -> int | None:
            done, raw = os.waitpid(rec.root_pid, os.WNOHANG)
            return raw if done else None

        previous = signal.signal(signal.SIGINT, sigint_handler())
        try:
            rec, status = self._collect(
                make_feeder, scratch_dir, begin, release, finished, stream=bool(config.RECORD_STREAM)
            )
        finally:
            signal.signal(signal.SIGINT, previous)
            if started.get("exited") is not None:
                os.close(started["exited"])
        rec.exit_code = os.waitstatus_to_exitcode(status)
        if rec.exit_code < 0:
            rec.exit_signal = -rec.exit_code
            rec.exit_code = 128 + rec.exit_signal
        return rec

    def attach(
        self,
        pids: Callable[[], list[int]],
        make_feeder: Callable[[int, int], EffectOrderFeeder],
        scratch_dir: str | os.PathLike,
        finished: Callable[[BccRecording], bool],
        on_records: Callable[[str, np.ndarray], None] | None = None,
        keep: Callable[[np.ndarray], np.ndarray] | None = None,
        cgroup: tuple[int, int] | None = None,
        on_live: Callable[[], None] | None = None,
    ) -> BccRecording:
        """Trace processes already running, with their descendants, until ``finished(rec)`` is true (called
        after every poll); ``pids()`` lists them (called until it names no new one, the later ones added
        while the first are traced: a fork in between is caught by the fork tracepoint or the next call).
        ``on_records(ring name, records)`` sees each chunk as it is copied (``tracer.attach`` counts
        checkpoint files there); ``keep(records)`` is the mask of the records to decode (the window's end).
        ``cgroup``: (cgroup id, level) of a cgroup v2 directory (``attach.resolve_cgroup``) whose processes,
        and those of the cgroups below it, are traced too, the kernel telling them (``traced_cgroup``).
        ``on_live()`` is called once they are all traced (the probes live for the job).
        The processes are never signalled, stopped or waited for: detaching is closing the BPF program."""

        def begin(rec: BccRecording, wakeups: select.epoll) -> None:
            if cgroup is not None:
                bpfcache.update_elem(
                    self.program.map_fds["traced_cgroup"], ctypes.c_int(0), (ctypes.c_uint64 * 2)(*cgroup)
                )
            seen: set[int] = set()
            while True:
                new = [pid for pid in pids() if pid not in seen]
                if not new:
                    break
                for pid in new:
                    bpfcache.update_elem(self.program.map_fds["traced"], ctypes.c_uint32(pid), ctypes.c_uint8(1))
                seen.update(new)
                if rec.root_pid < 0:
                    rec.root_pid = new[0]

        rec, _ = self._collect(
            make_feeder,
            scratch_dir,
            begin,
            on_live or (lambda: None),
            lambda rec: True if finished(rec) else None,
            on_records,
            keep,
        )
        return rec

    def _collect(
        self,
        make_feeder,
        scratch_dir,
        begin,
        release,
        finished,
        on_records=None,
        keep=None,
        *,
        stream: bool = False,
    ) -> tuple[BccRecording, Any]:
        """``run``'s and ``attach``'s common body: ``begin`` names the traced processes, ``release`` lets
        the command go, then the rings are copied until ``finished(rec)`` returns a status (not None), and
        everything held is decoded and fed. Returns (recording, status)."""
        program = self.program
        rec = BccRecording(bpf_program=dict(program.started))
        rings = _Rings(program, scratch_dir, on_records)
        wakeups = select.epoll()
        for name in rings.readers:
            wakeups.register(program.map_fds[name], select.EPOLLIN)
        rec.unseen = {
            capture: why
            for capture, why in (("io_uring_requests", self.view.uring), ("mapped_pages", self.view.mapped))
            if why
        }
        rec.cache_probe = self.view.macros.get("__CACHE_INSERT__") == "1"
        begin(rec, wakeups)
        rec.start_ns = time.monotonic_ns()
        cpu_at_start_ns = _cpu_ns()
        rec.feeder = make_feeder(rec.root_pid, rec.start_ns)
        if stream:
            rings.start_stream(rec)
        try:
            rec.released_s = time.monotonic()
            release()
            costs.prewarm_in_background()  # now that the start's work is done (a no-op after a compile)
            status = None
            gap_s, consumed_s = consume_gap_s(), 0.0
            while status is None:
                wakeups.poll(config.BPF_POLL_MS / 1000)  # or time out: records also come without a wakeup
                wait_s = consumed_s + gap_s - time.monotonic()
                if wait_s > 0:  # let records gather: a pass over the rings costs the same however few it finds
                    time.sleep(wait_s)
                rings.consume()
                consumed_s = time.monotonic()
                status = finished(rec)
            rec.exited_s = time.monotonic()
            rec.command_elapsed_ns = time.monotonic_ns() - rec.start_ns
            rec.recorder_cpu_ns = _cpu_ns() - cpu_at_start_ns
            rec.bpf_run_ns = self.bpf_run_ns()
            rings.consume()  # events are written at syscall exit, so all of them are there now
            program.detach_soon()  # nothing more to see: the detach's wait overlaps the decoding and writing
            if rings.decoder is not None:
                rec.decode_backlog_bytes = rings.decoder.pending_bytes
        except BaseException:
            if rings.decoder is not None:
                rings.decoder.abandon()
            raise
        finally:
            wakeups.close()
            rings.close_readers()
        rings.drain_all(rec, keep)
        self._count_lost(rec)
        return rec, status

    def _count_lost(self, rec: BccRecording) -> None:
        """The program's own counts of what it could not record, by reason, into ``rec``."""
        maps = self.program.map_fds
        lost = [bpfcache.lookup_u64(maps["lost"], i) for i in range(len(LOST_REASONS))]
        rec.lost_events = sum(lost)
        rec.lost_reasons = {reason: count for reason, count in zip(LOST_REASONS, lost) if count}
        if self.view.uring is None:
            counts = [bpfcache.lookup_u64(maps["uring_other"], i) for i in range(256)]
            rec.uring_other_ops = {
                vocabulary.URING_OPCODE_NAMES.get(i, str(i)): count for i, count in enumerate(counts) if count
            }
