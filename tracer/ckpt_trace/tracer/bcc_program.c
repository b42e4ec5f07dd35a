// ckpt-trace eBPF program (bcc). Syscall tracepoints only: no kprobes, no fentry.
// One program on raw_syscalls:sys_enter dispatches on the syscall number; the
// switch cases are generated per traced call by ckpt_trace.tracer.bcc_backend.
// Two tracepoints instead of one pair per syscall: each detach waits for an RCU
// grace period, and ninety of them took seconds at exit.
//
// Flow: sys_enter_* copies the arguments (and path strings, iovec lengths) of a
// traced thread group into a per-thread in-flight slot; sys_exit_* completes it
// with the return value and duration and pushes it to a ring buffer: `events` for
// the calls that carry strings (paths; io_uring_register's fds in the path buffer),
// `compact` for the others, as the record's fixed header alone (a write's record is
// 144 bytes there instead of 656, so a storm of small writes fits the ring 4.5x
// longer while the reader waits for a core). A failed ring-buffer reservation or a
// full in-flight map increments lost[0].
//
// In-kernel filtering drops only what the user-space builder would drop anyway:
// an open of an absolute path with no empty, "." or ".." component that the path
// filters exclude marks the returned (tgid, fd) in `ignored`; later calls on a
// marked descriptor are dropped, dups of it are marked too, and any traced call
// that creates a descriptor clears the mark of the number it returns. A stale
// mark can only hide calls on descriptors no traced call created (pipes,
// sockets), which the builder does not record.
//
// Beyond syscalls (format version 2): io_uring requests from the io_uring_submit_req /
// io_uring_complete tracepoints, reading each request's fd, offset, length and flags from the
// kernel's struct io_kiocb at offsets the tracer computed from the running kernel's BTF (no
// kprobes, no struct layouts from headers); libaio iocbs and io_events read from user memory at the
// exits of io_submit and io_getevents; and the file pages processes touch through mappings, from
// the filemap and writeback tracepoints, restricted in the kernel to the inodes traced processes
// mapped (read through task->files at mmap's exit, again at BTF offsets). These go to a second
// ring buffer, `aux`.
#include <asm/unistd.h>

#define PATH_BYTES __PATH_BYTES__
#define MAX_IOVECS __MAX_IOVECS__
#define URING __URING__
#define MAPPED __MAPPED__
#define FOLIOS __FOLIOS__
#define RSS __RSS__
#define OMIT_FAULT __OMIT_FAULT__
#define OMIT_MAP_PAGES __OMIT_MAP_PAGES__
#define OMIT_DIRTY __OMIT_DIRTY__
#define OMIT_RSS __OMIT_RSS__
#define CACHE_INSERT __CACHE_INSERT__
#define INSERT_ORDER __INSERT_ORDER__
#define MAX_IOCBS __MAX_IOCBS__
#define MAX_FILTERS __MAX_FILTERS__
#define FILTER_WORDS (PATH_BYTES / 8)
#define MAX_FIXED_FDS (PATH_BYTES / 4)

struct event_t {
    u64 ts_ns;
    u64 dur_ns;
    u32 pid;
    u32 tid;
    s32 nr;
    u32 truncated;
    u32 ignore;
    u32 creates;
    s64 ret;
    s64 a[6];
    s64 size;
    s64 extra;
    u64 ino;
    u32 dev;
    u32 nfds;
    char comm[16];
    char path[PATH_BYTES];
    char path2[PATH_BYTES];
};


// aux_t.kind
#define AUX_URING_REQ 1
#define AUX_URING_CREATE 2
#define AUX_AIO_SUBMIT 3
#define AUX_AIO_EVENT 4
#define AUX_FAULT 5
#define AUX_MAP_PAGES 6
#define AUX_DIRTY 7
#define AUX_RSS 8
#define AUX_CACHE_INSERT 9

struct aux_t {
    u64 ts_ns;
    u64 dur_ns;
    u32 pid;
    u32 tid;
    u32 kind;
    s32 fd;
    u64 ctx;
    u64 obj;
    u64 user_data;
    s64 offset;
    s64 len;
    s64 res;
    u64 addr;
    u64 ino;
    u64 index;
    u64 last_index;
    u32 dev;
    u32 opcode;
    u32 flags;
    u32 in_flight;
    u32 fixed;
    u32 vectored;
    char comm[16];
};

struct iovec_t {
    u64 base;
    u64 len;
};

BPF_RINGBUF_OUTPUT(events, __RINGBUF_PAGES__);
BPF_RINGBUF_OUTPUT(compact, __COMPACT_PAGES__);
BPF_RINGBUF_OUTPUT(aux, __AUX_PAGES__);

// Adaptive notification (bpf_ringbuf_output(), include/uapi/linux/bpf.h): a record wakes the reader only
// every __WAKE_EVERY__ records of a CPU; the reader also polls every BPF_POLL_MS and drains at the end.
// At ~100k io_uring requests a second, a wakeup per record costs the traced program more than the record.
BPF_PERCPU_ARRAY(wake_count, u64, 1);

