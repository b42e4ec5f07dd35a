"""Every name and code a trace uses, defined once: operations, offset sources, paths, open flags by architecture.

The tracer writes these names, the replayer and the reports read them; no
other module spells them. Documented in ``formats/README.md``.

Open flags are stored in a trace as the numbers the recorded program passed
to open(2), which depend on the architecture it ran on: x86-64 uses the
asm-generic values (include/uapi/asm-generic/fcntl.h) while arm64 (Grace
Hopper nodes) moves four of them (arch/arm64/include/uapi/asm/fcntl.h), so
O_DIRECT there is x86-64's O_DIRECTORY and the reverse. A trace records its
``arch``; ``translate_open_flags`` maps a recorded value to another
architecture's, flag by flag, which is the one place a replay converts.
"""

from __future__ import annotations

import platform

# -- operations (the ``op`` column) ------------------------------------------------
OPEN, CLOSE, READ, WRITE, LSEEK = "open", "close", "read", "write", "lseek"
FSYNC, FDATASYNC, SYNC_FILE_RANGE = "fsync", "fdatasync", "sync_file_range"
FTRUNCATE, FALLOCATE, RENAME, UNLINK, MKDIR, DUP, FCNTL = (
    "ftruncate",
    "fallocate",
    "rename",
    "unlink",
    "mkdir",
    "dup",
    "fcntl",
)
#: link(2)/linkat(2): ``path`` the existing name, ``new_path`` the new one; symlink(2)/symlinkat(2): ``path`` the
#: link's content exactly as the program passed it (never resolved), ``new_path`` the link made.
LINK, SYMLINK = "link", "symlink"
IO_URING_SETUP, IO_URING_ENTER, IO_URING_REGISTER = "io_uring_setup", "io_uring_enter", "io_uring_register"
IO_SETUP, IO_DESTROY, IO_SUBMIT, IO_GETEVENTS = "io_setup", "io_destroy", "io_submit", "io_getevents"
MMAP_OP, MUNMAP, MSYNC, MADVISE, MREMAP = "mmap", "munmap", "msync", "madvise", "mremap"

DATA_OPS = frozenset({READ, WRITE})
SYNC_OPS = frozenset({FSYNC, FDATASYNC, SYNC_FILE_RANGE})
#: Operations that name paths rather than descriptors.
PATH_OPS = frozenset({OPEN, RENAME, UNLINK, MKDIR, LINK, SYMLINK})
#: Operations on a descriptor.
FD_OPS = frozenset({CLOSE, READ, WRITE, LSEEK, FSYNC, FDATASYNC, SYNC_FILE_RANGE, FTRUNCATE, FALLOCATE, DUP, FCNTL})
#: File-system operations that move no data: what the paper counts as metadata operations.
METADATA_OPS = frozenset(
    {
        OPEN,
        CLOSE,
        LSEEK,
        FSYNC,
        FDATASYNC,
        SYNC_FILE_RANGE,
        FTRUNCATE,
        FALLOCATE,
        RENAME,
        UNLINK,
        MKDIR,
        DUP,
        FCNTL,
        LINK,
        SYMLINK,
    }
)
#: Rows of an io_uring instance or a Linux AIO context itself: the queue, not the data.
RING_OPS = frozenset({IO_URING_SETUP, IO_URING_ENTER, IO_URING_REGISTER, IO_SETUP, IO_DESTROY, IO_SUBMIT, IO_GETEVENTS})
#: Rows of a file mapping's life (its pages touched are read and write rows).
MAPPING_OPS = frozenset({MMAP_OP, MUNMAP, MSYNC, MADVISE, MREMAP})
#: Host<->device copies of a CUDA program (interface ``cuda``, format version 3): CUPTI's memcpy kinds.
COPY_H2D, COPY_D2H, COPY_D2D, COPY_H2H, COPY_P2P, COPY_OTHER = (
    "copy_h2d",
    "copy_d2h",
    "copy_d2d",
    "copy_h2h",
    "copy_p2p",
    "copy_other",
)
COPY_OPS = frozenset({COPY_H2D, COPY_D2H, COPY_D2D, COPY_H2H, COPY_P2P, COPY_OTHER})
OPS = METADATA_OPS | DATA_OPS | RING_OPS | MAPPING_OPS | COPY_OPS

