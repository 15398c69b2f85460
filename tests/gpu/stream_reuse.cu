/* stream_reuse: stream-ordered reuse on a real GPU (the GPU version of tests/c/api.c streams).
 *
 * Under the preload the program allocates with gpupool_malloc_async and frees with
 * gpupool_free_async (looked up with dlsym, so the same binary runs without the pool, where it
 * uses cudaMallocAsync/cudaFreeAsync, whose pool follows the same rule). Each round, on two
 * NON-BLOCKING streams s and t: allocate A on s; launch on s a kernel that spins ~100 ms and
 * then writes 0xEE over A; free A on s right after the launch; allocate C on t and fill it with
 * 0x42 on t; allocate B on s and fill it with 0x17 on s; synchronize. C must be all 0x42 (no
 * other stream gets A while the kernel runs), B all 0x17 (a block reused on the stream that
 * freed it is written after the old kernel, in stream order). In GPUPOOL_REUSE=relaxed the pool
 * hands B the address of A ("same_address yes"); in strict and barrier modes it does not.
 * Then once more with a stream destroyed while its kernel runs and a new stream created after
 * it: the new stream must not get the block either.
 *
 * usage: stream_reuse [ROUNDS [SPIN_MS]]   (defaults 4 and 100). Prints key=value lines: one per
 * round, one for the destroyed stream, the totals, then "stream_reuse=ok", or
 * "stream_reuse=CLOBBERED" and exit 1. */
#include <dlfcn.h>

#include "common.cuh"

typedef int (*MallocAsyncFn)(void **, size_t, cudaStream_t);
typedef int (*FreeAsyncFn)(void *, cudaStream_t);

static int runtime_malloc_async(void **p, size_t n, cudaStream_t s)
{
    return (int)cudaMallocAsync(p, n, s);
}

static int runtime_free_async(void *p, cudaStream_t s)
{
    return (int)cudaFreeAsync(p, s);
}

static MallocAsyncFn alloc_on;
static FreeAsyncFn free_on;

#define CHECK_INT(call)                                                                        \
    do {                                                                                       \
        int e_ = (call);                                                                       \
        REQUIRE(e_ == 0, "%s returned %d", #call, e_);                                         \
    } while (0)

/* Bytes of p[0..n) that are not v (after a device synchronization). */
static unsigned long long bad_bytes(Mismatch *m, unsigned char *p, size_t n, unsigned char v)
{
    mismatch_reset(m);
    count_not_byte<<<grid_for(n), FILL_THREADS>>>(p, n, v, m);
    CHECK_LAUNCH();
    return mismatch_read(m).bad;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    double spin_ms = argc > 2 ? atof(argv[2]) : 100.0;
    REQUIRE(rounds >= 1 && spin_ms > 0, "usage: stream_reuse [ROUNDS [SPIN_MS]]");
    CHECK(cudaFree(NULL));
    alloc_on = (MallocAsyncFn)dlsym(RTLD_DEFAULT, "gpupool_malloc_async");
    free_on = (FreeAsyncFn)dlsym(RTLD_DEFAULT, "gpupool_free_async");
    int pool = alloc_on != NULL && free_on != NULL;
    if (!pool) {
        alloc_on = runtime_malloc_async;
        free_on = runtime_free_async;
    }
    const double cpu = spin_cycles_per_us();
    const int sms = sm_count();
    const long long cycles = (long long)(spin_ms * 1000.0 * cpu);
    printf("allocator=%s cycles_per_us=%.1f sms=%d\n",
           pool ? "gpupool_malloc_async" : "cudaMallocAsync", cpu, sms);

    cudaStream_t s, t;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    Mismatch *m = NULL;
    CHECK(cudaMalloc((void **)&m, sizeof *m));

    int clobbered = 0, same_rounds = 0;
    for (int round = 0; round < rounds; round++) {
        size_t n = (round % 2 == 0) ? ((size_t)48 << 20) : ((size_t)5 << 20);
        unsigned char *a = NULL, *b = NULL, *c = NULL;
        CHECK_INT(alloc_on((void **)&a, n, s));
        spin_then_fill<<<sms, FILL_THREADS, 0, s>>>(cycles, a, n, 0xEE);
        CHECK_LAUNCH();
        CHECK_INT(free_on(a, s));
        CHECK_INT(alloc_on((void **)&c, n, t));
        fill_byte<<<grid_for(n), FILL_THREADS, 0, t>>>(c, n, 0x42);
        CHECK_LAUNCH();
        CHECK_INT(alloc_on((void **)&b, n, s));
        fill_byte<<<grid_for(n), FILL_THREADS, 0, s>>>(b, n, 0x17);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        unsigned long long bad_c = bad_bytes(m, c, n, 0x42), bad_b = bad_bytes(m, b, n, 0x17);
        int same = a == b;
        same_rounds += same;
        printf("round=%d size_mib=%zu same_address=%s other_stream_address=%s "
               "other_stream_bad=%llu same_stream_bad=%llu\n",
               round, n >> 20, same ? "yes" : "no", c == a ? "same" : "other", bad_c, bad_b);
        clobbered += bad_c != 0 || bad_b != 0;
        CHECK_INT(free_on(b, s));
        CHECK_INT(free_on(c, t));
        CHECK(cudaDeviceSynchronize());
    }

    /* A stream destroyed while its kernel runs; the next stream may get the same handle. */
    {
        size_t n = (size_t)5 << 20;
        cudaStream_t u, v;
        unsigned char *a = NULL, *e = NULL;
        CHECK(cudaStreamCreateWithFlags(&u, cudaStreamNonBlocking));
        CHECK_INT(alloc_on((void **)&a, n, u));
        spin_then_fill<<<sms, FILL_THREADS, 0, u>>>(cycles, a, n, 0xEE);
        CHECK_LAUNCH();
        CHECK_INT(free_on(a, u));
        CHECK(cudaStreamDestroy(u));
        CHECK(cudaStreamCreateWithFlags(&v, cudaStreamNonBlocking));
        CHECK_INT(alloc_on((void **)&e, n, v));
        fill_byte<<<grid_for(n), FILL_THREADS, 0, v>>>(e, n, 0x42);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        unsigned long long bad = bad_bytes(m, e, n, 0x42);
        printf("destroyed_stream_same_handle=%s destroyed_stream_same_address=%s "
               "destroyed_stream_bad=%llu\n",
               u == v ? "yes" : "no", a == e ? "yes" : "no", bad);
        clobbered += bad != 0;
        CHECK_INT(free_on(e, v));
        CHECK(cudaStreamDestroy(v));
        CHECK(cudaDeviceSynchronize());
    }

    CHECK(cudaFree(m));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(t));
    printf("rounds=%d same_stream_reuse=%d clobbered=%d\n", rounds, same_rounds, clobbered);
    if (clobbered) {
        printf("stream_reuse=CLOBBERED\n");
        return 1;
    }
    printf("stream_reuse=ok\n");
    return 0;
}
