/* A program linked with -lcuda and a library that links libgpupool (tests/c/gpupool_user.c):
 * libc comes before libgpupool in the lookup order. The program starts, its dlsym lookups read
 * as always, and the driver answers. Ends with "driver_late: all checks passed". */
#define _GNU_SOURCE
#include "check.h"
#include "cuda.h"

#include <dlfcn.h>
#include <unistd.h>

int gpupool_user_enabled(void);

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUcontext ctx = NULL;
    CUdeviceptr p = 0;
    CHECK(h != NULL, "dlopen: %s", dlerror());
    CHECK(dlsym(RTLD_DEFAULT, "getpid") == (void *)getpid, "dlsym of getpid");
    CHECK(dlsym(h, "cuNoSuchEntryPoint") == NULL && dlerror() != NULL, "a missing name");
    CHECK(dlsym(h, "cuMemAlloc_v2") != NULL, "no cuMemAlloc_v2: %s", dlerror());
    CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS, "retain");
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS, "set current");
    CHECK(cuMemAlloc_v2(&p, 1 << 20) == CUDA_SUCCESS, "cuMemAlloc_v2");
    CHECK(cuMemFree_v2(p) == CUDA_SUCCESS, "cuMemFree_v2");
    printf("pool_enabled=%d\n", gpupool_user_enabled());
    printf("driver_late: all checks passed\n");
    return 0;
}
