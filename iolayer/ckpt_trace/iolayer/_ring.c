/*
 * ckpt-trace's io_uring and POSIX issuing loops, in C, over the kernel ABI.
 *
 * No liburing: io_uring_setup(2), io_uring_enter(2) and io_uring_register(2)
 * are called directly and the rings are mapped as the io_uring(7) man page and
 * the kernel's Documentation/ describe, so this builds wherever <linux/io_uring.h>
 * (linux-libc-dev) is installed and runs on any kernel with io_uring (5.1+;
 * IORING_OP_READ/WRITE need 5.6). Loaded by ckpt_trace.iolayer.ring with
 * ctypes, which releases the GIL around every call here.
 *
 * Why C: from Python, one request per io_uring_enter through a ctypes binding
 * issued 77 k operations/s, 0.17x fio at queue depth 32 (issue 10). Here a whole
 * array of requests is submitted and reaped by one call: ckr_submit/ckr_reap for
 * callers that keep their own loop (the checkpoint writer), ckr_run for a batch
 * of independent requests kept at a queue depth (the replayer, the bench), and
 * ckr_pio_run for the same batch through plain pread(2)/pwrite(2)/fsync(2).
 * ckr_copy_mapped copies pieces of a file the page cache holds into memory out
 * of a mapping, checksumming each while it is in the core's cache (the emitted
 * reader's warm loads).
 *
 * Memory ordering follows io_uring(7): the SQ tail and CQ head are published
 * with release stores, the SQ head and CQ tail read with acquire loads. The
 * same two operations are exported for Python readers of other shared rings
 * (ckr_load_acquire_u64, ckr_store_release_u64, ckr_fence_acquire: the BPF
 * ring buffer reader, ckpt_trace.tracer.ringbuf), which numpy cannot order.
 *
 * ABI: ckr_abi_version() returns CKR_ABI_VERSION, which ring.py compares with
 * its own ABI_VERSION before binding anything, so a library built from an older
 * source is refused with one line instead of being called with the wrong
 * argument types. Bump both together whenever a signature or a struct changes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The version of the interface below (function signatures, ckr_req): ring.py's ABI_VERSION.
 * Overridable with -DCKR_ABI_VERSION=N only so that the test can build a mismatched library. */
#ifndef CKR_ABI_VERSION
#define CKR_ABI_VERSION 6
#endif

int ckr_abi_version(void) { return CKR_ABI_VERSION; }

/* Acquire load, release store and acquire fence for memory shared with another producer (a BPF
 * ring buffer's producer_pos and consumer_pos, Documentation/bpf/ringbuf.rst), as callable functions. */
uint64_t ckr_load_acquire_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void ckr_store_release_u64(uint64_t *p, uint64_t value) { __atomic_store_n(p, value, __ATOMIC_RELEASE); }
void ckr_fence_acquire(void) { __atomic_thread_fence(__ATOMIC_ACQUIRE); }

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif
#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif
#ifndef __NR_io_uring_register
#define __NR_io_uring_register 427
#endif

/* One request, as Python packs it (ckpt_trace.iolayer.ring.REQUEST_DTYPE): 40 bytes. */
typedef struct {
    uint8_t opcode;     /* IORING_OP_READ, _WRITE, _READ_FIXED, _WRITE_FIXED, _FSYNC, _READV, _WRITEV, _NOP */
    uint8_t sqe_flags;  /* IOSQE_* */
    uint16_t buf_index; /* registered buffer, for the _FIXED opcodes */
    int32_t fd;
    uint64_t addr;      /* buffer address (or iovec array for READV/WRITEV) */
    uint32_t len;       /* bytes (or iovec count) */
    uint32_t op_flags;  /* rw_flags, or fsync_flags (IORING_FSYNC_DATASYNC) */
    uint64_t off;       /* file offset; (uint64_t)-1: the file position */
    uint64_t user_data;
} ckr_req;

typedef struct {
    uint64_t user_data;
    int32_t res;
    uint32_t flags;
} ckr_cqe;

typedef struct {
    int fd;
    unsigned sq_entries, cq_entries, features, setup_flags;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    struct io_uring_sqe *sqes;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_cqe *cqes;
    void *sq_map, *cq_map;
    size_t sq_map_bytes, cq_map_bytes, sqes_bytes;
} ckr_ring;

static int sys_setup(unsigned entries, struct io_uring_params *p) {
    return (int)syscall(__NR_io_uring_setup, entries, p);
}

static int sys_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
    return (int)syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, NULL, 0);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8)
#endif
#ifndef IORING_SETUP_SINGLE_ISSUER
#define IORING_SETUP_SINGLE_ISSUER (1U << 12)
#endif
#ifndef IORING_SETUP_DEFER_TASKRUN
#define IORING_SETUP_DEFER_TASKRUN (1U << 13)
#endif
#define CKR_SETUP_BEST 0xFFFFFFFFU

