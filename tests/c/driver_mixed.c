/* The runtime and the driver in one process, linked with both (-lcudart -lcuda): one pool for
 * both paths. A block from cudaMalloc is freed by cuMemFree and the reverse; a double free
 * across the two is refused by the second; the calls reach the device's allocator rarely; a
 * cuMemAlloc larger than the device is the driver's out-of-memory (its report is the test's).
 * Prints key=value lines and "driver_mixed: all checks passed". */
#include "check.h"
#include "cuda.h"

#define MiB (1024ull * 1024ull)

int main(void)
{
    void *p = NULL;
    CUdeviceptr d = 0;
    cudasimStats before, after;
    int i;

    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(NULL));
    before = sim_stats(0);
    for (i = 0; i < 50; i++) {
        CHECK_CUDA(cudaMalloc(&p, MiB));
        CHECK(cuMemFree_v2((CUdeviceptr)p) == CUDA_SUCCESS, "cuMemFree of a cudaMalloc block");
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK(cuMemAlloc_v2(&d, MiB) == CUDA_SUCCESS, "cuMemAlloc");
        CHECK_CUDA(cudaFree((void *)d));
        CHECK(cuCtxSynchronize() == CUDA_SUCCESS, "cuCtxSynchronize");
    }
    after = sim_stats(0);
    printf("mixed_mallocs=%llu\n", after.malloc_calls - before.malloc_calls);

    /* Freed by one API, freed again by the other: the second is refused. */
    CHECK_CUDA(cudaMalloc(&p, MiB));
    CHECK(cuMemFree_v2((CUdeviceptr)p) == CUDA_SUCCESS, "first free");
    CHECK(cudaFree(p) == cudaErrorInvalidValue, "a second free through the runtime");
    (void)cudaGetLastError();
    CHECK(cuMemAlloc_v2(&d, MiB) == CUDA_SUCCESS, "cuMemAlloc");
    CHECK_CUDA(cudaFree((void *)d));
    CHECK(cuMemFree_v2(d) == CUDA_ERROR_INVALID_VALUE, "a second free through the driver");

    /* The driver's cuMemFree taken through the runtime: a cudaMalloc block freed with it goes
     * back to the pool, never its segment to the driver. */
    {
        CUresult (*mem_free)(CUdeviceptr) = NULL;
        enum cudaDriverEntryPointQueryResult st;
        CHECK_CUDA(cudaGetDriverEntryPoint("cuMemFree", (void **)&mem_free, cudaEnableDefault, &st));
        CHECK(mem_free != NULL && st == cudaDriverEntryPointSuccess, "no cuMemFree");
        CHECK_CUDA(cudaMalloc(&p, MiB));
        before = sim_stats(0);
        CHECK(mem_free((CUdeviceptr)p) == CUDA_SUCCESS, "cuMemFree through the entry point");
        after = sim_stats(0);
        printf("entry_point_frees=%llu\n", after.free_calls - before.free_calls);
        mem_free = NULL;
        CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuMemFree", (void **)&mem_free, 12000,
                                                    cudaEnableDefault, &st));
        CHECK_CUDA(cudaMalloc(&p, MiB));
        before = sim_stats(0);
        CHECK(mem_free((CUdeviceptr)p) == CUDA_SUCCESS, "cuMemFree through ByVersion");
        after = sim_stats(0);
        printf("entry_point_by_version_frees=%llu\n", after.free_calls - before.free_calls);
    }

    /* Larger than the 1 GiB device, with the runtime loaded: the driver's own answer. */
    CHECK(cuMemAlloc_v2(&d, 2048 * MiB) == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc of 2 GiB");

    printf("driver_mixed: all checks passed\n");
    return 0;
}
