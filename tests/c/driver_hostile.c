/* The driver API under the pool, as a hostile program uses it. Linked with -lcuda alone.
 *   driver_hostile fork         the pool used, then fork(): the child's calls reach the driver
 *   driver_hostile reset        cuDevicePrimaryCtxReset_v2 with blocks live and cached
 *   driver_hostile reset-release  a reset, then the release of the program's retain
 *   driver_hostile created-oom  a context the program made runs out while the pool caches
 *   driver_hostile threads      dlsym of driver names on many threads while others allocate
 *   driver_hostile destroyed-stream  cuMemFreeAsync of a block on a stream already destroyed
 *   driver_hostile query-fails  cuMemFreeAsync whose capture query fails with another error
 * Each prints key=value lines and ends with "driver_hostile MODE: all checks passed". */
#define _GNU_SOURCE
#include "check.h"
#include "cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

#define CU_EXPECT(call, want)                                                                 \
    do {                                                                                      \
        CUresult got_ = (call);                                                               \
        CHECK(got_ == (want), "%s returned %d, expected %d", #call, (int)got_, (int)(want)); \
    } while (0)
#define CU_OK(call) CU_EXPECT(call, CUDA_SUCCESS)

/* Memory taken from the driver: cuMemAlloc calls, and granules mapped (expandable segments). */
static unsigned long long driver_mallocs(void)
{
    return sim_stats(0).driver_mallocs + sim_stats(0).vmm_maps;
}

static CUcontext primary_current(void)
{
    CUcontext ctx = NULL;
    CU_OK(cuInit(0));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU_OK(cuCtxSetCurrent(ctx));
    return ctx;
}

/* Allocations and frees on another thread while the main thread forks. */
static volatile int stop_churn;
static void *churn(void *arg)
{
    CUcontext ctx = arg;
    CUdeviceptr p;
    CU_OK(cuCtxSetCurrent(ctx));
    while (!stop_churn) {
        CU_OK(cuMemAlloc_v2(&p, MiB));
        CU_OK(cuMemFree_v2(p));
    }
    return NULL;
}

static void mode_fork(void)
{
    CUcontext ctx = primary_current();
    CUdeviceptr p, kept;
    pthread_t t;
    int i, status;
    pid_t pid;
    CU_OK(cuMemAlloc_v2(&kept, MiB));
    CU_OK(pthread_create(&t, NULL, churn, ctx) == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    for (i = 0; i < 20; i++) {
        pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0) {
            unsigned long long before = driver_mallocs();
            size_t free_b, total_b;
            int j;
            for (j = 0; j < 10; j++) {
                if (cuMemAlloc_v2(&p, MiB) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS ||
                    cuCtxSynchronize() != CUDA_SUCCESS ||
                    cuMemGetInfo_v2(&free_b, &total_b) != CUDA_SUCCESS)
                    _exit(3);
            }
            /* Every allocation of the child reached the driver. */
            _exit(driver_mallocs() - before == 10 ? 0 : 4);
        }
        CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %d", i, status);
    }
    stop_churn = 1;
    pthread_join(t, NULL);
    CU_OK(cuMemFree_v2(kept));
}

static void mode_reset(void)
{
    CUdeviceptr live, cached, after, again;
    unsigned long long before;
    size_t free_b, total_b;
    primary_current();
    CU_OK(cuMemAlloc_v2(&live, 64 * MiB));
    CU_OK(cuMemAlloc_v2(&cached, 64 * MiB));
    CU_OK(cuMemFree_v2(cached));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuDevicePrimaryCtxReset_v2(0));
    /* The driver freed both: a free of the live one is the driver's error. */
    CU_EXPECT(cuMemFree_v2(live), CUDA_ERROR_INVALID_VALUE);
    primary_current();
    before = driver_mallocs();
    CU_OK(cuMemAlloc_v2(&after, 64 * MiB));
    /* Never a block of a segment the reset freed. */
    printf("reset_new_driver_mallocs=%d\n", driver_mallocs() - before >= 1);
    CU_OK(cuMemAlloc_v2(&again, 64 * MiB));
    CU_OK(cuMemFree_v2(after));
    CU_OK(cuMemFree_v2(again));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuMemGetInfo_v2(&free_b, &total_b));
    printf("reset_info_free=%zu\n", free_b);
    printf("reset_live=%llu\n", (unsigned long long)sim_stats(0).live_allocations);
    /* Reset again with the new segments cached, then the device used again: the exit frees
     * nothing twice. */
    CU_OK(cuDevicePrimaryCtxReset_v2(0));
    primary_current();
    CU_OK(cuMemAlloc_v2(&after, MiB));
    CU_OK(cuMemFree_v2(after));
}

/* The program's cleanup: its primary context reset, then its retain released. The reset
 * destroyed the context; the release after it destroys nothing. */
static void mode_reset_release(void)
{
    CUdeviceptr p;
    primary_current();
    CU_OK(cuMemAlloc_v2(&p, 8 * MiB));
    CU_OK(cuDevicePrimaryCtxReset_v2(0));
    CU_OK(cuDevicePrimaryCtxRelease_v2(0));
}

