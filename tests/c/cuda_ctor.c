/* A library whose constructor allocates with cudaMalloc and whose destructor frees with
 * cudaFree: both run inside dlopen and dlclose, under the dynamic linker's lock. */
#include "check.h"

#define BLOCKS 32

static void *g_blocks[BLOCKS];

__attribute__((constructor)) static void cuda_ctor_up(void)
{
    for (int i = 0; i < BLOCKS; i++)
        CHECK_CUDA(cudaMalloc(&g_blocks[i], 1000 + (size_t)i * 5000));
}

__attribute__((destructor)) static void cuda_ctor_down(void)
{
    for (int i = 0; i < BLOCKS; i++)
        CHECK_CUDA(cudaFree(g_blocks[i]));
}

/* The blocks the constructor made, for the program to check they are distinct. */
void *cuda_ctor_block(int i)
{
    return i >= 0 && i < BLOCKS ? g_blocks[i] : NULL;
}
