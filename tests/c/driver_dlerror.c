/* A failed lookup's message waits for the program's dlerror() while it calls the driver:
 *   driver_dlerror ROUTE ENTRY
 * ROUTE is how the driver's functions were found: lcuda (linked, by symbol), proc (the static
 * runtime's way, cuGetProcAddress_v2) or dlsym (versioned names from the driver's handle).
 * ENTRY is the first call the program makes of a hooked entry point after a failed dlsym:
 * pop, push, set, set-null, alloc (the process's first cuMemAlloc_v2, its context made current
 * before), get-info, sync, stream-create. Prints the call's result and what dlerror() reads. */
#include "driver_proc.h"

static struct {
    CUresult (*set_current)(CUcontext);
    CUresult (*push)(CUcontext);
    CUresult (*pop)(CUcontext *);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*get_info)(size_t *, size_t *);
    CUresult (*sync)(void);
    CUresult (*stream_create)(CUstream *, unsigned);
} cu;

static void *driver;

static void by_symbol(void)
{
    cu.set_current = cuCtxSetCurrent;
    cu.push = cuCtxPushCurrent_v2;
    cu.pop = cuCtxPopCurrent_v2;
    cu.alloc = cuMemAlloc_v2;
    cu.get_info = cuMemGetInfo_v2;
    cu.sync = cuCtxSynchronize;
    cu.stream_create = cuStreamCreate;
}

static void by_proc(void)
{
    get_proc_t get = static_runtime_get_proc(&driver);
    *(void **)&cu.set_current = proc(get, "cuCtxSetCurrent", 0);
    *(void **)&cu.push = proc(get, "cuCtxPushCurrent", 0);
    *(void **)&cu.pop = proc(get, "cuCtxPopCurrent", 0);
    *(void **)&cu.alloc = proc(get, "cuMemAlloc", 0);
    *(void **)&cu.get_info = proc(get, "cuMemGetInfo", 0);
    *(void **)&cu.sync = proc(get, "cuCtxSynchronize", 0);
    *(void **)&cu.stream_create = proc(get, "cuStreamCreate", 0);
}

static void by_dlsym(void)
{
    *(void **)&cu.set_current = dlsym(driver, "cuCtxSetCurrent");
    *(void **)&cu.push = dlsym(driver, "cuCtxPushCurrent_v2");
    *(void **)&cu.pop = dlsym(driver, "cuCtxPopCurrent_v2");
    *(void **)&cu.alloc = dlsym(driver, "cuMemAlloc_v2");
    *(void **)&cu.get_info = dlsym(driver, "cuMemGetInfo_v2");
    *(void **)&cu.sync = dlsym(driver, "cuCtxSynchronize");
    *(void **)&cu.stream_create = dlsym(driver, "cuStreamCreate");
}

int main(int argc, char **argv)
{
    CUcontext ctx = NULL, popped = NULL;
    CUdeviceptr p = 0;
    CUstream s = NULL;
    size_t free_b = 0, total_b = 0;
    const char *route, *entry, *err;
    CUresult r;
    CHECK(argc == 3, "usage: driver_dlerror ROUTE ENTRY");
    route = argv[1];
    entry = argv[2];
    driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(driver != NULL, "dlopen: %s", dlerror());
    if (strcmp(route, "lcuda") == 0)
        by_symbol();
    else if (strcmp(route, "proc") == 0)
        by_proc();
    else if (strcmp(route, "dlsym") == 0)
        by_dlsym();
    else
        CHECK(0, "unknown route %s", route);
    CHECK(cu.set_current && cu.push && cu.pop && cu.alloc && cu.get_info && cu.sync &&
              cu.stream_create,
          "the entry points");
    /* Neither of these is hooked: no hook has been called yet. */
    CHECK_CU(cuInit(0));
    CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    if (strcmp(entry, "alloc") == 0)
        CHECK_CU(cu.set_current(ctx));

    CHECK(dlsym(driver, "cuNoSuchEntryPoint") == NULL, "found a missing name");
    if (strcmp(entry, "pop") == 0)
        r = cu.pop(&popped);
    else if (strcmp(entry, "push") == 0)
        r = cu.push(ctx);
    else if (strcmp(entry, "set") == 0)
        r = cu.set_current(ctx);
    else if (strcmp(entry, "set-null") == 0)
        r = cu.set_current(NULL);
    else if (strcmp(entry, "alloc") == 0)
        r = cu.alloc(&p, 1 << 20);
    else if (strcmp(entry, "get-info") == 0)
        r = cu.get_info(&free_b, &total_b);
    else if (strcmp(entry, "sync") == 0)
        r = cu.sync();
    else if (strcmp(entry, "stream-create") == 0)
        r = cu.stream_create(&s, 0);
    else
        CHECK(0, "unknown entry %s", entry);
    err = dlerror();
    printf("result=%d\n", (int)r);
    printf("dlerror_kept=%d\n", err != NULL);
    printf("dlerror=%s\n", err ? err : "(none)");
    printf("driver_dlerror %s %s: done\n", route, entry);
    return 0;
}