/* Create a ring of at least `entries` SQEs with io_uring_setup(2) `flags`. 0, or -errno.
 * CKR_SETUP_BEST asks for the cheapest completion handling the kernel has, for a ring used by one
 * thread only: SINGLE_ISSUER | DEFER_TASKRUN (6.1+: completions run when the owner waits, no
 * interrupting task work), else COOP_TASKRUN (5.19+), else none. On a tmpfs, 4 KiB writes at queue
 * depth 32 went from 0.23-0.28 M/s with none to 0.36-0.41 M/s with these (one run each). */
int ckr_setup(unsigned entries, unsigned flags, ckr_ring **out) {
    struct io_uring_params p;
    static const unsigned best[] = {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
                                    IORING_SETUP_COOP_TASKRUN, 0};
    int fd = -1;
    for (unsigned k = 0; k < (flags == CKR_SETUP_BEST ? 3 : 1); k++) {
        memset(&p, 0, sizeof(p));
        p.flags = flags == CKR_SETUP_BEST ? best[k] : flags;
        fd = sys_setup(entries, &p);
        if (fd >= 0 || errno != EINVAL)
            break;
    }
    if (fd < 0)
        return -errno;
    flags = p.flags;
    ckr_ring *r = calloc(1, sizeof(*r));
    if (!r) {
        close(fd);
        return -ENOMEM;
    }
    r->fd = fd;
    r->sq_entries = p.sq_entries;
    r->cq_entries = p.cq_entries;
    r->features = p.features;
    r->setup_flags = flags;
    r->sq_map_bytes = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_map_bytes = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    int single = p.features & IORING_FEAT_SINGLE_MMAP;
    if (single) {
        if (r->cq_map_bytes > r->sq_map_bytes)
            r->sq_map_bytes = r->cq_map_bytes;
        r->cq_map_bytes = r->sq_map_bytes;
    }
    r->sq_map = mmap(NULL, r->sq_map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (r->sq_map == MAP_FAILED)
        goto fail;
    r->cq_map = single ? r->sq_map
                       : mmap(NULL, r->cq_map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                              IORING_OFF_CQ_RING);
    if (r->cq_map == MAP_FAILED)
        goto fail;
    r->sqes_bytes = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED)
        goto fail;
    char *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    *out = r;
    return 0;
fail: {
    int err = errno;
    if (r->sqes && r->sqes != MAP_FAILED)
        munmap(r->sqes, r->sqes_bytes);
    if (r->cq_map && r->cq_map != MAP_FAILED && r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_map_bytes);
    if (r->sq_map && r->sq_map != MAP_FAILED)
        munmap(r->sq_map, r->sq_map_bytes);
    close(fd);
    free(r);
    return -err;
}
}

void ckr_exit(ckr_ring *r) {
    if (!r)
        return;
    munmap(r->sqes, r->sqes_bytes);
    if (r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_map_bytes);
    munmap(r->sq_map, r->sq_map_bytes);
    close(r->fd);
    free(r);
}

int ckr_fd(const ckr_ring *r) { return r->fd; }
unsigned ckr_sq_entries(const ckr_ring *r) { return r->sq_entries; }
unsigned ckr_cq_entries(const ckr_ring *r) { return r->cq_entries; }
unsigned ckr_features(const ckr_ring *r) { return r->features; }
unsigned ckr_setup_flags(const ckr_ring *r) { return r->setup_flags; }

/* io_uring_register(2), as is: 0 or the kernel's value, or -errno. */
int ckr_register(ckr_ring *r, unsigned opcode, void *arg, unsigned nr_args) {
    int ret = (int)syscall(__NR_io_uring_register, r->fd, opcode, arg, nr_args);
    return ret < 0 ? -errno : ret;
}

static unsigned sq_free(const ckr_ring *r) {
    unsigned head = __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
    return r->sq_entries - (*r->sq_tail - head);
}

static void prep(ckr_ring *r, const ckr_req *q, uint64_t user_data, unsigned *tail) {
    unsigned index = *tail & *r->sq_mask;
    struct io_uring_sqe *sqe = &r->sqes[index];
    memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = q->opcode;
    sqe->flags = q->sqe_flags;
    sqe->fd = q->fd;
    sqe->off = q->off;
    sqe->addr = q->addr;
    sqe->len = q->len;
    sqe->rw_flags = q->op_flags;
    sqe->buf_index = q->buf_index;
    sqe->user_data = user_data;
    r->sq_array[index] = index;
    (*tail)++;
}

