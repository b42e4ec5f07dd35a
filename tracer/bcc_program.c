// ckpt-trace eBPF program (bcc). Syscall tracepoints only: no kprobes, no fentry.
// Per-syscall enter/exit probes are generated from the tracepoint format files
// and appended to this file by ckpt_trace.tracer.bcc_backend.
//
// Flow: sys_enter_* copies the arguments (and path strings, iovec lengths) of a
// traced thread group into a per-thread in-flight slot; sys_exit_* completes it
// with the return value and duration and pushes it to the ring buffer. A failed
// ring-buffer reservation or a full in-flight map increments lost[0].
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include <linux/fs.h>

#define PATH_BYTES __PATH_BYTES__
#define MAX_IOVECS __MAX_IOVECS__

struct event_t {
    u64 ts_ns;
    u64 dur_ns;
    u32 pid;
    u32 tid;
    s32 nr;
    u32 truncated;
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

static __always_inline void count_lost(void) {
    int zero = 0;
    u64 *value = lost.lookup(&zero);
    if (value)
        __sync_fetch_and_add(value, 1);
}

static __always_inline struct event_t *enter_begin(s32 nr) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!traced.lookup(&tgid))
        return 0;
    int zero = 0;
    struct event_t *e = scratch.lookup(&zero);
    if (!e)
        return 0;
    e->ts_ns = bpf_ktime_get_ns();
    e->pid = tgid;
    e->tid = (u32)id;
    e->nr = nr;
    e->truncated = 0;
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

static __always_inline int exit_common(long ret) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct event_t *e = inflight.lookup(&tid);
    if (!e)
        return 0;
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
