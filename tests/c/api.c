/* The gpupool_* C API, checked against what the program did and what the simulator saw: the
 * figures, empty-cache, bad arguments, the configuration read through the API, streams. The
 * pool's edges (queries it avoids, devices beyond its range, fork, signals) are in api_edges.c.
 * Linked with -lgpupool ahead of -lcudart, so the program's own cudaMalloc is pooled too.
 *
 * usage: api stats | empty | args | disabled | percent | streams | xdev | limitxdev */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <stdint.h>
#include <unistd.h>

#include "api_check.h"

/* Every figure the API reports equals what this program did, and the driver side equals what
 * the simulator saw. Half the allocations go through cudaMalloc (pooled: -lgpupool comes first),
 * half through gpupool_malloc/gpupool_malloc_async. */
/* gpupool_get_summary: the whole length whatever the buffer, a NUL-terminated prefix in a short
 * one, the JSON document with the struct's figures, refusals of bad arguments. */
static void summary_into_buffers(gpupool_stats st)
{
    size_t len = 0;
    CHECK_POOL(gpupool_get_summary(0, NULL, 0, &len));
    CHECK(len > 100, "text summary of %zu bytes", len);
    char *text = malloc(len + 1);
    size_t again = 0;
    CHECK_POOL(gpupool_get_summary(0, text, len + 1, &again));
    CHECK(again == len && strlen(text) == len, "length %zu then %zu, strlen %zu", len, again,
          strlen(text));
    CHECK(strstr(text, "gpupool summary") != NULL, "text: %.80s", text);
    char small[16];
    memset(small, 'x', sizeof small);
    CHECK_POOL(gpupool_get_summary(0, small, sizeof small, &again));
    CHECK(again == len && small[15] == 0 && strncmp(small, text, 15) == 0, "short buffer: %.16s",
          small);
    free(text);

    CHECK_POOL(gpupool_get_summary(1, NULL, 0, &len));
    char *json = malloc(len + 1);
    CHECK_POOL(gpupool_get_summary(1, json, len + 1, &again));
    char want[160];
    snprintf(want, sizeof want, "\"allocations\":%llu,", (unsigned long long)st.alloc_calls);
    CHECK(json[0] == '{' && strstr(json, want), "JSON lacks %s: %.200s", want, json);
    free(json);

    CHECK_POOL(gpupool_get_summary(2, NULL, 0, &len));
    CHECK(len > 100, "Prometheus text of %zu bytes", len);
    /* After a reset, each peak since the reset is the current value; the run's peak stays. */
    CHECK_POOL(gpupool_reset_peak_stats(0));
    CHECK_POOL(gpupool_reset_peak_stats(-1));
    CHECK(gpupool_reset_peak_stats(99) == GPUPOOL_ERROR_INVALID_DEVICE, "device 99");
    CHECK_POOL(gpupool_get_summary(1, NULL, 0, &len));
    json = malloc(len + 1);
    CHECK_POOL(gpupool_get_summary(1, json, len + 1, &again));
    snprintf(want, sizeof want, "\"requested_bytes\":{\"current\":%llu,\"peak\":%llu,"
             "\"peak_since_reset\":%llu,", (unsigned long long)st.requested_bytes,
             (unsigned long long)st.requested_bytes_peak, (unsigned long long)st.requested_bytes);
    CHECK(strstr(json, want), "JSON lacks %s: %.300s", want, json);
    free(json);
    /* The struct's peaks since the reset say the same; its `_peak` fields stay the run's. */
    gpupool_stats now = pool_stats(0);
    CHECK(now.requested_bytes_peak_since_reset == now.requested_bytes &&
              now.allocated_bytes_peak_since_reset == now.allocated_bytes &&
              now.reserved_bytes_peak_since_reset == now.reserved_bytes &&
              now.active_allocations_peak_since_reset == now.active_allocations &&
              now.segments_peak_since_reset == now.segments,
          "peaks since the reset: requested %llu (now %llu), allocated %llu (%llu), reserved "
          "%llu (%llu), blocks %llu (%llu), segments %llu (%llu)",
          (unsigned long long)now.requested_bytes_peak_since_reset,
          (unsigned long long)now.requested_bytes,
          (unsigned long long)now.allocated_bytes_peak_since_reset,
          (unsigned long long)now.allocated_bytes,
          (unsigned long long)now.reserved_bytes_peak_since_reset,
          (unsigned long long)now.reserved_bytes,
          (unsigned long long)now.active_allocations_peak_since_reset,
          (unsigned long long)now.active_allocations,
          (unsigned long long)now.segments_peak_since_reset, (unsigned long long)now.segments);
    CHECK(now.requested_bytes_peak == st.requested_bytes_peak &&
              now.requested_bytes_peak > now.requested_bytes_peak_since_reset,
          "the run's peak %llu, since the reset %llu",
          (unsigned long long)now.requested_bytes_peak,
          (unsigned long long)now.requested_bytes_peak_since_reset);

    CHECK(gpupool_get_summary(3, NULL, 0, &len) == GPUPOOL_ERROR_INVALID_VALUE, "format 3");
    CHECK(gpupool_get_summary(0, NULL, 8, &len) == GPUPOOL_ERROR_INVALID_VALUE, "NULL buffer");
    CHECK(gpupool_get_summary(0, small, 8, NULL) == GPUPOOL_ERROR_INVALID_VALUE, "NULL length");
}