// For `count` records sent now: one wakeup when the CPU's record count passes a multiple of __WAKE_EVERY__.
static __always_inline u64 wake_flags_batch(u64 count) {
    u32 zero = 0;
    u64 *sent = wake_count.lookup(&zero);
    if (!sent)
        return 0;
    *sent += count;
    return (*sent % __WAKE_EVERY__) < count ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

static __always_inline u64 wake_flags(void) {
    return wake_flags_batch(1);
}
BPF_HASH(mapped_inodes, u64, u8, 65536);
BPF_HASH(traced, u32, u8, 65536);
BPF_HASH(inflight, u32, struct event_t, __INFLIGHT__);
BPF_PERCPU_ARRAY(scratch, struct event_t, 1);
// [0] syscall events, [1] aux events, [2] io_uring requests not tracked (table full), [3] iocbs of io_submit not
// read (beyond MAX_IOCBS, or unreadable), [4] io_events of io_getevents not read (the same); bcc_backend.LOST_REASONS
BPF_ARRAY(lost, u64, 8);

struct fdkey_t {
    u32 tgid;
    s32 fd;
};
BPF_HASH(ignored, struct fdkey_t, u8, __IGNORED_ENTRIES__);

static __always_inline int fd_marked(u32 tgid, s64 fd) {
    struct fdkey_t key = {.tgid = tgid, .fd = (s32)fd};
    return ignored.lookup(&key) != 0;
}

static __always_inline void set_mark(u32 tgid, s64 fd, int marked) {
    struct fdkey_t key = {.tgid = tgid, .fd = (s32)fd};
    if (marked) {
        u8 one = 1;
        ignored.update(&key, &one);
    } else {
        ignored.delete(&key);
    }
}

// 0x80 in each byte of `x` that is 0, else 0: exact, with no carry between bytes (Warren, Hacker's Delight,
// 2nd ed., 6-1, "find leftmost 0-byte"). byte_is: each byte of `x` equal to `c`.
#define BYTES_LOW7 0x7f7f7f7f7f7f7f7fULL
static __always_inline u64 zero_bytes(u64 x) {
    return ~(((x & BYTES_LOW7) + BYTES_LOW7) | x | BYTES_LOW7);
}
static __always_inline u64 byte_is(u64 x, u8 c) {
    return zero_bytes(x ^ (0x0101010101010101ULL * c));
}

// 1 when `path` is absolute with no empty, "." or ".." component, so that prefix tests on the raw string
// agree with tests on the normalised path; 0 for a path of more than PATH_BYTES - 4 bytes. `path` is zero
// past its end (read_path). The test runs on 8-byte words with no branch (the three bytes after each '/'
// are the next word's low bytes shifted in): a byte loop made the verifier walk each of its 253 iterations,
// two thirds of sys_enter's 180,000 instructions walked, 0.2-0.27 s of every start (2026-11-30).
static __always_inline int plain_absolute(const char *path) {
    if (path[0] != '/' || path[PATH_BYTES - 4] != 0)
        return 0;
    const u64 *words = (const u64 *)path;
    u64 bad = 0;
    u64 slash = byte_is(words[0], '/'), dot = byte_is(words[0], '.'), nul = zero_bytes(words[0]);
    // a loop kept as a loop: its body has no branch, so the verifier's walk of it is short, and unrolled it
    // would spill past the 512-byte stack
#pragma clang loop unroll(disable)
    for (int i = 1; i <= FILTER_WORDS; i++) {
        u64 slash1 = 0, dot1 = 0, nul1 = 0x8080808080808080ULL;  // past the buffer: zeros
        if (i < FILTER_WORDS) {
            u64 next = words[i];
            slash1 = byte_is(next, '/');
            dot1 = byte_is(next, '.');
            nul1 = zero_bytes(next);
        }
        // at each byte's place: the byte 1, 2 and 3 after it (little-endian: 8 bits up per byte)
        u64 slash_a = (slash >> 8) | (slash1 << 56), dot_a = (dot >> 8) | (dot1 << 56);
        u64 slash_b = (slash >> 16) | (slash1 << 48), dot_b = (dot >> 16) | (dot1 << 48);
        u64 nul_b = (nul >> 16) | (nul1 << 48);
        u64 slash_c = (slash >> 24) | (slash1 << 40), nul_c = (nul >> 24) | (nul1 << 40);
        bad |= slash & (slash_a | (dot_a & (slash_b | nul_b)) | (dot_a & dot_b & (slash_c | nul_c)));
        slash = slash1;
        dot = dot1;
        nul = nul1;
    }
    return bad == 0;
}

// The path prefixes, data rather than code so that one compiled program serves every --path-filter
// (tracer.bpfcache): filter_mode 0, without path filters: a path under one of the prefixes (/proc/, /sys/,
// /dev/) is excluded; 1, with path filters: a path under none of them (the filters) is excluded, and opens for
// writing, unlinks and renames are kept (they follow renames: tracer/renames.py); 2: nothing is excluded here
// (filters the kernel cannot judge: user space decides alone). Each prefix: its bytes as little-endian words
// and a mask of the bytes that count (bcc_backend.fill_filters).
struct prefix_t {
    u64 word[FILTER_WORDS];
    u64 mask[FILTER_WORDS];
    u32 words;
    u32 used;
};
BPF_ARRAY(path_prefixes, struct prefix_t, MAX_FILTERS);
BPF_ARRAY(filter_mode, u32, 1);

static __always_inline u32 filter_mode_now(void) {
    int zero = 0;
    u32 *mode = filter_mode.lookup(&zero);
    return mode ? *mode : 2;
}

static __always_inline int under(const char *path, const struct prefix_t *prefix) {
    const u64 *words = (const u64 *)path;
#pragma unroll
    for (int i = 0; i < FILTER_WORDS; i++) {
        if (i >= prefix->words)
            return 1;
        if ((words[i] ^ prefix->word[i]) & prefix->mask[i])
            return 0;
    }
    return 1;
}

static __always_inline int excluded(const char *path, u32 mode) {
    if (mode > 1 || !plain_absolute(path))
        return 0;
#pragma unroll
    for (int j = 0; j < MAX_FILTERS; j++) {
        int key = j;
        struct prefix_t *prefix = path_prefixes.lookup(&key);
        if (!prefix || !prefix->used)
            break;
        if (under(path, prefix))
            return mode == 0;
    }
    return mode == 1;
}

static __always_inline void count_lost(void) {
    int zero = 0;
    u64 *value = lost.lookup(&zero);
    if (value)
        __sync_fetch_and_add(value, 1);
}

static __always_inline void count_aux_lost(void) {
    int one = 1;
    u64 *value = lost.lookup(&one);
    if (value)
        __sync_fetch_and_add(value, 1);
}

// record --cgroup (tracer.attach): the cgroup v2 directory whose processes are traced, those of its
// descendant cgroups too: its id (the directory's inode number, kernfs) and level (0: the root). Data, not
// code, so that one compiled program serves every cgroup (tracer.bpfcache). id 0: no cgroup is traced.
struct cgroup_t {
    u64 id;
    u64 level;
};
BPF_ARRAY(traced_cgroup, struct cgroup_t, 1);

static __always_inline u32 traced_tgid(void) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (traced.lookup(&tgid))
        return tgid;
    int zero = 0;
    struct cgroup_t *cgroup = traced_cgroup.lookup(&zero);
#if __CGROUP_ANCESTOR__
    if (cgroup && cgroup->id && bpf_get_current_ancestor_cgroup_id((int)cgroup->level) == cgroup->id)
        return tgid;
#else  // tracing programs may call the ancestor helper since Linux 5.10: the directory itself only
    if (cgroup && cgroup->id && bpf_get_current_cgroup_id() == cgroup->id)
        return tgid;
#endif
    return 0;
}

