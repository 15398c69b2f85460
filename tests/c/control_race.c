/* The pool's controls while threads churn. Worker threads allocate with cudaMalloc or
 * cudaMallocAsync on one of four streams (legacy, per-thread, blocking, non-blocking), give
 * every block a kernel that writes its tag late, and free with cudaFree or cudaFreeAsync while
 * those kernels may still run; now and then a worker frees every block of a created stream in
 * stream order and destroys that stream at once, then makes a new one. Workers come in waves:
 * a thread exits with its thread cache full. Meanwhile a control thread keeps calling what
 * OPTS names, on device 0 or on every device:
 *   t gpupool_set_release_threshold   e gpupool_empty_cache      p gpupool_reset_peak_stats
 *   g gpupool_get_stats, checked      S gpupool_get_summary      T cudaMemPoolTrimTo
 *   A default pool attributes         D cudaDeviceSynchronize    u SIGUSR1
 *   m cudaMemGetInfo                  f fork: the child allocates through the runtime, then
 *                                       exits or _exits
 * Other letters: R relaxed mode (frees in stream order only, no busy check), o out of memory
 * allowed (the allocation is skipped).
 *
 * Checks: no block handed out over a live one, no cudaMalloc block while a kernel still uses
 * it (not R), every tag kept (always for cudaMallocAsync blocks), no granule unmapped under a
 * kernel, the figures consistent while read, and at the end, all freed and the cache emptied,
 * the pool reserves what the driver holds. At most MAX_FORKS forks a run.
 *
 * usage: control_race THREADS WAVES ITERS SEED OPTS
 * Prints "checked=N", "controls=N", "ooms=N" and "control_race ok". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "../../include/gpupool.h"

#define LIVE 10
#define THREADS_MAX 8
#define MAX_FORKS 40
#define ALL (THREADS_MAX * LIVE)

static int g_iters;
static uint64_t g_seed;
static const char *g_opts = "";
static volatile int g_stop;
static unsigned long long g_checked, g_controls, g_ooms;

static int (*g_empty)(int, uint64_t *);
static int (*g_stats)(int, gpupool_stats *);
static int (*g_threshold)(int, uint64_t);
static int (*g_reset_peaks)(int);
static int (*g_summary)(int, char *, size_t, size_t *);

static pthread_mutex_t g_all_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t at;
    size_t n;
} g_all[ALL];

struct block {
    void *p;
    size_t n;
    int s; /* index of its stream */
    int async; /* from cudaMallocAsync: may be a block its stream freed, in stream order */
    unsigned char tag;
};

static int opt(char c)
{
    return strchr(g_opts, c) != NULL;
}

static void enter(int slot, void *p, size_t n)
{
    pthread_mutex_lock(&g_all_lock);
    for (int i = 0; i < ALL; i++) {
        if (g_all[i].n == 0)
            continue;
        CHECK((uintptr_t)p + n <= g_all[i].at || g_all[i].at + g_all[i].n <= (uintptr_t)p,
              "%p+%zu handed out over a live block %p+%zu", p, n, (void *)g_all[i].at,
              g_all[i].n);
    }
    g_all[slot].at = (uintptr_t)p;
    g_all[slot].n = n;
    pthread_mutex_unlock(&g_all_lock);
}

static void leave(int slot)
{
    pthread_mutex_lock(&g_all_lock);
    g_all[slot].n = 0;
    pthread_mutex_unlock(&g_all_lock);
}

static const size_t sizes[] = {512, 4096, 100000, 512 << 10, 1u << 20, 3u << 20, 9u << 20};