static void stats(void)
{
    static const size_t sizes[] = {1, 512, 513, 4096, MIB, MIB + 1, 3 * MIB, 12 * MIB, 25 * MIB};
    enum { N = sizeof sizes / sizeof sizes[0], ROUNDS = 4 };
    void *p[ROUNDS][N];
    unsigned long long requested = 0, count = 0;
    cudaStream_t s;
    CHECK(gpupool_enabled() == 1, "the pool is off");
    CHECK_CUDA(cudaStreamCreate(&s));
    cudasimResetStats();
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < N; i++) {
            if (r == 0)
                CHECK_CUDA(cudaMalloc(&p[r][i], sizes[i]));
            else if (r == 1)
                CHECK_POOL(gpupool_malloc(&p[r][i], sizes[i]));
            else
                CHECK_POOL(gpupool_malloc_async(&p[r][i], sizes[i], r == 2 ? s : NULL));
            CHECK(((uintptr_t)p[r][i] & 255) == 0, "pointer %p not 256-byte aligned", p[r][i]);
            requested += sizes[i];
            count++;
        }
    }
    gpupool_stats st = pool_stats(0);
    CHECK(st.alloc_calls == count, "alloc_calls %llu, made %llu",
          (unsigned long long)st.alloc_calls, count);
    CHECK(st.requested_bytes == requested && st.requested_bytes_peak == requested,
          "requested %llu (peak %llu), made %llu", (unsigned long long)st.requested_bytes,
          (unsigned long long)st.requested_bytes_peak, requested);
    CHECK(st.active_allocations == count, "active %llu", (unsigned long long)st.active_allocations);
    CHECK(st.allocated_bytes >= requested && st.allocated_bytes % 512 == 0, "allocated %llu",
          (unsigned long long)st.allocated_bytes);
    CHECK(st.allocated_bytes_total == st.allocated_bytes, "total %llu",
          (unsigned long long)st.allocated_bytes_total);
    CHECK(st.cache_hits + st.cache_misses == count, "hits %llu + misses %llu",
          (unsigned long long)st.cache_hits, (unsigned long long)st.cache_misses);
    cudasimStats sim = sim_stats(0);
    CHECK(st.driver_mallocs == sim.malloc_calls, "driver mallocs %llu, simulator saw %llu",
          (unsigned long long)st.driver_mallocs, sim.malloc_calls);
    CHECK(st.reserved_bytes == sim.live_bytes, "reserved %llu, simulator live %llu",
          (unsigned long long)st.reserved_bytes, sim.live_bytes);
    CHECK(st.segments == sim.live_allocations, "segments %llu, simulator %llu",
          (unsigned long long)st.segments, sim.live_allocations);
    CHECK(st.cached_bytes == st.reserved_bytes - st.allocated_bytes, "cached %llu",
          (unsigned long long)st.cached_bytes);

    /* Free rounds 0 (cudaFree), 1 (gpupool_free) and 2 (gpupool_free_async on its stream). */
    unsigned long long freed = 0;
    for (int i = 0; i < N; i++) {
        CHECK_CUDA(cudaFree(p[0][i]));
        CHECK_POOL(gpupool_free(p[1][i]));
        CHECK_POOL(gpupool_free_async(p[2][i], s));
        freed += 3 * sizes[i];
    }
    st = pool_stats(GPUPOOL_ALL_DEVICES); /* one device: the same figures */
    CHECK(st.free_calls == 3 * N, "free_calls %llu", (unsigned long long)st.free_calls);
    CHECK(st.requested_bytes == requested - freed, "requested %llu after frees",
          (unsigned long long)st.requested_bytes);
    CHECK(st.requested_bytes_peak == requested, "peak moved");
    CHECK(st.active_allocations == N, "active %llu", (unsigned long long)st.active_allocations);

    /* An older caller's struct: only the fields that fit are written. */
    gpupool_stats old = old_caller_stats(offsetof(gpupool_stats, allocated_bytes));
    CHECK(old.requested_bytes == st.requested_bytes, "old struct: requested %llu",
          (unsigned long long)old.requested_bytes);

    for (int i = 0; i < N; i++)
        CHECK_POOL(gpupool_free(p[3][i]));
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK_POOL(gpupool_write_summary(1));
    summary_into_buffers(pool_stats(0));
    printf("stats ok\n");
}

