"""Tunables, one place, each overridable by an environment variable.

``CKPT_TRACE_<NAME>`` overrides ``<NAME>``; values are read once at import.
"""

from __future__ import annotations

import os


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(f"CKPT_TRACE_{name}")
    if raw is None or raw == "":
        return default
    try:
        return int(raw, 0)
    except ValueError:
        return default


def _str_env(name: str, default: str) -> str:
    return os.environ.get(f"CKPT_TRACE_{name}") or default


# Tracer
BPF_PATH_BYTES = _int_env("BPF_PATH_BYTES", 256)  # bytes of each path copied by the BPF program
BPF_RINGBUF_PAGES = _int_env("BPF_RINGBUF_PAGES", 16384)  # 64 MiB for calls with paths (power of two pages)
BPF_COMPACT_RINGBUF_PAGES = _int_env("BPF_COMPACT_RINGBUF_PAGES", 16384)  # 64 MiB for the other calls' records
BPF_AUX_RINGBUF_PAGES = _int_env("BPF_AUX_RINGBUF_PAGES", 8192)  # 32 MiB for requests and mapped pages
BPF_URING_INFLIGHT_ENTRIES = _int_env("BPF_URING_INFLIGHT_ENTRIES", 65536)  # io_uring requests tracked at once
BPF_MAX_IOVECS = _int_env("BPF_MAX_IOVECS", 64)  # iovecs summed in BPF for readv/writev sizes
BPF_OMIT_TRACEPOINTS = _str_env("BPF_OMIT_TRACEPOINTS", "")  # page tracepoints left out (tests: an older kernel)
BPF_MAX_IOCBS = _int_env("BPF_MAX_IOCBS", 128)  # iocbs (io_events) read per io_submit (io_getevents); more: lost
BPF_INFLIGHT_ENTRIES = _int_env("BPF_INFLIGHT_ENTRIES", 65536)  # concurrent syscalls tracked
BPF_IGNORED_FDS = _int_env("BPF_IGNORED_FDS", 262144)  # (tgid, fd) pairs filtered in the kernel
BPF_POLL_MS = _int_env("BPF_POLL_MS", 50)
# least ms between two passes of the reader over the rings (bcc_backend.consume_gap_s)
BPF_CONSUME_GAP_MS = _int_env("BPF_CONSUME_GAP_MS", 2)
BPF_PROGRAM_CACHE = _int_env("BPF_PROGRAM_CACHE", 1)  # 0: compile with clang at every start (tracer.bpfcache)
BPF_CACHE_ENTRIES = _int_env("BPF_CACHE_ENTRIES", 16)  # compiled programs kept per kernel (bpfcache.prune)
BPF_WAKE_EVERY = _int_env("BPF_WAKE_EVERY", 512)  # records between reader wakeups (at most 1/16 of a ring)
STRACE_BIN = _str_env("STRACE_BIN", "strace")
STRACE_STRING_BYTES = _int_env("STRACE_STRING_BYTES", 1024)  # strace -s: bounds iovec arrays and envp strings
CACHE_DIR = _str_env(
    "CACHE_DIR", os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckpt-trace")
)  # per-kernel facts the tracer keeps (tracer.costs)
TRACE_BATCH_ROWS = _int_env("TRACE_BATCH_ROWS", 65536)
RECORD_RUN_ROWS = _int_env("RECORD_RUN_ROWS", 1 << 18)  # rows the recorder holds before spilling a sorted run
RECORD_RAW_BYTES = _int_env("RECORD_RAW_BYTES", 64 << 20)  # raw BPF records held before compressing them to disk
RECORD_REORDER_SLACK_NS = _int_env("RECORD_REORDER_SLACK_NS", 1_000_000_000)  # see state.EffectOrderFeeder
RECORD_RENAME_HELD_ROWS = _int_env(
    "RECORD_RENAME_HELD_ROWS", 1 << 20
)  # rows held for --path-filter's renames (tracer.renames)
RECORD_DECODE_EVENTS = _int_env("RECORD_DECODE_EVENTS", 65536)  # events decoded and fed at a time
RECORD_STREAM = _int_env("RECORD_STREAM", 1)  # bcc: decode while the command runs (0: after it exits)
# bcc, streaming: raw bytes the decoder gathers before a feed, or the milliseconds it waits for them
RECORD_DECODE_BATCH_BYTES = _int_env("RECORD_DECODE_BATCH_BYTES", 4 << 20)
RECORD_DECODE_BATCH_WAIT_MS = _int_env("RECORD_DECODE_BATCH_WAIT_MS", 250)
RECORD_RELEASE_EVERY = _int_env("RECORD_RELEASE_EVERY", 4096)  # events between two re-ordered feedings
# bcc: read/write calls decoded and fed as columns (tracer.datacalls); 0: one SyscallEvent each, as before
RECORD_DATA_COLUMNS = _int_env("RECORD_DATA_COLUMNS", 1)
# bcc: io_uring_enter calls and io_uring requests decoded and fed as columns (tracer.ringcalls); 0: one event each
RECORD_RING_COLUMNS = _int_env("RECORD_RING_COLUMNS", 1)

