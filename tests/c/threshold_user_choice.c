/* A release threshold the user chose at run time (gpupool_set_release_threshold, which replaces
 * GPUPOOL_RELEASE_THRESHOLD for the process), then PyTorch's cudaMallocAsync backend starting
 * on the device: it sets UINT64_MAX on the default pool. Argument "all" (the threshold set for
 * every device before the first CUDA call, as `gpupool.set_release_threshold` before
 * `import torch`) or "device" (for device 0 after cudaFree(0)). Four 30 MiB blocks are
 * allocated and freed in stream order, then the device is synchronized. Prints "api_rc=N",
 * "held=N" and "threshold_user_choice ok". Run under LD_PRELOAD=libgpupool.so only. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include "check.h"

#define MIB (1024ull * 1024ull)

typedef int (*set_fn)(int device, unsigned long long bytes);

static unsigned long long held(void)
{
    cudasimStats st = sim_stats(0);
    return st.live_bytes + st.pool_reserved_bytes - st.pool_used_bytes;
}

int main(int argc, char **argv)
{
    set_fn set = (set_fn)dlsym(RTLD_DEFAULT, "gpupool_set_release_threshold");
    cudaMemPool_t def;
    void *blocks[4];
    unsigned long long keep_all = ~0ull, base;
    int i, rc = -1, all;

    CHECK(argc > 1, "usage: threshold_user_choice all|device");
    CHECK(set != NULL, "run under the pool");
    all = strcmp(argv[1], "all") == 0;
    if (all)
        rc = set(-1, 0);
    CHECK_CUDA(cudaFree(0));
    if (!all)
        rc = set(0, 0);
    base = held();
    /* PyTorch's CUDAMallocAsyncAllocator, at the device's first use. */
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&def, 0));
    CHECK_CUDA(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &keep_all));
    for (i = 0; i < 4; i++)
        CHECK_CUDA(cudaMallocAsync(&blocks[i], 30 * MIB, cudaStreamLegacy));
    for (i = 0; i < 4; i++)
        CHECK_CUDA(cudaFreeAsync(blocks[i], cudaStreamLegacy));
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("api_rc=%d\nheld=%llu\n", rc, held() - base);
    printf("threshold_user_choice ok\n");
    return 0;
}
