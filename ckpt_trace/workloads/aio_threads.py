"""Two threads submitting batches of O_DIRECT iocbs to one shared AIO context, the way DeepSpeed's aio handle does.

``python -m ckpt_trace.workloads.aio_threads OUT_DIR LOG_JSON [IOCBS_PER_THREAD]`` opens
``OUT_DIR/aio0.bin`` and ``OUT_DIR/aio1.bin`` with O_DIRECT, and each of two threads
writes its file in 4 KiB iocbs, ``io_submit`` carrying 1 to 4 of them at a time
(a seeded choice), reusing the same four iocb structures for every batch. Both
threads reap completions from the one context (``io_getevents``, so a thread
often reaps the other's), and a thread submits its next batch once every iocb
of the last one is seen completed. LOG_JSON receives the program's own list of
what it submitted: ``[path, "write", offset, bytes]`` per iocb, the reference a
trace is compared with (io_submit(2), io_getevents(2); include/uapi/linux/aio_abi.h).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import sys
import threading

from ckpt_trace.iolayer import aio

from .logged import run_logged

BLOCK_BYTES = 4096


def run(out: str, iocbs_per_thread: int = 192, threads: int = 2) -> list[list]:
    """Do the writes; return the submission log (see the module docstring). Raises OSError, AssertionError
    (a completion other than a full block)."""
    setup, destroy, getevents, submit = aio._numbers()
    ctx = ctypes.c_ulong(0)
    aio._call(setup, ctypes.c_uint(64), ctypes.byref(ctx))
    memory = mmap.mmap(-1, threads * iocbs_per_thread * BLOCK_BYTES)
    base = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    for t in range(threads):
        memory[t * iocbs_per_thread * BLOCK_BYTES : (t + 1) * iocbs_per_thread * BLOCK_BYTES] = bytes([65 + t]) * (
            iocbs_per_thread * BLOCK_BYTES
        )
    lock = threading.Lock()
    completed: set[int] = set()
    log: list[list] = []
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        path = os.path.join(out, f"aio{t}.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            rng = random.Random(t)
            iocbs = [ctypes.create_string_buffer(aio._IOCB.size) for _ in range(4)]
            pointers = (ctypes.c_void_p * 4)(*[ctypes.addressof(b) for b in iocbs])
            events = ctypes.create_string_buffer(aio._EVENT.size * 4)
            done = 0
            while done < iocbs_per_thread:
                n = min(rng.randint(1, 4), iocbs_per_thread - done)
                tags = []
                for i in range(n):
                    tag = (t << 32) | (done + i)
                    block = t * iocbs_per_thread + done + i
                    ctypes.memmove(
                        iocbs[i],
                        aio._IOCB.pack(
                            tag,
                            0,
                            0,
                            aio.IOCB_CMD_PWRITE,
                            0,
                            fd,
                            base + block * BLOCK_BYTES,
                            BLOCK_BYTES,
                            (done + i) * BLOCK_BYTES,
                            0,
                            0,
                            0,
                        ),
                        aio._IOCB.size,
                    )
                    tags.append(tag)
                got = aio._call(submit, ctypes.c_ulong(ctx.value), ctypes.c_long(n), pointers)
                if got != n:
                    raise OSError(0, f"io_submit accepted {got} of {n} iocbs")
                with lock:
                    log.extend([path, "write", (done + i) * BLOCK_BYTES, BLOCK_BYTES] for i in range(n))
                while True:
                    with lock:
                        if all(tag in completed for tag in tags):
                            break
                    timeout = (ctypes.c_long * 2)(0, 2_000_000)  # 2 ms: the other thread may reap ours
                    got = aio._call(
                        getevents, ctypes.c_ulong(ctx.value), ctypes.c_long(1), ctypes.c_long(4), events, timeout
                    )
                    with lock:
                        for k in range(got):
                            tag, _, res, _ = aio._EVENT.unpack_from(events, k * aio._EVENT.size)
                            if res != BLOCK_BYTES:
                                raise OSError(-res if res < 0 else 0, f"an iocb completed with {res}")
                            completed.add(tag)
                done += n
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)
        finally:
            os.close(fd)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    aio._call(destroy, ctypes.c_ulong(ctx.value))
    if errors:
        raise errors[0]
    return log


def main(argv: list[str]) -> int:
    return run_logged(argv, run, 192)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