/* io_uring_enter(2), retried on EINTR. The CQ ring holds twice the SQ entries and no caller keeps
 * more than the SQ entries in flight, so completions never overflow (no EBUSY). */
static int enter(ckr_ring *r, unsigned to_submit, unsigned wait_nr) {
    if (to_submit == 0 && wait_nr == 0)
        return 0;
    for (;;) {
        int ret = sys_enter(r->fd, to_submit, wait_nr, wait_nr ? IORING_ENTER_GETEVENTS : 0);
        if (ret >= 0)
            return ret;
        if (errno != EINTR)
            return -errno;
    }
}

/* SQEs written but not yet consumed by the kernel (it may take fewer than offered). */
static unsigned sq_pending(const ckr_ring *r) {
    return *r->sq_tail - __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
}

/* Queue up to `n` requests (as many as the SQ has room for; user_data from each request) and
 * enter the kernel once, waiting for `wait_nr` completions. Returns how many were queued, or -errno. */
int ckr_submit(ckr_ring *r, const ckr_req *reqs, unsigned n, unsigned wait_nr) {
    unsigned room = sq_free(r);
    unsigned count = n < room ? n : room;
    unsigned tail = *r->sq_tail;
    for (unsigned i = 0; i < count; i++)
        prep(r, &reqs[i], reqs[i].user_data, &tail);
    __atomic_store_n(r->sq_tail, tail, __ATOMIC_RELEASE);
    int ret = enter(r, sq_pending(r), wait_nr);
    return ret < 0 ? ret : (int)count;
}

static unsigned cq_ready(const ckr_ring *r) {
    return __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE) - *r->cq_head;
}

/* Copy up to `max` completions into `out`, first waiting until at least `wait_nr` are posted.
 * Returns how many were copied, or -errno. */
int ckr_reap(ckr_ring *r, ckr_cqe *out, unsigned max, unsigned wait_nr) {
    if (wait_nr > max)
        wait_nr = max;
    while (cq_ready(r) < wait_nr) {
        int ret = enter(r, 0, wait_nr - cq_ready(r));
        if (ret < 0)
            return ret;
    }
    unsigned head = *r->cq_head, count = 0;
    unsigned tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
    while (head != tail && count < max) {
        struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
        out[count].user_data = cqe->user_data;
        out[count].res = cqe->res;
        out[count].flags = cqe->flags;
        count++;
        head++;
    }
    __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
    return (int)count;
}

/* The replay's data: incompressible bytes, unique per 4 KiB block of each file, a pure function of a 64-bit
 * file key and the file offset (so a write at any offset, aligned or not, and a check reading it back agree).
 * Counter mode over 8-byte words: word j of block b of key k is mix(seed(k, b) + j * GOLDEN), little-endian,
 * seed(k, b) = mix(k ^ mix(b * GOLDEN + 1)); mix is SplitMix64's finalizer (Steele, Lea, Flood, "Fast
 * splittable pseudorandom number generators", OOPSLA 2014), a bijection of 64-bit words. Two blocks share
 * no word unless their seeds differ by a multiple of GOLDEN under 512 (about 2^-54 for a pair of blocks).
 * ckpt_trace.iolayer.pattern.data_bytes is the same function in numpy (the reference the tests compare). */
