/* The out-of-memory report's numbers. Run with CUDASIM_MEM=1GiB CUDASIM_CONTEXT_BYTES=0: ten
 * 60 MiB blocks, two of them freed (120 MiB cached), then 800 MiB asked three times and 900 MiB
 * once: all fail with cudaErrorMemoryAllocation. With the argument "larger", then 2 GiB twice
 * (another order of magnitude), which fails too. Prints "oom report ok". */
#include "check.h"

#define MIB (1ull << 20)
#define COUNT 10

int main(int argc, char **argv)
{
    void *p[COUNT], *big = NULL;
    int i;
    for (i = 0; i < COUNT; i++)
        CHECK_CUDA(cudaMalloc(&p[i], 60 * MIB));
    CHECK_CUDA(cudaFree(p[3]));
    CHECK_CUDA(cudaFree(p[7]));
    for (i = 0; i < 3; i++) {
        CHECK(cudaMalloc(&big, 800 * MIB) == cudaErrorMemoryAllocation, "800 MiB: expected OOM");
        CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "last error after OOM");
    }
    CHECK(cudaMalloc(&big, 900 * MIB) == cudaErrorMemoryAllocation, "900 MiB: expected OOM");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "last error after OOM");
    if (argc > 1 && strcmp(argv[1], "larger") == 0) {
        for (i = 0; i < 2; i++)
            CHECK(cudaMalloc(&big, 2048 * MIB) == cudaErrorMemoryAllocation, "2 GiB: expected OOM");
    }
    for (i = 0; i < COUNT; i++) {
        if (i != 3 && i != 7)
            CHECK_CUDA(cudaFree(p[i]));
    }
    printf("oom report ok\n");
    return 0;
}
