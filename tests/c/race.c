/* Hostile concurrency: waves of threads on several devices allocate, launch a simulated kernel
 * on every block (on the legacy, a blocking or a non-blocking stream), and free blocks while
 * those kernels may still run, switching the current device between calls. Blocks are freed by
 * their thread or, through a shared mailbox, by another one; a thread that exits leaves its
 * blocks in the mailbox. Now and then a thread synchronizes the device or a stream, empties
 * the cache, asks cudaMemGetInfo or raises SIGUSR1 (a live dump with GPUPOOL_SUMMARY set).
 *
 * Checks: no allocation gets a range a kernel still uses (unless OPTS has `R`, for relaxed mode),
 * no two live blocks overlap, every block keeps its kernel's tag, no granule is unmapped under
 * a kernel, and at the end, once everything is freed and the caches emptied, the pool reserves
 * what the driver holds.
 *
 * usage: race THREADS WAVES ITERS DEVICES SEED [OPTS]
 * OPTS letters: `R` no busy check, `L` kernels on the legacy stream only, `e` empty_cache,
 * `d` device syncs, `s` stream syncs, `u` SIGUSR1, `m` cudaMemGetInfo, `b` big blocks (up to
 * 40 MiB), `o` out of memory is allowed (a failed allocation is skipped), `w` a warm-up in
 * turns that starts thread caches, `f` six sizes only (thread caches' hits). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include "check.h"
#include "../../include/gpupool.h"

#define MAX_LIVE 8
#define MAX_DEV 4
#define MAILBOX 64
#define MAX_ALL 4096

typedef struct {
    void *p;
    size_t n;
    unsigned char tag;
    int dev;
    cudaStream_t s; /* the kernel's stream; the mailbox syncs the device before a check */
} block_t;

static int g_iters, g_devices;
static uint64_t g_seed;
static const char *g_opts = "";
static unsigned long long g_checked, g_mallocs, g_ooms;
static int (*g_empty)(int, uint64_t *);
static int (*g_stats)(int, gpupool_stats *);

static pthread_mutex_t g_all_lock = PTHREAD_MUTEX_INITIALIZER;
static block_t g_all[MAX_ALL];
static int g_count;

/* Warm-up (`w`): the threads of a wave allocate in strict turns on every device, so that each
 * device's lock changes hands on every call and the pool starts thread caches. */
static unsigned g_turn;
static int g_wave_threads;

static pthread_mutex_t g_box_lock = PTHREAD_MUTEX_INITIALIZER;
static block_t g_box[MAILBOX];
static int g_boxed;

static int opt(char c)
{
    return strchr(g_opts, c) != NULL;
}

static void enter(block_t b)
{
    int i;
    pthread_mutex_lock(&g_all_lock);
    for (i = 0; i < g_count; i++) {
        uintptr_t a = (uintptr_t)g_all[i].p, x = (uintptr_t)b.p;
        CHECK(x + b.n <= a || a + g_all[i].n <= x, "block %p+%zu overlaps live %p+%zu", b.p, b.n,
              g_all[i].p, g_all[i].n);
    }
    CHECK(g_count < MAX_ALL, "too many live blocks");
    g_all[g_count++] = b;
    g_mallocs++;
    pthread_mutex_unlock(&g_all_lock);
}

static void leave(void *p)
{
    int i;
    pthread_mutex_lock(&g_all_lock);
    for (i = 0; i < g_count; i++) {
        if (g_all[i].p == p) {
            g_all[i] = g_all[--g_count];
            break;
        }
    }
    pthread_mutex_unlock(&g_all_lock);
}

static int post(block_t b)
{
    int ok;
    pthread_mutex_lock(&g_box_lock);
    ok = g_boxed < MAILBOX;
    if (ok)
        g_box[g_boxed++] = b;
    pthread_mutex_unlock(&g_box_lock);
    return ok;
}

static int collect(block_t *b)
{
    int ok;
    pthread_mutex_lock(&g_box_lock);
    ok = g_boxed > 0;
    if (ok)
        *b = g_box[--g_boxed];
    pthread_mutex_unlock(&g_box_lock);
    return ok;
}

static void release(block_t b, uint64_t *rng)
{
    if (rng_next(rng) % 4 == 0) {
        /* Check the tag: the block's own kernel done first. */
        CHECK_CUDA(cudaSetDevice(b.dev));
        CHECK_CUDA(cudaStreamSynchronize(b.s));
        check_tag(b.p, b.n, b.tag);
    }
    /* Free with any device current. */
    CHECK_CUDA(cudaSetDevice((int)(rng_next(rng) % (uint64_t)g_devices)));
    leave(b.p);
    CHECK_CUDA(cudaFree(b.p));
}

