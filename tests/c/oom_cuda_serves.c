/* One allocation of 1 MiB that the pool cannot serve (the simulator refuses its segments) and
 * CUDA's own try then serves: the program gets its memory, and the summary must not count an
 * out-of-memory returned to it.
 * usage: oom_cuda_serves runtime|pitch|async|driver|driver_async */
#include "check.h"
#include "cuda.h"

#define MIB ((size_t)1 << 20)

int main(int argc, char **argv)
{
    const char *how = argc > 1 ? argv[1] : "runtime";
    void *p = NULL;
    CUdeviceptr d = 0;
    size_t pitch = 0;
    CHECK_CUDA(cudaFree(NULL));
    if (!strcmp(how, "runtime")) {
        CHECK_CUDA(cudaMalloc(&p, MIB));
    } else if (!strcmp(how, "pitch")) {
        CHECK_CUDA(cudaMallocPitch(&p, &pitch, 1024, 1024));
    } else if (!strcmp(how, "async")) {
        CHECK_CUDA(cudaMallocAsync(&p, MIB, 0));
        CHECK_CUDA(cudaStreamSynchronize(0));
    } else if (!strcmp(how, "driver")) {
        CHECK(cuMemAlloc_v2(&d, MIB) == CUDA_SUCCESS, "cuMemAlloc_v2");
    } else if (!strcmp(how, "driver_async")) {
        CHECK(cuMemAllocAsync(&d, MIB, 0) == CUDA_SUCCESS, "cuMemAllocAsync");
        CHECK(cuStreamSynchronize(0) == CUDA_SUCCESS, "cuStreamSynchronize");
    } else {
        CHECK(0, "unknown mode %s", how);
    }
    CHECK(cudaGetLastError() == cudaSuccess, "a served request left a last error");
    if (p)
        CHECK_CUDA(strcmp(how, "async") ? cudaFree(p) : cudaFreeAsync(p, 0));
    if (d)
        CHECK(cuMemFree_v2(d) == CUDA_SUCCESS, "cuMemFree_v2");
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("oom_cuda_serves ok\n");
    return 0;
}
