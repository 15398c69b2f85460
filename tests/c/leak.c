/* Leaves blocks allocated at exit: three of 1 MiB and two of 4 KiB, one of the 1 MiB freed.
 * The exit summary's leak list must name the four left, by size. */
#include "check.h"

int main(void)
{
    void *big[3], *small[2];
    int i;
    for (i = 0; i < 3; i++)
        CHECK_CUDA(cudaMalloc(&big[i], 1u << 20));
    for (i = 0; i < 2; i++)
        CHECK_CUDA(cudaMalloc(&small[i], 4096));
    CHECK_CUDA(cudaFree(big[1]));
    printf("leak ok\n");
    return 0;
}