static void mode_created_oom(void)
{
    CUcontext created;
    CUdeviceptr p;
    primary_current();
    /* 700 MiB cached by the pool on a 1 GiB device. */
    CU_OK(cuMemAlloc_v2(&p, 700 * MiB));
    CU_OK(cuMemFree_v2(p));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuCtxCreate_v2(&created, 0, 0));
    /* Without the pool this fits: the cache must not make it fail. */
    CU_OK(cuMemAlloc_v2(&p, 700 * MiB));
    CU_OK(cuMemFree_v2(p));
    CU_OK(cuCtxPopCurrent_v2(NULL));
    CU_OK(cuCtxDestroy_v2(created));
}

/* Threads that look up driver names (hooked, not hooked, missing) while others allocate: every
 * answer the same as on the main thread, dlerror as glibc leaves it. */
static void *driver_h;
static void *looked_up[3];
static const char *const names[3] = {"cuMemAlloc_v2", "cuInit", "cuNoSuchFunction"};
static void *lookups(void *arg)
{
    int i, k;
    (void)arg;
    for (i = 0; i < 2000; i++) {
        for (k = 0; k < 3; k++) {
            void *f = dlsym(driver_h, names[k]);
            const char *err = dlerror();
            if (f != looked_up[k] || (f == NULL) != (err != NULL))
                return (void *)1;
        }
    }
    return NULL;
}

static void mode_threads(void)
{
    CUcontext ctx;
    pthread_t t[6];
    void *res;
    int i, k, bad = 0;
    driver_h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(driver_h != NULL, "dlopen: %s", dlerror());
    for (k = 0; k < 3; k++) {
        looked_up[k] = dlsym(driver_h, names[k]);
        (void)dlerror();
    }
    CHECK(looked_up[0] != NULL && looked_up[1] != NULL && looked_up[2] == NULL, "lookups");
    ctx = primary_current();
    stop_churn = 0;
    for (i = 0; i < 6; i++)
        CHECK(pthread_create(&t[i], NULL, i < 2 ? churn : lookups, ctx) == 0, "thread");
    for (i = 2; i < 6; i++) {
        pthread_join(t[i], &res);
        bad |= res != NULL;
    }
    stop_churn = 1;
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    CHECK(!bad, "a thread's lookup differed");
}

/* A pool block of 1 MiB and a non-blocking stream, in the primary context: what a
 * stream-ordered free is tried on. */
static void block_and_stream(CUdeviceptr *p, CUstream *s)
{
    primary_current();
    CU_OK(cuMemAlloc_v2(p, MiB));
    CU_OK(cuStreamCreate(s, CU_STREAM_NON_BLOCKING));
}

/* The driver refuses the destroyed stream and frees nothing: the block is still the program's,
 * and its cuMemFree works. Prints the refusal as "destroyed_stream_free=N". */
static void mode_destroyed_stream(void)
{
    CUstream s;
    CUdeviceptr p;
    CUresult r;
    block_and_stream(&p, &s);
    CU_OK(cuStreamDestroy_v2(s));
    r = cuMemFreeAsync(p, s);
    printf("destroyed_stream_free=%d\n", (int)r);
    CHECK(r != CUDA_SUCCESS, "cuMemFreeAsync on a destroyed stream succeeded");
    CU_OK(cuMemFree_v2(p));
}

/* A capture query about a live stream that fails with another error than an unknown stream's
 * says nothing about the free: it succeeds, as the driver's own does, and the block is gone
 * (a later cuMemFree of it is refused). Prints "query_fails_free=N" and "then_free=N". */
static void mode_query_fails(void)
{
    CUstream s;
    CUdeviceptr p;
    CUresult r;
    block_and_stream(&p, &s);
    CHECK(cudasimFailNext("cuStreamIsCapturing", 1, 999) == 0, "arm");
    r = cuMemFreeAsync(p, s);
    printf("query_fails_free=%d\n", (int)r);
    CU_OK(cuStreamSynchronize(s));
    CU_OK(cuCtxSynchronize());
    r = cuMemFree_v2(p);
    printf("then_free=%d\n", (int)r);
    CHECK(r != CUDA_SUCCESS, "the block survived its free");
    CU_OK(cuStreamDestroy_v2(s));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "fork") == 0)
        mode_fork();
    else if (strcmp(mode, "reset") == 0)
        mode_reset();
    else if (strcmp(mode, "reset-release") == 0)
        mode_reset_release();
    else if (strcmp(mode, "created-oom") == 0)
        mode_created_oom();
    else if (strcmp(mode, "threads") == 0)
        mode_threads();
    else if (strcmp(mode, "destroyed-stream") == 0)
        mode_destroyed_stream();
    else if (strcmp(mode, "query-fails") == 0)
        mode_query_fails();
    else
        CHECK(0, "unknown mode %s", mode);
    printf("driver_hostile %s: all checks passed\n", mode);
    return 0;
}