#define CKR_GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t ckr_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* `count` words mix(v), mix(v + GOLDEN), ... to dst (little-endian on x86-64 and arm64). The loop vectorizes;
 * on x86-64 a clone for AVX-512 (64-bit multiplies in vector registers) and one for AVX2 are picked at load
 * time (GCC's target_clones): 2.5x the scalar loop's bytes per second on the development VM. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=skylake-avx512", "avx2", "default"), optimize("O3")))
#endif
static void fill_words(uint8_t *dst, uint64_t v, uint64_t count) {
    uint64_t *out = (uint64_t *)(void *)dst;
    for (uint64_t j = 0; j < count; j++)
        out[j] = ckr_mix(v + j * CKR_GOLDEN);
}

/* Bytes generated at the start of each 4 KiB block (a multiple of 8, 8..4096); the rest of the block is zeros,
 * so a compressor shrinks the block to about unique/4096 of its size while every block stays unique (its first
 * word is its seed's). 4096, the default: nothing compressible. Set by ckr_set_unique_bytes before a replay's
 * runs (replay --data recorded-ratio), never while a fill runs. */
static uint64_t ckr_unique_bytes = 4096;

/* Set the generated bytes per 4 KiB block (rounded down to 8 bytes, at least 8, at most 4096); returns it. */
uint64_t ckr_set_unique_bytes(uint64_t unique) {
    unique &= ~(uint64_t)7;
    ckr_unique_bytes = unique < 8 ? 8 : unique > 4096 ? 4096 : unique;
    return ckr_unique_bytes;
}

/* Fill dst with the `len` bytes of key `key` from file offset `off`: in each 4 KiB block, the generator's bytes
 * before ckr_unique_bytes, zeros from there on. */
void ckr_fill(uint8_t *dst, uint64_t len, uint64_t key, uint64_t off) {
    const uint64_t unique = ckr_unique_bytes;
    while (len) {
        uint64_t in = off & 4095, take = 4096 - in < len ? 4096 - in : len;
        uint64_t seed = ckr_mix(key ^ ckr_mix((off >> 12) * CKR_GOLDEN + 1));
        uint64_t pos = in, end = in + take;
        uint64_t made = end < unique ? end : unique; /* generated bytes end here; zeros from here to end */
        if (made < pos)
            made = pos;
        while (pos < made && (pos & 7)) { /* head: bytes of a partly written word */
            *dst++ = (uint8_t)(ckr_mix(seed + (pos >> 3) * CKR_GOLDEN) >> (8 * (pos & 7)));
            pos++;
        }
        uint64_t words = (made - pos) >> 3;
        fill_words(dst, seed + (pos >> 3) * CKR_GOLDEN, words);
        pos += words << 3;
        dst += words << 3;
        while (pos < made) { /* tail */
            *dst++ = (uint8_t)(ckr_mix(seed + (pos >> 3) * CKR_GOLDEN) >> (8 * (pos & 7)));
            pos++;
        }
        if (pos < end) {
            memset(dst, 0, end - pos);
            dst += end - pos;
        }
        off += take;
        len -= take;
    }
}

/* Requests whose bytes are generated (ckr_run_gen, ckr_pio_run_gen): flags[i] != 0 marks request i. */
typedef struct {
    const uint8_t *flags;
    uint8_t *slots;      /* nslots buffers of slot_bytes each, page-aligned when slot_bytes is whole pages */
    uint64_t slot_bytes;
    uint32_t nslots;
} ckr_gen;

static int is_write(uint8_t opcode) {
    return opcode == IORING_OP_WRITE || opcode == IORING_OP_WRITE_FIXED || opcode == IORING_OP_WRITEV;
}

/* Run `n` independent requests with at most `depth` in flight, as fio does: fill the queue, enter
 * once per batch, reap what has completed. res[i] gets request i's result; lat_ns[i] the time from
 * its submission to the reaping of its completion. Each request's user_data is replaced by its
 * index. With `stop_on_error`, the first failed request or short write stops further submission;
 * what is in flight is still reaped. Returns how many requests completed, or -errno when the ring
 * itself failed (requests then in flight are lost to the caller: close the ring). */
static long run_impl(ckr_ring *r, const ckr_req *reqs, size_t n, unsigned depth, int64_t *res, int64_t *lat_ns,
                     int stop_on_error, const ckr_gen *gen);

long ckr_run(ckr_ring *r, const ckr_req *reqs, size_t n, unsigned depth, int64_t *res, int64_t *lat_ns,
             int stop_on_error) {
    return run_impl(r, reqs, n, depth, res, lat_ns, stop_on_error, NULL);
}

/* ckr_run, where the requests flagged in gen->flags are writes whose bytes are generated (ckr_fill) just before
 * each is queued: such a request's `addr` is its content offset and `user_data` its content key, and it is
 * written from one of gen->nslots slots of gen->slot_bytes (>= its len) at gen->slots, taken while it is in
 * flight (so at most nslots of them are). Returns as ckr_run; -EINVAL when a flagged request exceeds a slot. */
long ckr_run_gen(ckr_ring *r, const ckr_req *reqs, size_t n, unsigned depth, int64_t *res, int64_t *lat_ns,
                 int stop_on_error, const ckr_gen *gen) {
    return run_impl(r, reqs, n, depth, res, lat_ns, stop_on_error, gen);
}

#define SLOT_SHIFT 48 /* an SQE's user_data: request index | (slot + 1) << SLOT_SHIFT */

static long run_impl(ckr_ring *r, const ckr_req *reqs, size_t n, unsigned depth, int64_t *res, int64_t *lat_ns,
                     int stop_on_error, const ckr_gen *gen) {
    size_t next = 0, done = 0;
    unsigned in_flight = 0;
    int failed = 0;
    ckr_cqe batch[64];
    unsigned *free_slots = NULL, n_free = 0;
    if (depth == 0)
        depth = 1;
    if (depth > r->sq_entries)
        depth = r->sq_entries;
    if (gen) {
        if (gen->nslots == 0 || gen->nslots >= 0xFFFF)
            return -EINVAL;
        for (size_t i = 0; i < n; i++)
            if (gen->flags[i] && reqs[i].len > gen->slot_bytes)
                return -EINVAL;
        free_slots = malloc(gen->nslots * sizeof(unsigned));
        if (!free_slots)
            return -ENOMEM;
        for (unsigned s = gen->nslots; s > 0; s--)
            free_slots[n_free++] = s - 1;
    }
    while (done < next || (next < n && !failed)) {
        unsigned tail = *r->sq_tail, queued = 0;
        size_t first = next;
        while (next < n && !failed && in_flight + queued < depth) {
            if (gen && gen->flags[next]) {
                if (n_free == 0)
                    break;
                unsigned slot = free_slots[--n_free];
                ckr_req q = reqs[next];
                uint8_t *buf = gen->slots + (uint64_t)slot * gen->slot_bytes;
                ckr_fill(buf, q.len, q.user_data, q.addr);
                q.addr = (uint64_t)(uintptr_t)buf;
                prep(r, &q, (uint64_t)next | ((uint64_t)(slot + 1) << SLOT_SHIFT), &tail);
            } else {
                prep(r, &reqs[next], (uint64_t)next, &tail);
            }
            next++;
            queued++;
        }
        if (queued) {
            int64_t t = now_ns();
            for (size_t i = first; i < next; i++)
                lat_ns[i] = t;
            __atomic_store_n(r->sq_tail, tail, __ATOMIC_RELEASE);
        }
        in_flight += queued;
        unsigned full = in_flight >= depth || next >= n || failed;
        if (gen && next < n && !failed && gen->flags[next] && n_free == 0)
            full = 1; /* every slot is in flight: wait for one */
        int ret = enter(r, sq_pending(r), full && in_flight ? 1 : 0);
        if (ret < 0) {
            free(free_slots);
            return ret;
        }
        for (;;) {
            int got = ckr_reap(r, batch, 64, 0);
            if (got < 0) {
                free(free_slots);
                return got;
            }
            if (got == 0)
                break;
            int64_t t = now_ns();
            for (int k = 0; k < got; k++) {
                size_t i = (size_t)(batch[k].user_data & ((1ULL << SLOT_SHIFT) - 1));
                unsigned slot = (unsigned)(batch[k].user_data >> SLOT_SHIFT);
                if (slot)
                    free_slots[n_free++] = slot - 1;
                res[i] = batch[k].res;
                lat_ns[i] = t - lat_ns[i];
                in_flight--;
                done++;
                if (stop_on_error && (batch[k].res < 0 ||
                                      (is_write(reqs[i].opcode) && (uint32_t)batch[k].res < reqs[i].len)))
                    failed = 1;
            }
        }
    }
    free(free_slots);
    return (long)done;
}

/* The same batch through synchronous syscalls, one at a time (the POSIX engine): READ and WRITE
 * loop until `len` bytes moved (a read stops early at end of file), off == -1 uses read(2)/write(2)
 * at the file position; FSYNC is fsync(2), or fdatasync(2) with IORING_FSYNC_DATASYNC. Returns how
 * many requests ran; res[i] is the bytes moved or -errno, lat_ns[i] the call's duration. res is 64-bit:
 * one request of up to 4 GiB - 1 moves more than INT32_MAX bytes over several calls (Linux moves at
 * most MAX_RW_COUNT, 2 GiB - 4 KiB, per read(2)/write(2)). */
long ckr_pio_run_gen(const ckr_req *reqs, size_t n, int64_t *res, int64_t *lat_ns, int stop_on_error,
                     const ckr_gen *gen);

long ckr_pio_run(const ckr_req *reqs, size_t n, int64_t *res, int64_t *lat_ns, int stop_on_error) {
    return ckr_pio_run_gen(reqs, n, res, lat_ns, stop_on_error, NULL);
}

/* ckr_pio_run, where the requests flagged in gen->flags are writes of generated bytes, as in ckr_run_gen:
 * each is filled into the first slot just before its call (outside lat_ns). -EINVAL for one larger than a slot. */
long ckr_pio_run_gen(const ckr_req *reqs, size_t n, int64_t *res, int64_t *lat_ns, int stop_on_error,
                     const ckr_gen *gen) {
    if (gen)
        for (size_t i = 0; i < n; i++)
            if (gen->flags[i] && (reqs[i].len > gen->slot_bytes || gen->nslots == 0))
                return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        const ckr_req *q = &reqs[i];
        ckr_req filled;
        if (gen && gen->flags[i]) {
            filled = *q;
            ckr_fill(gen->slots, q->len, q->user_data, q->addr);
            filled.addr = (uint64_t)(uintptr_t)gen->slots;
            q = &filled;
        }
        int64_t t0 = now_ns();
        int64_t moved = 0;
        ssize_t ret = 0;
        switch (q->opcode) {
        case IORING_OP_WRITE:
        case IORING_OP_WRITE_FIXED:
        case IORING_OP_READ:
        case IORING_OP_READ_FIXED: {
            int writing = q->opcode == IORING_OP_WRITE || q->opcode == IORING_OP_WRITE_FIXED;
            char *buf = (char *)(uintptr_t)q->addr;
            while (moved < (int64_t)q->len) {
                size_t want = q->len - moved;
                if (q->off == (uint64_t)-1)
                    ret = writing ? write(q->fd, buf + moved, want) : read(q->fd, buf + moved, want);
                else
                    ret = writing ? pwrite(q->fd, buf + moved, want, (off_t)(q->off + moved))
                                  : pread(q->fd, buf + moved, want, (off_t)(q->off + moved));
                if (ret < 0 && errno == EINTR)
                    continue;
                if (ret <= 0)
                    break;
                moved += ret;
            }
            if (ret < 0 && moved == 0)
                moved = -errno;
            else if (ret == 0 && writing && moved < (int64_t)q->len)
                moved = moved ? moved : -ENOSPC;
            break;
        }
        case IORING_OP_FSYNC:
            ret = (q->op_flags & IORING_FSYNC_DATASYNC) ? fdatasync(q->fd) : fsync(q->fd);
            moved = ret < 0 ? -errno : 0;
            break;
        case IORING_OP_NOP:
            break;
        default:
            moved = -EINVAL;
        }
        res[i] = moved;
        lat_ns[i] = now_ns() - t0;
        if (stop_on_error && (moved < 0 || ((q->opcode == IORING_OP_WRITE || q->opcode == IORING_OP_WRITE_FIXED) &&
                                            moved < (int64_t)q->len)))
            return (long)(i + 1);
    }
    return (long)n;
}

