/* A program that prints whether it runs in secure mode (AT_SECURE: set-user-ID, set-group-ID,
 * file capabilities): "secure 1" or "secure 0". Without arguments it uses no CUDA; with any, it
 * allocates and frees 1 MiB through the pool and prints "cudaMalloc 0". Linked with -lgpupool,
 * since the dynamic linker preloads no library by path in secure mode. */
#include <stdio.h>
#include <sys/auxv.h>

#include "cuda_runtime.h"

int main(int argc, char **argv)
{
    (void)argv;
    printf("secure %lu\n", getauxval(AT_SECURE));
    if (argc > 1) {
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, 1 << 20);
        if (e == cudaSuccess)
            e = cudaFree(p);
        printf("cudaMalloc %d\n", (int)e);
    }
    return 0;
}
