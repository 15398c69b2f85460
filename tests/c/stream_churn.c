/* Stream-ordered churn: threads allocate with cudaMalloc or cudaMallocAsync, each block used by a
 * kernel on one stream (the legacy stream, the thread's per-thread stream, a blocking or a
 * non-blocking stream of its own) that writes the block's tag when it completes, and free it as
 * CUDA allows: cudaFreeAsync on that stream, or (not in relaxed mode, which trusts one stream)
 * cudaFree. A block handed out while an earlier owner's kernel may still run is caught when that
 * kernel's late write replaces the tag; a block handed out twice overlaps a live one.
 *
 * usage: stream_churn THREADS ITERATIONS SEED [async-only]
 * Prints "checked=N" (blocks whose tag was checked), "peak_live_mib=M" (the driver's peak, what
 * the program held at most when run without the pool) and "stream_churn ok". */
#include <pthread.h>

#include "check.h"

#define LIVE 12
#define THREADS_MAX 8

static int iterations;
static int async_only;
static uint64_t seed0;
static unsigned long long checked[THREADS_MAX];

/* Every thread's live blocks, for the overlap check. */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t at;
    size_t n;
} all[THREADS_MAX * LIVE];

struct block {
    void *p;
    size_t n;
    cudaStream_t s;
    unsigned char tag;
};

static const size_t sizes[] = {4096, 512 << 10, 3u << 20, 12u << 20};

static void enter(int slot, void *p, size_t n)
{
    pthread_mutex_lock(&all_lock);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (all[i].n == 0)
            continue;
        CHECK((uintptr_t)p + n <= all[i].at || all[i].at + all[i].n <= (uintptr_t)p,
              "%p+%zu handed out over a live block %p+%zu", p, n, (void *)all[i].at, all[i].n);
    }
    all[slot].at = (uintptr_t)p;
    all[slot].n = n;
    pthread_mutex_unlock(&all_lock);
}

static void leave(int slot)
{
    pthread_mutex_lock(&all_lock);
    all[slot].n = 0;
    pthread_mutex_unlock(&all_lock);
}

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t rng = seed0 * 2654435761u + (uint64_t)t * 40503u + 1;
    cudaStream_t streams[4];
    struct block live[LIVE];
    memset(live, 0, sizeof live);
    streams[0] = 0;
    streams[1] = cudaStreamPerThread;
    CHECK_CUDA(cudaStreamCreate(&streams[2]));
    CHECK_CUDA(cudaStreamCreateWithFlags(&streams[3], cudaStreamNonBlocking));
    for (int it = 0; it < iterations; it++) {
        int k = (int)(rng_next(&rng) % LIVE);
        struct block *b = &live[k];
        if (b->p) {
            /* Its own kernel done: the tag must be there, whatever ran before. */
            CHECK_CUDA(cudaStreamSynchronize(b->s));
            check_tag(b->p, b->n, b->tag);
            checked[t]++;
            leave(t * LIVE + k);
            if (async_only || rng_next(&rng) % 2)
                CHECK_CUDA(cudaFreeAsync(b->p, b->s));
            else
                CHECK_CUDA(cudaFree(b->p));
            b->p = NULL;
            continue;
        }
        b->n = sizes[rng_next(&rng) % 4] - (rng_next(&rng) % 3) * 512;
        b->s = streams[rng_next(&rng) % 4];
        b->tag = (unsigned char)(1 + rng_next(&rng) % 250);
        if (rng_next(&rng) % 2)
            CHECK_CUDA(cudaMallocAsync(&b->p, b->n, b->s));
        else
            CHECK_CUDA(cudaMalloc(&b->p, b->n));
        enter(t * LIVE + k, b->p, b->n);
        /* Up to 3 ms of work, then the tag. */
        unsigned usec = (unsigned)(rng_next(&rng) % 3000);
        CHECK_CUDA(cudasim_launch_fill(b->p, b->n, usec, b->tag, b->s));
    }
    for (int k = 0; k < LIVE; k++) {
        if (live[k].p) {
            CHECK_CUDA(cudaStreamSynchronize(live[k].s));
            check_tag(live[k].p, live[k].n, live[k].tag);
            leave(t * LIVE + k);
            CHECK_CUDA(cudaFreeAsync(live[k].p, live[k].s));
        }
    }
    CHECK_CUDA(cudaStreamSynchronize(streams[2]));
    CHECK_CUDA(cudaStreamSynchronize(streams[3]));
    CHECK_CUDA(cudaStreamDestroy(streams[2]));
    CHECK_CUDA(cudaStreamDestroy(streams[3]));
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t th[THREADS_MAX];
    unsigned long long total = 0;
    CHECK(argc >= 4, "usage: stream_churn THREADS ITERATIONS SEED [async-only]");
    int threads = atoi(argv[1]);
    CHECK(threads >= 1 && threads <= THREADS_MAX, "threads 1..%d", THREADS_MAX);
    iterations = atoi(argv[2]);
    seed0 = strtoull(argv[3], NULL, 10);
    async_only = argc > 4 && strcmp(argv[4], "async-only") == 0;
    CHECK_CUDA(cudaFree(0));
    for (int t = 0; t < threads; t++)
        CHECK(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0, "pthread_create");
    for (int t = 0; t < threads; t++)
        pthread_join(th[t], NULL);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (int t = 0; t < threads; t++)
        total += checked[t];
    CHECK(sim_stats(0).unmapped_while_busy == 0, "%llu granules unmapped under a kernel",
          sim_stats(0).unmapped_while_busy);
    printf("checked=%llu\n", total);
    printf("peak_live_mib=%llu\n", sim_stats(0).peak_live_bytes >> 20);
    printf("stream_churn ok\n");
    return 0;
}
