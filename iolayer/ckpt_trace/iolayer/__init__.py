"""The one I/O layer, torch-free: used by the replayer, the emitted writer and reader, and the bench.

- ``ring``: one io_uring per thread, batched submission, per-key drain,
  registered buffers, a latency hook; whole batches issued in C (``Ring.run``)
  and the POSIX engine's loop (``pio_run``); ``probe`` for queue depths.
- ``posix_ring``: the ring's request-by-request interface on
  os.preadv/os.pwritev, which ``ring.open_ring`` falls back to (one line).
- ``buffers``: page-aligned buffers, and the pattern buffer every writer of
  ours takes its bytes from; ``pattern``: that content, checkable.
- ``files``: open with an O_DIRECT fallback that says so, fallocate,
  sync_file_range, directory fsync.
- ``host``: mounts, block size, free space, device, the environment a
  measurement records, dropping the page cache.
- ``outputs``: the checks every command runs on its outputs before it starts.
- ``beneath``: a directory held open and every file operation beneath it
  (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or an O_NOFOLLOW walk);
  cleanup by (device, inode) of what it created.

Imports only the exception family (``ckpt_trace.errors``) and ``formats``.
"""
