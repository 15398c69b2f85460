/* Allocators the pool does not serve, on a device whose memory sits in the pool's cache: 900
 * MiB allocated with cudaMalloc and freed, then 500 MiB asked of another allocator. Without the
 * pool the memory is free and the request succeeds; with it, the pool must give its cache back
 * and let CUDA try again (never worse on memory), leaving no error behind. Modes: managed
 * (cudaMallocManaged), default-pool and own-pool (cudaMallocFromPoolAsync from the device's
 * default memory pool, or from one the program made); other-device (the 900 MiB on device 1,
 * then cudaMallocFromPoolAsync from device 1's default pool while device 0 is current; run with
 * CUDASIM_DEVICES=2). Run with CUDASIM_MEM=1GiB CUDASIM_CONTEXT_BYTES=0; ends with
 * "cache_in_the_way MODE: all checks passed". */
#include "check.h"

#define MIB (1024ull * 1024ull)

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    void *blocks[9], *p = NULL;
    cudaMemPool_t pool = NULL;
    struct cudaMemPoolProps props;
    int i, other = strcmp(mode, "other-device") == 0;

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