/* gpupool_empty_cache gives memory back: the simulator's live bytes drop by what it says; a
 * live block keeps its segment; -1 covers every device. The release threshold is per device. */
static void empty(void)
{
    void *small[64], *large[4], *keep;
    uint64_t released = 0, t = 0;
    CHECK_CUDA(cudaSetDevice(1));
    for (int i = 0; i < 4; i++)
        CHECK_POOL(gpupool_malloc(&large[i], 30 * MIB));
    for (int i = 0; i < 4; i++)
        CHECK_POOL(gpupool_free(large[i]));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_POOL(gpupool_malloc(&keep, 4096));
    for (int i = 0; i < 64; i++)
        CHECK_POOL(gpupool_malloc(&small[i], MIB));
    for (int i = 0; i < 64; i++)
        CHECK_POOL(gpupool_free(small[i]));
    unsigned long long before0 = sim_stats(0).live_bytes, before1 = sim_stats(1).live_bytes;
    CHECK(before0 >= 64 * MIB && before1 >= 120 * MIB, "live %llu / %llu", before0, before1);

    CHECK_POOL(gpupool_empty_cache(0, &released));
    unsigned long long after0 = sim_stats(0).live_bytes;
    CHECK(released > 0 && after0 == before0 - released,
          "released %llu: simulator live bytes %llu -> %llu", (unsigned long long)released,
          before0, after0);
    CHECK(after0 > 0 && after0 <= 4 * MIB, "the live block's segment stays: %llu", after0);
    CHECK(sim_stats(1).live_bytes == before1, "device 1 was touched");
    gpupool_stats st = pool_stats(0);
    CHECK(st.empty_cache_released_bytes == released && st.reserved_bytes == after0,
          "stats: released %llu reserved %llu", (unsigned long long)st.empty_cache_released_bytes,
          (unsigned long long)st.reserved_bytes);

    CHECK_POOL(gpupool_empty_cache(GPUPOOL_ALL_DEVICES, NULL));
    CHECK(sim_stats(1).live_bytes == 0, "device 1 still holds %llu", sim_stats(1).live_bytes);
    CHECK(sim_stats(0).live_bytes == after0, "device 0 changed");
    CHECK_POOL(gpupool_free(keep));
    CHECK_POOL(gpupool_empty_cache(0, &released));
    CHECK(sim_stats(0).live_bytes == 0 && released == after0, "device 0 keeps %llu",
          sim_stats(0).live_bytes);
    printf("released %llu\n", (unsigned long long)released);

    /* Thresholds: per device, and -1 for every device including ones used later. */
    CHECK_POOL(gpupool_get_release_threshold(1, &t));
    CHECK(t == GPUPOOL_KEEP_ALL, "default threshold %llu", (unsigned long long)t);
    CHECK_POOL(gpupool_set_release_threshold(0, 0));
    CHECK_POOL(gpupool_get_release_threshold(0, &t));
    CHECK(t == 0, "device 0 threshold %llu", (unsigned long long)t);
    CHECK_POOL(gpupool_get_release_threshold(1, &t));
    CHECK(t == GPUPOOL_KEEP_ALL, "device 1 changed: %llu", (unsigned long long)t);
    /* With threshold 0, a synchronization gives device 0's cache back. */
    for (int i = 0; i < 8; i++)
        CHECK_POOL(gpupool_malloc(&small[i], 12 * MIB));
    for (int i = 0; i < 8; i++)
        CHECK_POOL(gpupool_free(small[i]));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK(sim_stats(0).live_bytes == 0, "threshold 0 kept %llu", sim_stats(0).live_bytes);
    CHECK_POOL(gpupool_set_release_threshold(GPUPOOL_ALL_DEVICES, 4 * MIB));
    CHECK_POOL(gpupool_get_release_threshold(1, &t));
    CHECK(t == 4 * MIB, "device 1 threshold %llu", (unsigned long long)t);
    printf("empty ok\n");
}

