/* The out-of-memory report's advice.
 *   fragment (CUDASIM_MEM=1400MiB): a 1 GiB block freed, forty 24 MiB blocks carved from it,
 *             every other one freed (free memory in 24 MiB pieces), then 100 MiB asked: fails
 *             although the cache holds enough, unless a split cap keeps the big block whole.
 *             Prints "big ok" or "big oom".
 *   outside (CUDASIM_MEM=1GiB): one 64 MiB block through the pool, then 600 MiB taken outside
 *             it (cudaMallocManaged), then 512 MiB asked: fails.
 *   context (CUDASIM_MEM=1GiB): one 64 MiB block, then 900 MiB asked: fails with nothing but
 *             the context outside the pool.
 * Prints "oom advice ok". */
#include "check.h"

#define MIB (1ull << 20)
#define MAX_BLOCKS 1024

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    void *p[MAX_BLOCKS], *big = NULL, *first = NULL;
    int n = 0, i;
    if (strcmp(mode, "fragment") == 0) {
        cudaError_t r;
        CHECK_CUDA(cudaMalloc(&first, 1024 * MIB));
        CHECK_CUDA(cudaFree(first));
        CHECK_CUDA(cudaDeviceSynchronize());
        for (n = 0; n < 40; n++)
            CHECK_CUDA(cudaMalloc(&p[n], 24 * MIB));
        for (i = 0; i < n; i += 2)
            CHECK_CUDA(cudaFree(p[i]));
        CHECK_CUDA(cudaDeviceSynchronize());
        r = cudaMalloc(&big, 100 * MIB);
        CHECK(r == cudaSuccess || r == cudaErrorMemoryAllocation, "100 MiB: %d", (int)r);
        printf("big %s\n", r == cudaSuccess ? "ok" : "oom");
        (void)cudaGetLastError();
        if (r == cudaSuccess)
            CHECK_CUDA(cudaFree(big));
        for (i = 1; i < n; i += 2)
            CHECK_CUDA(cudaFree(p[i]));
    } else if (strcmp(mode, "outside") == 0 || strcmp(mode, "context") == 0) {
        void *other = NULL;
        CHECK_CUDA(cudaMalloc(&first, 64 * MIB));
        if (strcmp(mode, "outside") == 0) {
            CHECK_CUDA(cudaMallocManaged(&other, 600 * MIB, cudaMemAttachGlobal));
            CHECK(cudaMalloc(&big, 512 * MIB) == cudaErrorMemoryAllocation, "512 MiB: expected OOM");
            CHECK_CUDA(cudaFree(other));
        } else {
            CHECK(cudaMalloc(&big, 900 * MIB) == cudaErrorMemoryAllocation, "900 MiB: expected OOM");
        }
        CHECK_CUDA(cudaFree(first));
    } else {
        CHECK(0, "mode: fragment, outside or context");
    }
    printf("oom advice ok\n");
    return 0;
}
