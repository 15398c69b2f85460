/* A library that exports driver names itself (tests/c/standin_driver.c, the first argument),
 * opened RTLD_GLOBAL while no driver is loaded: what dlsym gives from its handle is its own,
 * before and after the program loads the driver. Linked with nothing of CUDA. Ends with
 * "driver_standin: all checks passed". */
#define _GNU_SOURCE
#include "check.h"
#include "cuda.h"

#include <dlfcn.h>

#define MiB (1024ull * 1024ull)

/* `name` from `handle`, checked to come from the object at `path`. */
static void *from(void *handle, const char *name, const char *path)
{
    void *f = dlsym(handle, name);
    Dl_info info;
    CHECK(f != NULL, "dlsym %s: %s", name, dlerror());
    CHECK(dladdr(f, &info) != 0 && strcmp(info.dli_fname, path) == 0,
          "%s of %s came from %s", name, path, info.dli_fname);
    return f;
}

int main(int argc, char **argv)
{
    void *standin, *driver;
    CUresult (*standin_alloc)(CUdeviceptr *, size_t);
    CUresult (*standin_free)(CUdeviceptr);
    CUresult (*init)(unsigned);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*release)(CUdeviceptr);
    CUcontext ctx = NULL;
    CUdeviceptr p = 0;
    CHECK(argc > 1, "usage: driver_standin STANDIN.so");
    standin = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    CHECK(standin != NULL, "dlopen %s: %s", argv[1], dlerror());
    *(void **)&standin_alloc = from(standin, "cuMemAlloc_v2", argv[1]);
    *(void **)&standin_free = from(standin, "cuMemFree_v2", argv[1]);

    /* The driver loaded and in use. */
    driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(driver != NULL, "dlopen libcuda.so.1: %s", dlerror());
    *(void **)&init = dlsym(driver, "cuInit");
    *(void **)&retain = dlsym(driver, "cuDevicePrimaryCtxRetain");
    *(void **)&set_current = dlsym(driver, "cuCtxSetCurrent");
    *(void **)&alloc = dlsym(driver, "cuMemAlloc_v2");
    *(void **)&release = dlsym(driver, "cuMemFree_v2");
    CHECK(init && retain && set_current && alloc && release, "the driver's functions");
    CHECK(init(0) == CUDA_SUCCESS && retain(&ctx, 0) == CUDA_SUCCESS &&
              set_current(ctx) == CUDA_SUCCESS,
          "the primary context");
    CHECK(alloc(&p, MiB) == CUDA_SUCCESS && release(p) == CUDA_SUCCESS, "the driver's pair");

    /* The stand-in's functions answer as the stand-in, and its handle still gives them. */
    CHECK(standin_alloc(&p, MiB) == 42 && p == 0x4200, "the stand-in's cuMemAlloc_v2");
    CHECK(standin_free(p) == 43, "the stand-in's cuMemFree_v2");
    CHECK(from(standin, "cuMemAlloc_v2", argv[1]) == (void *)standin_alloc, "a second lookup");
    printf("driver_standin: all checks passed\n");
    return 0;
}
