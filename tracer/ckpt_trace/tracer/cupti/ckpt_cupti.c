/*
 * ckpt_cupti: a CUPTI activity subscriber that records every host<->device
 * copy of a CUDA process, loaded without changing the program through
 * CUDA_INJECTION64_PATH (the CUDA driver calls InitializeInjection when the
 * process initialises CUDA; CUPTI documentation, "CUPTI injection").
 *
 * Output, in the directory named by CKPT_TRACE_GPU_DIR:
 *   copies-<pid>.bin  fixed 64-byte records (struct copy_record below, little
 *                     endian), one per CUPTI_ACTIVITY_KIND_MEMCPY record;
 *   status-<pid>.txt  one "key value" per line: "state ok" or
 *                     "state error <reason>", "clock_pair <monotonic ns>
 *                     <realtime ns>", "dropped <records CUPTI dropped>",
 *                     "records <written>", "unwritten <records a failed
 *                     write(2) lost>". Every CUPTI call's result is checked:
 *                     a failed one, or a failed write, makes the state
 *                     "error <what failed>: <why>" (the copies written so far
 *                     stay readable).
 *
 * Clock: timestamps are CLOCK_MONOTONIC nanoseconds, the clock of the bcc
 * backend, because the activity API is given clock_gettime(CLOCK_MONOTONIC)
 * as its timestamp source (cuptiActivityRegisterTimestampCallback, CUPTI 11.6
 * and later); the clock pair lets a reader convert to CLOCK_REALTIME (the
 * strace backend's clock). CUPTI converts GPU timestamps into the callback's
 * domain by periodic calibration; the reader docs (formats/README.md) state the
 * accuracy measured.
 *
 * Which thread issued a copy, and which host address it touched, come from
 * the callback API: at the entry of every runtime or driver API function whose
 * name contains "Memcpy", the correlation id is mapped to gettid() and, for
 * cudaMemcpy/cudaMemcpyAsync (parameters dst, src, count, kind first), the
 * host pointer. The activity record carries the same correlation id.
 *
 * Only one CUPTI subscriber may exist per process: when another profiler
 * holds it, the status file says so and no copies are recorded; the program
 * runs on unchanged.
 *
 * Built by ckpt_trace.tracer.gpu.build_injection with a C compiler, against
 * nothing but libc and libdl: see the declarations below.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <dlfcn.h>
#include <stddef.h>

/*
 * The subset of the CUPTI C ABI used here, declared rather than included so
 * that the library builds with a C compiler alone (CI has no CUDA headers) and
 * binds at run time to whichever libcupti the traced program's CUDA ships
 * (dlopen of CKPT_TRACE_CUPTI_LIB). Values and layouts are from cupti_*.h
 * (CUDA 12.9 and 13); compiled with -DCKPT_CUPTI_CHECK_HEADERS against the
 * real headers, the static assertions at the end of this block compare every
 * offset and value (tests/test_gpu.py does so on the GPU machine).
 */
typedef int k_result;                    /* k_result: CUPTI_SUCCESS 0 */
typedef uint32_t k_cbid;                 /* k_cbid */
typedef int k_domain;                    /* k_domain: DRIVER_API 1, RUNTIME_API 2 */
typedef void *k_subscriber;              /* k_subscriber */
typedef void *k_context;                 /* k_context */
enum {
    K_SUCCESS = 0,
    K_ERROR_MULTIPLE_SUBSCRIBERS = 39,
    K_DOMAIN_DRIVER = 1,
    K_DOMAIN_RUNTIME = 2,
    K_API_ENTER = 0,
    K_KIND_MEMCPY = 1,
    K_FLUSH_FORCED = 1,
    K_CBID_cudaMemcpyAsync = 41,
    K_RUNTIME_CBID_LIMIT = 1024,         /* beyond CUPTI_RUNTIME_TRACE_CBID_SIZE of every release */
    K_DRIVER_CBID_LIMIT = 2048,          /* beyond CUPTI_DRIVER_TRACE_CBID_SIZE */
};
typedef struct {                         /* CUpti_CallbackData */
    int callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    k_context context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} k_callback_data;
