"""In-kernel copies the way checkpoint engines make them: sendfile, copy_file_range, splice and FICLONE.

``python -m ckpt_trace.workloads.copies OUT_DIR LOG_JSON [SIZE_BYTES]`` writes ``OUT_DIR/source.bin``
(SIZE_BYTES, 1 MiB by default, of a seeded pattern), then copies it whole four ways:

- ``sendfile.bin``: sendfile(2) with an offset pointer (the source's position stays put), as
  DeepSpeed's and ``shutil.copyfile``'s fast path do, in calls of at most 256 KiB;
- ``copy_file_range.bin``: copy_file_range(2) with NULL offsets (both positions advance);
- ``splice.bin``: splice(2) from the source into a pipe and from the pipe into the copy, with an
  explicit source offset and the destination's position;
- ``ficlone.bin``: ioctl FICLONE, a reflink (EOPNOTSUPP on file systems without them, such as ext4,
  in which case the call is still made and logged with its error), then FICLONERANGE of the first
  64 KiB into ``ficlonerange.bin``.

LOG_JSON receives the program's own log, one ``[interface, source, destination, source offset,
destination offset, bytes asked, result]`` per call (sources: sendfile(2), copy_file_range(2),
splice(2), ioctl_ficlone(2)).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import sys

from .logged import run_logged

FICLONE = 0x40049409
FICLONERANGE = 0x4020940D
F_SETPIPE_SZ = 1031
CHUNK_BYTES = 256 << 10


def _pattern(size: int) -> bytes:
    block = bytes((i * 7 + 3) & 0xFF for i in range(4096))
    return (block * (size // 4096 + 1))[:size]


def _ioctl(fd: int, cmd: int, arg) -> int:
    try:
        fcntl.ioctl(fd, cmd, arg)
        return 0
    except OSError as err:
        return -(err.errno or 0)


def run(out: str, size: int = 1 << 20) -> list[list]:
    """Make the copies; return the log (see the module docstring). Raises OSError."""
    source = os.path.join(out, "source.bin")
    with open(source, "wb") as handle:
        handle.write(_pattern(size))
    log: list[list] = []
    src = os.open(source, os.O_RDONLY)
    try:

        def target(name: str) -> tuple[int, str]:
            path = os.path.join(out, name)
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), path

        dst, path = target("sendfile.bin")
        offset = 0
        while offset < size:
            count = min(CHUNK_BYTES, size - offset)
            got = os.sendfile(dst, src, offset, count)
            log.append(["sendfile", source, path, offset, offset, count, got])
            offset += got
        os.close(dst)

        dst, path = target("copy_file_range.bin")
        os.lseek(src, 0, os.SEEK_SET)
        done = 0
        while done < size:
            got = os.copy_file_range(src, dst, size - done)
            log.append(["copy_file_range", source, path, done, done, size - done, got])
            done += got
        os.close(dst)

        dst, path = target("splice.bin")
        pipe_r, pipe_w = os.pipe()
        try:
            fcntl.fcntl(pipe_w, F_SETPIPE_SZ, CHUNK_BYTES)
            done = 0
            while done < size:
                count = min(CHUNK_BYTES, size - done)
                into = os.splice(src, pipe_w, count, offset_src=done)
                log.append(["splice", source, None, done, None, count, into])
                left = into
                while left:
                    got = os.splice(pipe_r, dst, left)
                    log.append(["splice", None, path, None, done + into - left, left, got])
                    left -= got
                done += into
        finally:
            os.close(pipe_r)
            os.close(pipe_w)
        os.close(dst)

        dst, path = target("ficlone.bin")
        log.append(["ficlone", source, path, 0, 0, size, _ioctl(dst, FICLONE, src)])
        os.close(dst)
        dst, path = target("ficlonerange.bin")
        length = min(size, 64 << 10)
        log.append(
            ["ficlone", source, path, 0, 0, length, _ioctl(dst, FICLONERANGE, struct.pack("<qQQQ", src, 0, length, 0))]
        )
        os.close(dst)
    finally:
        os.close(src)
    for entry in log:
        if (
            entry[-1] < 0
            and entry[0] != "ficlone"
            or entry[0] == "ficlone"
            and entry[-1] not in (0, -errno.EOPNOTSUPP, -errno.EXDEV, -errno.EINVAL)
        ):
            raise OSError(-entry[-1], f"{entry[0]} failed: {os.strerror(-entry[-1])}")
    return log


def main(argv: list[str]) -> int:
    return run_logged(argv, run, 1 << 20)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
