/* cudaMallocAsync out of memory, as PyTorch's cudaMallocAsync backend meets it under the
 * preload: 600 MiB live on a 1 GiB device, then 600 MiB more on the same stream. The program
 * gets cudaErrorMemoryAllocation from the call and as its last error, with the pool or
 * without. Then the driver's cuMemAllocAsync of 300 MiB (found as a program finds it, through
 * the dynamic linker) runs out too. Prints "status=N", "last_error=N", "driver_status=N" and
 * "oom_async ok". */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>

#include "check.h"

typedef int (*cu_mem_alloc_async_fn)(unsigned long long *, size_t, cudaStream_t);

#define MIB (1024ull * 1024ull)

int main(void)
{
    cudaStream_t s;
    void *kept, *more = NULL;
    cudaError_t r;

    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK_CUDA(cudaMallocAsync(&kept, 600 * MIB, s));
    r = cudaMallocAsync(&more, 600 * MIB, s);
    printf("status=%d\nlast_error=%d\n", (int)r, (int)cudaGetLastError());
    cu_mem_alloc_async_fn cu_alloc_async =
        (cu_mem_alloc_async_fn)dlsym(RTLD_DEFAULT, "cuMemAllocAsync");
    unsigned long long cu_more = 0;
    CHECK(cu_alloc_async != NULL, "no cuMemAllocAsync in the process");
    printf("driver_status=%d\n", cu_alloc_async(&cu_more, 300 * MIB, s));
    CHECK_CUDA(cudaFreeAsync(kept, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    printf("oom_async ok\n");
    return 0;
}