static __always_inline struct event_t *enter_begin(s32 nr) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    int zero = 0;
    struct event_t *e = scratch.lookup(&zero);
    if (!e)
        return 0;
    e->ts_ns = bpf_ktime_get_ns();
    e->pid = tgid;
    e->tid = (u32)id;
    e->nr = nr;
    e->truncated = 0;
    e->ignore = 0;
    e->size = -1;
    e->extra = 0;
    e->ino = 0;
    e->dev = 0;
    e->nfds = 0;
    e->path[0] = 0;
    e->path2[0] = 0;
    return e;
}

static __always_inline int enter_end(struct event_t *e) {
    u32 tid = e->tid;
    if (inflight.update(&tid, e) != 0)
        count_lost();
    return 0;
}

static __always_inline void read_path(char *dst, const char *src, u32 *truncated) {
    __builtin_memset(dst, 0, PATH_BYTES);  // zero past the string: plain_absolute reads whole words
    int n = bpf_probe_read_user_str(dst, PATH_BYTES, src);
    if (n >= PATH_BYTES)
        *truncated = 1;
}

static __always_inline void sum_iovecs(struct event_t *e, const void *vec, u64 count) {
    s64 total = 0;
    for (int i = 0; i < MAX_IOVECS; i++) {
        if (i >= count)
            break;
        struct iovec_t iov = {};
        bpf_probe_read_user(&iov, sizeof(iov), (const char *)vec + i * sizeof(iov));
        total += iov.len;
    }
    e->size = count > MAX_IOVECS ? -1 : total;
}

static __always_inline void count_aux_lost(void);

static __always_inline void aux_begin(struct aux_t *a, u32 kind, struct event_t *e) {
    __builtin_memset(a, 0, sizeof(*a));
    a->kind = kind;
    a->pid = e->pid;
    a->tid = e->tid;
    __builtin_memcpy(a->comm, e->comm, sizeof(a->comm));
}

static __always_inline void aux_send(struct aux_t *a) {
    if (aux.ringbuf_output(a, sizeof(*a), wake_flags()) != 0)
        count_aux_lost();
}

// libaio (include/uapi/linux/aio_abi.h, a user-space ABI): each iocb io_submit accepted, each io_event
// io_getevents returned, read at the syscall's exit.
static __always_inline void count_lost_at(int index, u64 count) {
    u64 *value = lost.lookup(&index);
    if (value)
        __sync_fetch_and_add(value, count);
}

// Every iocb of the batch up to MAX_IOCBS; what cannot be read (a longer batch, an unreadable pointer or iocb)
// is counted in lost[3], never sent as a guess.
// struct iocb (include/uapi/linux/aio_abi.h) up to aio_offset, read in one copy.
struct iocb_head_t {
    u64 aio_data;
    u32 aio_key;
    u32 aio_rw_flags;
    u16 aio_lio_opcode;
    s16 aio_reqprio;
    u32 aio_fildes;
    u64 aio_buf;
    u64 aio_nbytes;
    s64 aio_offset;
};

