/* Barrier mode: a kernel the program launches on the legacy stream is a barrier, whether it
 * comes through cudaLaunchKernel or through __cudaLaunchKernel (what <<<...>>> compiles to since
 * CUDA 13). After such a launch, a freed block is reused without the pool issuing a barrier of
 * its own.
 *
 * usage: launch_barrier api|internal   (run with GPUPOOL_REUSE=barrier) */
#include "check.h"

#define N (12u << 20) /* a large block: its own segment, never in the small bins */

static cudaError_t launch(int internal, void *p, size_t n)
{
    void (*fn)(void) = cudasim_fill_kernel;
    const void *func;
    unsigned usec = 1000;
    int fill = -1;
    void *args[4];
    dim3 one = {1, 1, 1};
    memcpy(&func, &fn, sizeof func);
    args[0] = &p;
    args[1] = &n;
    args[2] = &usec;
    args[3] = &fill;
    return internal ? __cudaLaunchKernel(func, one, one, args, 0, 0)
                    : cudaLaunchKernel(func, one, one, args, 0, 0);
}

int main(int argc, char **argv)
{
    int internal;
    void *a, *b, *other;
    CHECK(argc == 2, "usage: launch_barrier api|internal");
    internal = strcmp(argv[1], "internal") == 0;
    CHECK_CUDA(cudaMalloc(&other, 4096));
    CHECK_CUDA(cudaMalloc(&a, N));
    CHECK_CUDA(launch(internal, a, N));
    CHECK_CUDA(cudaFree(a));
    unsigned long long waits = sim_stats(0).stream_wait_events;
    /* The program's next legacy-stream kernel orders everything after the free. */
    CHECK_CUDA(launch(internal, other, 4096));
    CHECK_CUDA(cudaMalloc(&b, N));
    CHECK(b == a, "expected the freed block back after the program's launch");
    CHECK(sim_stats(0).stream_wait_events == waits, "the pool issued a barrier it did not need");
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("launch_barrier %s ok\n", argv[1]);
    return 0;
}
