/* A stand-in for a framework's extension module (the PyTorch way): linked against the CUDA
 * runtime, loaded by Python with RTLD_LOCAL, so the runtime is invisible to RTLD_NEXT. */
#include "check.h"

/* Allocate and free `count` blocks of `bytes` in a loop, tagging each; returns 0 or an error. */
int fw_train_steps(int count, size_t bytes)
{
    for (int i = 0; i < count; i++) {
        void *p;
        cudaError_t e = cudaMalloc(&p, bytes);
        if (e != cudaSuccess)
            return (int)e;
        if ((e = cudaMemset(p, i & 0xff, bytes)) != cudaSuccess)
            return (int)e;
        if ((e = cudaFree(p)) != cudaSuccess)
            return (int)e;
    }
    return 0;
}

/* Real cudaMalloc calls the simulator saw on device 0. */
unsigned long long fw_real_mallocs(void)
{
    return sim_stats(0).malloc_calls;
}