static void free_block(struct block *b, cudaStream_t *streams, int slot, uint64_t *rng)
{
    if (b->async || rng_next(rng) % 3 == 0) {
        CHECK_CUDA(cudaStreamSynchronize(streams[b->s]));
        check_tag(b->p, b->n, b->tag);
        __atomic_fetch_add(&g_checked, 1, __ATOMIC_RELAXED);
    }
    leave(slot);
    if (opt('R') || rng_next(rng) % 2)
        CHECK_CUDA(cudaFreeAsync(b->p, streams[b->s]));
    else
        CHECK_CUDA(cudaFree(b->p));
    b->p = NULL;
}

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t rng = g_seed * 2654435761u + (uint64_t)t * 40503u + 1;
    cudaStream_t streams[4];
    struct block live[LIVE];
    memset(live, 0, sizeof live);
    CHECK_CUDA(cudaSetDevice(0));
    streams[0] = 0;
    streams[1] = cudaStreamPerThread;
    CHECK_CUDA(cudaStreamCreate(&streams[2]));
    CHECK_CUDA(cudaStreamCreateWithFlags(&streams[3], cudaStreamNonBlocking));
    for (int it = 0; it < g_iters; it++) {
        uint64_t r = rng_next(&rng) % 100;
        if (r < 2) {
            /* Free a created stream's blocks in its order, destroy it with the frees pending. */
            int s = 2 + (int)(rng_next(&rng) % 2);
            for (int k = 0; k < LIVE; k++)
                if (live[k].p && live[k].s == s) {
                    leave(t * LIVE + k);
                    CHECK_CUDA(cudaFreeAsync(live[k].p, streams[s]));
                    live[k].p = NULL;
                }
            CHECK_CUDA(cudaStreamDestroy(streams[s]));
            CHECK_CUDA(cudaStreamCreateWithFlags(&streams[s], s == 2 ? cudaStreamDefault
                                                                     : cudaStreamNonBlocking));
            continue;
        }
        int k = (int)(rng_next(&rng) % LIVE);
        struct block *b = &live[k];
        if (b->p) {
            free_block(b, streams, t * LIVE + k, &rng);
            continue;
        }
        b->n = sizes[rng_next(&rng) % (sizeof sizes / sizeof sizes[0])] - rng_next(&rng) % 512;
        b->s = (int)(rng_next(&rng) % 4);
        b->tag = (unsigned char)(rng_next(&rng) % 255 + 1);
        b->async = (int)(rng_next(&rng) % 2);
        cudaError_t e = b->async ? cudaMallocAsync(&b->p, b->n, streams[b->s])
                                 : cudaMalloc(&b->p, b->n);
        if (e == cudaErrorMemoryAllocation && opt('o')) {
            (void)cudaGetLastError();
            __atomic_fetch_add(&g_ooms, 1, __ATOMIC_RELAXED);
            b->p = NULL;
            continue;
        }
        CHECK(e == cudaSuccess, "thread %d: allocation of %zu returned %d", t, b->n, (int)e);
        /* A cudaMallocAsync may get a block its stream freed while its kernel runs, in that
         * stream's order, as CUDA's own pool does: its tag is checked instead. */
        if (!opt('R') && !b->async)
            CHECK(cudasimRangeBusy(b->p, b->n) == 0,
                  "thread %d: got %p (%zu bytes) while a kernel on it is in flight", t, b->p,
                  b->n);
        enter(t * LIVE + k, b->p, b->n);
        CHECK_CUDA(cudasim_launch_fill(b->p, b->n, 10 + (unsigned)(rng_next(&rng) % 150), b->tag,
                                       streams[b->s]));
    }
    /* Exit with a full thread cache: free everything, most of it at once. */
    for (int k = 0; k < LIVE; k++)
        if (live[k].p)
            free_block(&live[k], streams, t * LIVE + k, &rng);
    CHECK_CUDA(cudaStreamDestroy(streams[2]));
    CHECK_CUDA(cudaStreamDestroy(streams[3]));
    return NULL;
}