// The loops below keep one path through each iteration, what failed counted in locals and added to `lost`
// after the loop: the verifier walks a bounded loop once per iteration, and a branch per failure that ran on
// into the next iteration made sys_exit's walk 256,000 instructions (0.18-0.24 s of every start, 2026-11-30).
static __always_inline void aio_submitted(struct event_t *e, long ret) {
    const u64 *iocbpp = (const u64 *)e->a[2];
    u64 batch = ret > MAX_IOCBS ? MAX_IOCBS : ret;
    u64 flags = wake_flags_batch(batch);
    u64 unread = ret - batch, dropped = 0;
    struct aux_t a;
    aux_begin(&a, AUX_AIO_SUBMIT, e);
    a.ts_ns = e->ts_ns;
    a.ctx = e->a[0];
    for (int i = 0; i < MAX_IOCBS; i++) {
        if (i >= batch)
            break;
        u64 iocb;  // the helpers write both (zeros where they fail); a NULL iocb fails the second
        struct iocb_head_t head;
        if (bpf_probe_read_user(&iocb, sizeof(iocb), &iocbpp[i]) != 0 ||
            bpf_probe_read_user(&head, sizeof(head), (const void *)iocb) != 0) {
            unread++;
            continue;
        }
        a.obj = iocb;
        a.user_data = head.aio_data;
        a.opcode = head.aio_lio_opcode;
        a.fd = head.aio_fildes;
        a.addr = head.aio_buf;
        a.len = head.aio_nbytes;
        a.offset = head.aio_offset;
        a.vectored = head.aio_lio_opcode == 7 || head.aio_lio_opcode == 8;  // IOCB_CMD_PREADV, _PWRITEV: iovecs
        dropped += (u64)aux.ringbuf_output(&a, sizeof(a), flags) >> 63;  // 0, or a negative errno: no branch
    }
    count_lost_at(3, unread);  // unconditional: a branch on a count would make the verifier track its value
    count_lost_at(1, dropped);
}

static __always_inline void aio_reaped(struct event_t *e, long ret) {
    const u64 *events = (const u64 *)e->a[3];
    u64 batch = ret > MAX_IOCBS ? MAX_IOCBS : ret;
    u64 flags = wake_flags_batch(batch);
    u64 unread = ret - batch, dropped = 0;
    struct aux_t a;
    aux_begin(&a, AUX_AIO_EVENT, e);
    a.ts_ns = e->ts_ns + e->dur_ns;
    a.ctx = e->a[0];
    for (int i = 0; i < MAX_IOCBS; i++) {
        if (i >= batch)
            break;
        u64 event[3];  // struct io_event: data, obj, res (, res2); the helper writes it
        if (bpf_probe_read_user(event, sizeof(event), &events[4 * i]) != 0) {
            unread++;
            continue;
        }
        a.user_data = event[0];
        a.obj = event[1];
        a.res = (s64)event[2];
        dropped += (u64)aux.ringbuf_output(&a, sizeof(a), flags) >> 63;  // 0, or a negative errno: no branch
    }
    count_lost_at(4, unread);  // unconditional: a branch on a count would make the verifier track its value
    count_lost_at(1, dropped);
}

#if MAPPED
// The inode behind descriptor `fd` of the current task: current->files->fdt->fd[fd]->f_inode.
static __always_inline u64 fd_inode(s64 fd, u32 *dev) {
    void *task = (void *)bpf_get_current_task();
    void *files = 0, *fdt = 0, *fds = 0, *file = 0, *inode = 0, *sb = 0;
    u64 ino = 0;
    bpf_probe_read_kernel(&files, 8, task + __OFF_TASK_FILES__);
    if (!files) return 0;
    bpf_probe_read_kernel(&fdt, 8, files + __OFF_FILES_FDT__);
    if (!fdt) return 0;
    bpf_probe_read_kernel(&fds, 8, fdt + __OFF_FDT_FD__);
    if (!fds) return 0;
    bpf_probe_read_kernel(&file, 8, fds + 8 * (fd & 0xFFFFF));
    if (!file) return 0;
    bpf_probe_read_kernel(&inode, 8, file + __OFF_FILE_INODE__);
    if (!inode) return 0;
    bpf_probe_read_kernel(&ino, 8, inode + __OFF_INODE_INO__);
    bpf_probe_read_kernel(&sb, 8, inode + __OFF_INODE_SB__);
    if (sb)
        bpf_probe_read_kernel(dev, 4, sb + __OFF_SB_DEV__);
    return ino;
}
#endif

// e->nr is the call's index in the tracer's table (IDX_*), not the kernel's syscall number.
__INDEX_DEFINES__

