/* A module built against one CUDA runtime, loaded RTLD_LOCAL by runtimes_host.c beside a module
 * built against another (frameworks built for different CUDA versions in one process).
 * module_run launches the simulator's kernel twice through each entry point, cudaLaunchKernel
 * and __cudaLaunchKernel (what <<<...>>> calls since CUDA 13); with `with_memory` on a block
 * from cudaMalloc (the pool's, allocated through the runtime the pool uses), else on no memory.
 * Returns 0, or 100000 * step + the CUDA error. module_refused: below. Built twice by tests/preload.rs, against two
 * runtimes (-DSECOND_RUNTIME only tells the two builds apart). */
#include "check.h"

int module_run(int with_memory);
int module_refused(void);

int module_run(int with_memory)
{
    void *p = NULL;
    size_t bytes = 0;
    cudaError_t e;
    if (with_memory) {
        bytes = 1 << 20;
        if ((e = cudaMalloc(&p, bytes)) != cudaSuccess)
            return 100000 + (int)e;
    }
    for (int i = 0; i < 2; i++) {
        if ((e = cudasim_launch_fill(p, bytes, 100, -1, 0)) != cudaSuccess)
            return 200000 + (int)e;
        void (*fn)(void) = cudasim_fill_kernel;
        const void *kernel;
        int fill = -1;
        unsigned usec = 100;
        void *args[4] = {&p, &bytes, &usec, &fill};
        dim3 one = {1, 1, 1};
        memcpy(&kernel, &fn, sizeof kernel);
        if ((e = __cudaLaunchKernel(kernel, one, one, args, 0, 0)) != cudaSuccess)
            return 300000 + (int)e;
    }
    if ((e = cudaDeviceSynchronize()) != cudaSuccess)
        return 400000 + (int)e;
    if (with_memory && (e = cudaFree(p)) != cudaSuccess)
        return 500000 + (int)e;
    return 0;
}

/* A launch of the module's own kernel that its runtime refuses (memory it does not know): the
 * runtime's answer, and its last error, reach the module as they would without the pool.
 * Returns 1000 * the launch's status + cudaGetLastError's. */
int module_refused(void)
{
    cudaError_t e = cudasim_launch_fill((void *)0x1000, 4096, 100, -1, 0);
    cudaError_t last = cudaGetLastError();
    return 1000 * (int)e + (int)last;
}
