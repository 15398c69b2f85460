/* hit_bench: nanoseconds per allocate+free pair, per size (a benchmark, not a check).
 *
 * usage: hit_bench malloc   cudaMalloc + cudaFree pairs: run without LD_PRELOAD this is the
 *                           driver's cost; with libgpupool preloaded, the pool's (cache hits).
 *        hit_bench async    cudaMallocAsync + cudaFreeAsync on the legacy default stream, from
 *                           the device's default memory pool with its release threshold set to
 *                           UINT64_MAX (stream-ordered pool hits), for comparison.
 * Each size is measured in doubling batches until ~TARGET_MS of wall time (or MAX_ITERS pairs)
 * has passed, after one warm-up pair. Prints key=value lines: "mode=MODE", then
 * "size=BYTES ns_per_pair=NS pairs=N" per size, then "getdevice_ns=NS getdevice_calls=N" (what one
 * cudaGetDevice costs: the pool asks it in each hook when the process sees more than one device),
 * then "hit_bench=done". */
#include "common.cuh"

#define TARGET_MS 200.0
#define MAX_ITERS (1L << 21)

static void pair(size_t n, int async)
{
    void *p = NULL;
    if (async) {
        CHECK(cudaMallocAsync(&p, n, 0));
        CHECK(cudaFreeAsync(p, 0));
    } else {
        CHECK(cudaMalloc(&p, n));
        CHECK(cudaFree(p));
    }
}

static double measure(size_t n, int async, long *pairs)
{
    pair(n, async); /* warm-up: the first pair fills the cache */
    CHECK(cudaDeviceSynchronize());
    long total = 0, batch = 1;
    double elapsed = 0;
    while (elapsed < TARGET_MS && total < MAX_ITERS) {
        double t0 = now_ms();
        for (long i = 0; i < batch; i++)
            pair(n, async);
        if (async)
            CHECK(cudaStreamSynchronize(0));
        elapsed += now_ms() - t0;
        total += batch;
        batch *= 2;
    }
    *pairs = total;
    return elapsed * 1e6 / (double)total;
}

int main(int argc, char **argv)
{
    REQUIRE(argc == 2 && (strcmp(argv[1], "malloc") == 0 || strcmp(argv[1], "async") == 0),
            "usage: hit_bench malloc|async");
    int async = strcmp(argv[1], "async") == 0;
    static const size_t sizes[] = {512, (size_t)64 << 10, (size_t)1 << 20, (size_t)16 << 20,
                                   (size_t)256 << 20, (size_t)1 << 30};
    printf("mode=%s\n", argv[1]);
    CHECK(cudaFree(NULL));
    if (async) {
        cudaMemPool_t pool;
        uint64_t keep = UINT64_MAX;
        CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
        CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        long pairs = 0;
        double ns = measure(sizes[i], async, &pairs);
        printf("size=%zu ns_per_pair=%.0f pairs=%ld\n", sizes[i], ns, pairs);
        fflush(stdout);
    }
    /* The runtime's own cudaGetDevice, which the pool calls once in each cudaMalloc and
     * cudaFree it serves (to find the device's pool) when the process sees more than one
     * device: its share of a pooled pair there. */
    {
        const long calls = 1L << 20;
        int dev = -1;
        double t0 = now_ms();
        for (long i = 0; i < calls; i++)
            CHECK(cudaGetDevice(&dev));
        printf("getdevice_ns=%.1f getdevice_calls=%ld\n", (now_ms() - t0) * 1e6 / (double)calls,
               calls);
    }
    printf("hit_bench=done\n");
    return 0;
}
