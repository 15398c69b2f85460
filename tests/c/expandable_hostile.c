/* Hostile uses of expandable segments (CUDA virtual memory under the pool). Linked with the
 * runtime and -lcuda. Modes (argv[1]):
 *   own-vmm: 1 GiB device. 700 MiB allocated, written and freed through cudaMalloc, then the
 *     program's own cuMemCreate of 800 MiB, mapped, given access and written.
 *   own-vmm-map: the same, but the program reserved and created its own small mapping first.
 *     argv[2] "lookup": cuMemCreate found through cuGetProcAddress_v2, as the static runtime
 *     and PyTorch find it; else called by symbol.
 *   trim-busy: relaxed or any mode. A 64 MiB block freed under a 200 ms kernel on a
 *     non-blocking stream; then the cache is given back by argv[2]: sync (another stream's
 *     synchronization, threshold 0), trim (cudaMemPoolTrimTo), empty (gpupool_empty_cache),
 *     oom (a request that fits only once the cache goes back).
 *   peer-small: two devices. Device 1 given access to device 0 before (argv[2] "before") or
 *     after ("after") device 0 maps a small (64 KiB) and a 3 MiB block; kernels on device 1
 *     fill both.
 *   info-busy: a 600 MiB block freed under a 300 ms kernel; cudaMemGetInfo's free, and a
 *     request of all of it.
 *   own-context: a pool block used by a kernel in a context the program made (own_context_kernel).
 *   own-context-ordered: the same on a stream a barrier would order in the primary context
 *     (own_context_ordered).
 *   own-context-later: a block reusable after a barrier, then a context made and the block used
 *     there (own_context_later).
 *   own-context-async: relaxed mode, a block freed with cudaFreeAsync on the primary context's
 *     legacy stream, then used in a context the program made (own_context_async).
 *   green-context: a pool block used by a kernel on a stream of a green context, freed with the
 *     primary context current, then asked for again (green_context).
 *   green-sync: a pool block used by a kernel on a non-blocking stream of the primary context,
 *     freed, then a synchronization with a green context current (green_sync).
 *   execution-ctx: a pool block used by a kernel on a non-blocking stream of the primary
 *     execution context (cudaExecutionCtxStreamCreate), freed, asked for again (execution_ctx).
 *   per-thread: a pool block used by a kernel on the per-thread default stream, freed, asked
 *     for again (per_thread).
 *   small-then-large, large-then-small, mixed-info: another thread's freed blocks kept while
 *     the main thread asks for the device's memory (other_thread).
 * Prints "key=value" lines and "expandable_hostile MODE ok". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>

#include "cuda.h"
#include "check.h"

#define MiB (1024ull * 1024ull)

static CUmemAllocationProp prop_of(int device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);

/* cuMemCreate as the program reaches it: by symbol (-lcuda), or through cuGetProcAddress as
 * the static runtime and PyTorch do (`lookup`). */
static create_fn create_of(int lookup)
{
    void *f = NULL;
    CUdriverProcAddressQueryResult found;
    if (!lookup)
        return cuMemCreate;
    CHECK(cuGetProcAddress_v2("cuMemCreate", &f, 12000, 0, &found) == CUDA_SUCCESS && f != NULL,
          "cuGetProcAddress_v2(cuMemCreate)");
    return (create_fn)f;
}

/* The program's own mapping of `bytes` on device 0: created, reserved, mapped, given access and
 * set. The cuMemCreate's answer is printed as `key`; on success the mapping is undone. */
static void own_mapping(const char *key, size_t bytes, int lookup)
{
    CUmemAllocationProp prop = prop_of(0);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    CUmemAccessDesc access;
    CUresult r = create_of(lookup)(&h, bytes, &prop, 0);
    printf("%s=%d\n", key, (int)r);
    if (r != CUDA_SUCCESS)
        return;
    CHECK_CU(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    CHECK_CU(cuMemMap(va, bytes, 0, h, 0));
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_CU(cuMemSetAccess(va, bytes, &access, 1));
    CHECK_CUDA(cudaMemset((void *)va, 7, bytes));
    CHECK_CU(cuMemUnmap(va, bytes));
    CHECK_CU(cuMemRelease(h));
    CHECK_CU(cuMemAddressFree(va, bytes));
}

static void own_vmm(int first_own, int lookup)
{
    void *p = NULL;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(0));
    if (first_own)
        own_mapping("own_first", 64 * MiB, lookup);
    CHECK_CUDA(cudaMalloc(&p, 700 * MiB));
    CHECK_CUDA(cudaMemset(p, 1, 700 * MiB));
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaDeviceSynchronize());
    own_mapping("own_create", 800 * MiB, lookup);
}