/* ------------------------------------------------------------------------------------------------ */
/* Copies out of the page cache through a mapping (the emitted reader's warm path, writer.load). */

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* One piece: size_bytes at file offset `offset` copied to `dst`; with `check`, `crc` (a running CRC-32,
 * zlib's value, 0 to start) extended over those bytes. Python packs it (ring.PIECE_DTYPE): 32 bytes. */
typedef struct {
    uint64_t dst;
    uint64_t offset;
    uint64_t size_bytes;
    uint32_t check;
    uint32_t crc;
} ckr_piece;

/* A CRC-32 function of zlib's form with a 64-bit length: ISA-L's crc32_gzip_refl (the isal package's
 * isal_zlib extension exports it), whose address Python passes in. */
typedef uint32_t (*ckr_crc_fn)(uint32_t crc, const unsigned char *buf, uint64_t len);

/* Copy with non-temporal stores (SSE2, every x86-64 CPU): the destination's lines go to memory without
 * being read first (no read-for-ownership), so a copy out of the page cache moves each byte through memory
 * twice, not three times. 256 MiB out of a warm mapping on the project's 2-core EPYC, 2 threads: 15-18 ms
 * against 17-23 ms for torch's copy_ and 22-29 ms for preadv(2) (its rep movsb); 128-, 256- and 512-bit
 * stores measured alike (memory-bound). Elsewhere memcpy. */
static void stream_copy(uint8_t *dst, const uint8_t *src, size_t n) {
#if defined(__x86_64__)
    size_t i = 0;
    while (((uintptr_t)(dst + i) & 15) && i < n) {
        dst[i] = src[i];
        i++;
    }
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence(); /* the streamed stores are ordered before anything the caller does next */
    if (i < n)
        memcpy(dst + i, src + i, n - i);
#else
    memcpy(dst, src, n);
#endif
}

/* CRC-32 (zlib's polynomial 0x04C11DB7, reflected; zlib's value and chaining) of `n` bytes at `src`, computed
 * while they are copied to `dst` with non-temporal stores, in one pass: each 256 bytes are loaded into four
 * 512-bit registers once, streamed out from there, and folded into four running remainders by carry-less
 * multiplication (VPCLMULQDQ), as in Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ Instruction" (Intel, 2009), widened to 512 bits; then folded to one 128-bit remainder and
 * reduced to 32 bits by Barrett reduction (the same paper). Each fold constant is x^(D+32) mod P (for the
 * low 64 bits) and x^(D-32) mod P (high), bit-reflected and shifted left by one, D the distance folded in
 * bits: 2048 in the loop, 512, 384, 256 and 128 in the reduction; x^64 mod P and P's Barrett quotient
 * finish it. Needs n a multiple of 256 (n >= 256) and `dst` 64-byte aligned. Checksumming first and copying
 * after (ISA-L's crc32_gzip_refl over each 64 KiB, then stream_copy) reads each chunk into the core's cache
 * and then copies it from there, one after the other: 256 MiB out of a warm mapping on the project's 2-core
 * EPYC, 2 threads, 15 runs each: 18.6-19.3 ms that way, 14.4-15.3 ms fused, 14.6-15.3 ms for the copy
 * alone (2026-11-30). */
#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 8 : defined(__GNUC__) && __GNUC__ >= 8)
#define CKR_FUSED_CRC 1
#define CKR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,vpclmulqdq,pclmul,sse4.1")))

CKR_AVX512 static inline __m512i fold_512(__m512i x, __m512i k, __m512i next) {
    /* x's two 64-bit halves of each lane times the constants, xor'ed with the data D bits on (0x96: a^b^c) */
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11),
                                     next, 0x96);
}

