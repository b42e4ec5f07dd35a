"""A deterministic workload that exercises every file-position rule a tracer must get right.

``python -m ckpt_trace.workloads.odd_pattern OUT_DIR EXPECTED_JSON`` writes
files under OUT_DIR with lseek, O_APPEND, dup/dup2/F_DUPFD, fork (shared
positions), exec (inherited descriptor, cwd-relative open), threads,
writev/pwritev, openat with a directory fd, rename, unlink, mkdir and
O_DIRECT, then writes EXPECTED_JSON: every read and write with the path,
offset and byte count the *kernel* used. Offsets come from
/proc/self/fdinfo (file position) or fstat (end of file for O_APPEND),
neither of which touches the traced descriptors, so a tracer cannot pass
by echoing the workload's own calls.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import subprocess
import sys
import threading

_POS = re.compile(r"pos:\s+(\d+)")

CHILD = r"""
import json, os, re, sys
fd = int(sys.argv[1])
pos = int(re.search(r"pos:\s+(\d+)", open(f"/proc/self/fdinfo/{fd}").read()).group(1))
n = os.write(fd, b"E" * 333)
notes = [{"op": "write", "path": os.readlink(f"/proc/self/fd/{fd}"), "offset": pos, "bytes": n}]
rel = os.open("exec-relative.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
n = os.write(rel, b"R" * 1000)
notes.append({"op": "write", "path": os.path.realpath("exec-relative.bin"), "offset": 0, "bytes": n})
os.close(rel)
print(json.dumps(notes))
"""


class Notes:
    """The kernel-observed record of every data operation, thread-safe."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.lock = threading.Lock()

    def add(self, op: str, path: str, offset: int, nbytes: int) -> None:
        with self.lock:
            self.items.append({"op": op, "path": path, "offset": offset, "bytes": nbytes})


def position(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as info:
        found = _POS.search(info.read())
    if found is None:
        raise OSError(f"no pos in /proc/self/fdinfo/{fd}")
    return int(found.group(1))


def write(notes: Notes, fd: int, path: str, data: bytes | mmap.mmap) -> None:
    offset = position(fd)
    notes.add("write", path, offset, os.write(fd, data))


def append(notes: Notes, fd: int, path: str, data: bytes) -> None:
    offset = os.fstat(fd).st_size
    notes.add("write", path, offset, os.write(fd, data))


def positions_and_dups(notes: Notes, out: str) -> str:
    path = os.path.join(out, "a.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    write(notes, fd, path, b"a" * 100)
    os.lseek(fd, 4096, os.SEEK_SET)
    write(notes, fd, path, b"b" * 700)
    os.lseek(fd, -50, os.SEEK_CUR)
    write(notes, fd, path, b"c" * 9)
    os.lseek(fd, 10, os.SEEK_END)
    write(notes, fd, path, b"d" * 1)
    offset = position(fd)
    notes.add("write", path, offset, os.writev(fd, [b"e" * 10, b"f" * 300, b"g" * 5]))
    notes.add("write", path, 20000, os.pwritev(fd, [b"h" * 64, b"i" * 64], 20000))
    notes.add("write", path, 123, os.pwrite(fd, b"j" * 33, 123))
    dup = os.dup(fd)
    write(notes, dup, path, b"k" * 77)
    write(notes, fd, path, b"l" * 11)
    dup2 = os.dup2(fd, 77)
    write(notes, dup2, path, b"m" * 13)
    import fcntl

    dup3 = fcntl.fcntl(fd, fcntl.F_DUPFD, 90)
    write(notes, dup3, path, b"n" * 17)
    for extra in (dup, dup2, dup3):
        os.close(extra)
    return_fd_path = (fd, path)
    fork_shared_position(notes, *return_fd_path)
    exec_inherited(notes, out, fd)
    write(notes, fd, path, b"q" * 21)
    os.close(fd)
    return path


def fork_shared_position(notes: Notes, fd: int, path: str) -> None:
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        offset = position(fd)
        n = os.write(fd, b"o" * 444)
        os.write(writer, json.dumps({"op": "write", "path": path, "offset": offset, "bytes": n}).encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    notes.add(child["op"], child["path"], child["offset"], child["bytes"])
    write(notes, fd, path, b"p" * 55)


def exec_inherited(notes: Notes, out: str, fd: int) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(fd)], pass_fds=[fd], cwd=out, capture_output=True, text=True, check=True
    )
    for item in json.loads(result.stdout):
        notes.add(item["op"], item["path"], item["offset"], item["bytes"])


def appends(notes: Notes, out: str) -> None:
    import fcntl

    path = os.path.join(out, "c.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    for size in (10, 4000, 1, 8193):
        append(notes, fd, path, b"L" * size)
    os.lseek(fd, 0, os.SEEK_SET)
    append(notes, fd, path, b"M" * 5)
    fcntl.fcntl(fd, fcntl.F_SETFL, 0)
    os.lseek(fd, 2, os.SEEK_SET)
    write(notes, fd, path, b"N" * 3)
    os.close(fd)


def threads_and_dirfd(notes: Notes, out: str) -> None:
    sub = os.path.join(out, "sub")
    os.mkdir(sub)
    dirfd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY)
    path = os.path.join(sub, "b.bin")
    fd0 = os.open("b.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dirfd)
    os.close(fd0)

    def worker(index: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        os.lseek(fd, index * 65536, os.SEEK_SET)
        for size in (512, 3000, 65536 - 3512):
            write(notes, fd, path, bytes([65 + index]) * size)
        notes.add("write", path, 300000 + index * 4096, os.pwrite(fd, b"T" * 4096, 300000 + index * 4096))
        os.close(fd)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.close(dirfd)


def direct_io(notes: Notes, out: str) -> None:
    path = os.path.join(out, "d.direct")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    except OSError:
        return
    buf = mmap.mmap(-1, 8192)
    buf.write(b"Z" * 8192)
    try:
        write(notes, fd, path, buf)
        notes.add("write", path, 65536, os.pwrite(fd, buf, 65536))
    except OSError:
        pass
    finally:
        os.close(fd)
        buf.close()


def reads_renames_unlinks(notes: Notes, out: str, a_path: str) -> None:
    fd = os.open(a_path, os.O_RDONLY)
    offset = position(fd)
    notes.add("read", a_path, offset, len(os.read(fd, 1000)))
    os.lseek(fd, 4000, os.SEEK_SET)
    notes.add("read", a_path, 4000, len(os.read(fd, 200)))
    notes.add("read", a_path, 100, len(os.pread(fd, 50, 100)))
    offset = position(fd)
    buffers = [bytearray(16), bytearray(4096)]
    notes.add("read", a_path, offset, os.readv(fd, buffers))
    os.close(fd)
    final = os.path.join(out, "a.final")
    os.rename(a_path, final)
    tmp = os.path.join(out, "gone.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    write(notes, fd, tmp, b"u" * 10)
    os.close(fd)
    os.unlink(tmp)


def main(out: str, expected_path: str) -> None:
    out = os.path.realpath(out)
    os.makedirs(out, exist_ok=True)
    notes = Notes()
    a_path = positions_and_dups(notes, out)
    appends(notes, out)
    threads_and_dirfd(notes, out)
    direct_io(notes, out)
    reads_renames_unlinks(notes, out, a_path)
    with open(expected_path, "w") as handle:
        json.dump(notes.items, handle, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