static __always_inline void exit_special(struct event_t *e, long ret) {
    s32 nr = e->nr;
#ifdef __NR_io_submit
    if (nr == IDX_io_submit && ret > 0) {
        aio_submitted(e, ret);
        return;
    }
#endif
#if defined(__NR_io_getevents) || defined(__NR_io_pgetevents)
    // one call site: each inlined copy of the loop is walked by the verifier on its own
    int reaps = 0;
#ifdef __NR_io_getevents
    reaps |= nr == IDX_io_getevents;
#endif
#ifdef __NR_io_pgetevents
    reaps |= nr == IDX_io_pgetevents;
#endif
    if (reaps && ret > 0) {
        aio_reaped(e, ret);
        return;
    }
#endif
#ifdef __NR_io_setup
    if (nr == IDX_io_setup && ret == 0) {
        bpf_probe_read_user(&e->extra, 8, (const void *)e->a[1]);
        return;
    }
#endif
#if MAPPED
#ifdef __NR_mmap
    if (nr == IDX_mmap && (u64)ret < (u64)-4095 && (s32)e->a[4] >= 0 && !(e->a[3] & 0x20)) {  // a file, not MAP_ANONYMOUS
        e->ino = fd_inode(e->a[4], &e->dev);
        if (e->ino) {
            u8 one = 1;
            mapped_inodes.update(&e->ino, &one);
        }
    }
#endif
#endif
}

// e->creates: 1 when the call returns a new descriptor, 2 for fcntl (only F_DUPFD*).
static __always_inline int exit_common(long ret) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct event_t *e = inflight.lookup(&tid);
    if (!e)
        return 0;
    int creates = e->creates;
    if (creates == 2)
        creates = e->a[1] == 0 || e->a[1] == 1030;
    if (creates && ret >= 0)
        set_mark(e->pid, ret, e->ignore);
    if (e->ignore) {
        inflight.delete(&tid);
        return 0;
    }
    e->dur_ns = bpf_ktime_get_ns() - e->ts_ns;
    e->ret = ret;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    exit_special(e, ret);
    s32 nr = e->nr;
    if (__CARRIES_STRINGS__) {
        if (events.ringbuf_output(e, sizeof(*e), wake_flags()) != 0)
            count_lost();
    } else if (compact.ringbuf_output(e, __builtin_offsetof(struct event_t, path), wake_flags()) != 0) {
        count_lost();  // the record is event_t up to its strings (user space reads it with that layout)
    }
    inflight.delete(&tid);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_fork) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!traced.lookup(&tgid))
        return 0;
    u32 child = args->child_pid;
    u8 one = 1;
    traced.update(&child, &one);
    return 0;
}

TRACEPOINT_PROBE(raw_syscalls, sys_enter) {
    u32 tgid = traced_tgid();
    if (!tgid)
        return 0;
    u64 a[6];
    a[0] = args->args[0];
    a[1] = args->args[1];
    a[2] = args->args[2];
    a[3] = args->args[3];
    a[4] = args->args[4];
    a[5] = args->args[5];
    struct event_t *e = 0;
    int check = 0;
    u64 writes = 0;  // an open for writing or creating (a rename may yet bring its file into the filters)
    const void *iov = 0;
    u64 iov_count = 0;
    switch (args->id) {
__ENTER_CASES__
    default:
        return 0;
    }
    if (!e)
        return 0;
    // Shared tail, so each loop below is inlined and verified once.
    if (iov)
        sum_iovecs(e, iov, iov_count);
    if (check) {
        u32 mode = filter_mode_now();
        int follow_renames = mode == 1;
        int path_excluded = excluded(e->path, mode);
        if (check == 1)
            e->ignore = path_excluded && !(follow_renames && writes);
        else if (check == 2 && path_excluded && !follow_renames)
            return 0;
        else if (check == 3 && path_excluded && excluded(e->path2, mode) && !follow_renames)
            return 0;
    }
    return enter_end(e);
}

TRACEPOINT_PROBE(raw_syscalls, sys_exit) {
    return exit_common(args->ret);
}

#if URING
// io_uring requests (io_uring/io_uring.c): io_uring_submit_req fires after the opcode's prep, so the
// request holds its fd (or fixed-file index), offset, address and length.
struct ureq_t {
    u64 ts_ns;
    u64 ctx;
    u64 user_data;
    s64 offset;
    s64 len;
    u64 addr;
    u32 pid;
    u32 tid;
    s32 fd;
    u32 opcode;
    u32 flags;
    u32 fixed;
    u32 in_flight;
    u32 vectored;
    char comm[16];
};
BPF_HASH(ureqs, u64, struct ureq_t, __URING_INFLIGHT__);
BPF_HASH(uring_depth, u64, u32, 4096);
BPF_ARRAY(uring_other, u64, 256);  // requests of opcodes not recorded, by opcode

// include/uapi/linux/io_uring.h opcodes: 1 readv, 2 writev, 3 fsync, 4 read_fixed, 5 write_fixed,
// 8 sync_file_range, 17 fallocate, 22 read, 23 write.
static __always_inline int uring_class(u8 op) {
    if (op == 22 || op == 23 || op == 4 || op == 5)
        return 1;
    if (op == 1 || op == 2)
        return 2;
    if (op == 3 || op == 8 || op == 17)
        return 3;
    return 0;
}