static size_t pick_size(uint64_t *rng)
{
    uint64_t r = rng_next(rng) % 16;
    if (opt('f'))
        r = 4 + r % 4;
    if (r == 0)
        return (size_t)(rng_next(rng) % ((opt('b') ? 40u : 12u) << 20)) + 1;
    if (r < 4)
        return (size_t)(rng_next(rng) % (3u << 20)) + 1;
    if (r < 8) {
        static const size_t few[6] = {4096, 20000, 65536, 262144, 1u << 20, 3u << 20};
        return few[rng_next(rng) % 6];
    }
    return (size_t)(rng_next(rng) % (256u << 10)) + 1;
}

static void *worker(void *arg)
{
    uint64_t rng = g_seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(uintptr_t)arg + 1);
    block_t live[MAX_LIVE];
    cudaStream_t streams[MAX_DEV][3];
    int n = 0, i, d;
    unsigned long long checked = 0;
    for (d = 0; d < g_devices; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        streams[d][0] = 0;
        if (opt('L')) {
            streams[d][1] = 0;
            streams[d][2] = 0;
        } else {
            CHECK_CUDA(cudaStreamCreateWithFlags(&streams[d][1], cudaStreamDefault));
            CHECK_CUDA(cudaStreamCreateWithFlags(&streams[d][2], cudaStreamNonBlocking));
        }
    }
    if (opt('w')) {
        unsigned me = (unsigned)((uintptr_t)arg % (uintptr_t)g_wave_threads);
        for (i = 0; i < 1200; i++) {
            void *p;
            while (__atomic_load_n(&g_turn, __ATOMIC_ACQUIRE) % (unsigned)g_wave_threads != me)
                sched_yield();
            CHECK_CUDA(cudaSetDevice(i % g_devices));
            CHECK_CUDA(cudaMalloc(&p, 4096));
            CHECK_CUDA(cudaFree(p));
            __atomic_fetch_add(&g_turn, 1, __ATOMIC_RELEASE);
        }
    }
    for (i = 0; i < g_iters; i++) {
        block_t other;
        uint64_t r = rng_next(&rng) % 1000;
        int dev = (int)(rng_next(&rng) % (uint64_t)g_devices);
        if (r < 150 && collect(&other)) {
            release(other, &rng);
            continue;
        }
        if (r >= 990) {
            CHECK_CUDA(cudaSetDevice(dev));
            if (r < 993 && opt('d'))
                CHECK_CUDA(cudaDeviceSynchronize());
            else if (r < 995 && opt('e') && g_empty != NULL)
                CHECK(g_empty(dev, NULL) == 0, "gpupool_empty_cache(%d)", dev);
            else if (r < 997 && opt('s'))
                CHECK_CUDA(cudaStreamSynchronize(streams[dev][rng_next(&rng) % 3]));
            else if (r < 998 && opt('u'))
                raise(SIGUSR1);
            else if (opt('m')) {
                size_t f, t;
                CHECK_CUDA(cudaMemGetInfo(&f, &t));
                CHECK(f <= t, "free %zu > total %zu", f, t);
            }
            continue;
        }
        if (n == MAX_LIVE || (n > 0 && rng_next(&rng) % 100 < 45)) {
            int k = (int)(rng_next(&rng) % (uint64_t)n);
            block_t b = live[k];
            live[k] = live[--n];
            if (rng_next(&rng) % 100 >= 25 || !post(b))
                release(b, &rng);
            continue;
        }
        block_t b;
        cudaError_t e;
        b.n = pick_size(&rng);
        b.dev = dev;
        b.tag = (unsigned char)(rng_next(&rng) % 255 + 1);
        b.s = streams[dev][rng_next(&rng) % 3];
        CHECK_CUDA(cudaSetDevice(dev));
        e = cudaMalloc(&b.p, b.n);
        if (e == cudaErrorMemoryAllocation && opt('o')) {
            (void)cudaGetLastError();
            __atomic_fetch_add(&g_ooms, 1, __ATOMIC_RELAXED);
            continue;
        }
        CHECK(e == cudaSuccess, "cudaMalloc(%zu) on device %d returned %d", b.n, dev, (int)e);
        CHECK(((uintptr_t)b.p & 255) == 0, "pointer %p not 256-byte aligned", b.p);
        if (!opt('R'))
            CHECK(cudasimRangeBusy(b.p, b.n) == 0,
                  "thread %d: got %p (%zu bytes) on device %d while a kernel on it is in flight",
                  (int)(uintptr_t)arg, b.p, b.n, dev);
        enter(b);
        checked++;
        /* Busy for 10-200 us, then writes the tag over the block. */
        CHECK_CUDA(cudasim_launch_fill(b.p, b.n, 10 + (unsigned)(rng_next(&rng) % 190), b.tag, b.s));
        /* Maybe switch devices before the next call. */
        if (rng_next(&rng) % 2)
            CHECK_CUDA(cudaSetDevice((int)(rng_next(&rng) % (uint64_t)g_devices)));
        live[n++] = b;
    }
    /* Exit with blocks live: most go to the mailbox for others, the rest are freed here. */
    while (n > 0) {
        block_t b = live[--n];
        if (!post(b))
            release(b, &rng);
    }
    /* Blocks in the mailbox may still have kernels on these streams; a destroyed stream's work
     * runs on. Only the non-default ones are destroyed. */
    if (!opt('L'))
        for (d = 0; d < g_devices; d++) {
            CHECK_CUDA(cudaSetDevice(d));
            CHECK_CUDA(cudaStreamSynchronize(streams[d][1]));
            CHECK_CUDA(cudaStreamSynchronize(streams[d][2]));
        }
    __atomic_fetch_add(&g_checked, checked, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t tid[32];
    int threads, waves, w, t, d;
    block_t b;
    CHECK(argc >= 6, "usage: race THREADS WAVES ITERS DEVICES SEED [OPTS]");
    threads = atoi(argv[1]);
    waves = atoi(argv[2]);
    g_iters = atoi(argv[3]);
    g_devices = atoi(argv[4]);
    g_seed = strtoull(argv[5], NULL, 10) * 0x2545F4914F6CDD1Dull + 1;
    if (argc > 6)
        g_opts = argv[6];
    CHECK(threads >= 1 && threads <= 32 && waves >= 1 && g_devices >= 1 && g_devices <= MAX_DEV,
          "arguments");
    *(void **)&g_empty = dlsym(RTLD_DEFAULT, "gpupool_empty_cache");
    *(void **)&g_stats = dlsym(RTLD_DEFAULT, "gpupool_get_stats");
    g_wave_threads = threads;
    for (w = 0; w < waves; w++) {
        g_turn = 0;
        for (t = 0; t < threads; t++)
            CHECK(pthread_create(&tid[t], NULL, worker, (void *)(uintptr_t)(w * threads + t)) == 0,
                  "thread");
        for (t = 0; t < threads; t++)
            pthread_join(tid[t], NULL);
    }
    for (d = 0; d < g_devices; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    while (collect(&b)) {
        check_tag(b.p, b.n, b.tag);
        leave(b.p);
        CHECK_CUDA(cudaFree(b.p));
    }
    CHECK(g_count == 0, "%d blocks still registered", g_count);
    for (d = 0; d < g_devices; d++) {
        cudasimStats st = sim_stats(d);
        CHECK(st.unmapped_while_busy == 0, "device %d: %llu granules unmapped under a kernel", d,
              st.unmapped_while_busy);
        if (g_empty != NULL) {
            CHECK_CUDA(cudaSetDevice(d));
            CHECK(g_empty(d, NULL) == 0, "gpupool_empty_cache(%d)", d);
            st = sim_stats(d);
            printf("device %d after empty_cache: driver live bytes %llu (%llu allocations), mapped "
                   "%llu\n",
                   d, st.live_bytes, st.live_allocations, st.vmm_mapped_bytes);
        }
        if (g_stats != NULL) {
            gpupool_stats ps;
            memset(&ps, 0, sizeof ps);
            ps.struct_size = sizeof ps;
            CHECK(g_stats(d, &ps) == 0, "gpupool_get_stats(%d)", d);
            printf("device %d pool: reserved %llu allocated %llu active %llu mapped %llu\n", d,
                   (unsigned long long)ps.reserved_bytes, (unsigned long long)ps.allocated_bytes,
                   (unsigned long long)ps.active_allocations, (unsigned long long)ps.mapped_bytes);
            CHECK(ps.allocated_bytes == 0 && ps.active_allocations == 0,
                  "device %d: %llu bytes in %llu blocks still allocated", d,
                  (unsigned long long)ps.allocated_bytes,
                  (unsigned long long)ps.active_allocations);
            CHECK(ps.reserved_bytes == st.live_bytes,
                  "device %d: the pool reserves %llu, the driver holds %llu", d,
                  (unsigned long long)ps.reserved_bytes, st.live_bytes);
        }
    }
    printf("mallocs %llu checked %llu ooms %llu\n", g_mallocs, g_checked, g_ooms);
    printf("race ok\n");
    return 0;
}
