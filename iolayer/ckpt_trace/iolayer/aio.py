"""Linux native AIO (the "libaio" interface) through its raw system calls, without libaio.so.

io_setup(2), io_submit(2), io_getevents(2), io_destroy(2) called through
libc's ``syscall(3)`` with this architecture's numbers, on ``struct iocb``
and ``struct io_event`` as ``include/uapi/linux/aio_abi.h`` lays them out (64
and 32 bytes, little-endian on x86-64 and arm64). It exists so the project
has a libaio engine of its own, the path DeepSpeed's FastPersist and
``fio --ioengine=libaio`` take, to record and replay without building them.

Native AIO is asynchronous only with O_DIRECT on file systems that support
it; with buffered I/O, io_submit itself does the I/O (io_submit(2), NOTES).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from typing import NamedTuple

IOCB_CMD_PREAD, IOCB_CMD_PWRITE, IOCB_CMD_FSYNC, IOCB_CMD_FDSYNC = 0, 1, 2, 3
_KINDS = {"read": IOCB_CMD_PREAD, "write": IOCB_CMD_PWRITE, "fsync": IOCB_CMD_FSYNC, "fdatasync": IOCB_CMD_FDSYNC}

# (io_setup, io_destroy, io_getevents, io_submit): arch/x86/entry/syscalls/syscall_64.tbl,
# include/uapi/asm-generic/unistd.h (arm64).
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}

_IOCB = struct.Struct("<QIIHhIQQqQII")  # aio_data, aio_key, aio_rw_flags, opcode, reqprio, fildes, buf, nbytes,
#                                          offset, reserved2, flags, resfd
_EVENT = struct.Struct("<QQqq")  # data, obj, res, res2

_libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them (dlopen(3), NULL)
_libc.syscall.restype = ctypes.c_long


def _numbers() -> tuple[int, int, int, int]:
    machine = platform.machine()
    numbers = _SYSCALLS.get("aarch64" if machine == "arm64" else machine)
    if numbers is None:
        raise OSError(38, f"native AIO system call numbers of {machine} are not known")
    return numbers


def _call(number: int, *args) -> int:
    ret = _libc.syscall(ctypes.c_long(number), *args)
    if ret < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return ret


class Completion(NamedTuple):
    """One io_event: the request's ``tag`` (what ``submit`` got) and ``res`` (bytes moved or -errno)."""

    tag: int
    res: int


class AioContext:
    """One AIO context with room for ``max_events`` requests in flight (io_setup(2)). Raises OSError.

    Call order: ``submit`` requests (each its own iocb, submitted at once),
    ``reap`` completions, ``close`` (io_destroy) after the last completion.
    Buffers must stay valid until their request's completion is reaped.
    """

    def __init__(self, max_events: int) -> None:
        self._setup, self._destroy, self._getevents, self._submit = _numbers()
        self.max_events = max_events
        ctx = ctypes.c_ulong(0)
        _call(self._setup, ctypes.c_uint(max_events), ctypes.byref(ctx))
        self.ctx: int | None = ctx.value
        self.in_flight = 0
        self._iocbs: dict[int, ctypes.Array] = {}  # tag -> the iocb, alive until its completion
        self._events = ctypes.create_string_buffer(_EVENT.size * max_events)

    def submit(self, kind: str, fd: int, address: int, size_bytes: int, offset: int, tag: int) -> None:
        """io_submit(2) one request (``kind``: read, write, fsync, fdatasync); ``tag`` comes back with its
        completion (the iocb's aio_data)."""
        iocb = ctypes.create_string_buffer(
            _IOCB.pack(tag, 0, 0, _KINDS[kind], 0, fd, address, size_bytes, offset, 0, 0, 0), _IOCB.size
        )
        pointers = (ctypes.c_void_p * 1)(ctypes.addressof(iocb))
        _call(self._submit, ctypes.c_ulong(self._open_context()), ctypes.c_long(1), pointers)
        self._iocbs[tag] = iocb
        self.in_flight += 1

    def reap(self, min_events: int = 1) -> list[Completion]:
        """io_getevents(2): wait for at least ``min_events`` completions (at most what is in flight)."""
        wanted = min(min_events, self.in_flight)
        got = _call(
            self._getevents,
            ctypes.c_ulong(self._open_context()),
            ctypes.c_long(wanted),
            ctypes.c_long(self.max_events),
            self._events,
            None,
        )
        done = []
        for i in range(got):
            tag, _, res, _ = _EVENT.unpack_from(self._events, i * _EVENT.size)
            self._iocbs.pop(tag, None)
            done.append(Completion(tag, res))
        self.in_flight -= got
        return done

    def _open_context(self) -> int:
        if self.ctx is None:
            raise OSError(errno.EBADF, "the AIO context is closed")
        return self.ctx

    def close(self) -> None:
        """Reap what is in flight, then io_destroy(2); idempotent."""
        if self.ctx is None:
            return
        while self.in_flight:
            self.reap(self.in_flight)
        _call(self._destroy, ctypes.c_ulong(self.ctx))
        self.ctx = None

    def __enter__(self) -> AioContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