CKR_AVX512 static inline __m128i fold_128(__m128i x, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

CKR_AVX512 static uint32_t copy_crc32_avx512(uint8_t *dst, const uint8_t *src, size_t n, uint32_t crc) {
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x1322d1430, 0x11542778a));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x1c6e41596, 0x154442bd4));
    __m512i a = _mm512_loadu_si512(src), b = _mm512_loadu_si512(src + 64);
    __m512i c = _mm512_loadu_si512(src + 128), d = _mm512_loadu_si512(src + 192);
    _mm512_stream_si512((void *)dst, a);
    _mm512_stream_si512((void *)(dst + 64), b);
    _mm512_stream_si512((void *)(dst + 128), c);
    _mm512_stream_si512((void *)(dst + 192), d);
    a = _mm512_xor_si512(a, _mm512_castsi128_si512(_mm_cvtsi32_si128((int)~crc))); /* zlib's pre-inversion */
    for (size_t i = 256; i < n; i += 256) {
        __m512i na = _mm512_loadu_si512(src + i), nb = _mm512_loadu_si512(src + i + 64);
        __m512i nc = _mm512_loadu_si512(src + i + 128), nd = _mm512_loadu_si512(src + i + 192);
        _mm512_stream_si512((void *)(dst + i), na);
        _mm512_stream_si512((void *)(dst + i + 64), nb);
        _mm512_stream_si512((void *)(dst + i + 128), nc);
        _mm512_stream_si512((void *)(dst + i + 192), nd);
        a = fold_512(a, k2048, na);
        b = fold_512(b, k2048, nb);
        c = fold_512(c, k2048, nc);
        d = fold_512(d, k2048, nd);
    }
    _mm_sfence(); /* the streamed stores are ordered before anything the caller does next */
    a = fold_512(a, k512, b); /* four 512-bit remainders into one, */
    a = fold_512(a, k512, c);
    a = fold_512(a, k512, d);
    __m128i x = fold_128(_mm512_extracti32x4_epi32(a, 0), _mm_set_epi64x(0x174359406, 0x3db1ecdc), /* its lanes */
                         _mm512_extracti32x4_epi32(a, 3));
    x = fold_128(_mm512_extracti32x4_epi32(a, 1), _mm_set_epi64x(0x15a546366, 0xf1da05aa), x);
    const __m128i k128 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    x = fold_128(_mm512_extracti32x4_epi32(a, 2), k128, x);
    const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);
    x = _mm_xor_si128(_mm_srli_si128(x, 8), _mm_clmulepi64_si128(x, k128, 0x10));               /* 128 -> 96 bits */
    x = _mm_xor_si128(_mm_srli_si128(x, 4),                                                     /* 96 -> 64 bits */
                      _mm_clmulepi64_si128(_mm_and_si128(x, low32), _mm_set_epi64x(0, 0x163cd6124), 0x00));
    const __m128i barrett = _mm_set_epi64x(0x1f7011641, 0x1db710641); /* the quotient (high), P (low) */
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, low32), barrett, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
    return ~(uint32_t)_mm_extract_epi32(_mm_xor_si128(x, t), 1); /* zlib's post-inversion */
}
#endif

