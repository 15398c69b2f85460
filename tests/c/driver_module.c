/* A module that finds the driver as XLA does: loaded RTLD_LOCAL (as a Python extension is), it
 * opens libcuda.so.1 and takes the versioned entry points with dlsym. module_churn() makes 100
 * allocate/free/synchronize rounds and returns how many reached the driver's allocator (-1 on
 * any failure). */
#include <dlfcn.h>
#include <string.h>

#include "cuda.h"
#include "cudasim.h"

long module_churn(void);

long module_churn(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUresult (*init)(unsigned);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*release)(CUdeviceptr);
    CUresult (*sync)(void);
    int (*stats)(int, cudasimStats *);
    CUcontext ctx = NULL;
    CUdeviceptr p = 0;
    cudasimStats before, after;
    int i;
    if (h == NULL)
        return -1;
    *(void **)&init = dlsym(h, "cuInit");
    *(void **)&retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&set_current = dlsym(h, "cuCtxSetCurrent");
    *(void **)&alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&release = dlsym(h, "cuMemFree_v2");
    *(void **)&sync = dlsym(h, "cuCtxSynchronize");
    *(void **)&stats = dlsym(h, "cudasimGetStats");
    if (!init || !retain || !set_current || !alloc || !release || !sync || !stats)
        return -1;
    if (init(0) || retain(&ctx, 0) || set_current(ctx))
        return -1;
    memset(&before, 0, sizeof before);
    before.struct_size = sizeof before;
    after = before;
    if (stats(0, &before))
        return -1;
    for (i = 0; i < 100; i++) {
        if (alloc(&p, 1 << 20) || release(p) || sync())
            return -1;
    }
    if (stats(0, &after))
        return -1;
    return (long)(after.driver_mallocs - before.driver_mallocs);
}