static void trim_busy(const char *how)
{
    void *p = NULL, *q = NULL;
    cudaStream_t s, other;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&p, 64 * MiB));
    CHECK_CUDA(cudasim_launch_fill(p, 64 * MiB, 200000, 0x11, s));
    CHECK_CUDA(cudaFree(p));
    if (strcmp(how, "sync") == 0) {
        CHECK_CUDA(cudaStreamSynchronize(other));
    } else if (strcmp(how, "trim") == 0) {
        cudaMemPool_t pool;
        CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
        CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
    } else if (strcmp(how, "empty") == 0) {
        typedef int (*empty_fn)(int, size_t *);
        empty_fn f = (empty_fn)dlsym(RTLD_DEFAULT, "gpupool_empty_cache");
        if (f != NULL)
            CHECK(f(0, NULL) == 0, "gpupool_empty_cache");
    } else if (strcmp(how, "oom") == 0) {
        size_t free_b = 0, total = 0;
        CHECK_CUDA(cudaMemGetInfo(&free_b, &total));
        printf("oom_free=%zu\n", free_b);
        CHECK_CUDA(cudaMalloc(&q, 1000 * MiB));
        CHECK_CUDA(cudaFree(q));
    }
    printf("mapped_after=%llu\n", sim_stats(0).vmm_mapped_bytes);
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("unmapped_while_busy=%llu\n", sim_stats(0).unmapped_while_busy);
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK_CUDA(cudaStreamDestroy(other));
}

static void peer_small(int before)
{
    void *small = NULL, *big = NULL;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaFree(0));
    if (before)
        CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&small, 64 * 1024));
    CHECK_CUDA(cudaMalloc(&big, 3 * MiB));
    CHECK_CUDA(cudaSetDevice(1));
    if (!before)
        CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
    printf("fill_small=%d\n", (int)cudasim_launch_fill(small, 64 * 1024, 10, 0x22, NULL));
    printf("fill_big=%d\n", (int)cudasim_launch_fill(big, 3 * MiB, 10, 0x22, NULL));
    (void)cudaGetLastError();
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("denied=%llu\n", sim_stats(1).accessed_without_access + sim_stats(0).accessed_without_access);
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(small));
    CHECK_CUDA(cudaFree(big));
}

static void info_busy(void)
{
    void *p = NULL, *q = NULL;
    size_t free_b = 0, total = 0;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, 600 * MiB));
    CHECK_CUDA(cudasim_launch_fill(p, 600 * MiB, 300000, 0x33, NULL));
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total));
    printf("info_free=%zu\n", free_b);
    cudaError_t r = cudaMalloc(&q, free_b);
    printf("info_all=%d\n", (int)r);
    (void)cudaGetLastError();
    if (r == cudaSuccess)
        CHECK_CUDA(cudaFree(q));
    printf("unmapped_while_busy=%llu\n", sim_stats(0).unmapped_while_busy);
}

/* A second thread's blocks: `count` of `bytes` allocated and freed on device 0 while the main
 * thread has allocated too (so thread caches start), then the thread waits, alive, with what
 * its cache kept, until `release` is set. */
struct holder {
    int count;
    size_t bytes;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done, release;
};

static void *hold(void *arg)
{
    struct holder *h = (struct holder *)arg;
    void **p = (void **)calloc((size_t)h->count, sizeof *p);
    CHECK(p != NULL, "calloc");
    CHECK_CUDA(cudaSetDevice(0));
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < h->count; i++) {
            CHECK_CUDA(cudaMalloc(&p[i], h->bytes));
            CHECK_CUDA(cudaMemset(p[i], 3, h->bytes));
        }
        for (int i = 0; i < h->count; i++)
            CHECK_CUDA(cudaFree(p[i]));
    }
    free(p);
    pthread_mutex_lock(&h->lock);
    h->done = 1;
    pthread_cond_broadcast(&h->cond);
    while (!h->release)
        pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

