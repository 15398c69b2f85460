/* cudasim's driver face for a program linked with -lcuda alone (no runtime): initialization,
 * the primary and created contexts, allocation and its errors, streams, events, the async pair
 * and a launch on the in-flight model, memory pools the program creates and makes current, and a
 * green context. */
#include "cuda.h"
#include "check.h"

/* `call` must return the CUresult `want`. */
#define CU_EXPECT(call, want)                                                           \
    do {                                                                                \
        CUresult got_ = (call);                                                         \
        const char *name_ = NULL;                                                       \
        cuGetErrorName(got_, &name_);                                                   \
        CHECK(got_ == (want), "%s returned %d (%s), expected %d", #call, (int)got_,     \
              name_ ? name_ : "?", (int)(want));                                        \
    } while (0)
#define CU_OK(call) CU_EXPECT(call, CUDA_SUCCESS)

int main(void)
{
    CUdeviceptr p = 0, q = 7, a = 0;
    CUcontext primary = NULL, ctx = NULL, created = NULL;
    CUdevice dev = -1;
    CUstream s = NULL;
    CUevent e = NULL;
    size_t free_b = 0, total_b = 0, size = 0;
    int n = 0;
    const char *text = NULL;
    char buf[64], back[64];

    SECTION("before cuInit: versions and names answer, the rest is not initialized");
    CU_OK(cuDriverGetVersion(&n));
    CHECK(n == 12080, "version %d", n);
    CU_OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &text));
    CHECK(strcmp(text, "CUDA_ERROR_OUT_OF_MEMORY") == 0, "%s", text);
    CU_OK(cuGetErrorString(CUDA_ERROR_INVALID_CONTEXT, &text));
    CHECK(strcmp(text, "invalid device context") == 0, "%s", text);
    CU_EXPECT(cuGetErrorName((CUresult)12345, &text), CUDA_ERROR_INVALID_VALUE);
    CHECK(text == NULL, "name of an unknown code");
    CU_EXPECT(cuMemAlloc(&p, 64), CUDA_ERROR_NOT_INITIALIZED);
    CU_EXPECT(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);

    SECTION("cuInit, devices, and no context until one is made current");
    CU_EXPECT(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGetCount(&n));
    CHECK(n == 1, "%d devices", n);
    CU_OK(cuDeviceGet(&dev, 0));
    CU_EXPECT(cuDeviceGet(&dev, 1), CUDA_ERROR_INVALID_DEVICE);
    CU_OK(cuCtxGetCurrent(&ctx));
    CHECK(ctx == NULL, "a current context before any");
    CU_EXPECT(cuMemAlloc(&p, 64), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);

    SECTION("the primary context");
    CU_OK(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK(primary != NULL, "no primary context");
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(ctx == primary, "a second primary context");
    CU_OK(cuCtxSetCurrent(primary));
    CU_OK(cuCtxGetCurrent(&ctx));
    CHECK(ctx == primary, "current %p", (void *)ctx);
    CU_OK(cuCtxGetDevice(&dev));
    CHECK(dev == 0, "device %d", dev);

    SECTION("cuMemAlloc_v2 and cuMemFree_v2, counted as driver calls");
    CU_OK(cuMemAlloc(&p, 1 << 20));
    CHECK(p != 0, "NULL allocation");
    CHECK(stats_of(0).driver_mallocs == 1 && stats_of(0).malloc_calls == 1, "counters");
    CHECK(stats_of(0).live_allocations == 1, "live %llu", stats_of(0).live_allocations);
    CU_OK(cuMemGetAddressRange(&a, &size, p + 100));
    CHECK(a == p && size == 1 << 20, "range %llx %zu", a, size);
    CU_EXPECT(cuMemGetAddressRange(&a, &size, 16), CUDA_ERROR_NOT_FOUND);
    memset(buf, 0x42, sizeof buf);
    CU_OK(cuMemcpyHtoD(p, buf, sizeof buf));
    CU_OK(cuMemcpyDtoH(back, p, sizeof back));
    CHECK(memcmp(buf, back, sizeof buf) == 0, "copies do not round-trip");
    CU_OK(cuMemGetInfo(&free_b, &total_b));
    CHECK(total_b == 1ull << 30 && free_b == (1ull << 30) - (1 << 20), "%zu of %zu", free_b,
          total_b);

    SECTION("out of memory, zero bytes, bad frees");
    CU_EXPECT(cuMemAlloc(&q, 2ull << 30), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(q == 7, "out-pointer written on failure");
    CU_EXPECT(cuMemAlloc(&q, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuMemAlloc(NULL, 64), CUDA_ERROR_INVALID_VALUE);
    CHECK(stats_of(0).malloc_failures == 3, "failures %llu", stats_of(0).malloc_failures);
    CU_OK(cuMemFree(p));
    CU_EXPECT(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemFree(0));
    CHECK(stats_of(0).driver_frees == 2 && stats_of(0).live_allocations == 0, "frees");

    SECTION("streams, events and the async pair on the in-flight model");
    CU_EXPECT(cuStreamCreate(&s, 4), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cuStreamGetFlags(s, (unsigned *)&n));
    CHECK(n == CU_STREAM_NON_BLOCKING, "flags %d", n);
    ctx = NULL;
    CU_OK(cuStreamGetCtx(s, &ctx));
    CHECK(ctx == primary, "the stream's context %p", (void *)ctx);
    ctx = NULL;
    CU_OK(cuStreamGetCtx(CU_STREAM_LEGACY, &ctx));
    CHECK(ctx == primary, "the legacy stream's context %p", (void *)ctx);
    CU_EXPECT(cuStreamGetCtx(s, NULL), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuEventCreate(&e, CU_EVENT_DEFAULT));
    CU_OK(cuMemAllocAsync(&a, 4096, s));
    CU_OK(cudasim_cu_launch_fill(a, 4096, 100000, 0x5a, s));
    CU_OK(cuMemFreeAsync(a, s));
    CU_OK(cuEventRecord(e, s));
    CHECK(cudasimRangeBusy((void *)a, 4096) == 1, "the kernel is not in flight");
    CU_EXPECT(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    CU_EXPECT(cuEventQuery(e), CUDA_ERROR_NOT_READY);
    CU_OK(cuEventSynchronize(e));
    CU_OK(cuStreamQuery(s));
    CHECK(stats_of(0).kernel_writes == 1, "the block was unmapped before the kernel ended");
    CHECK(stats_of(0).live_allocations == 0, "live %llu", stats_of(0).live_allocations);
    CHECK(stats_of(0).async_mallocs == 1 && stats_of(0).driver_mallocs == 5, "counters");
    CU_EXPECT(cudasim_cu_launch_fill(0, 0, 0, -1, (CUstream)0x99), CUDA_ERROR_INVALID_HANDLE);
    CU_OK(cuStreamWaitEvent(s, e, 0));
    CU_OK(cuStreamSynchronize(s));
    CU_OK(cuStreamSynchronize_ptsz(NULL));
    CU_OK(cuEventDestroy(e));
    CU_OK(cuStreamDestroy(s));
    CU_EXPECT(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);

    SECTION("a created context: its own handle, its device's memory");
    CU_OK(cuCtxCreate(&created, 0, 0));
    CHECK(created != NULL && created != primary, "created %p", (void *)created);
    CU_OK(cuCtxGetCurrent(&ctx));
    CHECK(ctx == created, "cuCtxCreate did not make it current");
    CU_OK(cuMemAlloc(&p, 4096));
    CU_OK(cuCtxPopCurrent(&ctx));
    CHECK(ctx == created, "popped %p", (void *)ctx);
    CU_OK(cuCtxGetCurrent(&ctx));
    CHECK(ctx == primary, "below it: %p", (void *)ctx);
    CU_OK(cuMemFree(p));
    CU_OK(cuCtxPushCurrent(created));
    CU_OK(cuCtxDestroy(created));
    CU_OK(cuCtxGetCurrent(&ctx));
    CHECK(ctx == primary, "the destroyed context stayed current");
    CU_EXPECT(cuCtxPushCurrent(created), CUDA_ERROR_INVALID_CONTEXT);
    CU_EXPECT(cuCtxDestroy(primary), CUDA_ERROR_INVALID_CONTEXT);

    SECTION("a created context's default stream is its own, ordered with its blocking streams");
    {
        CUstream mine = NULL;
        CUevent done = NULL;
        CU_OK(cuCtxCreate(&created, 0, 0));
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cuStreamCreate(&mine, CU_STREAM_DEFAULT));
        CU_OK(cuEventCreate(&done, 0));
        CU_OK(cudasim_cu_launch_fill(p, 4096, 200000, 0x11, mine));
        /* The primary context's NULL stream waits for none of the created context's streams. */
        CU_OK(cuCtxPopCurrent(&ctx));
        CU_OK(cuEventRecord(done, NULL));
        CU_OK(cuEventSynchronize(done));
        CHECK(cudasimRangeBusy((void *)p, 4096) == 1, "the primary's NULL stream waited");
        /* The created context's NULL stream waits for its blocking stream. */
        CU_OK(cuCtxPushCurrent(created));
        CU_OK(cuEventRecord(done, NULL));
        CU_OK(cuEventSynchronize(done));
        CHECK(cudasimRangeBusy((void *)p, 4096) == 0, "its own NULL stream did not wait");
        /* The reverse: a kernel on the created context's NULL stream; the primary's blocking
         * stream does not wait for it, the created context's does. */
        CU_OK(cudasim_cu_launch_fill(p, 4096, 200000, 0x22, NULL));
        CU_OK(cuCtxPopCurrent(&ctx));
        CU_OK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
        CU_OK(cuEventRecord(done, s));
        CU_OK(cuEventSynchronize(done));
        CHECK(cudasimRangeBusy((void *)p, 4096) == 1, "the primary's blocking stream waited");
        CU_OK(cuStreamDestroy(s));
        CU_OK(cuCtxPushCurrent(created));
        CU_OK(cuEventRecord(done, mine));
        CU_OK(cuEventSynchronize(done));
        CHECK(cudasimRangeBusy((void *)p, 4096) == 0, "its blocking stream did not wait");
        CU_OK(cuEventDestroy(done));
        CU_OK(cuStreamDestroy(mine));
        CU_OK(cuMemFree(p));
        CU_OK(cuCtxDestroy(created));
    }

    SECTION("memory pools: created, made current, served cuMemAllocAsync, destroyed");
    {
        CUmemoryPool def = NULL, mine = NULL, cur = NULL;
        CUmemPoolProps props;
        unsigned long long served = 0;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        CU_OK(cuDeviceGetDefaultMemPool(&def, 0));
        CU_EXPECT(cuDeviceGetDefaultMemPool(&def, 1), CUDA_ERROR_INVALID_DEVICE);
        CU_OK(cuDeviceGetMemPool(&cur, 0));
        CHECK(cur == def, "current %p default %p", (void *)cur, (void *)def);
        {
            /* The attributes and the trim, as the runtime's: under a release threshold, 64 KiB
             * freed stay reserved through a synchronization, until a trim. */
            unsigned long long reserved = 0, threshold = 1 << 20;
            CU_OK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
            threshold = 0;
            CU_OK(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
            CHECK(threshold == 1 << 20, "threshold %llu", threshold);
            CU_OK(cuMemAllocAsync(&a, 64 * 1024, CU_STREAM_LEGACY));
            CU_OK(cuMemFreeAsync(a, CU_STREAM_LEGACY));
            CU_OK(cuCtxSynchronize());
            CU_OK(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
            CHECK(reserved == 64 * 1024, "reserved %llu", reserved);
            CU_OK(cuMemPoolTrimTo(def, 0));
            CU_OK(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
            CHECK(reserved == 0, "reserved after the trim %llu", reserved);
            threshold = 0;
            CU_OK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
            CU_EXPECT(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, NULL),
                      CUDA_ERROR_INVALID_VALUE);
        }
        {
            /* Access to the pool, as the runtime's cudaMemPoolSetAccess checks it. */
            CUmemAccessDesc access;
            memset(&access, 0, sizeof access);
            access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            access.location.id = 0;
            access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            CU_OK(cuMemPoolSetAccess(def, &access, 1));
            CU_EXPECT(cuMemPoolSetAccess(def, NULL, 1), CUDA_ERROR_INVALID_VALUE);
            access.location.id = 1;
            CU_EXPECT(cuMemPoolSetAccess(def, &access, 1), CUDA_ERROR_INVALID_DEVICE);
        }
        props.location.id = 1;
        CU_EXPECT(cuMemPoolCreate(&mine, &props), CUDA_ERROR_INVALID_VALUE);
        props.location.id = 0;
        CU_OK(cuMemPoolCreate(&mine, &props));
        CU_EXPECT(cuDeviceSetMemPool(1, mine), CUDA_ERROR_INVALID_DEVICE);
        CU_OK(cuDeviceSetMemPool(0, mine));
        CU_OK(cuMemAllocAsync(&a, 4096, CU_STREAM_LEGACY));
        CHECK(cudasimGetPoolMallocs((cudaMemPool_t)mine, &served) == 0 && served == 1,
              "the created pool served %llu", served);
        CHECK(cudasimGetPoolMallocs((cudaMemPool_t)def, &served) == 0 && served == 2,
              "the default pool served %llu (two before)", served);
        CU_OK(cuMemFreeAsync(a, CU_STREAM_LEGACY));
        /* From a named pool, whichever is current; 0 bytes refused, as the driver documents. */
        CU_OK(cuMemAllocFromPoolAsync(&a, 4096, def, CU_STREAM_LEGACY));
        CHECK(cudasimGetPoolMallocs((cudaMemPool_t)def, &served) == 0 && served == 3,
              "the default pool served %llu by name", served);
        CU_OK(cuMemFreeAsync(a, CU_STREAM_LEGACY));
        CU_EXPECT(cuMemAllocFromPoolAsync_ptsz(&a, 0, def, NULL), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuMemAllocManaged(&a, 4096, CU_MEM_ATTACH_GLOBAL));
        CU_OK(cuMemFree(a));
        CU_EXPECT(cuMemAllocManaged(&a, 4096, 7), CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuMemAllocManaged(&a, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
        CU_EXPECT(cuMemPoolDestroy(def), CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuMemPoolDestroy(mine));
        CU_OK(cuDeviceGetMemPool(&cur, 0));
        CHECK(cur == def, "the destroyed pool stayed current");
        CU_OK(cuCtxSynchronize());
    }

    SECTION("private tables, releases");
    {
        const void *table = (const void *)0x1;
        CUuuid id;
        memset(&id, 0, sizeof id);
        CU_EXPECT(cuGetExportTable(&table, &id), CUDA_ERROR_NOT_SUPPORTED);
        CHECK(table == NULL, "a table");
    }
    CU_OK(cuDevicePrimaryCtxRelease(0));
    CU_OK(cuDevicePrimaryCtxRelease(0));
    CU_EXPECT(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cuDevicePrimaryCtxReset(0));

    SECTION("fault injection by driver name (CUDASIM_FAIL=cuMemAlloc_v2@10=2 in the test)");
    CU_OK(cuMemAlloc(&p, 64));
    CU_EXPECT(cuMemAlloc(&q, 64), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cuMemFree(p));

    SECTION("a green context: its streams are its own, the primary's synchronization waits for them");
    {
        CUdevResource all, part[2], rest;
        CUdevResourceDesc desc = NULL;
        CUgreenCtx green = NULL;
        CUcontext mine = NULL;
        CUstream gs = NULL;
        CUevent done = NULL;
        unsigned int groups = 2;
        CU_OK(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
        CHECK(all.type == CU_DEV_RESOURCE_TYPE_SM && all.sm.smCount >= 16, "SMs %u",
              all.sm.smCount);
        CU_OK(cuDevSmResourceSplitByCount(part, &groups, &all, &rest, 0, 8));
        CHECK(groups == 2 && part[1].sm.smCount == 8 && rest.sm.smCount == all.sm.smCount - 16,
              "split: %u groups, %u left", groups, rest.sm.smCount);
        CU_OK(cuDevResourceGenerateDesc(&desc, part, 1));
        CU_EXPECT(cuGreenCtxCreate(&green, desc, 0, 2), CUDA_ERROR_INVALID_VALUE);
        /* It retains the device's primary context, whatever context is current: here one the
         * program made, after the primary context's reset. */
        {
            CUcontext own = NULL;
            unsigned int flags = 0;
            int active = 1;
            CU_OK(cuDevicePrimaryCtxReset(0));
            CU_OK(cuCtxCreate(&own, 0, 0));
            CU_OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
            CHECK(active == 0, "the primary context is active after its reset");
            CU_OK(cuGreenCtxCreate(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
            CU_OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
            CHECK(active == 1, "a green context left its primary context inactive");
            CU_OK(cuCtxDestroy(own));
        }
        CU_OK(cuCtxFromGreenCtx(&mine, green));
        CU_EXPECT(cuGreenCtxStreamCreate(&gs, green, CU_STREAM_DEFAULT, 0),
                  CUDA_ERROR_INVALID_VALUE);
        CU_OK(cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0));
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cuEventCreate(&done, 0));
        CU_OK(cudasim_cu_launch_fill(p, 4096, 200000, 0x33, gs));
        /* The primary context's NULL stream waits not for it; its synchronization does. */
        CU_OK(cuEventRecord(done, NULL));
        CU_OK(cuEventSynchronize(done));
        CHECK(cudasimRangeBusy((void *)p, 4096) == 1, "the primary's NULL stream waited");
        CU_OK(cuCtxSynchronize());
        CHECK(cudasimRangeBusy((void *)p, 4096) == 0, "the primary's synchronization did not wait");
        /* Its context handle made current: its synchronization waits for its own streams, and
         * only cuGreenCtxDestroy destroys it. */
        CU_OK(cudasim_cu_launch_fill(p, 4096, 200000, 0x44, gs));
        CU_OK(cuCtxPushCurrent(mine));
        CU_EXPECT(cuCtxDestroy(mine), CUDA_ERROR_INVALID_CONTEXT);
        CU_OK(cuCtxSynchronize());
        CHECK(cudasimRangeBusy((void *)p, 4096) == 0, "its synchronization did not wait");
        /* CUDA 13's cuCtxSynchronize_v2 of its handle waits for its streams; of the primary
         * context's, with the green one current, for them too. */
        CU_OK(cudasim_cu_launch_fill(p, 4096, 200000, 0x55, gs));
        CU_OK(cuCtxSynchronize_v2(mine));
        CHECK(cudasimRangeBusy((void *)p, 4096) == 0, "its handle's synchronization did not wait");
        CU_OK(cudasim_cu_launch_fill(p, 4096, 200000, 0x66, gs));
        CU_OK(cuCtxSynchronize_v2(primary));
        CHECK(cudasimRangeBusy((void *)p, 4096) == 0, "the primary's handle did not wait");
        CU_OK(cuCtxPopCurrent(&ctx));
        CHECK(ctx == mine, "popped another context");
        CU_OK(cuStreamDestroy(gs));
        CU_OK(cuGreenCtxDestroy(green));
        CU_EXPECT(cuCtxFromGreenCtx(&mine, green), CUDA_ERROR_INVALID_CONTEXT);
        CU_OK(cuEventDestroy(done));
        CU_OK(cuMemFree(p));
    }
    SECTION("cuCtxSynchronize_v2: the context given, or the current one for NULL");
    {
        CUcontext own = NULL;
        void *f = NULL;
        CUdriverProcAddressQueryResult found;
        CU_OK(cuGetProcAddress_v2("cuCtxSynchronize_v2", &f, 13000, 0, &found));
        CHECK(f == (void *)cuCtxSynchronize_v2 && found == CU_GET_PROC_ADDRESS_SUCCESS,
              "cuGetProcAddress_v2(cuCtxSynchronize_v2, 13000)");
        CU_OK(cuCtxSetCurrent(primary));
        CU_OK(cuMemAlloc(&p, 4096));
        CU_OK(cudasim_cu_launch_fill(p, 4096, 200000, 0x77, NULL));
        CU_OK(cuCtxCreate(&own, 0, 0));
        /* A created context's synchronization waits not for the primary context's work. */
        CU_OK(cuCtxSynchronize_v2(own));
        CU_OK(cuCtxSynchronize_v2(NULL));
        CHECK(cudasimRangeBusy((void *)p, 4096) == 1, "the created context's waited");
        /* The primary's, by its handle, does; the thread's context stays. */
        CU_OK(cuCtxSynchronize_v2(primary));
        CHECK(cudasimRangeBusy((void *)p, 4096) == 0, "the primary's handle did not wait");
        CU_OK(cuCtxGetCurrent(&ctx));
        CHECK(ctx == own, "the current context changed");
        CU_EXPECT(cuCtxSynchronize_v2((CUcontext)&n), CUDA_ERROR_INVALID_CONTEXT);
        CU_OK(cuCtxDestroy(own));
        CU_EXPECT(cuCtxSynchronize_v2(own), CUDA_ERROR_INVALID_CONTEXT);
        CU_OK(cuCtxSetCurrent(NULL));
        CU_EXPECT(cuCtxSynchronize_v2(NULL), CUDA_ERROR_INVALID_CONTEXT);
        CU_OK(cuCtxSetCurrent(primary));
        CU_OK(cuMemFree(p));
    }
    printf("sim_driver: all checks passed\n");
    return 0;
}
