/* A CUDA runtime whose own initialisation calls the CUDA API by name, as a runtime built
 * without -Bsymbolic reaches its own exported functions: through the dynamic linker, and so,
 * under libgpupool, through the pool's hooks, while the pool is still opening this runtime
 * (GPUPOOL_CUDART names it, in a program that calls only gpupool_*). Built as a shared library
 * linked with the simulator's runtime, which serves every call. Its constructor prints
 * "constructor_mem_get_info=STATUS" and "constructor_free=N". */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>

/* The simulator's runtime, linked in: an undefined reference keeps the dependency. */
extern int cudaRuntimeGetVersion(int *version);

typedef int (*mem_get_info_fn)(size_t *free_bytes, size_t *total_bytes);

__attribute__((constructor)) static void initialise(void)
{
    mem_get_info_fn get_info = (mem_get_info_fn)dlsym(RTLD_DEFAULT, "cudaMemGetInfo");
    size_t free_bytes = 0, total_bytes = 0;
    int version = 0;
    int r = get_info ? get_info(&free_bytes, &total_bytes) : -1;
    cudaRuntimeGetVersion(&version);
    printf("constructor_mem_get_info=%d\nconstructor_free=%zu\n", r, free_bytes);
    fflush(stdout);
}