# -- I/O interfaces (the ``interface`` column) ------------------------------------------
SYSCALL = "syscall"  # a synchronous system call (read, pwrite64, fsync...), or the ring or context calls
IO_URING = "io_uring"  # one io_uring request (SQE), from its submission to its completion (CQE)
LIBAIO = "libaio"  # one Linux AIO request (iocb of io_submit), completed by io_getevents
MMAP = "mmap"  # a file mapping (mmap, munmap, msync, madvise, mremap) or the pages touched through one
CUDA = "cuda"  # one host<->device copy, as CUPTI's activity API reported it (format version 3)
# In-kernel copies between two descriptors (optional additions, ckpt-trace 0.3): each call is a read row on its
# source and a write row on its destination, each naming the other file in ``new_path``.
SENDFILE, COPY_FILE_RANGE, SPLICE, FICLONE = "sendfile", "copy_file_range", "splice", "ficlone"
COPY_INTERFACES = (SENDFILE, COPY_FILE_RANGE, SPLICE, FICLONE)
INTERFACES = (SYSCALL, IO_URING, LIBAIO, MMAP, CUDA) + COPY_INTERFACES

# -- memory kinds (the ``memory_kind`` column of copy rows: the host side's memory) ------------
MEMORY_PAGEABLE, MEMORY_PINNED, MEMORY_DEVICE, MEMORY_MANAGED, MEMORY_UNKNOWN = (
    "pageable",
    "pinned",
    "device",
    "managed",
    "unknown",
)
MEMORY_KINDS = (MEMORY_PAGEABLE, MEMORY_PINNED, MEMORY_DEVICE, MEMORY_MANAGED, MEMORY_UNKNOWN)

# -- offset sources (the ``offset_source`` column) -----------------------------------
OFFSET_EXPLICIT = "explicit"  # the call's own offset argument (pwrite64...)
OFFSET_POSITION = "position"  # the file position, tracked through open/lseek/read/write/dup/fork
OFFSET_APPEND = "append"  # end of file, for O_APPEND writes
OFFSET_KERNEL = "kernel"  # read from the kernel's struct file at syscall exit
OFFSET_UNKNOWN = "unknown"  # applicable, but the trace could not know it
OFFSET_PAGE = "page"  # pages touched through a mapping: page-aligned, whole pages (the kernel's page size)
OFFSET_SOURCES = (OFFSET_EXPLICIT, OFFSET_POSITION, OFFSET_APPEND, OFFSET_KERNEL, OFFSET_UNKNOWN, OFFSET_PAGE)

# -- what the ``syscall`` column holds for rows that are not system calls -----------------
# io_uring requests: "io_uring:" + the opcode name (io_uring:WRITE); libaio: "aio:" + IOCB_CMD name
# (aio:PWRITE); pages through a mapping: these three.
PAGE_FAULT, FAULT_AROUND, PAGE_DIRTY = "page_fault", "fault_around", "page_dirty"
CUDA_MEMCPY = "cuda_memcpy"  # a copy row (CUPTI_ACTIVITY_KIND_MEMCPY)
URING_OPCODE_NAMES = {
    0: "NOP",
    6: "POLL_ADD",
    7: "POLL_REMOVE",
    9: "SENDMSG",
    10: "RECVMSG",
    11: "TIMEOUT",
    13: "ACCEPT",
    16: "CONNECT",
    18: "OPENAT",
    19: "CLOSE",
    20: "FILES_UPDATE",
    21: "STATX",
    24: "FADVISE",
    25: "MADVISE",
    26: "SEND",
    27: "RECV",
    28: "OPENAT2",
    35: "RENAMEAT",
    36: "UNLINKAT",
    37: "MKDIRAT",
}  # opcodes not recorded, named where counted
URING_OPCODES = {
    1: "READV",
    2: "WRITEV",
    3: "FSYNC",
    4: "READ_FIXED",
    5: "WRITE_FIXED",
    8: "SYNC_FILE_RANGE",
    17: "FALLOCATE",
    22: "READ",
    23: "WRITE",
}  # include/uapi/linux/io_uring.h, the ones recorded
URING_OPCODE_NAMES.update(URING_OPCODES)
AIO_OPCODES = {0: "PREAD", 1: "PWRITE", 2: "FSYNC", 3: "FDSYNC", 5: "NOOP", 7: "PREADV", 8: "PWRITEV"}  # aio_abi.h