TRACEPOINT_PROBE(io_uring, io_uring_submit_req) {
    if (!traced_tgid())
        return 0;
    u8 op = args->opcode;
    int cls = uring_class(op);
    if (!cls) {
        int index = op;
        u64 *count = uring_other.lookup(&index);
        if (count)
            __sync_fetch_and_add(count, 1);
        return 0;
    }
    void *req = (void *)args->req;
    u64 key = (u64)req;
    struct ureq_t r = {};
    u64 id = bpf_get_current_pid_tgid();
    r.ts_ns = bpf_ktime_get_ns();
    r.pid = id >> 32;
    r.tid = (u32)id;
    r.ctx = (u64)args->ctx;
    r.user_data = args->user_data;
    r.opcode = op;
    bpf_get_current_comm(&r.comm, sizeof(r.comm));
    u64 flags = 0;
    bpf_probe_read_kernel(&flags, __REQ_FLAGS_SIZE__, req + __OFF_REQ_FLAGS__);
    r.fixed = (flags >> __FIXED_BIT__) & 1;
    bpf_probe_read_kernel(&r.fd, 4, req + __OFF_CQE_FD__);
    if (cls == 3) {  // struct io_sync: len, off, flags (fsync/sync_file_range flags), mode (fallocate)
        bpf_probe_read_kernel(&r.offset, 8, req + __OFF_SYNC_OFF__);
        bpf_probe_read_kernel(&r.len, 8, req + __OFF_SYNC_LEN__);
        bpf_probe_read_kernel(&r.flags, 4, req + (op == 17 ? __OFF_SYNC_MODE__ : __OFF_SYNC_FLAGS__));
    } else {  // struct io_rw: kiocb.ki_pos (sqe->off; -1: the file position), addr, len
        u32 len = 0;
        bpf_probe_read_kernel(&r.offset, 8, req + __OFF_RW_POS__);
        bpf_probe_read_kernel(&r.addr, 8, req + __OFF_RW_ADDR__);
        bpf_probe_read_kernel(&len, 4, req + __OFF_RW_LEN__);
        r.len = len;
        if (cls == 2) {  // len counts the iovecs at addr (user memory of the submitter, or of SQPOLL's mm)
            s64 total = 0;
            for (int i = 0; i < MAX_IOVECS; i++) {
                if (i >= len)
                    break;
                struct iovec_t iov = {};
                bpf_probe_read_user(&iov, sizeof(iov), (const char *)r.addr + i * sizeof(iov));
                total += iov.len;
            }
            r.vectored = len;
            r.len = len > MAX_IOVECS ? -1 : total;
        }
    }
    u32 one = 1;
    u32 *depth = uring_depth.lookup(&r.ctx);
    if (depth) {
        __sync_fetch_and_add(depth, 1);
        r.in_flight = *depth;
    } else {
        uring_depth.update(&r.ctx, &one);
        r.in_flight = 1;
    }
    if (ureqs.update(&key, &r) != 0) {
        int two = 2;
        u64 *value = lost.lookup(&two);
        if (value)
            __sync_fetch_and_add(value, 1);
    }
    return 0;
}

TRACEPOINT_PROBE(io_uring, io_uring_complete) {
    u64 key = (u64)args->req;
    struct ureq_t *r = ureqs.lookup(&key);
    if (!r)
        return 0;
    struct aux_t a = {};
    a.kind = AUX_URING_REQ;
    a.ts_ns = r->ts_ns;
    a.dur_ns = bpf_ktime_get_ns() - r->ts_ns;
    a.pid = r->pid;
    a.tid = r->tid;
    a.fd = r->fd;
    a.ctx = r->ctx;
    a.obj = key;
    a.user_data = r->user_data;
    a.offset = r->offset;
    a.len = r->len;
    a.res = args->res;
    a.addr = r->addr;
    a.opcode = r->opcode;
    a.flags = r->flags;
    a.in_flight = r->in_flight;
    a.fixed = r->fixed;
    a.vectored = r->vectored;
    __builtin_memcpy(a.comm, r->comm, sizeof(a.comm));
    u32 *depth = uring_depth.lookup(&r->ctx);
    if (depth && *depth > 0)
        __sync_fetch_and_add(depth, -1);
    ureqs.delete(&key);
    if (aux.ringbuf_output(&a, sizeof(a), wake_flags()) != 0)
        count_aux_lost();
    return 0;
}

TRACEPOINT_PROBE(io_uring, io_uring_create) {
    u32 tgid = traced_tgid();
    if (!tgid)
        return 0;
    struct aux_t a = {};
    u64 id = bpf_get_current_pid_tgid();
    a.kind = AUX_URING_CREATE;
    a.ts_ns = bpf_ktime_get_ns();
    a.pid = tgid;
    a.tid = (u32)id;
    a.fd = args->fd;
    a.ctx = (u64)args->ctx;
    a.flags = args->flags;
    if (aux.ringbuf_output(&a, sizeof(a), wake_flags()) != 0)
        count_aux_lost();
    return 0;
}
#endif

#if MAPPED
// Pages a traced process touches through a mapping of a traced file (mm/filemap.c, mm/page-writeback.c).
static __always_inline int page_event(u32 kind, u64 ino, u32 dev, u64 index, u64 last) {
    u32 tgid = traced_tgid();
    if (!tgid || !mapped_inodes.lookup(&ino))
        return 0;
    struct aux_t a = {};
    u64 id = bpf_get_current_pid_tgid();
    a.kind = kind;
    a.ts_ns = bpf_ktime_get_ns();
    a.pid = tgid;
    a.tid = (u32)id;
    a.ino = ino;
    a.dev = dev;
    a.index = index;
    a.last_index = last;
    bpf_get_current_comm(&a.comm, sizeof(a.comm));
    if (aux.ringbuf_output(&a, sizeof(a), wake_flags()) != 0)
        count_aux_lost();
    return 0;
}

