/* Release threshold: allocate 1 GiB in 64 MiB blocks, free it, synchronize, and print what the
 * runtime still holds. The test runs it with and without GPUPOOL_RELEASE_THRESHOLD. */
#include "check.h"

int main(void)
{
    void *p[16];
    int i;
    for (i = 0; i < 16; i++)
        CHECK_CUDA(cudaMalloc(&p[i], 64u << 20));
    for (i = 0; i < 16; i++)
        CHECK_CUDA(cudaFree(p[i]));
    printf("held after free %llu\n", sim_stats(0).live_bytes);
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("held after sync %llu\n", sim_stats(0).live_bytes);
    return 0;
}