/* A thread that allocated and freed `count` blocks of `bytes` waits alive; then the main thread
 * asks cudaMemGetInfo, and for `want` bytes in blocks of `piece` (all the free memory with
 * `want` 0). */
static void other_thread(int count, size_t bytes, size_t want, size_t piece)
{
    struct holder h;
    pthread_t t;
    void *mine = NULL, **got;
    size_t free_b = 0, total = 0, n;
    memset(&h, 0, sizeof h);
    h.count = count;
    h.bytes = bytes;
    pthread_mutex_init(&h.lock, NULL);
    pthread_cond_init(&h.cond, NULL);
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&mine, 4096));
    CHECK(pthread_create(&t, NULL, hold, &h) == 0, "pthread_create");
    pthread_mutex_lock(&h.lock);
    while (!h.done)
        pthread_cond_wait(&h.cond, &h.lock);
    pthread_mutex_unlock(&h.lock);
    CHECK_CUDA(cudaFree(mine));
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total));
    printf("other_free=%zu\n", free_b);
    if (want == 0)
        want = free_b / piece * piece;
    n = want / piece;
    got = (void **)calloc(n, sizeof *got);
    CHECK(got != NULL, "calloc");
    size_t i = 0;
    cudaError_t r = cudaSuccess;
    for (; i < n; i++) {
        r = cudaMalloc(&got[i], piece);
        if (r != cudaSuccess)
            break;
    }
    (void)cudaGetLastError();
    printf("other_got=%zu\n", i * piece);
    printf("other_error=%d\n", (int)r);
    for (size_t j = 0; j < i; j++)
        CHECK_CUDA(cudaFree(got[j]));
    free(got);
    pthread_mutex_lock(&h.lock);
    h.release = 1;
    pthread_cond_broadcast(&h.cond);
    pthread_mutex_unlock(&h.lock);
    pthread_join(t, NULL);
}

/* A 64 MiB pool block of device 0, zeroed, with the primary context (`*primary`) current. */
static void *pool_block(CUcontext *primary)
{
    void *p = NULL;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, 64 * MiB));
    CHECK_CUDA(cudaMemset(p, 0, 64 * MiB));
    CHECK_CU(cuCtxGetCurrent(primary));
    return p;
}

/* `p` (64 MiB) under a 300 ms kernel filling 0x44, launched with `ctx` current on its stream `s`
 * (NULL: its NULL stream), with `primary` current again after. */
static void busy_on(void *p, CUcontext ctx, CUstream s, CUcontext primary)
{
    CHECK_CU(cuCtxPushCurrent(ctx));
    CHECK_CU(cudasim_cu_launch_fill((CUdeviceptr)p, 64 * MiB, 300000, 0x44, s));
    CHECK_CU(cuCtxPopCurrent(&ctx));
    CHECK_CU(cuCtxSetCurrent(primary));
}

/* A 64 MiB pool block of device 0 under a 300 ms kernel (filling 0x44) in a context the program
 * made (`*mine`), on a stream made there with `flags` (-1: that context's NULL stream), with the
 * primary context (`*primary`) current again after. */
static void *busy_in_own_context(int flags, CUcontext *mine, CUcontext *primary, CUstream *s)
{
    void *p = pool_block(primary);
    CHECK_CU(cuCtxCreate(mine, 0, 0));
    *s = NULL;
    if (flags >= 0)
        CHECK_CU(cuStreamCreate(s, (unsigned)flags));
    CHECK_CU(cuCtxPopCurrent(mine));
    busy_on(p, *mine, *s, *primary);
    return p;
}

/* A pool block used by a 300 ms kernel on a non-blocking stream of a context the program made
 * on device 0, then freed with the primary context current; then the cache given back (`how`
 * "empty": gpupool_empty_cache; "trim": cudaMemPoolTrimTo) or, with "reuse", the same size
 * asked for again ("sync-reuse": after the program's cudaDeviceSynchronize, of the primary
 * context) and set, and its first byte read once the kernel is done. */
