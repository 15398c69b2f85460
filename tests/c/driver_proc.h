/* The driver reached as the static CUDA runtime reaches it: dlopen("libcuda.so.1"), dlsym of
 * cuGetProcAddress_v2, which is asked for cuGetProcAddress itself, then every entry point by
 * base name at CUDA 12.8 with the given flags (0, or 2 for the _ptsz forms). */
#ifndef GPUPOOL_TEST_DRIVER_PROC_H
#define GPUPOOL_TEST_DRIVER_PROC_H

#include <dlfcn.h>

#include "check.h"
#include "cuda.h"

typedef CUresult (*get_proc_t)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

static inline void *proc(get_proc_t get, const char *name, cuuint64_t flags)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r = get(name, &p, 12080, flags, &st);
    CHECK(r == CUDA_SUCCESS && p != NULL, "cuGetProcAddress(%s, flags %llu): %d", name,
          (unsigned long long)flags, (int)r);
    return p;
}

/* The driver's cuGetProcAddress as the static runtime takes it; `*handle` the driver. */
static inline get_proc_t static_runtime_get_proc(void **handle)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    get_proc_t first, get;
    CHECK(h != NULL, "dlopen: %s", dlerror());
    *(void **)&first = dlsym(h, "cuGetProcAddress_v2");
    CHECK(first != NULL, "no cuGetProcAddress_v2");
    *(void **)&get = proc(first, "cuGetProcAddress", 0);
    *handle = h;
    return get;
}

/* What gpupool_empty_cache(device) gave back, or -1 without the pool. */
static inline long long empty_cache_if_pooled(int device)
{
    unsigned long long n = 0;
    int (*empty)(int, unsigned long long *) =
        (int (*)(int, unsigned long long *))dlsym(RTLD_DEFAULT, "gpupool_empty_cache");
    if (!empty)
        return -1;
    CHECK(empty(device, &n) == 0, "gpupool_empty_cache(%d)", device);
    return (long long)n;
}

#endif