# Replay
REPLAY_MAX_IO_BYTES = _int_env("REPLAY_MAX_IO_BYTES", 64 << 20)  # largest single synthetic buffer
REPLAY_FREE_SPACE_MARGIN_BYTES = _int_env("REPLAY_FREE_SPACE_MARGIN_BYTES", 64 << 20)
REPLAY_NAMED_PATH_MIN_SHARE = 0.9  # a strategy whose named data path carried less of the bytes is flagged
REPLAY_MIN_ROUNDS = _int_env(
    "REPLAY_MIN_ROUNDS", 3
)  # a replay's default rounds (each strategy once per round): at least,
REPLAY_MAX_ROUNDS = _int_env("REPLAY_MAX_ROUNDS", 20)  # at most,
REPLAY_BUDGET_S = float(
    _int_env("REPLAY_BUDGET_S", 60)
)  # and no new round once the runs' measured time reached this (replayer.verdicts)
REPLAY_VERDICT_MIN_COVERAGE = 0.9  # an interval covering less (fewer than 5 rounds) is "within noise"
REPLAY_MIN_JUDGE_BYTES = _int_env("REPLAY_MIN_JUDGE_BYTES", 64 << 10)  # data bytes under which nothing is judged
REPLAY_MAX_RUNS = _int_env("REPLAY_MAX_RUNS", 200)  # most runs --min-seconds may ask of one strategy

# Regression checks (baseline / check): each figure is the median of at least CHECK_MIN_RUNS runs adding up to
# CHECK_MIN_SECONDS of measured time. benchmarks/check_stability.py on this project's 2-core VM, unchanged
# storage, the golden traces (12-17 ms replays), 16 figures x 4 rounds: one run per figure flagged 5 to 13
# figures a round as regressed; with 1 s of runs (63-66 runs) none, the short traces being reported as too
# noisy to judge at 10 % instead (docs/CHECKS.md).
CHECK_MIN_RUNS = _int_env("CHECK_MIN_RUNS", 5)
CHECK_MIN_SECONDS = float(os.environ.get("CKPT_TRACE_CHECK_MIN_SECONDS") or 1.0)

# Checkpoint writer/reader (ckpt_trace.writer); the emitted module pins its own values
WRITER_BUFFER_BYTES = _int_env("WRITER_BUFFER_BYTES", 4 << 20)  # one staging buffer = one aligned write
WRITER_QUEUE_DEPTH = _int_env("WRITER_QUEUE_DEPTH", 8)  # io_uring requests in flight per writer thread
WRITER_THREADS = _int_env("WRITER_THREADS", 1)  # writer threads per rank, one data file each
WRITER_ALIGN_BYTES = _int_env("WRITER_ALIGN_BYTES", 4096)  # O_DIRECT offset/size/address alignment
WRITER_ITEM_ALIGN_BYTES = _int_env("WRITER_ITEM_ALIGN_BYTES", 64)  # each tensor starts at a multiple of this
# 0: staging copies by torch's copy_ on its OpenMP threads (writer.staging.copy_bytes; the before of
# benchmarks/ranks_per_node.py); 1: one memmove on the calling thread
WRITER_SINGLE_THREAD_COPIES = _int_env("WRITER_SINGLE_THREAD_COPIES", 1)
# The checksum kind the emitted writer records per item, "crc32" or "crc32c"; "" chooses (writer.checksum)
WRITER_CHECKSUM_KIND = _str_env("WRITER_CHECKSUM_KIND", "")
# Page-locked staging kept between saves (writer.staging.PINNED_POOL): 8 x 4 MiB x 8 threads by default.
PINNED_POOL_BYTES = _int_env("PINNED_POOL_BYTES", 256 << 20)
# The share of a data file's pages in the page cache from which the reader reads it buffered (warm).
READER_WARM_SHARE = float(os.environ.get("CKPT_TRACE_READER_WARM_SHARE") or 0.9)
# 1: the emitted reader copies what the page cache holds out of a mapping of the file (writer.load,
# iolayer.ring.copy_mapped); 0: with preadv(2) (a file truncated by another process during a load then
# fails the load with a one-line error rather than SIGBUS)
READER_MAPPED_COPY = _int_env("READER_MAPPED_COPY", 1)
# Checksum CRC-32 in the same pass as the copy where the CPU has AVX-512 and VPCLMULQDQ: the reader's warm mapped
# copy and the writer's staging copies (iolayer.ring.fused_crc_copy); 0 checksums first and copies after
ONE_PASS_CHECKS = _int_env("ONE_PASS_CHECKS", 1)
# The emitted reader's cold way measured per device, kept for later processes of the same boot (writer.load);
# "" keeps it in the measuring process only
READER_COLD_WAYS = _str_env("READER_COLD_WAYS", os.path.join(CACHE_DIR, "reader-cold-ways.json"))

# Micro-benchmark (ckpt-trace bench)
BENCH_SETUP_TIMEOUT_S = _int_env("BENCH_SETUP_TIMEOUT_S", 120)  # longest a point's processes may take to start
BENCH_FREE_SPACE_MARGIN_BYTES = _int_env("BENCH_FREE_SPACE_MARGIN_BYTES", 16 << 20)
BENCH_TOP_ROWS = _int_env("BENCH_TOP_ROWS", 8)  # fastest configurations listed
BENCH_NEAR_BEST_PERCENT = _int_env("BENCH_NEAR_BEST_PERCENT", 5)  # points this close to the best are counted as ties
BENCH_READ_MEMORY_FRACTION = 0.8  # share of the available memory read points may fill with their destinations

# Longest the checkpoint layout may take to build after `record` (and in `annotate`); files left are unknown.
LAYOUT_TIME_LIMIT_S = _int_env("LAYOUT_TIME_LIMIT_S", 60)