# -- paths ----------------------------------------------------------------------------
IO_URING_PATH = "anon_inode:[io_uring]"  # the ``path`` of io_uring instance rows
#: Paths the tracer leaves out unless a path filter names them: pseudo files and non-files.
SPECIAL_PREFIXES = ("/proc/", "/sys/", "/dev/", "pipe:", "socket:", "anon_inode:")
SPECIAL_PATHS = ("/proc", "/sys", "/dev")

# -- other flag values a trace stores (the same on every Linux architecture) --------------
AT_REMOVEDIR = 0x200  # unlinkat(2) flags: the unlink is an rmdir
FALLOC_FL_KEEP_SIZE = 0x1  # fallocate(2) mode: the file size does not change
RWF_APPEND = 0x10  # pwritev2(2) flags: append, whatever the offset

# -- architectures and open flags --------------------------------------------------------
X86_64, AARCH64 = "x86_64", "aarch64"
ARCHES = (X86_64, AARCH64)
_ALIASES = {"amd64": X86_64, "x86-64": X86_64, "x64": X86_64, "arm64": AARCH64}

_GENERIC = {
    "O_WRONLY": 0o1,
    "O_RDWR": 0o2,
    "O_CREAT": 0o100,
    "O_EXCL": 0o200,
    "O_NOCTTY": 0o400,
    "O_TRUNC": 0o1000,
    "O_APPEND": 0o2000,
    "O_NONBLOCK": 0o4000,
    "O_DSYNC": 0o10000,
    "O_ASYNC": 0o20000,
    "O_DIRECT": 0o40000,
    "O_LARGEFILE": 0o100000,
    "O_DIRECTORY": 0o200000,
    "O_NOFOLLOW": 0o400000,
    "O_NOATIME": 0o1000000,
    "O_CLOEXEC": 0o2000000,
    "__O_SYNC": 0o4000000,
    "O_PATH": 0o10000000,
    "__O_TMPFILE": 0o20000000,
}
#: Open flag name -> value, per architecture (O_RDONLY is 0 everywhere; O_ACCMODE is 3).
OPEN_FLAGS: dict[str, dict[str, int]] = {
    X86_64: dict(_GENERIC),
    AARCH64: {
        **_GENERIC,
        "O_DIRECTORY": 0o40000,
        "O_NOFOLLOW": 0o100000,
        "O_DIRECT": 0o200000,
        "O_LARGEFILE": 0o400000,
    },
}
O_ACCMODE = 0o3


def normalize_arch(machine: str) -> str:
    """'amd64' / 'arm64' / uname -m -> one of ``ARCHES`` (others are returned as given)."""
    return _ALIASES.get(machine.lower(), machine.lower())


def host_arch() -> str:
    """This machine's architecture, as a trace records it."""
    return normalize_arch(platform.machine())


def open_flag(name: str, arch: str) -> int:
    """The value of open flag ``name`` (e.g. 'O_DIRECT') on ``arch``. Raises KeyError for an unknown arch or name."""
    return OPEN_FLAGS[normalize_arch(arch)][name]


def open_flag_names(flags: int, arch: str) -> list[str]:
    """The names of the bits set in ``flags`` on ``arch`` (access mode first: O_RDONLY, O_WRONLY or O_RDWR).
    Bits no name covers are given as one octal number."""
    table = OPEN_FLAGS[normalize_arch(arch)]
    names = [{0: "O_RDONLY", 1: "O_WRONLY", 2: "O_RDWR"}.get(flags & O_ACCMODE, "O_ACCMODE")]
    rest = flags & ~O_ACCMODE
    for name, value in sorted(table.items(), key=lambda item: item[1]):
        if name in ("O_WRONLY", "O_RDWR"):
            continue
        if rest & value:
            names.append(name)
            rest &= ~value
    if rest:
        names.append(oct(rest))
    return names


def translate_open_flags(flags: int, from_arch: str, to_arch: str) -> int:
    """Recorded open ``flags`` of ``from_arch`` as the same flags on ``to_arch`` (bit by bit; bits with
    no name are kept). Raises KeyError for an unknown architecture."""
    source, target = OPEN_FLAGS[normalize_arch(from_arch)], OPEN_FLAGS[normalize_arch(to_arch)]
    if source is target:
        return flags
    out = flags & O_ACCMODE
    rest = flags & ~O_ACCMODE
    for name, value in source.items():
        if name not in ("O_WRONLY", "O_RDWR") and rest & value:
            out |= target[name]
            rest &= ~value
    return out | rest
