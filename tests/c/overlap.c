#define _POSIX_C_SOURCE 200809L
/* The loop every training step is made of, on the default stream: allocate, launch a kernel on
 * the block, free it, do host work. The real cudaFree waits for the kernel every time; a pool
 * should let host work and device work overlap.
 *
 * usage: overlap ITERATIONS KERNEL_US HOST_US BYTES   prints the wall time in ms. */
#include <time.h>

#include "check.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void host_work(unsigned us)
{
    double end = now_ms() + us / 1e3;
    while (now_ms() < end) {
    }
}

int main(int argc, char **argv)
{
    int iters, i;
    unsigned kernel_us, host_us;
    size_t bytes;
    double t0, t1;
    CHECK(argc == 5, "usage: overlap ITERATIONS KERNEL_US HOST_US BYTES");
    iters = atoi(argv[1]);
    kernel_us = (unsigned)atoi(argv[2]);
    host_us = (unsigned)atoi(argv[3]);
    bytes = (size_t)strtoull(argv[4], NULL, 0);
    CHECK_CUDA(cudaFree(NULL));
    t0 = now_ms();
    for (i = 0; i < iters; i++) {
        void *p;
        CHECK_CUDA(cudaMalloc(&p, bytes));
        CHECK_CUDA(cudasim_launch_fill(p, bytes, kernel_us, -1, 0));
        CHECK_CUDA(cudaFree(p));
        host_work(host_us);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    t1 = now_ms();
    printf("wall_ms %.1f\n", t1 - t0);
    printf("ideal_ms %.1f\n", iters * (double)(kernel_us > host_us ? kernel_us : host_us) / 1e3);
    printf("serial_ms %.1f\n", iters * (double)(kernel_us + host_us) / 1e3);
    return 0;
}
