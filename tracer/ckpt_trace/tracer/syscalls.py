"""The traced system calls: argument names in prototype order and normalised ops.

Argument order follows the x86-64 prototypes in syscalls(2) and the field
order of the ``syscalls:sys_enter_*`` tracepoints, which is also the order
strace prints them in. Both backends decode raw arguments by these names,
so the state machine never sees a backend's own spelling.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_trace.formats import vocabulary

# Argument names that carry a user-space path string.
PATH_ARGS = ("path", "path2")


@dataclass(frozen=True)
class Syscall:
    """One traced system call.

    ``op`` is the normalised operation written to the trace (None for calls
    traced only to keep process state: clone, execve, chdir...).
    """

    name: str
    op: str | None
    args: tuple[str, ...]


def _table(*entries: Syscall) -> dict[str, Syscall]:
    return {entry.name: entry for entry in entries}


_READV = ("fd", "iov", "iov_count")
_PREADV = ("fd", "iov", "iov_count", "offset", "pos_h")
_PREADV2 = _PREADV + ("rwflags",)

SYSCALLS: dict[str, Syscall] = _table(
    Syscall("open", "open", ("path", "flags", "mode")),  # the op names are formats.vocabulary's
    Syscall("openat", "open", ("dirfd", "path", "flags", "mode")),
    Syscall("openat2", "open", ("dirfd", "path", "how", "usize")),
    Syscall("creat", "open", ("path", "mode")),
    Syscall("close", "close", ("fd",)),
    Syscall("close_range", None, ("fd", "max_fd", "flags")),
    Syscall("read", "read", ("fd", "buf", "count")),
    Syscall("pread64", "read", ("fd", "buf", "count", "offset")),
    Syscall("readv", "read", _READV),
    Syscall("preadv", "read", _PREADV),
    Syscall("preadv2", "read", _PREADV2),
    Syscall("write", "write", ("fd", "buf", "count")),
    Syscall("pwrite64", "write", ("fd", "buf", "count", "offset")),
    Syscall("writev", "write", _READV),
    Syscall("pwritev", "write", _PREADV),
    Syscall("pwritev2", "write", _PREADV2),
    Syscall("lseek", "lseek", ("fd", "offset", "whence")),
    Syscall("fsync", "fsync", ("fd",)),
    Syscall("fdatasync", "fdatasync", ("fd",)),
    Syscall("sync_file_range", "sync_file_range", ("fd", "offset", "count", "flags")),
    Syscall("ftruncate", "ftruncate", ("fd", "length")),
    Syscall("fallocate", "fallocate", ("fd", "mode", "offset", "count")),
    Syscall("rename", "rename", ("path", "path2")),
    Syscall("renameat", "rename", ("dirfd", "path", "dirfd2", "path2")),
    Syscall("renameat2", "rename", ("dirfd", "path", "dirfd2", "path2", "flags")),
    Syscall("unlink", "unlink", ("path",)),
    Syscall("unlinkat", "unlink", ("dirfd", "path", "flags")),
    Syscall("rmdir", "unlink", ("path",)),  # recorded as unlinkat(AT_REMOVEDIR) is
    Syscall("link", "link", ("path", "path2")),
    Syscall("linkat", "link", ("dirfd", "path", "dirfd2", "path2", "flags")),
    Syscall("symlink", "symlink", ("path", "path2")),  # path: the link's content, a string never resolved
    Syscall("symlinkat", "symlink", ("path", "dirfd2", "path2")),
    Syscall("mkdir", "mkdir", ("path", "mode")),
    Syscall("mkdirat", "mkdir", ("dirfd", "path", "mode")),
    Syscall("dup", "dup", ("fd",)),
    Syscall("dup2", "dup", ("fd", "newfd")),
    Syscall("dup3", "dup", ("fd", "newfd", "flags")),
    Syscall("fcntl", "fcntl", ("fd", "cmd", "arg")),
    Syscall("ioctl", None, ("fd", "cmd", "arg")),
    # In-kernel copies (op None: each is a read row and a write row). The *_ptr arguments point to offsets:
    # backends decode them as ``in_offset``/``out_offset`` (absent or None: NULL, the file position; -2:
    # unreadable).
    Syscall("sendfile", None, ("out_fd", "in_fd", "offset_ptr", "count")),
    Syscall("copy_file_range", None, ("in_fd", "off_in_ptr", "out_fd", "off_out_ptr", "count", "flags")),
    Syscall("splice", None, ("in_fd", "off_in_ptr", "out_fd", "off_out_ptr", "count", "flags")),
    Syscall("io_uring_setup", "io_uring_setup", ("entries", "params")),
    Syscall("io_uring_enter", "io_uring_enter", ("fd", "to_submit", "min_complete", "flags", "sig", "sigsz")),
    Syscall("io_uring_register", "io_uring_register", ("fd", "opcode", "arg", "nr_args")),
    Syscall("io_setup", "io_setup", ("nr_events", "ctxp")),
    Syscall("io_destroy", "io_destroy", ("ctx",)),
    Syscall("io_submit", "io_submit", ("ctx", "nr", "iocbpp")),
    Syscall("io_getevents", "io_getevents", ("ctx", "min_nr", "nr", "events", "timeout")),
    Syscall("io_pgetevents", "io_getevents", ("ctx", "min_nr", "nr", "events", "timeout", "usig")),
    Syscall("mmap", "mmap", ("addr", "length", "prot", "mmap_flags", "fd", "offset")),
    Syscall("munmap", "munmap", ("addr", "length")),
    Syscall("msync", "msync", ("addr", "length", "flags")),
    Syscall("madvise", "madvise", ("addr", "length", "advice")),
    Syscall("mremap", "mremap", ("addr", "length", "new_length", "flags", "new_addr")),
    Syscall("clone", None, ("clone_flags", "stack", "ptid", "ctid", "tls")),
    Syscall("clone3", None, ("uargs", "usize")),
    Syscall("fork", None, ()),
    Syscall("vfork", None, ()),
    Syscall("execve", None, ("path", "argv", "envp")),
    Syscall("execveat", None, ("dirfd", "path", "argv", "envp", "flags")),
    Syscall("chdir", None, ("path",)),
    Syscall("fchdir", None, ("fd",)),
)

VECTORED = frozenset({"readv", "writev", "preadv", "pwritev", "preadv2", "pwritev2"})
POSITIONAL = frozenset({"pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2"})

# Open flags as this machine's kernel reads them (the trace records this machine's arch with them).
_OPEN = (
    vocabulary.OPEN_FLAGS[vocabulary.host_arch()]
    if vocabulary.host_arch() in vocabulary.OPEN_FLAGS
    else vocabulary.OPEN_FLAGS[vocabulary.X86_64]
)
O_ACCMODE, O_RDONLY, O_WRONLY, O_RDWR = vocabulary.O_ACCMODE, 0, _OPEN["O_WRONLY"], _OPEN["O_RDWR"]
O_CREAT, O_EXCL, O_TRUNC, O_APPEND = _OPEN["O_CREAT"], _OPEN["O_EXCL"], _OPEN["O_TRUNC"], _OPEN["O_APPEND"]
O_DIRECT, O_CLOEXEC = _OPEN["O_DIRECT"], _OPEN["O_CLOEXEC"]
# fcntl F_SETFL changes only these status flags (fs/fcntl.c SETFL_MASK).
SETFL_MASK = O_APPEND | O_DIRECT | _OPEN["O_ASYNC"] | _OPEN["O_NONBLOCK"] | _OPEN["O_NOATIME"]
RWF_APPEND, FALLOC_FL_KEEP_SIZE = vocabulary.RWF_APPEND, vocabulary.FALLOC_FL_KEEP_SIZE

# Calls' own constants, the same on x86-64 and arm64 (include/uapi/linux/fcntl.h, sched.h,
# asm-generic/ioctls.h, linux/close_range.h).
AT_FDCWD = -100
F_DUPFD = 0
F_SETFD = 2
F_SETFL = 4
F_DUPFD_CLOEXEC = 1030
FD_CLOEXEC = 1
FIONCLEX = 0x5450
FIOCLEX = 0x5451
FICLONE = 0x40049409  # include/uapi/linux/fs.h: _IOW(0x94, 9, int)
FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)
COPY_CALLS = frozenset({"sendfile", "copy_file_range", "splice"})
OFFSET_UNREADABLE = -2  # an in_offset/out_offset the tracer could not read
CLONE_FILES = 0x400
CLONE_FS = 0x200
CLONE_THREAD = 0x10000
CLOSE_RANGE_CLOEXEC = 1 << 2
SEEK_SET, SEEK_CUR, SEEK_END = 0, 1, 2
MAP_SHARED, MAP_ANONYMOUS, PROT_WRITE = 0x01, 0x20, 0x2  # asm-generic/mman-common.h


def traced_names() -> list[str]:
    """Every syscall name a backend must trace, rows and process state alike."""
    return list(SYSCALLS)