/* The figures of device 0 read while the workers run: each snapshot must add up. */
static void check_stats(void)
{
    gpupool_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK(g_stats(0, &s) == 0, "gpupool_get_stats(0)");
    CHECK(s.requested_bytes <= s.allocated_bytes, "requested %llu > allocated %llu",
          (unsigned long long)s.requested_bytes, (unsigned long long)s.allocated_bytes);
    CHECK(s.allocated_bytes <= s.reserved_bytes, "allocated %llu > reserved %llu",
          (unsigned long long)s.allocated_bytes, (unsigned long long)s.reserved_bytes);
    CHECK(s.cached_bytes == s.reserved_bytes - s.allocated_bytes,
          "cached %llu != reserved %llu - allocated %llu", (unsigned long long)s.cached_bytes,
          (unsigned long long)s.reserved_bytes, (unsigned long long)s.allocated_bytes);
    CHECK(s.pending_bytes <= s.cached_bytes, "pending %llu > cached %llu",
          (unsigned long long)s.pending_bytes, (unsigned long long)s.cached_bytes);
    CHECK(s.releasable_bytes + s.stranded_bytes <= s.cached_bytes,
          "releasable %llu + stranded %llu > cached %llu",
          (unsigned long long)s.releasable_bytes, (unsigned long long)s.stranded_bytes,
          (unsigned long long)s.cached_bytes);
    CHECK(s.mapped_bytes <= s.reserved_bytes, "mapped %llu > reserved %llu",
          (unsigned long long)s.mapped_bytes, (unsigned long long)s.reserved_bytes);
    CHECK(s.allocated_bytes <= s.allocated_bytes_peak_since_reset &&
              s.allocated_bytes_peak_since_reset <= s.allocated_bytes_peak,
          "allocated %llu, peak since reset %llu, peak %llu",
          (unsigned long long)s.allocated_bytes,
          (unsigned long long)s.allocated_bytes_peak_since_reset,
          (unsigned long long)s.allocated_bytes_peak);
    CHECK(s.reserved_bytes <= s.reserved_bytes_peak_since_reset &&
              s.reserved_bytes_peak_since_reset <= s.reserved_bytes_peak,
          "reserved %llu, peak since reset %llu, peak %llu", (unsigned long long)s.reserved_bytes,
          (unsigned long long)s.reserved_bytes_peak_since_reset,
          (unsigned long long)s.reserved_bytes_peak);
    CHECK(s.active_allocations <= s.active_allocations_peak_since_reset &&
              s.segments <= s.segments_peak_since_reset,
          "active %llu (peak since reset %llu), segments %llu (peak since reset %llu)",
          (unsigned long long)s.active_allocations,
          (unsigned long long)s.active_allocations_peak_since_reset,
          (unsigned long long)s.segments, (unsigned long long)s.segments_peak_since_reset);
}

