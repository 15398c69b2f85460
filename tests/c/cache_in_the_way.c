/* Allocators the pool does not serve, on a device whose memory sits in the pool's cache: 900
 * MiB allocated with cudaMalloc and freed, then 500 MiB asked of another allocator. Without the
 * pool the memory is free and the request succeeds; with it, the pool must give its cache back
 * and let CUDA try again (never worse on memory), leaving no error behind. Modes: managed
 * (cudaMallocManaged), default-pool and own-pool (cudaMallocFromPoolAsync from the device's
 * default memory pool, or from one the program made); other-device (the 900 MiB on device 1,
 * then cudaMallocFromPoolAsync from device 1's default pool while device 0 is current; run with
 * CUDASIM_DEVICES=2); own-current (cudaMallocAsync while a pool the program made is device 0's
 * current one, with 200 MiB of device 1 in the pool's cache too: only device 0's cache can
 * serve that pool, so a request larger than device 0 is refused and device 1's cache stays,
 * then 500 MiB fit; CUDASIM_DEVICES=2, under the pool only). Run with
 * CUDASIM_MEM=1GiB CUDASIM_CONTEXT_BYTES=0; ends with "cache_in_the_way MODE: all checks
 * passed". */
#include <dlfcn.h>

#include "check.h"
#include "../../include/gpupool.h"

#define MIB (1024ull * 1024ull)

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    void *blocks[9], *p = NULL;
    cudaMemPool_t pool = NULL;
    struct cudaMemPoolProps props;
    int i, other = strcmp(mode, "other-device") == 0;
    int own_current = strcmp(mode, "own-current") == 0;
    int (*stats)(int, gpupool_stats *) = NULL;
    gpupool_stats before, after;

    if (own_current) {
        *(void **)&stats = dlsym(RTLD_DEFAULT, "gpupool_get_stats");
        CHECK(stats != NULL, "own-current runs under the pool");
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMalloc(&p, 200 * MIB));
        CHECK_CUDA(cudaFree(p));
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaSetDevice(0));
        memset(&before, 0, sizeof before);
        before.struct_size = sizeof before;
        CHECK(stats(1, &before) == 0 && before.reserved_bytes >= 200 * MIB,
              "device 1 holds %llu bytes", (unsigned long long)before.reserved_bytes);
    }
    if (other)
        CHECK_CUDA(cudaSetDevice(1));
    for (i = 0; i < 9; i++)
        CHECK_CUDA(cudaMalloc(&blocks[i], 100 * MIB));
    for (i = 0; i < 9; i++)
        CHECK_CUDA(cudaFree(blocks[i]));
    CHECK_CUDA(cudaDeviceSynchronize());
    if (other) {
        CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 1));
        CHECK_CUDA(cudaSetDevice(0));
        CHECK_CUDA(cudaMallocFromPoolAsync(&p, 500 * MIB, pool, NULL));
        CHECK_CUDA(cudaSetDevice(1));
    } else if (own_current) {
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = 0;
        CHECK_CUDA(cudaMemPoolCreate(&pool, &props));
        CHECK_CUDA(cudaDeviceSetMemPool(0, pool));
        /* More than device 0 holds: refused with or without the pool, and no other device's
         * cache could have served it. */
        CHECK(cudaMallocAsync(&p, 1500 * MIB, NULL) == cudaErrorMemoryAllocation,
              "1500 MiB on a 1 GiB device");
        CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "the refusal's error");
        memset(&after, 0, sizeof after);
        after.struct_size = sizeof after;
        CHECK(stats(1, &after) == 0 && after.reserved_bytes == before.reserved_bytes,
              "device 1's cache went back for device 0's own pool: %llu bytes, %llu before",
              (unsigned long long)after.reserved_bytes, (unsigned long long)before.reserved_bytes);
        CHECK_CUDA(cudaMallocAsync(&p, 500 * MIB, NULL));
    } else if (strcmp(mode, "managed") == 0) {
        CHECK_CUDA(cudaMallocManaged(&p, 500 * MIB, cudaMemAttachGlobal));
    } else if (strcmp(mode, "default-pool") == 0 || strcmp(mode, "own-pool") == 0) {
        if (strcmp(mode, "default-pool") == 0) {
            CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
        } else {
            memset(&props, 0, sizeof props);
            props.allocType = cudaMemAllocationTypePinned;
            props.location.type = cudaMemLocationTypeDevice;
            props.location.id = 0;
            CHECK_CUDA(cudaMemPoolCreate(&pool, &props));
        }
        CHECK_CUDA(cudaMallocFromPoolAsync(&p, 500 * MIB, pool, NULL));
    } else {
        CHECK(0, "unknown mode '%s'", mode);
    }
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemset(p, 0x5a, 500 * MIB));
    if (pool != NULL)
        CHECK_CUDA(cudaFreeAsync(p, NULL));
    else
        CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("cache_in_the_way %s: all checks passed\n", mode);
    return 0;
}
