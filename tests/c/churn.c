/* Random alloc/free churn: every block is tagged with its own byte when allocated and checked
 * before it is freed, and every new block is checked against every live block for overlap.
 * A block handed out twice, or reused while live, shows as a clobbered tag or an overlap.
 *
 * usage: churn THREADS ITERATIONS DEVICES [SEED [CROSS [SIZES]]]
 * With several devices, each thread allocates on a random device and frees with another
 * device current. With CROSS (a percentage, default 0), that share of frees goes through a
 * queue shared by the threads: the block is freed by whichever thread takes it next, usually
 * not the one that allocated it. SIZES "few" draws every size from twelve fixed ones (as a
 * model's tensors repeat), so that freed blocks are asked for again at their exact size. Prints "program mallocs N", the simulator's real cudaMalloc count and peak
 * live bytes (summed over devices, then per device). */
#include <pthread.h>

#include "check.h"

#define MAX_LIVE 64
#define QUEUE 512

typedef struct {
    void *p;
    size_t n;
    unsigned char tag;
    int dev;
} live_t;

static int g_iters, g_devices;
static uint64_t g_seed;
static pthread_mutex_t g_ranges = PTHREAD_MUTEX_INITIALIZER;
static live_t g_all[64 * MAX_LIVE + QUEUE];
static int g_count;
static unsigned long long g_mallocs;
static int g_cross;
static int g_few_sizes;
static pthread_mutex_t g_queue_lock = PTHREAD_MUTEX_INITIALIZER;
static live_t g_queue[QUEUE];
static int g_queued;
static unsigned long long g_cross_frees;

static void register_block(live_t b)
{
    int i;
    pthread_mutex_lock(&g_ranges);
    for (i = 0; i < g_count; i++) {
        uintptr_t a = (uintptr_t)g_all[i].p, x = (uintptr_t)b.p;
        CHECK(x + b.n <= a || a + g_all[i].n <= x, "block %p+%zu overlaps live %p+%zu", b.p, b.n,
              g_all[i].p, g_all[i].n);
    }
    g_all[g_count++] = b;
    g_mallocs++;
    pthread_mutex_unlock(&g_ranges);
}

static void unregister_block(void *p)
{
    int i;
    pthread_mutex_lock(&g_ranges);
    for (i = 0; i < g_count; i++) {
        if (g_all[i].p == p) {
            g_all[i] = g_all[--g_count];
            break;
        }
    }
    pthread_mutex_unlock(&g_ranges);
}

/* Hand a block to the other threads; false when the queue is full. */
static int enqueue(live_t b)
{
    int ok = 0;
    pthread_mutex_lock(&g_queue_lock);
    if (g_queued < QUEUE) {
        g_queue[g_queued++] = b;
        ok = 1;
    }
    pthread_mutex_unlock(&g_queue_lock);
    return ok;
}

static int dequeue(live_t *b)
{
    int ok = 0;
    pthread_mutex_lock(&g_queue_lock);
    if (g_queued > 0) {
        *b = g_queue[--g_queued];
        ok = 1;
    }
    pthread_mutex_unlock(&g_queue_lock);
    return ok;
}

/* Check, unregister and free a block, with another device current when there is one. */
static void release(live_t b)
{
    check_tag(b.p, b.n, b.tag);
    CHECK_CUDA(cudaSetDevice((b.dev + 1) % g_devices));
    unregister_block(b.p);
    CHECK_CUDA(cudaFree(b.p));
}

static size_t pick_size(uint64_t *rng)
{
    static const size_t few[12] = {300,       4096,      6000,      65536,
                                   100000,    262144,    1 << 20,   1500000,
                                   3u << 20,  5000000,   12u << 20, 20000000};
    uint64_t r = rng_next(rng);
    if (g_few_sizes)
        return few[r % 12];
    switch (r % 8) {
    case 0:
        return (size_t)(rng_next(rng) % (24u << 20)) + 1; /* large */
    case 1:
    case 2:
        return (size_t)(rng_next(rng) % (4u << 20)) + 1; /* medium */
    default:
        return (size_t)(rng_next(rng) % (256u << 10)) + 1; /* small */
    }
}

static void *worker(void *arg)
{
    uint64_t rng = g_seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(uintptr_t)arg + 1);
    live_t mine[MAX_LIVE];
    int n = 0, i;
    for (i = 0; i < g_iters; i++) {
        live_t other;
        if (g_cross > 0 && (int)(rng_next(&rng) % 100) < g_cross && dequeue(&other)) {
            release(other);
            __atomic_fetch_add(&g_cross_frees, 1, __ATOMIC_RELAXED);
        }
        int do_alloc = n == 0 || (n < MAX_LIVE && rng_next(&rng) % 100 < 55);
        if (do_alloc) {
            live_t b;
            b.dev = (int)(rng_next(&rng) % (uint64_t)g_devices);
            b.n = pick_size(&rng);
            b.tag = (unsigned char)(rng_next(&rng) % 255 + 1);
            CHECK_CUDA(cudaSetDevice(b.dev));
            CHECK_CUDA(cudaMalloc(&b.p, b.n));
            CHECK(((uintptr_t)b.p & 255) == 0, "pointer %p not 256-byte aligned", b.p);
            register_block(b);
            tag_block(b.p, b.n, b.tag);
            mine[n++] = b;
        } else {
            int k = (int)(rng_next(&rng) % (uint64_t)n);
            live_t b = mine[k];
            mine[k] = mine[--n];
            if (!(g_cross > 0 && (int)(rng_next(&rng) % 100) < g_cross && enqueue(b)))
                release(b);
        }
    }
    while (n > 0) {
        live_t b = mine[--n];
        check_tag(b.p, b.n, b.tag);
        unregister_block(b.p);
        CHECK_CUDA(cudaFree(b.p));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads, t, d;
    pthread_t tid[64];
    unsigned long long real = 0, peak = 0;
    CHECK(argc >= 4, "usage: churn THREADS ITERATIONS DEVICES [SEED]");
    threads = atoi(argv[1]);
    g_iters = atoi(argv[2]);
    g_devices = atoi(argv[3]);
    g_seed = argc > 4 ? strtoull(argv[4], NULL, 0) : 42;
    g_cross = argc > 5 ? atoi(argv[5]) : 0;
    g_few_sizes = argc > 6 && strcmp(argv[6], "few") == 0;
    CHECK(threads >= 1 && threads <= 64 && g_devices >= 1, "arguments");
    for (t = 0; t < threads; t++)
        CHECK(pthread_create(&tid[t], NULL, worker, (void *)(uintptr_t)t) == 0, "thread");
    for (t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    {
        live_t b;
        while (dequeue(&b))
            release(b);
    }
    if (g_cross > 0)
        printf("freed by another thread %llu\n", g_cross_frees);
    for (d = 0; d < g_devices; d++) {
        real += sim_stats(d).malloc_calls;
        peak += sim_stats(d).peak_live_bytes;
    }
    printf("program mallocs %llu\n", g_mallocs);
    printf("real mallocs %llu\n", real);
    printf("peak real bytes %llu\n", peak);
    for (d = 0; d < g_devices; d++) {
        printf("device %d real mallocs %llu peak real bytes %llu\n", d, sim_stats(d).malloc_calls,
               sim_stats(d).peak_live_bytes);
    }
    printf("churn ok (seed %llu)\n", (unsigned long long)g_seed);
    return 0;
}