#if FOLIOS
// Raw tracepoints (their arguments are the kernel's own pointers): a row covers the whole folios the kernel
// mapped or dirtied, not the page index the formatted events carry. On kernels with large folios (ext4 since
// 6.x) one fault-around maps whole folios past its window, and one dirtied folio is megabytes. Layouts from BTF.
static __always_inline u64 mapping_inode(void *mapping, u32 *dev) {
    void *inode = 0, *sb = 0;
    u64 ino = 0;
    bpf_probe_read_kernel(&inode, 8, mapping + __OFF_MAPPING_HOST__);
    if (!inode)
        return 0;
    bpf_probe_read_kernel(&ino, 8, inode + __OFF_INODE_INO__);
    bpf_probe_read_kernel(&sb, 8, inode + __OFF_INODE_SB__);
    if (sb)
        bpf_probe_read_kernel(dev, 4, sb + __OFF_SB_DEV__);
    return ino;
}

// Pages of a folio (1 << order): order 0 unless PG_head is set (include/linux/mm.h folio_order()).
static __always_inline u64 folio_pages(void *folio) {
    u64 flags = 0, flags1 = 0;
    bpf_probe_read_kernel(&flags, 8, folio + __OFF_FOLIO_FLAGS__);
    if (!(flags & (1ULL << __PG_HEAD__)))
        return 1;
    bpf_probe_read_kernel(&flags1, 8, folio + __OFF_FOLIO_FLAGS1__);
    return 1ULL << (flags1 & 0xff);
}

// The folio holding page `index` of `mapping` (lib/xarray.c's walk, read only: mapping->i_pages; internal
// entries are nodes, (pointer | 2), or siblings, (slot << 2 | 2) below 256), or 0 when none is cached.
static __always_inline void *cached_folio(void *mapping, u64 index) {
    void *entry = 0;
    bpf_probe_read_kernel(&entry, 8, mapping + __OFF_MAPPING_XA_HEAD__);
    for (int level = 0; level < 8; level++) {
        u64 value = (u64)entry;
        if ((value & 3) != 2 || value < 4096)
            break;
        void *node = (void *)(value - 2);
        u8 shift = 0;
        bpf_probe_read_kernel(&shift, 1, node + __OFF_XA_NODE_SHIFT__);
        u64 slot = (index >> (shift & 63)) & 63;
        bpf_probe_read_kernel(&entry, 8, node + __OFF_XA_NODE_SLOTS__ + 8 * slot);
        value = (u64)entry;
        if ((value & 3) == 2 && value < 256) {  // a sibling: the folio is in an earlier slot of this node
            slot = (value >> 2) & 63;
            bpf_probe_read_kernel(&entry, 8, node + __OFF_XA_NODE_SLOTS__ + 8 * slot);
        }
    }
    u64 value = (u64)entry;
    if (!value || (value & 3))
        return 0;  // empty, a value entry (shadow of an evicted page) or a retry entry
    return entry;
}

// [first, last] widened to the folios holding them (each folio's index and size read from the folio).
static __always_inline void folio_span(void *mapping, u64 *first, u64 *last) {
    void *folio = cached_folio(mapping, *first);
    if (folio) {
        u64 index = 0, pages = folio_pages(folio);
        bpf_probe_read_kernel(&index, 8, folio + __OFF_FOLIO_INDEX__);
        if (index <= *first && *first < index + pages)
            *first = index;
    }
    folio = cached_folio(mapping, *last);
    if (folio) {
        u64 index = 0, pages = folio_pages(folio);
        bpf_probe_read_kernel(&index, 8, folio + __OFF_FOLIO_INDEX__);
        if (index <= *last && *last < index + pages)
            *last = index + pages - 1;
    }
}

#if !OMIT_FAULT
RAW_TRACEPOINT_PROBE(mm_filemap_fault) {  // (struct address_space *mapping, pgoff_t index)
    if (!traced_tgid())
        return 0;
    void *mapping = (void *)ctx->args[0];
    u64 first = ctx->args[1], last = first;
    u32 dev = 0;
    u64 ino = mapping_inode(mapping, &dev);
    if (!mapped_inodes.lookup(&ino))
        return 0;
    folio_span(mapping, &first, &last);  // cached already (a fault after readahead): the folio is mapped whole
    return page_event(AUX_FAULT, ino, dev, first, last);
}
#endif

#if !OMIT_MAP_PAGES
RAW_TRACEPOINT_PROBE(mm_filemap_map_pages) {  // (mapping, pgoff_t start, pgoff_t last)
    if (!traced_tgid())
        return 0;
    void *mapping = (void *)ctx->args[0];
    u64 first = ctx->args[1], last = ctx->args[2];
    u32 dev = 0;
    u64 ino = mapping_inode(mapping, &dev);
    if (!mapped_inodes.lookup(&ino))
        return 0;
    folio_span(mapping, &first, &last);
    return page_event(AUX_MAP_PAGES, ino, dev, first, last);
}
#endif