static void own_context_kernel(const char *how)
{
    void *q = NULL;
    CUcontext mine = NULL, primary = NULL;
    CUstream s = NULL;
    unsigned char first = 0;
    void *p = busy_in_own_context(CU_STREAM_NON_BLOCKING, &mine, &primary, &s);
    CHECK_CUDA(cudaFree(p));
    if (strcmp(how, "empty") == 0) {
        typedef int (*empty_fn)(int, size_t *);
        empty_fn f = (empty_fn)dlsym(RTLD_DEFAULT, "gpupool_empty_cache");
        if (f != NULL)
            CHECK(f(0, NULL) == 0, "gpupool_empty_cache");
    } else if (strcmp(how, "trim") == 0) {
        cudaMemPool_t pool;
        CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
        CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
    } else {
        if (strcmp(how, "sync-reuse") == 0)
            CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMalloc(&q, 64 * MiB));
        printf("ctx_reused_same=%d\n", q == p);
        CHECK_CUDA(cudaMemset(q, 0x55, 64 * MiB));
    }
    printf("ctx_busy_now=%zu\n", cudasimRangeBusy(p, 64 * MiB));
    printf("ctx_unmapped_while_busy=%llu\n", sim_stats(0).unmapped_while_busy);
    CHECK_CU(cuCtxPushCurrent(mine));
    CHECK_CU(cuStreamSynchronize(s));
    CHECK_CU(cuStreamDestroy(s));
    CHECK_CU(cuCtxPopCurrent(&mine));
    CHECK_CU(cuCtxSetCurrent(primary));
    if (q != NULL) {
        CHECK_CUDA(cudaMemcpy(&first, q, 1, cudaMemcpyDeviceToHost));
        printf("ctx_reused_first=%u\n", (unsigned)first);
        CHECK_CUDA(cudaFree(q));
    }
    printf("ctx_unmapped_while_busy_end=%llu\n", sim_stats(0).unmapped_while_busy);
    CHECK_CU(cuCtxDestroy(mine));
}

/* Once the work of context `ctx` is done, the first byte of `q` (its new owner's) printed, then
 * `q` freed. The read, on the primary context's legacy stream, comes after that context's
 * kernels too. */
static void read_after(void *q, CUcontext ctx, CUcontext primary)
{
    unsigned char first = 0;
    CHECK_CU(cuCtxPushCurrent(ctx));
    CHECK_CU(cuCtxSynchronize());
    CHECK_CU(cuCtxPopCurrent(&ctx));
    CHECK_CU(cuCtxSetCurrent(primary));
    CHECK_CUDA(cudaMemcpy(&first, q, 1, cudaMemcpyDeviceToHost));
    printf("new_owner_first=%u\n", (unsigned)first);
    CHECK_CUDA(cudaFree(q));
}

/* `read_after`, then the context the program made, `mine`, destroyed. */
static void read_new_owner(void *q, CUcontext mine, CUcontext primary)
{
    read_after(q, mine, primary);
    CHECK_CU(cuCtxDestroy(mine));
}

/* A pool block used by a 300 ms kernel in a context the program made on device 0, on a blocking
 * stream (argv[2] "blocking...") or that context's NULL stream ("null..."), then freed with the
 * primary context current. With "...-launch", the program then launches a kernel on the primary
 * context's legacy stream (a barrier in `barrier` mode); either way the same size is asked for
 * again and set to 0x55, and its first byte read once the kernel is done. In CUDA each context
 * has its own legacy stream: neither the launch nor the pool's barrier orders that kernel. */
static void own_context_ordered(const char *how)
{
    void *q = NULL;
    CUcontext mine = NULL, primary = NULL;
    CUstream s = NULL;
    int flags = strncmp(how, "blocking", 8) == 0 ? CU_STREAM_DEFAULT : -1;
    void *p = busy_in_own_context(flags, &mine, &primary, &s);
    CHECK_CUDA(cudaFree(p));
    if (strstr(how, "-launch") != NULL)
        CHECK_CUDA(cudasim_launch_fill(NULL, 0, 0, -1, 0));
    CHECK_CUDA(cudaMalloc(&q, 64 * MiB));
    printf("ordered_reused_same=%d\n", q == p);
    CHECK_CUDA(cudaMemset(q, 0x55, 64 * MiB));
    if (s != NULL) {
        /* Its kernel still runs to its end. */
        CHECK_CU(cuCtxPushCurrent(mine));
        CHECK_CU(cuStreamDestroy(s));
        CHECK_CU(cuCtxPopCurrent(&mine));
        CHECK_CU(cuCtxSetCurrent(primary));
    }
    read_new_owner(q, mine, primary);
}