/* ckr_copy_mapped's flags: checksum with `crc` and copy after, even where one pass is possible. */
#define CKR_COPY_NO_FUSED 1

/* 1 where this build and CPU copy and checksum in one pass (copy_crc32_avx512: AVX-512F/BW/VL and
 * VPCLMULQDQ, the registers' state enabled by the kernel; libgcc's check), else 0. */
int ckr_fused_crc_copy(void) {
#ifdef CKR_FUSED_CRC
    static int supported = -1;
    if (supported < 0) {
        __builtin_cpu_init();
        supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
    }
    return supported;
#else
    return 0;
#endif
}

/* Copy `len` bytes to `dst` and return `crc` extended over them: in one pass (copy_crc32_avx512) for the
 * 256-byte blocks from dst's first 64-byte boundary when `fused`, by `fn` and stream_copy for the rest. */
static uint32_t copy_and_check(uint8_t *dst, const uint8_t *src, size_t len, uint32_t crc, ckr_crc_fn fn, int fused) {
#ifdef CKR_FUSED_CRC
    if (fused) {
        size_t head = (64 - ((uintptr_t)dst & 63)) & 63;
        if (head > len)
            head = len;
        size_t body = (len - head) & ~(size_t)255;
        if (body) {
            if (head) {
                crc = fn(crc, src, head);
                memcpy(dst, src, head);
            }
            crc = copy_crc32_avx512(dst + head, src + head, body, crc);
            dst += head + body;
            src += head + body;
            len -= head + body;
        }
    }
#else
    (void)fused;
#endif
    if (len) {
        crc = fn(crc, src, len);
        stream_copy(dst, src, len);
    }
    return crc;
}

