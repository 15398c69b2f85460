/* Leaves blocks allocated at exit: three of 1 MiB and two of 4 KiB, one of the 1 MiB freed.
 * The exit summary's leak list must name the four left, by size. With the argument "reset",
 * then a cudaDeviceReset (which drops them), two more 1 MiB blocks, one freed. */
#include "check.h"

int main(int argc, char **argv)
{
    void *big[3], *small[2];
    int i;
    for (i = 0; i < 3; i++)
        CHECK_CUDA(cudaMalloc(&big[i], 1u << 20));
    for (i = 0; i < 2; i++)
        CHECK_CUDA(cudaMalloc(&small[i], 4096));
    CHECK_CUDA(cudaFree(big[1]));
    if (argc > 1 && strcmp(argv[1], "reset") == 0) {
        CHECK_CUDA(cudaDeviceReset());
        for (i = 0; i < 2; i++)
            CHECK_CUDA(cudaMalloc(&big[i], 1u << 20));
        CHECK_CUDA(cudaFree(big[0]));
    }
    printf("leak ok\n");
    return 0;
}