#if !OMIT_DIRTY
RAW_TRACEPOINT_PROBE(writeback_dirty_folio) {  // (const struct folio *folio, struct address_space *mapping)
    if (!traced_tgid())
        return 0;
    void *folio = (void *)ctx->args[0];
    void *mapping = (void *)ctx->args[1];
    u32 dev = 0;
    u64 ino = mapping_inode(mapping, &dev), index = 0;
    if (!mapped_inodes.lookup(&ino))
        return 0;
    bpf_probe_read_kernel(&index, 8, folio + __OFF_FOLIO_INDEX__);
    return page_event(AUX_DIRTY, ino, 0, index, index + folio_pages(folio) - 1);
}
#endif

// What the kernel mapped, to count what no row covers: a user fault's address (exceptions:page_fault_user,
// kept per thread, no record), then each change of the faulting process's file-page count (kmem:rss_stat,
// MM_FILEPAGES, in pages) goes out with that address; a change inside a traced system call carries none.
// Both fire for every process of the machine: page_fault_user is raw (the formatted event costs a buffer each).
#if RSS && !OMIT_RSS
BPF_HASH(fault_address, u32, u64, 65536);

RAW_TRACEPOINT_PROBE(page_fault_user) {  // (unsigned long address, struct pt_regs *regs, unsigned long error_code)
    if (!traced_tgid())
        return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 address = ctx->args[0];
    // The thread's slot, written in place once it exists: an update of a preallocated hash takes a free
    // element, locks the bucket and frees the old one, 250 ns a fault against about 100 here (bpf_stats,
    // a 2-rank DCP save: 1.1 M faults). Only this thread writes its slot.
    u64 *slot = fault_address.lookup(&tid);
    if (slot)
        *slot = address;
    else
        fault_address.update(&tid, &address);
    return 0;
}

// The formatted kmem:rss_stat, not the raw one: its size is percpu_counter_sum_positive() of the counter, exact
// (include/trace/events/kmem.h), where the raw tracepoint's mm only gives percpu_counter.count, which lags by
// the per-CPU parts not yet folded in (up to percpu_counter_batch pages per CPU) and then jumps by them, so the
// pages another mapping had mapped were counted for the mapping whose fault folded them in (mm/rss counters).
TRACEPOINT_PROBE(kmem, rss_stat) {  // mm_id (a hash of the mm), curr (the mm is current's), member, size (bytes)
    if (args->member != 0 || !args->curr)  // MM_FILEPAGES of the current process (not fork copying, a remote unmap)
        return 0;
    u32 tgid = traced_tgid();
    if (!tgid)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct aux_t a = {};
    a.kind = AUX_RSS;
    a.ts_ns = bpf_ktime_get_ns();
    a.pid = tgid;
    a.tid = tid;
    a.ctx = args->mm_id;
    a.res = (u64)args->size >> __PAGE_SHIFT__;
    if (!inflight.lookup(&tid)) {
        u64 *address = fault_address.lookup(&tid);
        if (address)
            a.addr = *address;
    }
    if (aux.ringbuf_output(&a, sizeof(a), wake_flags()) != 0)
        count_aux_lost();
    return 0;
}
#endif
#else
TRACEPOINT_PROBE(filemap, mm_filemap_fault) {
    return page_event(AUX_FAULT, args->i_ino, args->s_dev, args->index, args->index);
}

TRACEPOINT_PROBE(filemap, mm_filemap_map_pages) {
    return page_event(AUX_MAP_PAGES, args->i_ino, args->s_dev, args->index, args->last_index);
}

TRACEPOINT_PROBE(writeback, writeback_dirty_folio) {
    return page_event(AUX_DIRTY, args->ino, 0, args->index, args->index);
}
#endif
#endif

// Pages a traced process brought into the page cache (filemap:mm_filemap_add_to_page_cache, formatted: i_ino,
// s_dev, index and, where the kernel has it, the folio's order; fields from the tracepoint's format file): the
// pages that were not resident when the recording began. One record per folio inserted; user space
// (tracer.page_cache) turns them into each read row's cold_bytes. Insertions made while a traced thread is in a
// write call are the write's own new pages, not data read from storage: they are left out here.
#if CACHE_INSERT
TRACEPOINT_PROBE(filemap, mm_filemap_add_to_page_cache) {
    u32 tgid = traced_tgid();
    if (!tgid)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct event_t *e = inflight.lookup(&tid);
    if (e) {
        s32 nr = e->nr;
        if (nr == IDX_write || nr == IDX_pwrite64 || nr == IDX_writev || nr == IDX_pwritev || nr == IDX_pwritev2)
            return 0;
    }
    struct aux_t a = {};
    a.kind = AUX_CACHE_INSERT;
    a.ts_ns = bpf_ktime_get_ns();
    a.pid = tgid;
    a.tid = tid;
    a.ino = args->i_ino;
    a.dev = args->s_dev;
    a.index = args->index;
#if INSERT_ORDER
    a.last_index = args->index + (1ULL << (args->order & 31)) - 1;
#else
    a.last_index = args->index;
#endif
    if (aux.ringbuf_output(&a, sizeof(a), wake_flags()) != 0)
        count_aux_lost();
    return 0;
}
#endif
