/* A release threshold set on a device's default memory pool, as PyTorch's cudaMallocAsync
 * backend sets one (UINT64_MAX: keep everything) and as a program that wants its memory back
 * sets 0: the pool serves that pool's cudaMallocAsyncs, so the threshold is the pool's too.
 * Argument "zero", "max" or "64MiB". Four 30 MiB blocks are allocated and freed in stream
 * order (with "64MiB" the first stays live: CUDA's threshold bounds the reserved bytes, those
 * in use included), then the device is synchronized. Prints "initial=N" (the threshold read
 * before the set), "read_back=N" (read after it), "held=N" (device bytes still taken: live
 * allocations, and what the runtime's own pool keeps) and "default_pool_threshold ok". */
#include "check.h"

#define MIB (1024ull * 1024ull)

static unsigned long long held(void)
{
    cudasimStats st = sim_stats(0);
    return st.live_bytes + st.pool_reserved_bytes - st.pool_used_bytes;
}

int main(int argc, char **argv)
{
    cudaMemPool_t def;
    void *blocks[4];
    unsigned long long threshold, initial = 1, back = 1, base;
    int i, live;

    CHECK(argc > 1, "usage: default_pool_threshold zero|max|64MiB");
    threshold = strcmp(argv[1], "zero") == 0 ? 0 : ~0ull;
    live = strcmp(argv[1], "64MiB") == 0;
    if (live)
        threshold = 64 * MIB;
    CHECK_CUDA(cudaFree(0));
    base = held();
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&def, 0));
    CHECK_CUDA(cudaMemPoolGetAttribute(def, cudaMemPoolAttrReleaseThreshold, &initial));
    CHECK_CUDA(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &threshold));
    CHECK_CUDA(cudaMemPoolGetAttribute(def, cudaMemPoolAttrReleaseThreshold, &back));
    printf("initial=%llu\nread_back=%llu\n", initial, back);
    for (i = 0; i < 4; i++)
        CHECK_CUDA(cudaMallocAsync(&blocks[i], 30 * MIB, cudaStreamLegacy));
    for (i = live; i < 4; i++)
        CHECK_CUDA(cudaFreeAsync(blocks[i], cudaStreamLegacy));
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("held=%llu\n", held() - base);
    if (live)
        CHECK_CUDA(cudaFree(blocks[0]));
    printf("default_pool_threshold ok\n");
    return 0;
}