/* `q` filled with 0x55 by a kernel on the NULL stream of `mine`, with `primary` current again
 * after. */
static void fill_in_own_context(void *q, CUcontext mine, CUcontext primary)
{
    CHECK_CU(cuCtxPushCurrent(mine));
    CHECK_CU(cudasim_cu_launch_fill((CUdeviceptr)q, 64 * MiB, 0, 0x55, NULL));
    CHECK_CU(cuCtxPopCurrent(&mine));
    CHECK_CU(cuCtxSetCurrent(primary));
}

/* A pool block used by a 300 ms kernel (filling 0x44) on a blocking stream of the primary
 * context, freed, then the program's launch on the legacy stream (a barrier in `barrier` mode:
 * the block is reusable, and every later blocking stream of the primary context waits for the
 * kernel). Then the program makes a context, asks for the same size with the primary context
 * current, and fills it with 0x55 in its own context, which waits for no barrier. The first
 * byte is read once the kernel is done. */
static void own_context_later(void)
{
    void *p = NULL, *q = NULL;
    CUcontext mine = NULL, primary = NULL;
    cudaStream_t s = NULL;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK_CUDA(cudaMalloc(&p, 64 * MiB));
    CHECK_CUDA(cudasim_launch_fill(p, 64 * MiB, 300000, 0x44, s));
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudasim_launch_fill(NULL, 0, 0, -1, 0));
    CHECK_CU(cuCtxGetCurrent(&primary));
    CHECK_CU(cuCtxCreate(&mine, 0, 0));
    CHECK_CU(cuCtxPopCurrent(&mine));
    CHECK_CU(cuCtxSetCurrent(primary));
    CHECK_CUDA(cudaMalloc(&q, 64 * MiB));
    printf("later_reused_same=%d\n", q == p);
    fill_in_own_context(q, mine, primary);
    /* Its kernel still runs to its end; the read waits for it. */
    CHECK_CUDA(cudaStreamDestroy(s));
    read_new_owner(q, mine, primary);
}

/* Relaxed mode: a pool block used by a 300 ms kernel (filling 0x44) on the primary context's
 * legacy stream and freed there in stream order, while a context the program made lives. The
 * same size asked for with cudaMalloc (another stream: it waits for a barrier in relaxed mode)
 * is filled with 0x55 in that context, whose work no barrier orders; its first byte is read
 * once the kernel is done. */
static void own_context_async(void)
{
    void *p = NULL, *q = NULL;
    CUcontext mine = NULL, primary = NULL;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, 64 * MiB));
    CHECK_CU(cuCtxGetCurrent(&primary));
    CHECK_CU(cuCtxCreate(&mine, 0, 0));
    CHECK_CU(cuCtxPopCurrent(&mine));
    CHECK_CU(cuCtxSetCurrent(primary));
    CHECK_CUDA(cudasim_launch_fill(p, 64 * MiB, 300000, 0x44, 0));
    CHECK_CUDA(cudaFreeAsync(p, 0));
    CHECK_CUDA(cudaMalloc(&q, 64 * MiB));
    printf("async_reused_same=%d\n", q == p);
    fill_in_own_context(q, mine, primary);
    read_new_owner(q, mine, primary);
}

typedef CUresult (*green_create_fn)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned int);

/* cuGreenCtxCreate as the program reaches it: by symbol (-lcuda), or (`unswapped`) through
 * cuGetProcAddress_v2, which hands out the driver's own function under
 * GPUPOOL_DRIVER_HOOKS=0: the pool never sees the green context made. */
static green_create_fn green_create_of(int unswapped)
{
    void *f = NULL;
    CUdriverProcAddressQueryResult found;
    if (!unswapped)
        return cuGreenCtxCreate;
    CHECK(cuGetProcAddress_v2("cuGreenCtxCreate", &f, 12040, 0, &found) == CUDA_SUCCESS &&
              f != NULL,
          "cuGetProcAddress_v2(cuGreenCtxCreate)");
    return (green_create_fn)f;
}

/* A green context on all of device 0's SMs, with a default stream, and its context handle;
 * created through a pointer the pool did not swap with `unswapped`. */
