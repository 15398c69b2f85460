/* Cost of one allocate+free pair of the same size, with LIVE_BLOCKS other blocks held.
 *
 * usage: hit_path LIVE_BLOCKS SIZE ITERATIONS MODE
 *   MODE cuda:  cudaMalloc/cudaFree (under LD_PRELOAD=libgpupool.so these are the pool's hooks;
 *               without it, the CUDA runtime's own calls)
 *   MODE glibc: malloc/free
 *   MODE torch: gpupool_torch_malloc/gpupool_torch_free on device 0 and the legacy stream, as
 *               PyTorch's pluggable allocator calls them (libgpupool preloaded)
 *   MODE torch-stream: the same on a non-blocking stream of the program's own
 *   MODE async: cudaMallocAsync/cudaFreeAsync on the legacy stream, as PyTorch's
 *               cudaMallocAsync backend calls them (the pool's route under the preload)
 *   MODE async-stream: the same on a non-blocking stream of the program's own (each call asks
 *               the runtime whether the stream is being captured; the allocation asks its id,
 *               which the free takes from the thread's last allocation on that stream)
 *   MODE driver: cuMemAlloc_v2/cuMemFree_v2 on the primary context, the driver hooks' route
 *               (a static runtime's, XLA's), taken with dlsym(RTLD_DEFAULT)
 *   MODE driver-async-stream: cuMemAllocAsync/cuMemFreeAsync on a non-blocking stream of the
 *               program's own, as a static runtime's cudaMallocAsync/cudaFreeAsync make them
 *               (the same questions as async-stream, asked of the driver)
 *
 * LIVE_BLOCKS blocks of mixed sizes (512 B .. 64 KiB, log-uniform, fixed seed) are allocated
 * with the same allocator before timing and stay live during it. After a warm-up, ITERATIONS
 * pairs of SIZE bytes are timed with CLOCK_MONOTONIC, REPS times; prints key=value lines
 *   ns_per_pair=MEDIAN
 *   ns_min=MIN
 *   ns_max=MAX
 *   real_mallocs_timed=N   (cuda mode: the simulator's cudaMalloc calls during the timed pairs)
 * Every call's return code is checked. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CHECK, CHECK_CUDA and the simulator's headers, shared with the test programs. */
#include "../tests/c/check.h"

#define REPS 7
#define WARMUP 5000

/* Every pointer handed out is folded into this, so the compiler cannot drop a malloc/free
 * pair. */
static volatile uintptr_t sink;

static int use_cuda;
static int use_async;
/* The stream of the async modes: the legacy one, or the program's own (async-stream). */
static cudaStream_t async_stream;

/* PyTorch's pluggable allocator signatures, and the stream its calls name (torch modes). */
typedef void *(*torch_malloc_fn)(ssize_t size, int device, cudaStream_t stream);
typedef void (*torch_free_fn)(void *ptr, ssize_t size, int device, cudaStream_t stream);
static torch_malloc_fn torch_malloc;
/* The driver's pair (driver mode): the static runtime's route, reached by symbol. */
typedef int (*cu_malloc_fn)(unsigned long long *dptr, size_t size);
typedef int (*cu_free_fn)(unsigned long long dptr);
static cu_malloc_fn cu_malloc;
static cu_free_fn cu_free;
/* The driver's stream-ordered pair (driver-async-stream), on `async_stream`. */
typedef int (*cu_malloc_async_fn)(unsigned long long *dptr, size_t size, cudaStream_t stream);
typedef int (*cu_free_async_fn)(unsigned long long dptr, cudaStream_t stream);
static cu_malloc_async_fn cu_malloc_async;
static cu_free_async_fn cu_free_async;
static torch_free_fn torch_free;
static cudaStream_t torch_stream;

static void *alloc(size_t n)
{
    void *p = NULL;
    if (torch_malloc) {
        p = torch_malloc((ssize_t)n, 0, torch_stream);
    } else if (use_async) {
        CHECK_CUDA(cudaMallocAsync(&p, n, async_stream));
    } else if (use_cuda) {
        CHECK_CUDA(cudaMalloc(&p, n));
    } else {
        p = malloc(n);
    }
    CHECK(p != NULL, "allocation of %zu bytes", n);
    return p;
}

static void release(void *p, size_t n)
{
    if (torch_free) {
        torch_free(p, (ssize_t)n, 0, torch_stream);
    } else if (use_async) {
        CHECK_CUDA(cudaFreeAsync(p, async_stream));
    } else if (use_cuda) {
        CHECK_CUDA(cudaFree(p));
    } else {
        free(p);
    }
}

