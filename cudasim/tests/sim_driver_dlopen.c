/* cudasim's driver face reached as the static CUDA runtime reaches a driver: dlopen of
 * libcuda.so.1, dlsym of cuGetProcAddress_v2, lookups by base name, version and flags; and the
 * fallback of programs that take the versioned names with dlsym. Linked with nothing of CUDA. */
#include "check.h"
#include "cuda.h"

#include <dlfcn.h>

typedef CUresult (*get_proc_t)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
typedef CUresult (*init_t)(unsigned);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*set_current_t)(CUcontext);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*sync_t)(CUstream);
typedef int (*stats_t)(int, cudasimStats *);

static void *handle;

/* What dlsym gives for `name`, as a plain pointer. */
static void *sym(const char *name)
{
    return dlsym(handle, name);
}

/* The answer of cuGetProcAddress_v2 for (name, version, flags); `*status` its query result. */
static void *lookup(get_proc_t get, const char *name, int version, cuuint64_t flags,
                    CUresult *result, CUdriverProcAddressQueryResult *status)
{
    void *p = (void *)0x1;
    *result = get(name, &p, version, flags, status);
    return p;
}

int main(void)
{
    get_proc_t first, get;
    CUresult r;
    CUdriverProcAddressQueryResult st;
    void *p;
    CUcontext ctx = NULL;
    CUdeviceptr d = 0;
    cudasimStats stats;

    SECTION("dlopen(libcuda.so.1) and dlsym(cuGetProcAddress_v2)");
    handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(handle != NULL, "dlopen: %s", dlerror());
    *(void **)&first = sym("cuGetProcAddress_v2");
    CHECK(first != NULL && sym("cuDriverGetVersion") != NULL, "no entry point");

    SECTION("cuGetProcAddress for itself");
    *(void **)&get = lookup(first, "cuGetProcAddress", 12080, 0, &r, &st);
    CHECK(r == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS, "%d %d", r, st);
    CHECK((void *)get == sym("cuGetProcAddress_v2"), "12080 gave the 11.3 signature");
    p = lookup(get, "cuGetProcAddress", 11030, 0, &r, &st);
    CHECK(r == CUDA_SUCCESS && p == sym("cuGetProcAddress"), "11030: %d", r);

    SECTION("flags 0: the legacy-stream functions, the versioned ABI of a base name");
    p = lookup(get, "cuMemAlloc", 12080, 0, &r, &st);
    CHECK(r == CUDA_SUCCESS && p == sym("cuMemAlloc_v2"), "cuMemAlloc: %d", r);
    p = lookup(get, "cuMemAlloc", 3020, 0, &r, &st);
    CHECK(r == CUDA_SUCCESS && p == sym("cuMemAlloc_v2"), "cuMemAlloc at 3020: %d", r);
    p = lookup(get, "cuMemAllocAsync", 12080, 0, &r, &st);
    CHECK(p == sym("cuMemAllocAsync"), "cuMemAllocAsync");
    p = lookup(get, "cuStreamSynchronize", 12080, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &r, &st);
    CHECK(p == sym("cuStreamSynchronize"), "cuStreamSynchronize, legacy");

    SECTION("flags 2: the _ptsz variants where they exist");
    {
        const char *names[] = {"cuMemAllocAsync", "cuMemFreeAsync", "cuStreamSynchronize",
                               "cuEventRecord", "cuStreamWaitEvent", "cuLaunchKernel"};
        char ptsz[64];
        size_t i;
        for (i = 0; i < sizeof names / sizeof names[0]; i++) {
            snprintf(ptsz, sizeof ptsz, "%s_ptsz", names[i]);
            p = lookup(get, names[i], 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &r,
                       &st);
            CHECK(r == CUDA_SUCCESS && p == sym(ptsz) && p != NULL, "%s", ptsz);
        }
    }
    p = lookup(get, "cuMemAlloc", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &r, &st);
    CHECK(p == sym("cuMemAlloc_v2"), "no variant: the function itself");

    SECTION("a version too low, an unknown name, a versioned name, bad flags");
    p = lookup(get, "cuMemAlloc", 3010, 0, &r, &st);
    CHECK(r == CUDA_ERROR_NOT_FOUND && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && !p,
          "3010: %d %d", r, st);
    p = lookup(get, "cuMemAllocAsync", 11010, 0, &r, &st);
    CHECK(r == CUDA_ERROR_NOT_FOUND && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
          "async at 11010: %d %d", r, st);
    p = lookup(get, "cuNoSuchFunction", 12080, 0, &r, &st);
    CHECK(r == CUDA_ERROR_NOT_FOUND && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && !p,
          "unknown: %d %d", r, st);
    p = lookup(get, "cuMemAlloc_v2", 12080, 0, &r, &st);
    CHECK(r == CUDA_ERROR_NOT_FOUND && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
          "versioned: %d %d", r, st);
    lookup(get, "cuMemAlloc", 12080, 4, &r, &st);
    CHECK(r == CUDA_ERROR_INVALID_VALUE, "flags 4: %d", r);

    SECTION("the answers work: cuInit, the primary context, an allocation");
    {
        init_t init;
        retain_t retain;
        set_current_t set_current;
        alloc_t alloc;
        free_t release;
        sync_t sync_ptsz;
        *(void **)&init = lookup(get, "cuInit", 12080, 0, &r, &st);
        *(void **)&retain = lookup(get, "cuDevicePrimaryCtxRetain", 12080, 0, &r, &st);
        *(void **)&set_current = lookup(get, "cuCtxSetCurrent", 12080, 0, &r, &st);
        *(void **)&alloc = lookup(get, "cuMemAlloc", 12080, 0, &r, &st);
        *(void **)&release = lookup(get, "cuMemFree", 12080, 0, &r, &st);
        *(void **)&sync_ptsz = lookup(get, "cuStreamSynchronize", 12080, 2, &r, &st);
        CHECK(init(0) == CUDA_SUCCESS, "cuInit");
        CHECK(retain(&ctx, 0) == CUDA_SUCCESS && set_current(ctx) == CUDA_SUCCESS, "context");
        CHECK(alloc(&d, 4096) == CUDA_SUCCESS && d != 0, "cuMemAlloc");
        CHECK(sync_ptsz(NULL) == CUDA_SUCCESS, "per-thread stream");
        CHECK(release(d) == CUDA_SUCCESS, "cuMemFree");
    }

    SECTION("the dlsym fallback: versioned names taken directly");
    {
        alloc_t alloc;
        free_t release;
        stats_t get_stats;
        *(void **)&alloc = sym("cuMemAlloc_v2");
        *(void **)&release = sym("cuMemFree_v2");
        *(void **)&get_stats = sym("cudasimGetStats");
        CHECK(alloc && release && get_stats, "missing symbols");
        CHECK(alloc(&d, 8192) == CUDA_SUCCESS, "cuMemAlloc_v2");
        memset(&stats, 0, sizeof stats);
        stats.struct_size = sizeof stats;
        CHECK(get_stats(0, &stats) == 0, "stats");
        CHECK(stats.driver_mallocs == 2 && stats.live_allocations == 1, "%llu %llu",
              stats.driver_mallocs, stats.live_allocations);
        CHECK(release(d) == CUDA_SUCCESS, "cuMemFree_v2");
    }
    printf("sim_driver_dlopen: all checks passed\n");
    return 0;
}
