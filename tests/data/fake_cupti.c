/*
 * A stand-in libcupti for tests/test_gpu.py: just enough of the CUPTI C API for ckpt_cupti.c to run
 * without CUDA. cuptiActivityFlushAll hands the subscriber FAKE_CUPTI_RECORDS memcpy activity records
 * (default 3); FAKE_CUPTI_ENABLE_RC makes cuptiActivityEnable return that result code.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int kind;
    uint8_t copyKind, srcKind, dstKind, flags;
    uint64_t bytes, start, end;
    uint32_t deviceId, contextId, streamId, correlationId, runtimeCorrelationId;
} fake_memcpy;

static void (*requested)(uint8_t **, size_t *, size_t *);
static void (*completed)(void *, uint32_t, uint8_t *, size_t, size_t);

int cuptiSubscribe(void **s, void *cb, void *u) { (void)cb; (void)u; *s = (void *)1; return 0; }
int cuptiEnableCallback(uint32_t e, void *s, int d, uint32_t c) { (void)e; (void)s; (void)d; (void)c; return 0; }
int cuptiGetCallbackName(int d, uint32_t c, const char **name) { (void)d; (void)c; *name = NULL; return 1; }
int cuptiActivityRegisterTimestampCallback(uint64_t (*f)(void)) { (void)f; return 0; }
int cuptiActivityRegisterCallbacks(void *r, void *c) { requested = r; completed = c; return 0; }
int cuptiActivityEnable(int kind) {
    (void)kind;
    const char *rc = getenv("FAKE_CUPTI_ENABLE_RC");
    return rc ? atoi(rc) : 0;
}
int cuptiActivityGetNumDroppedRecords(void *c, uint32_t s, size_t *n) { (void)c; (void)s; *n = 0; return 0; }
int cuptiGetResultString(int rc, const char **why) { *why = rc == 17 ? "CUPTI_ERROR_NOT_INITIALIZED" : "fake"; return 0; }

int cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
    uint8_t *next = *record ? (uint8_t *)*record + sizeof(fake_memcpy) : buffer;
    if (next + sizeof(fake_memcpy) > buffer + valid)
        return 1;  /* CUPTI_ERROR_MAX_LIMIT_REACHED, in spirit */
    *record = next;
    return 0;
}

int cuptiActivityFlushAll(uint32_t flags) {
    (void)flags;
    const char *env = getenv("FAKE_CUPTI_RECORDS");
    size_t count = env ? (size_t)atoi(env) : 3, size = 0, max = 0;
    uint8_t *buffer = NULL;
    requested(&buffer, &size, &max);
    fake_memcpy *records = (fake_memcpy *)buffer;
    for (size_t i = 0; i < count; i++) {
        memset(&records[i], 0, sizeof records[i]);
        records[i].kind = 1;  /* CUPTI_ACTIVITY_KIND_MEMCPY */
        records[i].copyKind = 2;
        records[i].bytes = 4096 * (i + 1);
        records[i].start = 1000 * (i + 1);
        records[i].end = 1000 * (i + 1) + 10;
        records[i].correlationId = (uint32_t)(i + 1);
    }
    completed(NULL, 0, buffer, size, count * sizeof(fake_memcpy));
    return 0;
}
