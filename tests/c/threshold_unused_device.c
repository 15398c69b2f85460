/* A release threshold of 5 MiB set on the default pool of a device the program never used
 * (device 1 of two; device 0 is the program's). Without the pool the call makes no context on
 * device 1. Prints "device1_active=N" (cuDevicePrimaryCtxGetState), "threshold1=N" (the pool's threshold
 * for device 1, -1 without the pool) and "threshold_unused_device ok". Linked with -lcuda. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include "check.h"

typedef int (*get_fn)(int device, unsigned long long *bytes);

int main(void)
{
    cudaMemPool_t def1;
    unsigned long long five = 5ull << 20, pools = ~0ull;
    get_fn get = (get_fn)dlsym(RTLD_DEFAULT, "gpupool_get_release_threshold");
    unsigned int flags = 0;
    int active = -1;

    CHECK_CUDA(cudaFree(0));
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&def1, 1));
    CHECK_CUDA(cudaMemPoolSetAttribute(def1, cudaMemPoolAttrReleaseThreshold, &five));
    CHECK(cuDevicePrimaryCtxGetState(1, &flags, &active) == CUDA_SUCCESS, "state");
    printf("device1_active=%d\n", active);
    if (get != NULL)
        CHECK(get(1, &pools) == 0, "gpupool_get_release_threshold(1)");
    printf("threshold1=%lld\n", get != NULL ? (long long)pools : -1ll);
    printf("threshold_unused_device ok\n");
    return 0;
}
