/* The driver API under the pool, reached the ways real programs reach the driver:
 *   driver_pool lcuda   linked with -lcuda: calls reach the exported cuMemAlloc_v2... by symbol;
 *   driver_pool static  as the static CUDA runtime: dlopen(libcuda.so.1), dlsym of
 *                       cuGetProcAddress_v2, every entry point from it (flags 0 and 2), and the
 *                       dlsym fallback of versioned names.
 * Both print key=value lines the test compares with and without the pool, and end with
 * "driver_pool MODE: all checks passed". Linked with nothing of the runtime.
 *   driver_pool MODE custom-pool  instead: cuMemAllocAsync while the program's own memory pool
 *                       is current (cuDeviceSetMemPool), see `custom_pool`.
 *   driver_pool MODE default-pool  instead: the default memory pool's figures, trim and release
 *                       threshold, see `default_pool_calls`.
 *   driver_pool MODE streams  instead: created streams where two devices are seen, see
 *                       `placed_streams`.
 *   driver_pool MODE cache-back KIND  instead: allocators the pool does not serve, out of
 *                       memory while its cache holds the memory, see `cache_back`. */
#include "driver_proc.h"

#define MiB (1024ull * 1024ull)

#define CU_EXPECT(call, want)                                                           \
    do {                                                                                \
        CUresult got_ = (call);                                                         \
        CHECK(got_ == (want), "%s returned %d, expected %d", #call, (int)got_, (int)(want)); \
    } while (0)
#define CU_OK(call) CU_EXPECT(call, CUDA_SUCCESS)

/* The entry points, as the mode found them. */
static struct {
    CUresult (*init)(unsigned);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*create)(CUcontext *, unsigned, CUdevice);
    CUresult (*pop)(CUcontext *);
    CUresult (*destroy)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*get_info)(size_t *, size_t *);
    CUresult (*ipc)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*sync)(void);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*pool_create)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*pool_destroy)(CUmemoryPool);
    CUresult (*set_pool)(CUdevice, CUmemoryPool);
    CUresult (*default_pool)(CUmemoryPool *, CUdevice);
    CUresult (*pool_get)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*pool_set)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*pool_trim)(CUmemoryPool, size_t);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*alloc_from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    int (*stats)(int, cudasimStats *);
    int (*pool_mallocs)(cudaMemPool_t, unsigned long long *);
    void (*fill)(void);
} cu;

/* The simulator's counters of device 0. */
static cudasimStats device0(void)
{
    cudasimStats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(cu.stats(0, &st) == 0, "cudasimGetStats");
    return st;
}

static void link_directly(void)
{
    cu.init = cuInit;
    cu.retain = cuDevicePrimaryCtxRetain;
    cu.set_current = cuCtxSetCurrent;
    cu.create = cuCtxCreate_v2;
    cu.pop = cuCtxPopCurrent_v2;
    cu.destroy = cuCtxDestroy_v2;
    cu.alloc = cuMemAlloc_v2;
    cu.free = cuMemFree_v2;
    cu.alloc_async = cuMemAllocAsync;
    cu.free_async = cuMemFreeAsync;
    cu.get_info = cuMemGetInfo_v2;
    cu.ipc = cuIpcGetMemHandle;
    cu.sync = cuCtxSynchronize;
    cu.htod = cuMemcpyHtoD_v2;
    cu.dtoh = cuMemcpyDtoH_v2;
    cu.launch = cuLaunchKernel;
    cu.pool_create = cuMemPoolCreate;
    cu.pool_destroy = cuMemPoolDestroy;
    cu.set_pool = cuDeviceSetMemPool;
    cu.default_pool = cuDeviceGetDefaultMemPool;
    cu.pool_get = cuMemPoolGetAttribute;
    cu.pool_set = cuMemPoolSetAttribute;
    cu.pool_trim = cuMemPoolTrimTo;
    cu.stream_create = cuStreamCreate;
    cu.stream_destroy = cuStreamDestroy_v2;
    cu.alloc_managed = cuMemAllocManaged;
    cu.alloc_from_pool = cuMemAllocFromPoolAsync;
    cu.stats = cudasimGetStats;
    cu.pool_mallocs = cudasimGetPoolMallocs;
    cu.fill = cudasim_fill_kernel;
}

