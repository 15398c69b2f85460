/* In a context the program made (cuCtxCreate) the pool serves nothing: the runtime's and the
 * driver's allocations there go to the driver, outside GPUPOOL_LIMIT. Asks cudaMemGetInfo and
 * cuMemGetInfo_v2 there, one after the other, then cudaMalloc of 128 MiB. Prints "rt_free=N",
 * "rt_total=N", "drv_free=N", "drv_total=N", "malloc_rc=N" and "own_context_mem_info ok".
 * Linked with -lcuda and the runtime. */
#include <cuda.h>

#include "check.h"

#define MIB (1024ull * 1024ull)
#define CU(x) CHECK((x) == CUDA_SUCCESS, "%s", #x)

int main(void)
{
    CUcontext own = NULL;
    size_t rt_free = 0, rt_total = 0, drv_free = 0, drv_total = 0;
    void *p = NULL;

    CHECK_CUDA(cudaFree(0));
    CU(cuCtxCreate(&own, 0, 0));
    CHECK_CUDA(cudaMemGetInfo(&rt_free, &rt_total));
    CU(cuMemGetInfo_v2(&drv_free, &drv_total));
    cudaError_t r = cudaMalloc(&p, 128 * MIB);
    printf("rt_free=%zu\nrt_total=%zu\ndrv_free=%zu\ndrv_total=%zu\nmalloc_rc=%d\n", rt_free,
           rt_total, drv_free, drv_total, (int)r);
    if (r == cudaSuccess)
        CHECK_CUDA(cudaFree(p));
    CU(cuCtxDestroy(own));
    printf("own_context_mem_info ok\n");
    return 0;
}