typedef struct {                         /* CUpti_Activity */
    int kind;
} k_activity;
typedef struct {                         /* the common prefix of CUpti_ActivityMemcpy .. Memcpy6 */
    int kind;
    uint8_t copyKind;
    uint8_t srcKind;
    uint8_t dstKind;
    uint8_t flags;
    uint64_t bytes;
    uint64_t start;
    uint64_t end;
    uint32_t deviceId;
    uint32_t contextId;
    uint32_t streamId;
    uint32_t correlationId;
    uint32_t runtimeCorrelationId;
} k_memcpy;
/* The parameters of cudaMemcpy, cudaMemcpyAsync, cuMemcpy, cuMemcpyAsync, cuMemcpyDtoH(Async) and
 * cuMemcpyHtoD(Async) (every version and per-thread-stream variant) begin with the destination and the
 * source (generated_cuda_runtime_api_meta.h, generated_cuda_meta.h). */
struct memcpy_params_prefix {
    uint64_t dst;
    uint64_t src;
};
typedef void (*k_api_callback)(void *, k_domain, k_cbid, const void *);
typedef void (*k_buffer_requested)(uint8_t **, size_t *, size_t *);
typedef void (*k_buffer_completed)(k_context, uint32_t, uint8_t *, size_t, size_t);

#ifdef CKPT_CUPTI_CHECK_HEADERS
#include <cupti.h>
#define SAME(a, b) _Static_assert((a) == (b), #a " != " #b)
#define SAME_FIELD(mine, theirs, f) SAME(offsetof(mine, f), offsetof(theirs, f))
SAME(K_ERROR_MULTIPLE_SUBSCRIBERS, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
SAME(K_DOMAIN_DRIVER, CUPTI_CB_DOMAIN_DRIVER_API);
SAME(K_DOMAIN_RUNTIME, CUPTI_CB_DOMAIN_RUNTIME_API);
SAME(K_API_ENTER, CUPTI_API_ENTER);
SAME(K_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMCPY);
SAME(K_FLUSH_FORCED, CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
SAME(K_CBID_cudaMemcpyAsync, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020);
_Static_assert(K_RUNTIME_CBID_LIMIT > CUPTI_RUNTIME_TRACE_CBID_SIZE, "runtime cbid limit");
_Static_assert(K_DRIVER_CBID_LIMIT > CUPTI_DRIVER_TRACE_CBID_SIZE, "driver cbid limit");
SAME_FIELD(k_callback_data, CUpti_CallbackData, callbackSite);
SAME_FIELD(k_callback_data, CUpti_CallbackData, functionParams);
SAME_FIELD(k_callback_data, CUpti_CallbackData, correlationId);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, copyKind);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, srcKind);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, dstKind);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, flags);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, bytes);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, start);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, end);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, deviceId);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, streamId);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, correlationId);
SAME_FIELD(k_memcpy, CKPT_MEMCPY_RECORD, runtimeCorrelationId);
SAME_FIELD(struct memcpy_params_prefix, cudaMemcpyAsync_v3020_params, src);
SAME(sizeof(void *), sizeof(uint64_t));
#endif

/* The CUPTI functions, bound by dlsym. */
static k_result (*p_subscribe)(k_subscriber *, k_api_callback, void *);
static k_result (*p_enable_callback)(uint32_t, k_subscriber, k_domain, k_cbid);
static k_result (*p_get_callback_name)(k_domain, uint32_t, const char **);
static k_result (*p_register_timestamp)(uint64_t (*)(void));
static k_result (*p_register_callbacks)(k_buffer_requested, k_buffer_completed);
static k_result (*p_enable)(int);
static k_result (*p_flush_all)(uint32_t);
static k_result (*p_next_record)(uint8_t *, size_t, k_activity **);
static k_result (*p_dropped)(k_context, uint32_t, size_t *);
static k_result (*p_result_string)(k_result, const char **);

