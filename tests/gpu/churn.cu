/* churn: random cudaMalloc/cudaFree churn from several host threads on a real GPU (the real-GPU
 * version of tests/c/churn.c).
 *
 * Checks, for every block a thread allocates:
 *  - the pointer is 256-byte aligned;
 *  - its range overlaps no other live block of any thread (host-side registry);
 *  - the data a KERNEL wrote into it (a byte pattern derived from a process-unique block id)
 *    is intact when the block is freed, counted by a verify kernel into a device counter, so
 *    GB-sized blocks are checked at device speed.
 * A block handed out twice, or reused while live or while a kernel still writes it, shows as an
 * overlap or a clobbered pattern.
 *
 * usage: churn THREADS ITERATIONS [SEED [MAX_BYTES [SIZES]]]
 *   MAX_BYTES caps the block size (default 1 GiB; the largest class is rare). SIZES "few" draws
 *   every size from twelve fixed ones (as a model's tensors repeat), which the pool's thread
 *   caches serve in relaxed mode. Prints key=value lines: program_mallocs, bytes_verified,
 *   init_ms, churn_ms, the arguments, then "churn=ok". Exit 1 on any failure. */
#include <pthread.h>

#include "common.cuh"

#define MAX_THREADS 64
#define MAX_LIVE 64

typedef struct {
    unsigned char *p;
    size_t n;
    uint32_t id;
} live_t;

static int g_iters;
static uint64_t g_seed;
static size_t g_max_bytes = (size_t)1 << 30;
static int g_few_sizes;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static live_t g_all[MAX_THREADS * MAX_LIVE];
static int g_count;
static unsigned long long g_mallocs, g_bytes_checked;
static uint32_t g_next_id = 1;

/* The byte at offset i of the block with this id (a mixed hash of both). */
__host__ __device__ static inline unsigned char tag_byte(uint32_t id, size_t i)
{
    uint32_t x = id * 0x9E3779B1u ^ (uint32_t)(i >> 2) * 0x85EBCA77u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 13;
    return (unsigned char)(x >> ((i & 3) * 8));
}

__global__ void fill_tag(unsigned char *p, size_t n, uint32_t id)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = tag_byte(id, i);
}

__global__ void count_tag_mismatches(const unsigned char *p, size_t n, uint32_t id, Mismatch *m)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long bad = 0, first = ~0ull;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (p[i] != tag_byte(id, i)) {
            if (bad == 0)
                first = i;
            bad++;
        }
    }
    if (bad) {
        atomicAdd(&m->bad, bad);
        atomicMin(&m->first, first);
    }
}

static void register_block(const live_t *b)
{
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_count; i++) {
        uintptr_t a = (uintptr_t)g_all[i].p, x = (uintptr_t)b->p;
        REQUIRE(x + b->n <= a || a + g_all[i].n <= x, "block %p+%zu overlaps live block %p+%zu",
                (void *)b->p, b->n, (void *)g_all[i].p, g_all[i].n);
    }
    REQUIRE(g_count < MAX_THREADS * MAX_LIVE, "registry full");
    g_all[g_count++] = *b;
    g_mallocs++;
    pthread_mutex_unlock(&g_lock);
}

static void unregister_block(const live_t *b)
{
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_count; i++) {
        if (g_all[i].p == b->p) {
            g_all[i] = g_all[--g_count];
            break;
        }
    }
    g_bytes_checked += b->n;
    pthread_mutex_unlock(&g_lock);
}

static size_t cap(size_t n)
{
    return n < g_max_bytes ? n : g_max_bytes;
}

static size_t pick_size(uint64_t *rng)
{
    static const size_t few[12] = {300,     4096,    6000,     65536,     100000,    262144,
                                   1 << 20, 1500000, 3u << 20, 5000000,   12u << 20, 20000000};
    if (g_few_sizes)
        return cap(few[rng_next(rng) % 12]);
    uint64_t r = rng_next(rng) % 64;
    if (r == 0) /* huge: 64 MiB .. 1 GiB */
        return cap((64u << 20) + (size_t)(rng_next(rng) % ((size_t)960 << 20)) + 1);
    if (r < 8) /* large */
        return cap((size_t)(rng_next(rng) % (24u << 20)) + 1);
    if (r < 24) /* medium */
        return cap((size_t)(rng_next(rng) % (4u << 20)) + 1);
    return cap((size_t)(rng_next(rng) % (256u << 10)) + 1); /* small */
}