/* NULL and bad arguments give errors, never crashes, and leave out-parameters alone. */
static void args(void)
{
    void *sentinel = (void *)0x1234, *p = sentinel, *q;
    uint64_t n = 77;
    int stack_byte = 0;
    gpupool_stats st;

    CHECK(gpupool_malloc(NULL, 16) == GPUPOOL_ERROR_INVALID_VALUE, "malloc(NULL)");
    CHECK(gpupool_malloc_async(NULL, 16, NULL) == GPUPOOL_ERROR_INVALID_VALUE, "malloc_async");
    CHECK(gpupool_malloc(&p, SIZE_MAX) == GPUPOOL_ERROR_MEMORY_ALLOCATION && p == sentinel,
          "malloc(SIZE_MAX) gave %p", p);
    (void)cudaGetLastError();
    CHECK(gpupool_malloc(&p, 0) == GPUPOOL_SUCCESS && p == NULL, "malloc(0) gave %p", p);
    CHECK(gpupool_free(NULL) == GPUPOOL_SUCCESS, "free(NULL)");
    CHECK(gpupool_free_async(NULL, NULL) == GPUPOOL_SUCCESS, "free_async(NULL)");
    CHECK_POOL(gpupool_malloc(&q, 4096));
    CHECK(gpupool_free((char *)q + 512) == GPUPOOL_ERROR_INVALID_VALUE, "interior free");
    CHECK_POOL(gpupool_free(q));
    CHECK(gpupool_free(q) == GPUPOOL_ERROR_INVALID_VALUE, "double free");
    CHECK(gpupool_free(&stack_byte) == GPUPOOL_ERROR_INVALID_VALUE, "wild free");
    (void)cudaGetLastError();

    memset(&st, 0x5A, sizeof st);
    CHECK(gpupool_get_stats(0, NULL) == GPUPOOL_ERROR_INVALID_VALUE, "stats(NULL)");
    st.struct_size = 0;
    CHECK(gpupool_get_stats(0, &st) == GPUPOOL_ERROR_INVALID_VALUE, "struct_size 0");
    st.struct_size = 4;
    CHECK(gpupool_get_stats(0, &st) == GPUPOOL_ERROR_INVALID_VALUE, "struct_size 4");
    st.struct_size = sizeof st;
    CHECK(gpupool_get_stats(7, &st) == GPUPOOL_ERROR_INVALID_DEVICE, "stats(7)");
    CHECK(gpupool_get_stats(-2, &st) == GPUPOOL_ERROR_INVALID_DEVICE, "stats(-2)");
    CHECK(st.requested_bytes == 0x5A5A5A5A5A5A5A5AULL, "stats written on failure");

    CHECK(gpupool_empty_cache(5, &n) == GPUPOOL_ERROR_INVALID_DEVICE && n == 77, "empty(5)");
    CHECK(gpupool_empty_cache(-7, &n) == GPUPOOL_ERROR_INVALID_DEVICE && n == 77, "empty(-7)");
    CHECK(gpupool_set_release_threshold(9, 0) == GPUPOOL_ERROR_INVALID_DEVICE, "set(9)");
    CHECK(gpupool_get_release_threshold(0, NULL) == GPUPOOL_ERROR_INVALID_VALUE, "get NULL");
    CHECK(gpupool_get_release_threshold(GPUPOOL_ALL_DEVICES, &n) == GPUPOOL_ERROR_INVALID_DEVICE
              && n == 77,
          "get(-1)");
    CHECK(gpupool_get_release_threshold(3, &n) == GPUPOOL_ERROR_INVALID_DEVICE && n == 77,
          "get(3)");

    CHECK(gpupool_write_summary(-1) == GPUPOOL_ERROR_INVALID_VALUE, "summary(-1)");
    int fd = open("/dev/null", O_WRONLY);
    CHECK(fd >= 0, "open /dev/null");
    close(fd);
    CHECK(gpupool_write_summary(fd) == GPUPOOL_ERROR_INVALID_VALUE, "summary to a closed fd");

    CHECK(gpupool_torch_malloc(-1, 0, NULL) == NULL, "torch size -1");
    CHECK(gpupool_torch_malloc(16, 9, NULL) == NULL, "torch device 9");
    CHECK(gpupool_torch_malloc(16, -1, NULL) == NULL, "torch device -1");
    int dev = -1;
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK(dev == 0, "a failed torch call changed the device to %d", dev);
    (void)cudaGetLastError();
    gpupool_torch_free(NULL, 0, 0, NULL);
    gpupool_torch_free(&stack_byte, 4, 0, NULL); /* refused with a warning, no crash */

    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", GPUPOOL_VERSION_MAJOR, GPUPOOL_VERSION_MINOR,
             GPUPOOL_VERSION_PATCH);
    CHECK(strcmp(gpupool_version(), expect) == 0, "version %s, header %s", gpupool_version(),
          expect);
    CHECK(gpupool_version_number() == GPUPOOL_VERSION_NUMBER, "version number %u",
          gpupool_version_number());
    printf("args ok\n");
}

