/* A runtime program, not linked with -lcuda, whose runtime loaded the driver by a full path
 * (cudasim's does when libcuda.so.1 is not on the search path): the driver's functions, taken
 * with dlsym(RTLD_DEFAULT), are still pooled. Prints driver_path_mallocs=N for 100 rounds and
 * "driver_by_path ok". */
#include <dlfcn.h>

#include "check.h"

typedef int (*cu_malloc_fn)(unsigned long long *dptr, size_t size);
typedef int (*cu_free_fn)(unsigned long long dptr);

int main(void)
{
    cu_malloc_fn cu_malloc;
    cu_free_fn cu_free;
    cudasimStats before, after;
    CHECK_CUDA(cudaFree(NULL));
    *(void **)&cu_malloc = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    *(void **)&cu_free = dlsym(RTLD_DEFAULT, "cuMemFree_v2");
    CHECK(cu_malloc && cu_free, "no cuMemAlloc_v2");
    before = sim_stats(0);
    for (int i = 0; i < 100; i++) {
        unsigned long long d = 0;
        CHECK(cu_malloc(&d, 1 << 20) == 0, "cuMemAlloc_v2");
        CHECK(cu_free(d) == 0, "cuMemFree_v2");
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    after = sim_stats(0);
    printf("driver_path_mallocs=%llu\n", after.malloc_calls - before.malloc_calls);
    printf("driver_by_path ok\n");
    return 0;
}