/* Verify a block's pattern with the verify kernel; exit 1 with details if clobbered. */
static void check_block(const live_t *b, Mismatch *m)
{
    mismatch_reset(m);
    count_tag_mismatches<<<grid_for(b->n), FILL_THREADS>>>(b->p, b->n, b->id, m);
    CHECK_LAUNCH();
    Mismatch h = mismatch_read(m);
    if (h.bad != 0) {
        unsigned char got = 0;
        CHECK(cudaMemcpy(&got, b->p + h.first, 1, cudaMemcpyDeviceToHost));
        REQUIRE(0,
                "block %p+%zu (id %u): %llu bytes clobbered, first at offset %llu "
                "(0x%02x, expected 0x%02x)",
                (void *)b->p, b->n, b->id, h.bad, h.first, (unsigned)got,
                (unsigned)tag_byte(b->id, (size_t)h.first));
    }
}

static void release_block(const live_t *b, Mismatch *m)
{
    check_block(b, m);
    unregister_block(b);
    CHECK(cudaFree(b->p));
}

static void *worker(void *arg)
{
    uint64_t rng = g_seed ^ (0x9E3779B97F4A7C15ull * ((uint64_t)(uintptr_t)arg + 1));
    live_t mine[MAX_LIVE];
    int n = 0;
    Mismatch *m = NULL;
    if (rng == 0)
        rng = 1;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc((void **)&m, sizeof *m));
    for (int i = 0; i < g_iters; i++) {
        int do_alloc = n == 0 || (n < MAX_LIVE && rng_next(&rng) % 100 < 55);
        if (do_alloc) {
            live_t b;
            b.n = pick_size(&rng);
            b.id = __sync_fetch_and_add(&g_next_id, 1);
            CHECK(cudaMalloc((void **)&b.p, b.n));
            REQUIRE(b.p != NULL, "cudaMalloc(%zu) returned NULL", b.n);
            REQUIRE(((uintptr_t)b.p & 255) == 0, "pointer %p not 256-byte aligned", (void *)b.p);
            register_block(&b);
            fill_tag<<<grid_for(b.n), FILL_THREADS>>>(b.p, b.n, b.id);
            CHECK_LAUNCH();
            mine[n++] = b;
        } else {
            int k = (int)(rng_next(&rng) % (uint64_t)n);
            live_t b = mine[k];
            mine[k] = mine[--n];
            release_block(&b, m);
        }
    }
    while (n > 0) {
        live_t b = mine[--n];
        release_block(&b, m);
    }
    CHECK(cudaFree(m));
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t tid[MAX_THREADS];
    REQUIRE(argc >= 3, "usage: churn THREADS ITERATIONS [SEED [MAX_BYTES [SIZES]]]");
    int threads = atoi(argv[1]);
    g_iters = atoi(argv[2]);
    g_seed = argc > 3 ? strtoull(argv[3], NULL, 0) : 42;
    if (argc > 4)
        g_max_bytes = (size_t)strtoull(argv[4], NULL, 0);
    g_few_sizes = argc > 5 && strcmp(argv[5], "few") == 0;
    REQUIRE(threads >= 1 && threads <= MAX_THREADS && g_iters >= 0 && g_max_bytes >= 1,
            "arguments: threads 1..%d, iterations >= 0, max bytes >= 1", MAX_THREADS);
    double t0 = now_ms();
    CHECK(cudaFree(NULL)); /* create the context before the clock matters */
    double t1 = now_ms();
    for (int t = 0; t < threads; t++)
        REQUIRE(pthread_create(&tid[t], NULL, worker, (void *)(uintptr_t)t) == 0, "thread");
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    CHECK(cudaDeviceSynchronize());
    double t2 = now_ms();
    REQUIRE(g_count == 0, "%d blocks left in the registry", g_count);
    printf("program_mallocs=%llu\n", g_mallocs);
    printf("bytes_verified=%llu\n", g_bytes_checked);
    printf("init_ms=%.1f churn_ms=%.1f\n", t1 - t0, t2 - t1);
    printf("threads=%d iterations=%d seed=%llu\n", threads, g_iters, (unsigned long long)g_seed);
    printf("churn=ok\n");
    return 0;
}