/* Copy `n` bytes from `src` to `dst` (not overlapping) and return `crc` (a running CRC-32, zlib's value) extended
 * over them by `fn`: in one pass where the CPU allows (copy_and_check) unless `flags` has CKR_COPY_NO_FUSED,
 * else checksummed first and copied after, 64 KiB at a time. The emitted writer's staging copies: the bytes
 * it stages are checksummed without a second pass over them. */
uint32_t ckr_copy_crc32(void *dst, const void *src, uint64_t n, uint32_t crc, ckr_crc_fn fn, int flags) {
    const int fused = !(flags & CKR_COPY_NO_FUSED) && ckr_fused_crc_copy();
    uint8_t *d = dst;
    const uint8_t *s = src;
    const uint64_t chunk = 64 << 10;
    for (uint64_t done = 0; done < n; done += chunk) {
        uint64_t len = n - done < chunk ? n - done : chunk;
        crc = copy_and_check(d + done, s + done, len, crc, fn, fused);
    }
    return crc;
}

/* Copy `n` pieces of file `fd` into memory out of a shared read-only mapping of the file, in windows of
 * at most `window_bytes` (mapped and unmapped in turn: the page tables stay bounded), `chunk_bytes` at a
 * time: a checked piece's chunk is checksummed and copied in one pass where the CPU allows
 * (copy_and_check; not with CKR_COPY_NO_FUSED in `flags`), else first checksummed by `crc` where the mapping
 * holds it (which brings it into the core's cache) and then copied from there; the parts the one pass
 * cannot take (before the destination's first 64-byte boundary, the last 255 bytes or fewer of a chunk)
 * go the second way. Pieces are handled in array order; each should lie
 * within the file (a page past its end raises SIGBUS, as with any mapping: the caller checks the size).
 * `*maps` (when not NULL) is increased by the mmap(2) calls made. Returns the bytes copied, or -errno when
 * mmap(2) fails (pieces before it are done). */
long ckr_copy_mapped(int fd, ckr_piece *pieces, size_t n, ckr_crc_fn crc, uint64_t window_bytes,
                     uint64_t chunk_bytes, int flags, uint64_t *maps) {
    const int fused = !(flags & CKR_COPY_NO_FUSED) && ckr_fused_crc_copy();
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint8_t *map = NULL;
    uint64_t map_start = 0, map_bytes = 0;
    long copied = 0;
    if (window_bytes < page)
        window_bytes = page;
    if (chunk_bytes == 0)
        chunk_bytes = 64 << 10;
    for (size_t k = 0; k < n; k++) {
        ckr_piece *p = &pieces[k];
        uint8_t *dst = (uint8_t *)(uintptr_t)p->dst;
        uint64_t done = 0;
        while (done < p->size_bytes) {
            uint64_t off = p->offset + done;
            uint64_t len = p->size_bytes - done < chunk_bytes ? p->size_bytes - done : chunk_bytes;
            if (map == NULL || off < map_start || off + len > map_start + map_bytes) {
                if (map != NULL)
                    munmap(map, map_bytes);
                map_start = off & ~(page - 1);
                map_bytes = window_bytes;
                if (map_bytes < off + len - map_start)
                    map_bytes = (off + len - map_start + page - 1) & ~(page - 1);
                map = mmap(NULL, map_bytes, PROT_READ, MAP_SHARED, fd, (off_t)map_start);
                if (map == MAP_FAILED) {
                    map = NULL;
                    return -errno;
                }
                if (maps != NULL)
                    (*maps)++;
            }
            const uint8_t *src = map + (off - map_start);
            if (p->check && crc != NULL)
                p->crc = copy_and_check(dst + done, src, len, p->crc, crc, fused);
            else
                stream_copy(dst + done, src, len);
            done += len;
            copied += (long)len;
        }
    }
    if (map != NULL)
        munmap(map, map_bytes);
    return copied;
}
