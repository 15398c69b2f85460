/* A request that fits the device while the runtime cannot say how much memory is free, on a
 * 4 GiB device (CUDASIM_MEM=4GiB): 3 GiB and 512 MiB allocated and freed (with
 * GPUPOOL_RELEASE_THRESHOLD=0 a pool gives them back at the synchronization), then, with the
 * next cudaMemGetInfo calls refused, 2 GiB asked. It must be served: the device is empty. */
#include "check.h"

#define MIB (1ull << 20)

int main(void)
{
    void *big, *small, *asked;
    unsigned i;
    CHECK_CUDA(cudaMalloc(&big, 3072 * MIB));
    CHECK_CUDA(cudaMalloc(&small, 512 * MIB));
    CHECK_CUDA(cudaFree(big));
    CHECK_CUDA(cudaFree(small));
    CHECK_CUDA(cudaDeviceSynchronize());
    for (i = 1; i <= 16; i++)
        CHECK(cudasimFailNext("cudaMemGetInfo", i, (int)cudaErrorUnknown) == 0, "arm %u", i);
    {
        cudaError_t e = cudaMalloc(&asked, 2048 * MIB);
        CHECK(e == cudaSuccess, "2 GiB on an empty device: %d", (int)e);
    }
    tag_block(asked, 2048 * MIB, 0x3c);
    CHECK_CUDA(cudaFree(asked));
    printf("memory_info_fails ok\n");
    return 0;
}
