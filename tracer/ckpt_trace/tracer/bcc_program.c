// ckpt-trace eBPF program (bcc). Syscall tracepoints only: no kprobes, no fentry.
// One program on raw_syscalls:sys_enter dispatches on the syscall number; the
// switch cases are generated per traced call by ckpt_trace.tracer.bcc_backend.
// Two tracepoints instead of one pair per syscall: each detach waits for an RCU
// grace period, and ninety of them took seconds at exit.
//
// Flow: sys_enter_* copies the arguments (and path strings, iovec lengths) of a
// traced thread group into a per-thread in-flight slot; sys_exit_* completes it
// with the return value and duration and pushes it to the ring buffer. A failed
// ring-buffer reservation or a full in-flight map increments lost[0].
//
// In-kernel filtering drops only what the user-space builder would drop anyway:
// an open of an absolute path with no empty, "." or ".." component that the path
// filters exclude marks the returned (tgid, fd) in `ignored`; later calls on a
// marked descriptor are dropped, dups of it are marked too, and any traced call
// that creates a descriptor clears the mark of the number it returns. A stale
// mark can only hide calls on descriptors no traced call created (pipes,
// sockets), which the builder does not record.
#include <asm/unistd.h>

#define PATH_BYTES __PATH_BYTES__
#define MAX_IOVECS __MAX_IOVECS__

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
    char comm[16];
    char path[PATH_BYTES];
    char path2[PATH_BYTES];
};

struct iovec_t {
    u64 base;
    u64 len;
};

BPF_RINGBUF_OUTPUT(events, __RINGBUF_PAGES__);
BPF_HASH(traced, u32, u8, 65536);
BPF_HASH(inflight, u32, struct event_t, __INFLIGHT__);
BPF_PERCPU_ARRAY(scratch, struct event_t, 1);
BPF_ARRAY(lost, u64, 1);

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

// 1 when `path` is absolute with no empty, "." or ".." component, so that prefix
// tests on the raw string agree with tests on the normalised path.
static __always_inline int plain_absolute(const char *path) {
    if (path[0] != '/')
        return 0;
    for (int i = 0; i < PATH_BYTES - 3; i++) {
        char c = path[i];
        if (c == 0)
            return 1;
        if (c != '/')
            continue;
        char c1 = path[i + 1], c2 = path[i + 2], c3 = path[i + 3];
        if (c1 == '/')
            return 0;
        if (c1 == '.' && (c2 == '/' || c2 == 0 || (c2 == '.' && (c3 == '/' || c3 == 0))))
            return 0;
    }
    return 0;
}

static __always_inline int excluded(const char *path) {
    if (!plain_absolute(path))
        return 0;
__EXCLUDED_BODY__
}

static __always_inline void count_lost(void) {
    int zero = 0;
    u64 *value = lost.lookup(&zero);
    if (value)
        __sync_fetch_and_add(value, 1);
}

static __always_inline u32 traced_tgid(void) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    return traced.lookup(&tgid) ? tgid : 0;
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
    if (events.ringbuf_output(e, sizeof(*e), 0) != 0)
        count_lost();
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
        int path_excluded = excluded(e->path);
        if (check == 1)
            e->ignore = path_excluded;
        else if (check == 2 && path_excluded)
            return 0;
        else if (check == 3 && path_excluded && excluded(e->path2))
            return 0;
    }
    return enter_end(e);
}

TRACEPOINT_PROBE(raw_syscalls, sys_exit) {
    return exit_common(args->ret);
}