static CUgreenCtx make_green_through(CUcontext *ctx, int unswapped)
{
    CUdevResource all;
    CUdevResourceDesc desc = NULL;
    CUgreenCtx green = NULL;
    CHECK_CU(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
    CHECK_CU(cuDevResourceGenerateDesc(&desc, &all, 1));
    CHECK_CU(green_create_of(unswapped)(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CHECK_CU(cuCtxFromGreenCtx(ctx, green));
    return green;
}

static CUgreenCtx make_green(CUcontext *ctx)
{
    return make_green_through(ctx, 0);
}

/* `p` (64 MiB, busy under a kernel filling 0x44) freed with the primary context current; with
 * `how` containing "launch", the program then launches a kernel on the primary context's
 * legacy stream (a barrier in `barrier` mode); then the same size asked for again, whether it
 * is `p` printed under `key`, and set to 0x55 on the legacy stream. The new block. */
static void *free_and_ask_again(void *p, const char *how, const char *key)
{
    void *q = NULL;
    CHECK_CUDA(cudaFree(p));
    if (strstr(how, "launch") != NULL)
        CHECK_CUDA(cudasim_launch_fill(NULL, 0, 0, -1, 0));
    CHECK_CUDA(cudaMalloc(&q, 64 * MiB));
    printf("%s=%d\n", key, q == p);
    CHECK_CUDA(cudaMemset(q, 0x55, 64 * MiB));
    return q;
}

/* A pool block used by a 300 ms kernel (filling 0x44) on a stream of a green context of device
 * 0, then freed with the primary context current (free_and_ask_again: argv[2] with "launch",
 * after the program's launch on the primary context's legacy stream); the new owner's first
 * byte is read once the kernel is done. A green context's streams are its own: no action on
 * the primary context's legacy stream orders them. With "unswapped...", the green context is
 * made through cuGetProcAddress_v2's pointer (unswapped under GPUPOOL_DRIVER_HOOKS=0); only
 * its stream's creation, by symbol, reaches the pool. */
static void green_context(const char *how)
{
    void *q = NULL;
    CUcontext primary = NULL, mine = NULL;
    CUstream s = NULL;
    void *p = pool_block(&primary);
    CUgreenCtx green = make_green_through(&mine, strstr(how, "unswapped") != NULL);
    CHECK_CU(cuGreenCtxStreamCreate(&s, green, CU_STREAM_NON_BLOCKING, 0));
    busy_on(p, mine, s, primary);
    q = free_and_ask_again(p, how, "green_reused_same");
    read_after(q, mine, primary);
    CHECK_CU(cuStreamDestroy(s));
    CHECK_CU(cuGreenCtxDestroy(green));
}

/* A pool block used by a 300 ms kernel (filling 0x44) on a non-blocking stream of the primary
 * context, freed; then the program synchronizes with a green context's handle current, through
 * the runtime (argv[2] "runtime": cudaDeviceSynchronize) or the driver ("driver":
 * cuCtxSynchronize). Either waits for the green context's work alone (CUDA documents that only
 * the primary context's synchronization waits for green contexts too). The same size is then
 * asked for with the primary context current and set to 0x55 on the legacy stream, which does
 * not wait for the non-blocking stream; its first byte is read once all work is done. */
static void green_sync(const char *how)
{
    void *q = NULL;
    CUcontext primary = NULL, mine = NULL;
    cudaStream_t s = NULL;
    void *p = pool_block(&primary);
    CUgreenCtx green = make_green(&mine);
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudasim_launch_fill(p, 64 * MiB, 300000, 0x44, s));
    CHECK_CUDA(cudaFree(p));
    CHECK_CU(cuCtxPushCurrent(mine));
    if (strcmp(how, "driver") == 0)
        CHECK_CU(cuCtxSynchronize());
    else
        CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CU(cuCtxPopCurrent(&mine));
    CHECK_CU(cuCtxSetCurrent(primary));
    CHECK_CUDA(cudaMalloc(&q, 64 * MiB));
    printf("green_sync_reused_same=%d\n", q == p);
    CHECK_CUDA(cudaMemset(q, 0x55, 64 * MiB));
    /* The primary context's synchronization waits for every stream of it, the kernel's too. */
    read_after(q, primary, primary);
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK_CU(cuGreenCtxDestroy(green));
}

/* A pool block used by a 300 ms kernel (filling 0x44) on a non-blocking stream made with
 * cudaExecutionCtxStreamCreate in device 0's primary execution context
 * (cudaDeviceGetExecutionCtx), then freed and asked for again (free_and_ask_again, argv[2]);
 * the new owner's first byte read once all work is done. No barrier orders that stream. */
static void execution_ctx(const char *how)
{
    void *q = NULL;
    CUcontext primary = NULL;
    cudaExecutionContext_t ctx = NULL;
    cudaStream_t s = NULL;
    void *p = pool_block(&primary);
    CHECK_CUDA(cudaDeviceGetExecutionCtx(&ctx, 0));
    CHECK_CUDA(cudaExecutionCtxStreamCreate(&s, ctx, cudaStreamNonBlocking, 0));
    CHECK_CUDA(cudasim_launch_fill(p, 64 * MiB, 300000, 0x44, s));
    q = free_and_ask_again(p, how, "exec_reused_same");
    read_after(q, primary, primary);
    CHECK_CUDA(cudaStreamDestroy(s));
}

/* A pool block used by a 300 ms kernel (filling 0x44) on the per-thread default stream, freed;
 * with argv[2] "ptsz-launch", the program then launches a kernel on that stream too; then the
 * same size asked for again and filled with 0x55 by a 1 ms kernel on a blocking stream of its
 * own, which waits for the legacy stream's earlier work but not the per-thread stream's. (A
 * kernel, not cudaMemsetAsync: the simulator moves an asynchronous set's bytes at once.) Its
 * first byte is read once all work is done. */
static void per_thread(const char *how)
{
    void *q = NULL;
    CUcontext primary = NULL;
    cudaStream_t own = NULL;
    void *p = pool_block(&primary);
    CHECK_CUDA(cudaStreamCreate(&own));
    CHECK_CUDA(cudasim_launch_fill(p, 64 * MiB, 300000, 0x44, cudaStreamPerThread));
    CHECK_CUDA(cudaFree(p));
    if (strcmp(how, "ptsz-launch") == 0)
        CHECK_CUDA(cudasim_launch_fill(NULL, 0, 0, -1, cudaStreamPerThread));
    CHECK_CUDA(cudaMalloc(&q, 64 * MiB));
    printf("per_thread_reused_same=%d\n", q == p);
    CHECK_CUDA(cudasim_launch_fill(q, 64 * MiB, 1000, 0x55, own));
    read_after(q, primary, primary);
    CHECK_CUDA(cudaStreamDestroy(own));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    const char *arg = argc > 2 ? argv[2] : "";
    CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
    if (strcmp(mode, "own-vmm") == 0)
        own_vmm(0, strcmp(arg, "lookup") == 0);
    else if (strcmp(mode, "own-vmm-map") == 0)
        own_vmm(1, strcmp(arg, "lookup") == 0);
    else if (strcmp(mode, "trim-busy") == 0)
        trim_busy(arg);
    else if (strcmp(mode, "peer-small") == 0)
        peer_small(strcmp(arg, "before") == 0);
    else if (strcmp(mode, "info-busy") == 0)
        info_busy();
    else if (strcmp(mode, "own-context") == 0)
        own_context_kernel(arg);
    else if (strcmp(mode, "own-context-ordered") == 0)
        own_context_ordered(arg);
    else if (strcmp(mode, "own-context-later") == 0)
        own_context_later();
    else if (strcmp(mode, "own-context-async") == 0)
        own_context_async();
    else if (strcmp(mode, "green-context") == 0)
        green_context(arg);
    else if (strcmp(mode, "green-sync") == 0)
        green_sync(arg);
    else if (strcmp(mode, "execution-ctx") == 0)
        execution_ctx(arg);
    else if (strcmp(mode, "per-thread") == 0)
        per_thread(arg);
    else if (strcmp(mode, "small-then-large") == 0)
        other_thread(800, MiB, 900 * MiB, 900 * MiB);
    else if (strcmp(mode, "large-then-small") == 0)
        other_thread(1, 900 * MiB, 900 * MiB, MiB);
    else if (strcmp(mode, "mixed-info") == 0)
        other_thread(100, 5 * MiB, 0, 3 * MiB);
    else
        CHECK(0, "unknown mode %s", mode);
    printf("expandable_hostile %s ok\n", mode);
    return 0;
}