#define BUFFER_BYTES (8u << 20)
#define ALIGN_BYTES 8
#define SLOTS (1u << 16) /* correlation id -> issuing thread, open addressing */

struct copy_record {           /* 64 bytes, the layout tracer/gpu.py reads */
    uint64_t start_ns;         /* CLOCK_MONOTONIC */
    uint64_t end_ns;
    uint64_t bytes;
    uint64_t host_address;     /* 0: unknown */
    uint32_t pid;
    uint32_t tid;              /* 0: unknown */
    uint32_t device;
    uint32_t stream;
    uint32_t correlation;
    uint8_t copy_kind;         /* CUpti_ActivityMemcpyKind: 1 HtoD, 2 DtoH, 8 DtoD, 9 HtoH, 10 PtoP */
    uint8_t src_kind;          /* CUpti_ActivityMemoryKind: 1 pageable, 2 pinned, 3 device, 5 managed */
    uint8_t dst_kind;
    uint8_t flags;             /* CUpti_ActivityFlag, 1: asynchronous */
    uint64_t reserved;
};
_Static_assert(sizeof(struct copy_record) == 64, "copy_record is 64 bytes");

struct slot {
    uint32_t correlation;
    uint32_t tid;
    uint64_t dst;
    uint64_t src;
};

/* Per callback id of each domain: 1 when its parameters begin with (dst, src). */
static uint8_t pointer_params[3][K_DRIVER_CBID_LIMIT];
static const char *const POINTER_FUNCTIONS[] = {
    "cudaMemcpy", "cudaMemcpyAsync", "cuMemcpy", "cuMemcpyAsync", "cuMemcpyDtoH", "cuMemcpyDtoHAsync",
    "cuMemcpyHtoD", "cuMemcpyHtoDAsync", NULL,
};