/* As the static runtime: the driver opened by name, everything through cuGetProcAddress. */
static void link_as_static_runtime(cuuint64_t flags)
{
    void *h;
    get_proc_t get = static_runtime_get_proc(&h);
    *(void **)&cu.init = proc(get, "cuInit", flags);
    *(void **)&cu.retain = proc(get, "cuDevicePrimaryCtxRetain", flags);
    *(void **)&cu.set_current = proc(get, "cuCtxSetCurrent", flags);
    *(void **)&cu.create = proc(get, "cuCtxCreate", flags);
    *(void **)&cu.pop = proc(get, "cuCtxPopCurrent", flags);
    *(void **)&cu.destroy = proc(get, "cuCtxDestroy", flags);
    *(void **)&cu.alloc = proc(get, "cuMemAlloc", flags);
    *(void **)&cu.free = proc(get, "cuMemFree", flags);
    *(void **)&cu.alloc_async = proc(get, "cuMemAllocAsync", flags);
    *(void **)&cu.free_async = proc(get, "cuMemFreeAsync", flags);
    *(void **)&cu.get_info = proc(get, "cuMemGetInfo", flags);
    *(void **)&cu.ipc = proc(get, "cuIpcGetMemHandle", flags);
    *(void **)&cu.sync = proc(get, "cuCtxSynchronize", flags);
    *(void **)&cu.htod = proc(get, "cuMemcpyHtoD", flags);
    *(void **)&cu.dtoh = proc(get, "cuMemcpyDtoH", flags);
    *(void **)&cu.launch = proc(get, "cuLaunchKernel", flags);
    *(void **)&cu.pool_create = proc(get, "cuMemPoolCreate", flags);
    *(void **)&cu.pool_destroy = proc(get, "cuMemPoolDestroy", flags);
    *(void **)&cu.set_pool = proc(get, "cuDeviceSetMemPool", flags);
    *(void **)&cu.default_pool = proc(get, "cuDeviceGetDefaultMemPool", flags);
    *(void **)&cu.pool_get = proc(get, "cuMemPoolGetAttribute", flags);
    *(void **)&cu.pool_set = proc(get, "cuMemPoolSetAttribute", flags);
    *(void **)&cu.pool_trim = proc(get, "cuMemPoolTrimTo", flags);
    *(void **)&cu.stream_create = proc(get, "cuStreamCreate", flags);
    *(void **)&cu.stream_destroy = proc(get, "cuStreamDestroy", flags);
    *(void **)&cu.alloc_managed = proc(get, "cuMemAllocManaged", flags);
    *(void **)&cu.alloc_from_pool = proc(get, "cuMemAllocFromPoolAsync", flags);
    *(void **)&cu.stats = dlsym(h, "cudasimGetStats");
    *(void **)&cu.pool_mallocs = dlsym(h, "cudasimGetPoolMallocs");
    *(void **)&cu.fill = dlsym(h, "cudasim_fill_kernel");
    CHECK(cu.stats != NULL && cu.pool_mallocs != NULL && cu.fill != NULL, "no control API");
}

static CUresult launch_fill(CUdeviceptr p, size_t bytes, unsigned usec, int fill)
{
    CUfunction f;
    void *args[4];
    memcpy(&f, &cu.fill, sizeof f);
    args[0] = &p;
    args[1] = &bytes;
    args[2] = &usec;
    args[3] = &fill;
    return cu.launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
}