static double now_ns(void)
{
    struct timespec t;
    CHECK(clock_gettime(CLOCK_MONOTONIC, &t) == 0, "clock_gettime");
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static unsigned long long sim_mallocs(void)
{
    cudasimStats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(cudasimGetStats(0, &st) == 0, "cudasimGetStats");
    return st.malloc_calls;
}

/* `timed_pairs` of the driver's modes, a loop of their own: the other modes' loops stay as they
 * were, so their figures compare with earlier runs. `async` (driver-async-stream) is a constant
 * at each call, inlined: each mode's loop is compiled without the other's branch. */
static inline __attribute__((always_inline)) double timed_cu_pairs(size_t size, long iters,
                                                                   int async)
{
    unsigned long long acc = 0;
    double t0, t1;
    long i;
    t0 = now_ns();
    for (i = 0; i < iters; i++) {
        unsigned long long d = 0;
        if (async) {
            CHECK(cu_malloc_async(&d, size, async_stream) == 0, "cuMemAllocAsync");
        } else {
            CHECK(cu_malloc(&d, size) == 0, "cuMemAlloc_v2");
        }
        acc += d;
        if (async) {
            CHECK(cu_free_async(d, async_stream) == 0, "cuMemFreeAsync");
        } else {
            CHECK(cu_free(d) == 0, "cuMemFree_v2");
        }
    }
    t1 = now_ns();
    sink += (uintptr_t)acc;
    return (t1 - t0) / (double)iters;
}

static double timed_driver_pairs(size_t size, long iters)
{
    return timed_cu_pairs(size, iters, 0);
}

static double timed_driver_async_pairs(size_t size, long iters)
{
    return timed_cu_pairs(size, iters, 1);
}

/* Time `iters` pairs; returns ns per pair. */
static double timed_pairs(size_t size, long iters)
{
    uintptr_t acc = 0;
    double t0, t1;
    long i;
    if (cu_malloc) {
        return timed_driver_pairs(size, iters);
    }
    if (cu_malloc_async) {
        return timed_driver_async_pairs(size, iters);
    }
    t0 = now_ns();
    for (i = 0; i < iters; i++) {
        void *p = alloc(size);
        acc += (uintptr_t)p;
        release(p, size);
    }
    t1 = now_ns();
    sink += acc;
    return (t1 - t0) / (double)iters;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    long live, iters, i;
    size_t size;
    void **blocks;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    double ns[REPS];
    unsigned long long mallocs_before = 0;
    int r;

    CHECK(argc == 5,
          "usage: hit_path LIVE_BLOCKS SIZE ITERATIONS "
          "cuda|glibc|torch|torch-stream|async|async-stream|driver|driver-async-stream");
    live = atol(argv[1]);
    size = (size_t)strtoull(argv[2], NULL, 0);
    iters = atol(argv[3]);
    CHECK(live >= 0 && size > 0 && iters > 0, "bad arguments");
    if (strcmp(argv[4], "cuda") == 0) {
        use_cuda = 1;
    } else if (strncmp(argv[4], "async", 5) == 0) {
        use_cuda = use_async = 1;
        CHECK(strcmp(argv[4] + 5, "") == 0 || strcmp(argv[4] + 5, "-stream") == 0,
              "unknown mode '%s'", argv[4]);
    } else if (strcmp(argv[4], "driver") == 0) {
        use_cuda = 1;
        cu_malloc = (cu_malloc_fn)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
        cu_free = (cu_free_fn)dlsym(RTLD_DEFAULT, "cuMemFree_v2");
        CHECK(cu_malloc && cu_free, "no cuMemAlloc_v2");
    } else if (strcmp(argv[4], "driver-async-stream") == 0) {
        use_cuda = 1;
        cu_malloc_async = (cu_malloc_async_fn)dlsym(RTLD_DEFAULT, "cuMemAllocAsync");
        cu_free_async = (cu_free_async_fn)dlsym(RTLD_DEFAULT, "cuMemFreeAsync");
        CHECK(cu_malloc_async && cu_free_async, "no cuMemAllocAsync");
    } else if (strncmp(argv[4], "torch", 5) == 0) {
        use_cuda = 1;
        torch_malloc = (torch_malloc_fn)dlsym(RTLD_DEFAULT, "gpupool_torch_malloc");
        torch_free = (torch_free_fn)dlsym(RTLD_DEFAULT, "gpupool_torch_free");
        CHECK(torch_malloc && torch_free, "torch modes need libgpupool preloaded");
        CHECK(strcmp(argv[4] + 5, "") == 0 || strcmp(argv[4] + 5, "-stream") == 0,
              "unknown mode '%s'", argv[4]);
    } else {
        CHECK(strcmp(argv[4], "glibc") == 0,
              "MODE is cuda, glibc, torch, torch-stream, async, async-stream, driver or "
              "driver-async-stream, not '%s'",
              argv[4]);
    }
    if (use_cuda) {
        CHECK_CUDA(cudaFree(NULL)); /* initialize the runtime outside the timing */
    }
    if (strcmp(argv[4], "torch-stream") == 0) {
        CHECK_CUDA(cudaStreamCreateWithFlags(&torch_stream, cudaStreamNonBlocking));
    }
    if (strcmp(argv[4], "async-stream") == 0 || cu_malloc_async) {
        CHECK_CUDA(cudaStreamCreateWithFlags(&async_stream, cudaStreamNonBlocking));
    }

    blocks = calloc(live > 0 ? (size_t)live : 1, sizeof *blocks);
    CHECK(blocks != NULL, "block table");
    for (i = 0; i < live; i++) {
        uint64_t lo = 512ull << (rng_next(&seed) % 7); /* 512 .. 32 KiB */
        size_t n = (size_t)(lo + rng_next(&seed) % (lo + 1)); /* lo .. 2*lo */
        blocks[i] = alloc(n);
        sink += (uintptr_t)blocks[i];
    }

    timed_pairs(size, WARMUP);
    if (use_cuda) {
        mallocs_before = sim_mallocs();
    }
    for (r = 0; r < REPS; r++) {
        ns[r] = timed_pairs(size, iters);
    }
    qsort(ns, REPS, sizeof ns[0], cmp_double);
    printf("ns_per_pair=%.1f\n", ns[REPS / 2]);
    printf("ns_min=%.1f\n", ns[0]);
    printf("ns_max=%.1f\n", ns[REPS - 1]);
    if (use_cuda) {
        printf("real_mallocs_timed=%llu\n", sim_mallocs() - mallocs_before);
    }

    for (i = 0; i < live; i++) {
        release(blocks[i], 0); /* sizes the pool does not need */
    }
    free(blocks);
    return 0;
}