/* GPUPOOL_RELEASE_THRESHOLD=25%: a device not used yet reports a quarter of its own memory,
 * and reading it leaves the current device alone. */
static void percent(void)
{
    uint64_t t = 0;
    size_t free_bytes, total;
    int dev = -1;
    CHECK_POOL(gpupool_get_release_threshold(1, &t));
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK(dev == 0, "current device became %d", dev);
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK(t == total / 4, "threshold %llu of %zu bytes", (unsigned long long)t, total);
    CHECK_POOL(gpupool_set_release_threshold(1, 0));
    CHECK_POOL(gpupool_get_release_threshold(1, &t));
    CHECK(t == 0, "set on an unused device: %llu", (unsigned long long)t);
    printf("percent ok\n");
}

/* GPUPOOL_LIMIT=50% on devices of different sizes: device 1's pool, made by a call about it
 * while device 0 is current, is bounded by half of device 1's own memory, as cudaMemGetInfo
 * reported it before that pool existed. */
static void limitxdev(void)
{
    void *p = NULL;
    size_t free_bytes, total, limit;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMemGetInfo(&free_bytes, &limit));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, MIB));
    CHECK_POOL(gpupool_set_release_threshold(1, 0));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
    CHECK(total == limit, "device 1 looks %zu bytes large, %zu before its pool", total, limit);
    void *big = NULL;
    cudaError_t e = cudaMalloc(&big, limit + 64 * MIB);
    CHECK(e == cudaErrorMemoryAllocation, "an allocation above the limit returned %d", (int)e);
    (void)cudaGetLastError();
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(p));
    printf("limitxdev ok\n");
}