/* The checks every mode runs on the entry points it found. */
static void exercise(void)
{
    CUcontext primary = NULL, created = NULL;
    CUdeviceptr p = 0, q = 0, blocks[8];
    CUipcMemHandle handle;
    size_t free_b = 0, total_b = 0;
    unsigned long long before;
    static unsigned char data[MiB], back[MiB];
    int i, n;

    CU_OK(cu.init(0));
    CU_OK(cu.retain(&primary, 0));
    CU_OK(cu.set_current(primary));

    /* alloc and free, 100 times, the context synchronized after each free (what makes a
     * block freed by cuMemFree reusable in strict mode) */
    before = device0().driver_mallocs;
    for (i = 0; i < 100; i++) {
        CU_OK(cu.alloc(&p, MiB));
        CU_OK(cu.free(p));
        CU_OK(cu.sync());
    }
    printf("churn_driver_mallocs=%llu\n", device0().driver_mallocs - before);

    /* the async pair, 100 times */
    before = device0().driver_mallocs;
    for (i = 0; i < 100; i++) {
        CU_OK(cu.alloc_async(&p, 3 * MiB, NULL));
        CU_OK(cu.free_async(p, NULL));
    }
    CU_OK(cu.sync());
    printf("async_driver_mallocs=%llu\n", device0().driver_mallocs - before);

    /* 0 bytes, interior and double frees: the driver's answers */
    CU_EXPECT(cu.alloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.alloc(&p, 4096));
    CU_EXPECT(cu.free(p + 256), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cu.free(p));
    CU_EXPECT(cu.free(p), CUDA_ERROR_INVALID_VALUE);

    /* an IPC handle of a block inside a segment would name the segment: refused */
    CU_OK(cu.alloc(&p, 4096));
    CU_OK(cu.alloc(&q, 4096));
    printf("ipc_second_block=%d\n", (int)cu.ipc(&handle, p > q ? p : q));
    CU_OK(cu.free(p));
    CU_OK(cu.free(q));

    /* content: a block freed under a running kernel is not handed out clobbered */
    memset(data, 0x5a, sizeof data);
    CU_OK(cu.alloc(&p, MiB));
    CU_OK(launch_fill(p, MiB, 20000, 0xab));
    CU_OK(cu.free(p));
    CU_OK(cu.alloc(&q, MiB));
    CU_OK(cu.htod(q, data, MiB));
    CU_OK(cu.sync());
    CU_OK(cu.dtoh(back, q, MiB));
    CHECK(memcmp(back, data, MiB) == 0, "the kernel's fill landed on the new owner's data");
    CU_OK(cu.free(q));

    /* cached memory counts as free */
    CU_OK(cu.alloc(&p, 64 * MiB));
    CU_OK(cu.free(p));
    CU_OK(cu.get_info(&free_b, &total_b));
    printf("info_free=%zu\ninfo_total=%zu\n", free_b, total_b);

    /* a context the program made: its allocations go to the driver, and the pool's cache counts
     * as free there too (the pool gives it back when the driver refuses the context) */
    CU_OK(cu.create(&created, 0, 0));
    CU_OK(cu.get_info(&free_b, &total_b));
    printf("created_info_free=%zu\n", free_b);
    before = device0().driver_mallocs;
    for (i = 0; i < 10; i++) {
        CU_OK(cu.alloc(&p, MiB));
        CU_OK(cu.free(p));
    }
    printf("created_context_driver_mallocs=%llu\n", device0().driver_mallocs - before);
    CU_OK(cu.pop(NULL));
    CU_OK(cu.destroy(created));
    CU_OK(cu.set_current(primary));

    /* out of memory: the driver's error, and the cache given back for a retry */
    for (n = 0; n < 8; n++) {
        CUresult r = cu.alloc(&blocks[n], 300 * MiB);
        if (r != CUDA_SUCCESS) {
            CHECK(r == CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc at OOM: %d", (int)r);
            break;
        }
    }
    printf("oom_after=%d\n", n);
    for (i = 0; i < n; i++) {
        CU_OK(cu.free(blocks[i]));
    }
    if (getenv("GPUPOOL_LIMIT") == NULL) {
        CU_OK(cu.alloc(&p, 900 * MiB));
        CU_OK(cu.free(p));
    }
    /* What gpupool_enabled() says in a process with no runtime (-1: no pool preloaded). */
    int (*enabled)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpupool_enabled");
    printf("pool_enabled=%d\n", enabled ? enabled() : -1);
}

static unsigned long long served(CUmemoryPool pool)
{
    unsigned long long n = 0;
    CHECK(cu.pool_mallocs((cudaMemPool_t)pool, &n) == 0, "cudasimGetPoolMallocs");
    return n;
}

/* Allocators the pool does not serve, on a 1 GiB device whose memory sits in the pool's cache
 * (900 MiB allocated and freed): KIND managed (cuMemAllocManaged), pool (cuMemAllocFromPoolAsync
 * from the device's default pool), other-device (the 900 MiB on device 1, then 500 MiB from
 * device 1's default pool with device 0's context current; needs CUDASIM_DEVICES=2). Without
 * the pool the 500 MiB fit; with it too, once the pool gave its cache back. */
static void cache_back(const char *kind)
{
    CUcontext ctx0 = NULL, ctx1 = NULL, home;
    CUdeviceptr blocks[9], p = 0;
    CUmemoryPool pool = NULL;
    int i, other = strcmp(kind, "other-device") == 0;

    CU_OK(cu.init(0));
    CU_OK(cu.retain(&ctx0, 0));
    home = ctx0;
    if (other) {
        CU_OK(cu.retain(&ctx1, 1));
        home = ctx1;
    }
    CU_OK(cu.set_current(home));
    for (i = 0; i < 9; i++)
        CU_OK(cu.alloc(&blocks[i], 100 * MiB));
    for (i = 0; i < 9; i++)
        CU_OK(cu.free(blocks[i]));
    CU_OK(cu.sync());
    CU_OK(cu.set_current(ctx0));
    if (strcmp(kind, "managed") == 0) {
        CU_OK(cu.alloc_managed(&p, 500 * MiB, CU_MEM_ATTACH_GLOBAL));
        CU_OK(cu.free(p));
    } else {
        CHECK(other || strcmp(kind, "pool") == 0, "unknown kind %s", kind);
        CU_OK(cu.default_pool(&pool, other ? 1 : 0));
        CU_OK(cu.alloc_from_pool(&p, 500 * MiB, pool, NULL));
        CU_OK(cu.set_current(home));
        CU_OK(cu.free_async(p, NULL));
    }
    CU_OK(cu.sync());
}

/* cuMemAllocAsync while the program's own memory pool is current: the driver serves it from
 * that pool (the simulator counts what each pool served), its cuMemFreeAsync reaches the
 * driver, and a block the pool served before the switch frees fine after it. Setting the
 * default pool back, or destroying the program's current pool, makes cuMemAllocAsync the
 * pool's again. Prints "default_pool_served=N" (what the driver's default pool served: 0 under
 * the pool), "program_async=N" (the requests from the default pool), and "own_pool_async=N"
 * and "own_pool_bytes=N" (the requests the program's own pool served, and their bytes). */
static void custom_pool(void)
{
    CUcontext primary = NULL;
    CUmemoryPool def = NULL, mine = NULL;
    CUmemPoolProps props;
    CUdeviceptr before = 0, a = 0, b = 0;
    unsigned long long frees, mine_served;
    int program_async = 0;
    unsigned long long own_async = 0, own_bytes = 0;

    CU_OK(cu.init(0));
    CU_OK(cu.retain(&primary, 0));
    CU_OK(cu.set_current(primary));
    CU_OK(cu.default_pool(&def, 0));
    /* The program's own pool, IPC-exportable. */
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CU_OK(cu.pool_create(&mine, &props));

    /* The default pool is current: the request is the pool's. */
    CU_OK(cu.alloc_async(&before, MiB, CU_STREAM_LEGACY));
    program_async++;

    CU_OK(cu.set_pool(0, mine));
    frees = device0().driver_frees;
    CU_OK(cu.alloc_async(&a, MiB, CU_STREAM_LEGACY));
    CU_OK(cu.alloc_async(&b, 2 * MiB, CU_STREAM_PER_THREAD));
    own_async += 2;
    own_bytes += 3 * MiB;
    CHECK(served(mine) == 2, "the program's pool served %llu of 2 requests", served(mine));
    CU_OK(cu.free_async(a, CU_STREAM_LEGACY));
    CU_OK(cu.free_async(b, CU_STREAM_PER_THREAD));
    CU_OK(cu.free_async(before, CU_STREAM_LEGACY));
    frees = device0().driver_frees - frees;
    CHECK(frees >= 2, "the driver saw %llu frees", frees);
    CU_OK(cu.sync());

    /* The default pool set back: the pool's again. */
    CU_OK(cu.set_pool(0, def));
    mine_served = served(mine);
    CU_OK(cu.alloc_async(&a, MiB, CU_STREAM_LEGACY));
    program_async++;
    CHECK(served(mine) == mine_served, "the program's pool served after the default came back");
    CU_OK(cu.free_async(a, CU_STREAM_LEGACY));

    /* Destroying the program's current pool makes the default current: the pool's again. */
    CU_OK(cu.set_pool(0, mine));
    CU_OK(cu.alloc_async(&a, MiB, CU_STREAM_LEGACY));
    own_async++;
    own_bytes += MiB;
    CHECK(served(mine) == mine_served + 1, "the program's pool did not serve");
    CU_OK(cu.free_async(a, CU_STREAM_LEGACY));
    CU_OK(cu.sync());
    CU_OK(cu.pool_destroy(mine));
    CU_OK(cu.alloc_async(&a, MiB, CU_STREAM_LEGACY));
    program_async++;
    CU_OK(cu.free_async(a, CU_STREAM_LEGACY));
    CU_OK(cu.sync());

    printf("default_pool_served=%llu\n", served(def));
    printf("program_async=%d\n", program_async);
    printf("own_pool_async=%llu\n", own_async);
    printf("own_pool_bytes=%llu\n", own_bytes);
}

static unsigned long long pool_figure(CUmemoryPool pool, CUmemPool_attribute attr)
{
    unsigned long long v = 0;
    CU_OK(cu.pool_get(pool, attr, &v));
    return v;
}

/* Four 30 MiB blocks, allocated and freed in stream order, then the context synchronized. */
static void churn_async(void)
{
    CUdeviceptr blocks[4];
    int i;
    for (i = 0; i < 4; i++)
        CU_OK(cu.alloc_async(&blocks[i], 30 * MiB, CU_STREAM_LEGACY));
    for (i = 0; i < 4; i++)
        CU_OK(cu.free_async(blocks[i], CU_STREAM_LEGACY));
    CU_OK(cu.sync());
}

/* The default memory pool, as the static runtime's cudaMemPool* calls reach it: its figures
 * count what the pool holds, a trim gives the pool's cache back, and a release threshold the
 * program sets is the pool's. Prints "reserved_cached=N" (ReservedMemCurrent after the churn),
 * "used_live=N" (UsedMemCurrent with 1 MiB live), "held_after_trim=N" (device bytes still
 * taken after everything was freed and the pool trimmed to 0), "reserved_after_trim=N", and
 * "held_under_zero_threshold=N" (after the churn again, the program's threshold set to 0). */
static void default_pool_calls(void)
{
    CUcontext primary = NULL;
    CUmemoryPool def = NULL;
    CUdeviceptr live = 0;
    unsigned long long base, zero = 0, threshold = 0;

    CU_OK(cu.init(0));
    CU_OK(cu.retain(&primary, 0));
    CU_OK(cu.set_current(primary));
    CU_OK(cu.default_pool(&def, 0));
    base = device0().live_bytes;

    /* The driver's own pool keeps nothing at a synchronization (threshold 0): the figure is the
     * pool's cache. */
    churn_async();
    printf("reserved_cached=%llu\n", pool_figure(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    CU_OK(cu.alloc_async(&live, MiB, CU_STREAM_LEGACY));
    printf("used_live=%llu\n", pool_figure(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    CU_OK(cu.free_async(live, CU_STREAM_LEGACY));
    CU_OK(cu.sync());
    CU_OK(cu.pool_trim(def, 0));
    printf("held_after_trim=%llu\n", device0().live_bytes - base);
    printf("reserved_after_trim=%llu\n",
           pool_figure(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));

    /* The program asks for its memory back at every synchronization. */
    CU_OK(cu.pool_get(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    printf("threshold_initial=%llu\n", threshold);
    CU_OK(cu.pool_set(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
    CU_OK(cu.pool_get(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    printf("threshold_read_back=%llu\n", threshold);
    churn_async();
    printf("held_under_zero_threshold=%llu\n", device0().live_bytes - base);
    CU_EXPECT(cu.pool_get(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, NULL),
              CUDA_ERROR_INVALID_VALUE);
}

/* Where the driver sees two devices, a stream the program created names no device: the pool
 * asks the driver for its context. Ten 2 MiB blocks allocated and freed on a stream of device
 * 0, device 0's context current, are the pool's; one on a stream of device 1 goes to the
 * driver. Needs CUDASIM_DEVICES=2. Prints "placed_driver_mallocs=N" (what the ten took from
 * the driver), "unplaced=N" and "unplaced_bytes=N". */
static void placed_streams(void)
{
    CUcontext ctx0 = NULL, ctx1 = NULL;
    CUstream s0, s1;
    CUdeviceptr p = 0;
    unsigned long long before;
    int i;

    CU_OK(cu.init(0));
    CU_OK(cu.retain(&ctx0, 0));
    CU_OK(cu.retain(&ctx1, 1));
    CU_OK(cu.set_current(ctx1));
    CU_OK(cu.stream_create(&s1, 0));
    CU_OK(cu.set_current(ctx0));
    CU_OK(cu.stream_create(&s0, 0));
    before = device0().driver_mallocs;
    for (i = 0; i < 10; i++) {
        CU_OK(cu.alloc_async(&p, 2 * MiB, s0));
        CU_OK(cu.free_async(p, s0));
    }
    CU_OK(cu.sync());
    printf("placed_driver_mallocs=%llu\n", device0().driver_mallocs - before);
    CU_OK(cu.alloc_async(&p, 3 * MiB, s1));
    CU_OK(cu.free_async(p, s1));
    CU_OK(cu.sync());
    printf("unplaced=1\nunplaced_bytes=%llu\n", 3 * MiB);
    CU_OK(cu.stream_destroy(s0));
    CU_OK(cu.stream_destroy(s1));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "lcuda";
    if (strcmp(mode, "lcuda") == 0) {
        link_directly();
    } else if (strcmp(mode, "static") == 0) {
        link_as_static_runtime(0);
    } else if (strcmp(mode, "static-ptsz") == 0) {
        link_as_static_runtime(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    } else if (strcmp(mode, "fallback") == 0) {
        /* A driver without cuGetProcAddress: the versioned names by dlsym. */
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        CHECK(h != NULL, "dlopen: %s", dlerror());
        link_directly();
        *(void **)&cu.alloc = dlsym(h, "cuMemAlloc_v2");
        *(void **)&cu.free = dlsym(h, "cuMemFree_v2");
        *(void **)&cu.alloc_async = dlsym(h, "cuMemAllocAsync");
        *(void **)&cu.free_async = dlsym(h, "cuMemFreeAsync");
        *(void **)&cu.get_info = dlsym(h, "cuMemGetInfo_v2");
        *(void **)&cu.ipc = dlsym(h, "cuIpcGetMemHandle");
        *(void **)&cu.sync = dlsym(h, "cuCtxSynchronize");
        *(void **)&cu.launch = dlsym(h, "cuLaunchKernel");
        CHECK(cu.alloc && cu.free && cu.get_info && cu.sync, "dlsym: %s", dlerror());
    } else if (strcmp(mode, "module") == 0 && argc > 2) {
        /* As XLA: a Python-extension-like module loaded RTLD_LOCAL finds the driver itself. */
        void *m = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        long (*churn)(void);
        CHECK(m != NULL, "dlopen %s: %s", argv[2], dlerror());
        *(void **)&churn = dlsym(m, "module_churn");
        CHECK(churn != NULL, "no module_churn");
        printf("module_driver_mallocs=%ld\n", churn());
        printf("driver_pool module: all checks passed\n");
        return 0;
    } else if (strcmp(mode, "lookups") == 0) {
        /* What dlsym answers for everything else must not change under the pool. */
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        const char *err;
        CHECK(h != NULL, "dlopen: %s", dlerror());
        CHECK(dlsym(h, "cuNoSuchEntryPoint") == NULL, "found a missing name");
        err = dlerror();
        printf("dlerror_missing=%s\n", err ? err : "(none)");
        CHECK(dlsym(h, "cuInit") != NULL, "no cuInit");
        err = dlerror();
        printf("dlerror_after_success=%s\n", err ? err : "(none)");
        /* RTLD_NEXT is relative to the caller: from the program, the next object defining
         * cudaMalloc is the preloaded pool, or none; never what comes after the pool. */
        printf("rtld_next_is_default=%d\n",
               dlsym(RTLD_NEXT, "cudaMalloc") == dlsym(RTLD_DEFAULT, "cudaMalloc"));
        printf("rtld_next_getpid_is_default=%d\n",
               dlsym(RTLD_NEXT, "getpid") == dlsym(RTLD_DEFAULT, "getpid"));
        printf("driver_pool lookups: all checks passed\n");
        return 0;
    } else {
        CHECK(0, "unknown mode %s", mode);
    }
    if (argc > 2 && strcmp(argv[2], "streams") == 0) {
        placed_streams();
        printf("driver_pool %s streams: all checks passed\n", mode);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "default-pool") == 0) {
        default_pool_calls();
        printf("driver_pool %s default-pool: all checks passed\n", mode);
        return 0;
    }
    if (argc > 3 && strcmp(argv[2], "cache-back") == 0) {
        cache_back(argv[3]);
        printf("driver_pool %s cache-back %s: all checks passed\n", mode, argv[3]);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "custom-pool") == 0) {
        custom_pool();
        printf("driver_pool %s custom-pool: all checks passed\n", mode);
        return 0;
    }
    exercise();
    printf("driver_pool %s: all checks passed\n", mode);
    return 0;
}