static void *control(void *arg)
{
    uint64_t rng = g_seed ^ 0x5bd1e995u;
    static char buf[1 << 16];
    cudaMemPool_t pool;
    int forks = 0;
    (void)arg;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
    while (!__atomic_load_n(&g_stop, __ATOMIC_ACQUIRE)) {
        char c = g_opts[rng_next(&rng) % strlen(g_opts)];
        int dev = rng_next(&rng) % 2 ? 0 : -1;
        static const uint64_t thresholds[] = {0, 1u << 20, 64u << 20, UINT64_MAX};
        uint64_t th = thresholds[rng_next(&rng) % 4];
        size_t len;
        switch (c) {
        case 't':
            CHECK(g_threshold(dev, th) == 0, "set_release_threshold(%d)", dev);
            break;
        case 'e':
            CHECK(g_empty(dev, NULL) == 0, "empty_cache(%d)", dev);
            break;
        case 'p':
            CHECK(g_reset_peaks(dev) == 0, "reset_peak_stats(%d)", dev);
            break;
        case 'g':
            check_stats();
            break;
        case 'S':
            CHECK(g_summary((int)(rng_next(&rng) % 3), buf, sizeof buf, &len) == 0,
                  "get_summary");
            break;
        case 'T':
            CHECK_CUDA(cudaMemPoolTrimTo(pool, (size_t)(th == UINT64_MAX ? 0 : th)));
            break;
        case 'A': {
            unsigned long long v = th, zero = 0, got = 0;
            CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &v));
            CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
            CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
            /* Two reads, not one snapshot: no relation between them is checked. */
            CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &got));
            CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v));
            break;
        }
        case 'D':
            CHECK_CUDA(cudaDeviceSynchronize());
            break;
        case 'u':
            raise(SIGUSR1);
            break;
        case 'm': {
            size_t f, tot;
            CHECK_CUDA(cudaMemGetInfo(&f, &tot));
            CHECK(f <= tot, "free %zu > total %zu", f, tot);
            break;
        }
        case 'f': {
            int status;
            pid_t pid;
            /* Each fork copies the process and waits for the child: a bounded number keeps
             * the run's time bounded on a loaded machine. */
            if (forks >= MAX_FORKS)
                continue;
            forks++;
            pid = fork();
            CHECK(pid >= 0, "fork");
            if (pid == 0) {
                void *p = NULL;
                int ok = cudaMalloc(&p, 1 << 20) == cudaSuccess && cudaFree(p) == cudaSuccess;
                if (rng_next(&rng) % 2)
                    _exit(ok ? 0 : 3);
                exit(ok ? 0 : 3);
            }
            CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child: status %d",
                  status);
            break;
        }
        default:
            continue;
        }
        __atomic_fetch_add(&g_controls, 1, __ATOMIC_RELAXED);
        if (rng_next(&rng) % 4 == 0)
            sched_yield();
    }
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t tid[THREADS_MAX], ctl;
    CHECK(argc >= 6, "usage: control_race THREADS WAVES ITERS SEED OPTS");
    int threads = atoi(argv[1]), waves = atoi(argv[2]);
    g_iters = atoi(argv[3]);
    g_seed = strtoull(argv[4], NULL, 10) + 1;
    g_opts = argv[5];
    CHECK(threads >= 1 && threads <= THREADS_MAX && waves >= 1 && g_iters > 0, "arguments");
    *(void **)&g_empty = dlsym(RTLD_DEFAULT, "gpupool_empty_cache");
    *(void **)&g_stats = dlsym(RTLD_DEFAULT, "gpupool_get_stats");
    *(void **)&g_threshold = dlsym(RTLD_DEFAULT, "gpupool_set_release_threshold");
    *(void **)&g_reset_peaks = dlsym(RTLD_DEFAULT, "gpupool_reset_peak_stats");
    *(void **)&g_summary = dlsym(RTLD_DEFAULT, "gpupool_get_summary");
    CHECK(g_empty && g_stats && g_threshold && g_reset_peaks && g_summary,
          "run under LD_PRELOAD=libgpupool.so");
    /* The first allocation makes the pool (and its SIGUSR1 handler) before the control thread. */
    void *first;
    CHECK_CUDA(cudaMalloc(&first, 4096));
    CHECK_CUDA(cudaFree(first));
    CHECK(pthread_create(&ctl, NULL, control, NULL) == 0, "control thread");
    for (int w = 0; w < waves; w++) {
        for (int t = 0; t < threads; t++)
            CHECK(pthread_create(&tid[t], NULL, worker, (void *)(intptr_t)t) == 0, "thread");
        for (int t = 0; t < threads; t++)
            pthread_join(tid[t], NULL);
    }
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
    pthread_join(ctl, NULL);

    CHECK_CUDA(cudaDeviceSynchronize());
    cudasimStats st = sim_stats(0);
    CHECK(st.unmapped_while_busy == 0, "%llu granules unmapped under a kernel",
          st.unmapped_while_busy);
    CHECK(g_empty(0, NULL) == 0, "empty_cache(0)");
    check_stats();
    gpupool_stats ps;
    memset(&ps, 0, sizeof ps);
    ps.struct_size = sizeof ps;
    CHECK(g_stats(0, &ps) == 0, "gpupool_get_stats(0)");
    st = sim_stats(0);
    CHECK(ps.allocated_bytes == 0 && ps.active_allocations == 0,
          "%llu bytes in %llu blocks still allocated", (unsigned long long)ps.allocated_bytes,
          (unsigned long long)ps.active_allocations);
    CHECK(ps.pending_bytes == 0, "%llu bytes pending after a synchronization",
          (unsigned long long)ps.pending_bytes);
    CHECK(ps.reserved_bytes == st.live_bytes, "the pool reserves %llu, the driver holds %llu",
          (unsigned long long)ps.reserved_bytes, st.live_bytes);
    printf("reserved=%llu\n", (unsigned long long)ps.reserved_bytes);
    printf("checked=%llu\ncontrols=%llu\nooms=%llu\n", g_checked, g_controls, g_ooms);
    printf("control_race ok\n");
    return 0;
}
