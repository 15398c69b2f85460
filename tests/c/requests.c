/* Asks cudaMalloc for each size given (in MiB), in order, and prints what each returned; then
 * frees what it got and prints the simulator's own count of the cudaMalloc calls that reached
 * device 0 and of those it refused ("sim mallocs N", "sim refused N").
 * usage: requests MIB [MIB...] (at most 16) */
#include "check.h"

int main(int argc, char **argv)
{
    void *p[16] = {0};
    CHECK(argc > 1 && argc <= 17, "usage: requests MIB [MIB...]");
    for (int i = 1; i < argc; i++) {
        size_t mib = strtoull(argv[i], NULL, 10);
        cudaError_t e = cudaMalloc(&p[i - 1], mib << 20);
        printf("%zu MiB -> %d\n", mib, (int)e);
        if (e != cudaSuccess)
            p[i - 1] = NULL;
    }
    for (int i = 0; i < 16; i++)
        if (p[i])
            CHECK_CUDA(cudaFree(p[i]));
    cudasimStats s = sim_stats(0);
    printf("sim mallocs %llu\nsim refused %llu\n", s.malloc_calls, s.malloc_failures);
    return 0;
}