/* GPUPOOL_DISABLE=1: the API passes through to the runtime. */
static void disabled(void)
{
    void *p[8];
    uint64_t n = 5;
    cudaStream_t s;
    CHECK(gpupool_enabled() == 0, "enabled");
    CHECK_CUDA(cudaStreamCreate(&s));
    cudasimResetStats();
    for (int i = 0; i < 4; i++)
        CHECK_POOL(gpupool_malloc(&p[i], MIB));
    for (int i = 4; i < 8; i++)
        CHECK_POOL(gpupool_malloc_async(&p[i], MIB, s));
    CHECK(sim_stats(0).malloc_calls == 8, "runtime saw %llu mallocs", sim_stats(0).malloc_calls);
    for (int i = 0; i < 4; i++)
        CHECK_POOL(gpupool_free(p[i]));
    for (int i = 4; i < 8; i++)
        CHECK_POOL(gpupool_free_async(p[i], s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK(sim_stats(0).live_bytes == 0, "live %llu", sim_stats(0).live_bytes);
    gpupool_stats st = pool_stats(0);
    CHECK(st.alloc_calls == 0 && st.reserved_bytes == 0, "a disabled pool counted");
    CHECK_POOL(gpupool_empty_cache(GPUPOOL_ALL_DEVICES, &n));
    CHECK(n == 0, "released %llu", (unsigned long long)n);
    CHECK_POOL(gpupool_set_release_threshold(0, 0));
    CHECK_POOL(gpupool_get_release_threshold(0, &n));
    CHECK(n == GPUPOOL_KEEP_ALL, "threshold %llu", (unsigned long long)n);
    CHECK_POOL(gpupool_write_summary(1));
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("disabled ok\n");
}

/* GPUPOOL_REUSE=relaxed: a block freed with gpupool_free_async serves the next
 * gpupool_malloc_async on the same stream at once (the stream runs the new owner's work after
 * the old), and no allocation on another stream while the old work runs. Other modes: not even
 * on the same stream. */
static void streams(void)
{
    const char *reuse = getenv("GPUPOOL_REUSE");
    int relaxed = reuse && strcmp(reuse, "relaxed") == 0;
    cudaStream_t s, t;
    void *a, *b, *c;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    gpupool_stats before = pool_stats(0);
    CHECK_POOL(gpupool_malloc_async(&a, MIB, s));
    /* 200 ms of work on `a`, then the kernel writes 0xEE over it. */
    CHECK_CUDA(cudasim_launch_fill(a, MIB, 200000, 0xEE, s));
    CHECK_POOL(gpupool_free_async(a, s));
    CHECK_POOL(gpupool_malloc_async(&c, MIB, t));
    CHECK(c != a && cudasimRangeBusy(c, MIB) == 0, "stream t got %p under stream s's kernel", c);
    CHECK_POOL(gpupool_malloc_async(&b, MIB, s));
    if (relaxed) {
        CHECK(b == a, "stream s got %p, not the block %p it freed", b, a);
        CHECK(cudasimRangeBusy(b, MIB) == 1, "the kernel on %p already finished: no test", b);
    } else {
        CHECK(b != a && cudasimRangeBusy(b, MIB) == 0, "stream s got %p under its kernel", b);
    }
    /* The new owner's kernel runs after the old one on the stream: its bytes are the last. */
    CHECK_CUDA(cudasim_launch_fill(b, MIB, 0, 0x42, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    check_tag(b, MIB, 0x42);
    gpupool_stats after = pool_stats(0);
    CHECK(after.stream_hits - before.stream_hits == (unsigned long long)relaxed, "stream hits %llu",
          (unsigned long long)(after.stream_hits - before.stream_hits));
    CHECK_POOL(gpupool_free_async(b, s));
    CHECK_POOL(gpupool_free_async(c, t));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK_CUDA(cudaStreamDestroy(t));

    /* A stream destroyed while its work still runs, and a new stream (which may get the same
     * handle): another stream, which must not get the block under the old stream's kernel. */
    cudaStream_t u, v;
    void *d, *e;
    int same = 0;
    for (int i = 0; i < 3 && !same; i++) {
        CHECK_CUDA(cudaStreamCreateWithFlags(&u, cudaStreamNonBlocking));
        CHECK_POOL(gpupool_malloc_async(&d, 5 * MIB, u));
        CHECK_CUDA(cudasim_launch_fill(d, 5 * MIB, 200000, 0xEE, u));
        CHECK_POOL(gpupool_free_async(d, u));
        CHECK_CUDA(cudaStreamDestroy(u));
        CHECK_CUDA(cudaStreamCreateWithFlags(&v, cudaStreamNonBlocking));
        same = u == v;
        CHECK_POOL(gpupool_malloc_async(&e, 5 * MIB, v));
        CHECK(cudasimRangeBusy(e, 5 * MIB) == 0, "a new stream got %p under a destroyed one's kernel",
              e);
        CHECK_POOL(gpupool_free_async(e, v));
        CHECK_CUDA(cudaStreamDestroy(v));
    }
    CHECK(same, "no stream handle was reused: the case is not tested");
    CHECK_CUDA(cudaDeviceSynchronize());

    /* The legacy stream, PyTorch's, under both its handles (NULL and cudaStreamLegacy): the same
     * stream, named without asking the runtime. The next cudaStreamGetId and
     * cudaStreamIsCapturing are armed to fail: the program's own calls must still meet them. */
    cudaStream_t w;
    void *l, *m, *n;
    unsigned long long id = 0;
    enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    CHECK_CUDA(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking));
    before = pool_stats(0);
    CHECK(cudasimFailNext("cudaStreamGetId", 1, (int)cudaErrorInvalidResourceHandle) == 0, "arm");
    CHECK(cudasimFailNext("cudaStreamIsCapturing", 1, (int)cudaErrorInvalidResourceHandle) == 0,
          "arm");
    CHECK_POOL(gpupool_malloc_async(&l, 3 * MIB, NULL));
    CHECK_CUDA(cudasim_launch_fill(l, 3 * MIB, 200000, 0xEE, NULL));
    CHECK_POOL(gpupool_free_async(l, cudaStreamLegacy));
    CHECK_POOL(gpupool_malloc_async(&m, 3 * MIB, NULL));
    if (relaxed) {
        CHECK(m == l, "the legacy stream got %p, not the block %p it freed", m, l);
        CHECK(cudasimRangeBusy(m, 3 * MIB) == 1, "the kernel on %p already finished: no test", m);
    } else {
        CHECK(m != l && cudasimRangeBusy(m, 3 * MIB) == 0, "the legacy stream got %p under its kernel",
              m);
    }
    CHECK(cudaStreamGetId(w, &id) == cudaErrorInvalidResourceHandle,
          "the pool asked the runtime for the legacy stream's id");
    CHECK(cudaStreamIsCapturing(w, &capturing) ==
              cudaErrorInvalidResourceHandle,
          "the pool asked the runtime whether the legacy stream captures");
    (void)cudaGetLastError();
    CHECK_CUDA(cudasim_launch_fill(m, 3 * MIB, 0, 0x42, NULL));
    CHECK_CUDA(cudaStreamSynchronize(NULL));
    check_tag(m, 3 * MIB, 0x42);
    after = pool_stats(0);
    CHECK(after.stream_hits - before.stream_hits == (unsigned long long)relaxed,
          "legacy stream hits %llu", (unsigned long long)(after.stream_hits - before.stream_hits));
    /* A non-blocking stream's request after the legacy stream's kernel is done. */
    CHECK_POOL(gpupool_free_async(m, NULL));
    CHECK_POOL(gpupool_malloc_async(&n, 3 * MIB, w));
    CHECK_POOL(gpupool_free_async(n, w));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaStreamDestroy(w));
    printf("streams ok\n");
}

/* A block of device 0 freed in stream order with device 1 current: the stream named is device
 * 1's, so neither device 0's legacy stream nor its barriers may reuse the block at once (in
 * relaxed mode device 0's next request on its legacy stream must not take it under device 1's
 * kernel). Device 1 is given peer access to device 0's memory first, as a kernel on a GPU
 * needs. Run with CUDASIM_DEVICES=2. */
static void xdev(void)
{
    void *a, *b;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_POOL(gpupool_malloc_async(&a, 3 * MIB, NULL));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudasim_launch_fill(a, 3 * MIB, 200000, 0xEE, NULL));
    CHECK_POOL(gpupool_free_async(a, NULL));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_POOL(gpupool_malloc_async(&b, 3 * MIB, NULL));
    CHECK(cudasimRangeBusy(b, 3 * MIB) == 0, "device 0 got %p under device 1's kernel", b);
    CHECK_POOL(gpupool_free_async(b, NULL));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("xdev ok\n");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "stats") == 0)
        stats();
    else if (strcmp(mode, "empty") == 0)
        empty();
    else if (strcmp(mode, "args") == 0)
        args();
    else if (strcmp(mode, "disabled") == 0)
        disabled();
    else if (strcmp(mode, "percent") == 0)
        percent();
    else if (strcmp(mode, "streams") == 0)
        streams();
    else if (strcmp(mode, "xdev") == 0)
        xdev();
    else if (strcmp(mode, "limitxdev") == 0)
        limitxdev();
    else {
        fprintf(stderr, "usage: api stats|empty|args|disabled|percent|streams|xdev|limitxdev\n");
        return 2;
    }
    return 0;
}