static struct slot slots[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int out_fd = -1;
static char status_path[4096];
static uint64_t written;
static uint64_t unwritten;    /* records lost to a failed write(2) */
static int write_errno;       /* the first such failure */
static char failure[256];     /* the first failed CUPTI call after setup, for the status at exit */
static uint64_t dropped;
static k_subscriber subscriber;

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t monotonic_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static void write_status(const char *state)
{
    FILE *f = fopen(status_path, "w");
    if (!f)
        return;
    fprintf(f, "state %s\nclock_pair %llu %llu\nrecords %llu\nunwritten %llu\ndropped %llu\n", state,
            (unsigned long long)clock_ns(CLOCK_MONOTONIC), (unsigned long long)clock_ns(CLOCK_REALTIME),
            (unsigned long long)written, (unsigned long long)unwritten, (unsigned long long)dropped);
    fclose(f);
}

static void remember(uint32_t correlation, uint64_t dst, uint64_t src)
{
    pthread_mutex_lock(&lock);
    struct slot *s = &slots[correlation & (SLOTS - 1)];
    s->correlation = correlation;
    s->tid = (uint32_t)syscall(SYS_gettid);
    s->dst = dst;
    s->src = src;
    pthread_mutex_unlock(&lock);
}

static int recall(uint32_t correlation, struct slot *out)
{
    int found = 0;
    pthread_mutex_lock(&lock);
    struct slot *s = &slots[correlation & (SLOTS - 1)];
    if (correlation && s->correlation == correlation) {
        *out = *s;
        found = 1;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

static void on_api(void *userdata, k_domain domain, k_cbid cbid, const void *data)
{
    (void)userdata;
    const k_callback_data *cb = (const k_callback_data *)data;
    if (cb->callbackSite != K_API_ENTER)
        return;
    uint64_t dst = 0, src = 0;
    if ((domain == K_DOMAIN_RUNTIME || domain == K_DOMAIN_DRIVER) && cbid < K_DRIVER_CBID_LIMIT &&
        pointer_params[domain][cbid] && cb->functionParams) {
        const struct memcpy_params_prefix *p = (const struct memcpy_params_prefix *)cb->functionParams;
        dst = p->dst;
        src = p->src;
    }
    remember(cb->correlationId, dst, src);
}

static void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    void *p = NULL;
    if (posix_memalign(&p, ALIGN_BYTES, BUFFER_BYTES) != 0)
        p = NULL;
    *buffer = (uint8_t *)p;
    *size = p ? BUFFER_BYTES : 0;
    *max_records = 0;
}

/* The CUPTI call `what` returned `rc`: keep the first failure's text for the status file. 1 if it failed. */
static int failed(const char *what, k_result rc)
{
    if (rc == K_SUCCESS)
        return 0;
    if (!failure[0]) {
        const char *why = NULL;
        if (!p_result_string || p_result_string(rc, &why) != K_SUCCESS)
            why = NULL;
        snprintf(failure, sizeof failure, "%s: %s (CUPTI result %d)", what, why ? why : "unknown", rc);
    }
    return 1;
}

/* Write `count` whole records; counts them as written, or, when write(2) fails (disk full, say), as
 * unwritten: a record of which only a part reached the file is lost, and the reader drops the part. */
static void write_records(const struct copy_record *records, size_t count)
{
    const char *p = (const char *)records;
    size_t n = count * sizeof *records, done = 0;
    while (done < n && !write_errno) {
        ssize_t w = write(out_fd, p + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            write_errno = w < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)w;
    }
    size_t whole = done / sizeof *records;
    written += whole;
    unwritten += count - whole;
}

static void buffer_completed(k_context ctx, uint32_t stream_id, uint8_t *buffer, size_t size, size_t valid)
{
    k_activity *record = NULL;
    struct copy_record batch[256];
    size_t n = 0;
    (void)size;
    while (out_fd >= 0 && p_next_record(buffer, valid, &record) == K_SUCCESS) {
        if (record->kind != K_KIND_MEMCPY)
            continue;
        const k_memcpy *m = (const k_memcpy *)record;
        struct copy_record *r = &batch[n++];
        struct slot s;
        memset(r, 0, sizeof *r);
        if (recall(m->runtimeCorrelationId, &s) || recall(m->correlationId, &s)) {
            r->tid = s.tid;
            r->host_address = m->copyKind == 2 ? s.dst : m->copyKind == 1 ? s.src : 0;
        }
        r->start_ns = m->start;
        r->end_ns = m->end;
        r->bytes = m->bytes;
        r->pid = (uint32_t)getpid();
        r->device = m->deviceId;
        r->stream = m->streamId;
        r->correlation = m->correlationId;
        r->copy_kind = m->copyKind;
        r->src_kind = m->srcKind;
        r->dst_kind = m->dstKind;
        r->flags = m->flags;
        if (n == sizeof batch / sizeof batch[0]) {
            write_records(batch, n);
            n = 0;
        }
    }
    if (n)
        write_records(batch, n);
    size_t lost = 0;
    if (!failed("cuptiActivityGetNumDroppedRecords", p_dropped(ctx, stream_id, &lost)))
        dropped += lost;
    free(buffer);
}

static void at_exit(void)
{
    if (out_fd < 0)
        return;
    failed("cuptiActivityFlushAll", p_flush_all(K_FLUSH_FORCED));
    char state[512];
    if (write_errno)
        snprintf(state, sizeof state, "error writing the copies file: %s (%llu records lost)", strerror(write_errno),
                 (unsigned long long)unwritten);
    else if (failure[0])
        snprintf(state, sizeof state, "error %s", failure);
    else
        snprintf(state, sizeof state, "ok");
    write_status(state);
    close(out_fd);
    out_fd = -1;
}

/* Enable the API callback of every copy function of `domain`; returns how many were enabled (a
 * failure to enable one is kept for the status: its copies would carry no thread or address). */
static unsigned enable_memcpy_callbacks(k_domain domain, uint32_t limit)
{
    unsigned enabled = 0;
    for (uint32_t cbid = 1; cbid < limit; cbid++) {
        const char *name = NULL;
        /* CUPTI_ERROR_INVALID_PARAMETER past the last id of this CUDA: not a failure */
        if (p_get_callback_name(domain, cbid, &name) != K_SUCCESS || !name || !strstr(name, "emcpy"))
            continue;
        if (failed("cuptiEnableCallback", p_enable_callback(1, subscriber, domain, cbid)))
            continue;
        enabled++;
        size_t stem = strcspn(name, "_"); /* cuMemcpyDtoH_v2, cudaMemcpyAsync_ptsz: the name before '_' */
        for (const char *const *f = POINTER_FUNCTIONS; *f; f++)
            if (strlen(*f) == stem && strncmp(*f, name, stem) == 0)
                pointer_params[domain][cbid] = 1;
    }
    return enabled;
}

static int bind_cupti(void)
{
    const char *lib = getenv("CKPT_TRACE_CUPTI_LIB");
    void *h = dlopen(lib && *lib ? lib : "libcupti.so", RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return 0;
#define BIND(ptr, name) if (!(*(void **)(&ptr) = dlsym(h, name))) return 0
    BIND(p_subscribe, "cuptiSubscribe");
    BIND(p_enable_callback, "cuptiEnableCallback");
    BIND(p_get_callback_name, "cuptiGetCallbackName");
    BIND(p_register_timestamp, "cuptiActivityRegisterTimestampCallback");
    BIND(p_register_callbacks, "cuptiActivityRegisterCallbacks");
    BIND(p_enable, "cuptiActivityEnable");
    BIND(p_flush_all, "cuptiActivityFlushAll");
    BIND(p_next_record, "cuptiActivityGetNextRecord");
    BIND(p_dropped, "cuptiActivityGetNumDroppedRecords");
    BIND(p_result_string, "cuptiGetResultString");
#undef BIND
    return 1;
}

int InitializeInjection(void)
{
    const char *dir = getenv("CKPT_TRACE_GPU_DIR");
    char path[4096];
    if (!dir || !*dir)
        return 1;
    snprintf(status_path, sizeof status_path, "%s/status-%d.txt", dir, (int)getpid());
    if (!bind_cupti()) {
        char line[512];
        snprintf(line, sizeof line, "error cannot load CUPTI: %s", dlerror());
        write_status(line);
        return 1;
    }
    k_result rc = p_subscribe(&subscriber, on_api, NULL);
    if (rc == K_ERROR_MULTIPLE_SUBSCRIBERS) {
        write_status("error another CUPTI subscriber (a profiler) holds this process");
        return 1;
    }
    if (rc != K_SUCCESS) {
        const char *why = NULL;
        char line[256];
        p_result_string(rc, &why);
        snprintf(line, sizeof line, "error cuptiSubscribe: %s", why ? why : "unknown");
        write_status(line);
        return 1;
    }
    if (p_register_timestamp(monotonic_ns) != K_SUCCESS) {
        write_status("error cuptiActivityRegisterTimestampCallback refused: copies would not be on the trace clock");
        return 1;
    }
    snprintf(path, sizeof path, "%s/copies-%d.bin", dir, (int)getpid());
    out_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) {
        write_status("error cannot create the copies file");
        return 1;
    }
    enable_memcpy_callbacks(K_DOMAIN_RUNTIME, K_RUNTIME_CBID_LIMIT);
    enable_memcpy_callbacks(K_DOMAIN_DRIVER, K_DRIVER_CBID_LIMIT);
    int started = !failed("cuptiActivityRegisterCallbacks", p_register_callbacks(buffer_requested, buffer_completed)) &&
                  !failed("cuptiActivityEnable", p_enable(K_KIND_MEMCPY));
    char line[300];
    snprintf(line, sizeof line, "error %s", failure);
    write_status(failure[0] ? line : "ok");
    if (!started) { /* no activity records will come: nothing to flush at exit */
        close(out_fd);
        out_fd = -1;
        return 1;
    }
    atexit(at_exit);
    return 1;
}
