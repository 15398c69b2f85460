/* cudasim: the default memory pool of each device (attributes, release threshold, trimming,
 * cudaMallocFromPoolAsync), pools the program creates and makes current, and stream capture. Run with CUDASIM_DEVICES=2 CUDASIM_MEM=1GiB
 * CUDASIM_CONTEXT_BYTES=0. */
#include "check.h"

#include <pthread.h>
#include <stdint.h>

#define GiB (1024ull * 1024 * 1024)
#define KiB 1024ull
#define MiB (1024ull * 1024)

static unsigned long long attr_u64(cudaMemPool_t pool, enum cudaMemPoolAttr attr)
{
    unsigned long long v = 0xdeadbeef;
    if (cudaMemPoolGetAttribute(pool, attr, &v) != cudaSuccess) return 0xdeadbeef;
    return v;
}

#define RESERVED(pool) attr_u64(pool, cudaMemPoolAttrReservedMemCurrent)
#define USED(pool) attr_u64(pool, cudaMemPoolAttrUsedMemCurrent)

static size_t free_bytes(void)
{
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) return 0;
    return f;
}

/* cudaMalloc on another thread (device 0); its result. */
static void *other_thread_malloc(void *arg)
{
    void *p = NULL;
    cudaError_t *err = (cudaError_t *)arg;
    *err = cudaMalloc(&p, 512);
    if (*err == cudaSuccess) cudaFree(p);
    return NULL;
}

static cudaError_t malloc_on_other_thread(void)
{
    pthread_t t;
    cudaError_t err = cudaErrorUnknown;
    if (pthread_create(&t, NULL, other_thread_malloc, &err) != 0) return cudaErrorUnknown;
    pthread_join(t, NULL);
    return err;
}

static int pools(void)
{
    cudaMemPool_t p0 = NULL, p0b = NULL, p1 = NULL;
    int iv = -1;
    unsigned long long v = 0;

    SECTION("cudaDeviceGetDefaultMemPool: one stable handle per device");
    OK(cudaDeviceGetDefaultMemPool(&p0, 0));
    OK(cudaDeviceGetDefaultMemPool(&p0b, 0));
    OK(cudaDeviceGetDefaultMemPool(&p1, 1));
    CHECK(p0 != NULL && p1 != NULL && p0 == p0b && p0 != p1, "%p %p %p", (void *)p0,
          (void *)p0b, (void *)p1);
    EXPECT(cudaDeviceGetDefaultMemPool(&p0b, 2), cudaErrorInvalidDevice);
    EXPECT(cudaDeviceGetDefaultMemPool(&p0b, -1), cudaErrorInvalidDevice);
    EXPECT(cudaDeviceGetDefaultMemPool(NULL, 0), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);

    SECTION("attributes: defaults and bad arguments");
    OK(cudaMemPoolGetAttribute(p0, cudaMemPoolReuseFollowEventDependencies, &iv));
    CHECK(iv == 1, "follow event dependencies %d", iv);
    OK(cudaMemPoolGetAttribute(p0, cudaMemPoolReuseAllowOpportunistic, &iv));
    CHECK(iv == 1, "opportunistic %d", iv);
    OK(cudaMemPoolGetAttribute(p0, cudaMemPoolReuseAllowInternalDependencies, &iv));
    CHECK(iv == 1, "internal dependencies %d", iv);
    CHECK(attr_u64(p0, cudaMemPoolAttrReleaseThreshold) == 0, "threshold");
    CHECK(RESERVED(p0) == 0 && USED(p0) == 0, "fresh pool");
    CHECK(attr_u64(p0, cudaMemPoolAttrReservedMemHigh) == 0, "reserved high");
    CHECK(attr_u64(p0, cudaMemPoolAttrUsedMemHigh) == 0, "used high");
    EXPECT(cudaMemPoolGetAttribute(p0, (enum cudaMemPoolAttr)0, &v), cudaErrorInvalidValue);
    EXPECT(cudaMemPoolGetAttribute(p0, (enum cudaMemPoolAttr)9, &v), cudaErrorInvalidValue);
    EXPECT(cudaMemPoolGetAttribute(p0, cudaMemPoolAttrUsedMemCurrent, NULL),
           cudaErrorInvalidValue);
    EXPECT(cudaMemPoolGetAttribute((cudaMemPool_t)&v, cudaMemPoolAttrUsedMemCurrent, &v),
           cudaErrorInvalidValue);
    EXPECT(cudaMemPoolGetAttribute(NULL, cudaMemPoolAttrUsedMemCurrent, &v),
           cudaErrorInvalidValue);
    v = 0;
    EXPECT(cudaMemPoolSetAttribute(p0, cudaMemPoolAttrReservedMemCurrent, &v),
           cudaErrorInvalidValue);
    EXPECT(cudaMemPoolSetAttribute(p0, cudaMemPoolAttrUsedMemCurrent, &v),
           cudaErrorInvalidValue);
    v = 1;
    EXPECT(cudaMemPoolSetAttribute(p0, cudaMemPoolAttrReservedMemHigh, &v),
           cudaErrorInvalidValue);
    EXPECT(cudaMemPoolSetAttribute(p0, cudaMemPoolAttrUsedMemHigh, &v), cudaErrorInvalidValue);
    EXPECT(cudaMemPoolSetAttribute((cudaMemPool_t)&v, cudaMemPoolAttrReleaseThreshold, &v),
           cudaErrorInvalidValue);
    EXPECT(cudaMemPoolTrimTo((cudaMemPool_t)&v, 0), cudaErrorInvalidValue);
    iv = 0;
    OK(cudaMemPoolSetAttribute(p0, cudaMemPoolReuseAllowOpportunistic, &iv));
    iv = -1;
    OK(cudaMemPoolGetAttribute(p0, cudaMemPoolReuseAllowOpportunistic, &iv));
    CHECK(iv == 0, "opportunistic after set %d", iv);
    iv = 1;
    OK(cudaMemPoolSetAttribute(p0, cudaMemPoolReuseAllowOpportunistic, &iv));

    SECTION("cudaMemPoolSetAccess: devices, flags and bad arguments");
    {
        struct cudaMemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location.type = cudaMemLocationTypeDevice;
        access.location.id = 1;
        access.flags = cudaMemAccessFlagsProtReadWrite;
        OK(cudaMemPoolSetAccess(p0, &access, 1));
        access.flags = cudaMemAccessFlagsProtNone;
        OK(cudaMemPoolSetAccess(p0, &access, 1));
        EXPECT(cudaMemPoolSetAccess(p0, NULL, 1), cudaErrorInvalidValue);
        EXPECT(cudaMemPoolSetAccess(p0, &access, 0), cudaErrorInvalidValue);
        EXPECT(cudaMemPoolSetAccess((cudaMemPool_t)&v, &access, 1), cudaErrorInvalidValue);
        access.flags = (enum cudaMemAccessFlags)2;
        EXPECT(cudaMemPoolSetAccess(p0, &access, 1), cudaErrorInvalidValue);
        access.flags = cudaMemAccessFlagsProtRead;
        access.location.type = cudaMemLocationTypeHost;
        EXPECT(cudaMemPoolSetAccess(p0, &access, 1), cudaErrorInvalidValue);
        access.location.type = cudaMemLocationTypeDevice;
        access.location.id = 2;
        EXPECT(cudaMemPoolSetAccess(p0, &access, 1), cudaErrorInvalidDevice);
        EXPECT(cudaGetLastError(), cudaErrorInvalidDevice);
    }
    return 0;
}

static int stream_ordered(void)
{
    cudaMemPool_t p0 = NULL, p1 = NULL;
    cudaStream_t s = NULL;
    void *a = NULL, *b = NULL, *c = NULL;
    unsigned long long v = 0;
    cudasimStats st;
    struct cudaPointerAttributes pa;

    OK(cudaDeviceGetDefaultMemPool(&p0, 0));
    OK(cudaDeviceGetDefaultMemPool(&p1, 1));
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudasimResetStats();

    SECTION("cudaMallocAsync uses the default pool; the free keeps it until a synchronization");
    OK(cudaMallocAsync(&a, 1000, s));
    CHECK(USED(p0) == 1024 && RESERVED(p0) == 1024, "used %llu reserved %llu", USED(p0),
          RESERVED(p0));
    st = stats_of(0);
    CHECK(st.async_mallocs == 1 && st.malloc_calls == 1 && st.captured_mallocs == 0,
          "async %llu malloc %llu captured %llu", st.async_mallocs, st.malloc_calls,
          st.captured_mallocs);
    CHECK(st.pool_used_bytes == 1024 && st.pool_reserved_bytes == 1024, "stats %llu %llu",
          st.pool_used_bytes, st.pool_reserved_bytes);
    CHECK(free_bytes() == GiB - 1024, "free %zu", free_bytes());
    OK(cudasim_launch_fill(a, 1000, 30000, 5, s));
    OK(cudaFreeAsync(a, s));
    CHECK(USED(p0) == 1024, "used %llu while the kernel runs", USED(p0));
    OK(cudaMallocAsync(&b, 0, s));
    CHECK(b == NULL && USED(p0) == 1024, "size 0");
    OK(cudaMallocAsync(&b, 512, NULL)); /* the legacy stream: the current device's pool */
    CHECK(USED(p0) == 1536, "used %llu", USED(p0));
    OK(cudaFreeAsync(b, NULL));
    OK(cudaStreamQuery(NULL)); /* the legacy stream does not wait for a non-blocking one */
    CHECK(USED(p0) == 1024 && RESERVED(p0) == 1536, "legacy free reached: %llu %llu",
          USED(p0), RESERVED(p0));
    CHECK(free_bytes() == GiB - 1536, "kept bytes count against the device: free %zu",
          free_bytes());
    OK(cudaStreamSynchronize(s));
    CHECK(USED(p0) == 0 && RESERVED(p0) == 0, "after sync: used %llu reserved %llu", USED(p0),
          RESERVED(p0));
    CHECK(free_bytes() == GiB, "free %zu", free_bytes());
    CHECK(attr_u64(p0, cudaMemPoolAttrUsedMemHigh) == 1536, "used high %llu",
          attr_u64(p0, cudaMemPoolAttrUsedMemHigh));
    CHECK(attr_u64(p0, cudaMemPoolAttrReservedMemHigh) == 1536, "reserved high");

    SECTION("the release threshold keeps freed memory; later allocations reuse it");
    v = 1 * MiB;
    OK(cudaMemPoolSetAttribute(p0, cudaMemPoolAttrReleaseThreshold, &v));
    CHECK(attr_u64(p0, cudaMemPoolAttrReleaseThreshold) == MiB, "threshold");
    OK(cudaMallocAsync(&a, 512 * KiB, s));
    OK(cudaMallocAsync(&b, 1 * MiB, s));
    OK(cudaFreeAsync(a, s));
    OK(cudaFreeAsync(b, s));
    OK(cudaStreamSynchronize(s));
    CHECK(USED(p0) == 0 && RESERVED(p0) == MiB, "kept to the threshold: %llu %llu", USED(p0),
          RESERVED(p0));
    CHECK(free_bytes() == GiB - MiB, "free %zu", free_bytes());
    OK(cudaMallocAsync(&a, 256 * KiB, s));
    CHECK(USED(p0) == 256 * KiB && RESERVED(p0) == MiB, "reused: %llu %llu", USED(p0),
          RESERVED(p0));
    CHECK(free_bytes() == GiB - MiB, "reuse takes nothing new: free %zu", free_bytes());
    OK(cudaMallocAsync(&b, 1 * MiB, s));
    CHECK(USED(p0) == 1280 * KiB && RESERVED(p0) == 1280 * KiB, "grew: %llu %llu", USED(p0),
          RESERVED(p0));
    CHECK(free_bytes() == GiB - 1280 * KiB, "free %zu", free_bytes());
    OK(cudaFreeAsync(a, s));
    OK(cudaFreeAsync(b, s));
    OK(cudaDeviceSynchronize());
    CHECK(RESERVED(p0) == MiB, "device sync trims to the threshold: %llu", RESERVED(p0));

    SECTION("cudaMemPoolTrimTo releases kept memory");
    OK(cudaMemPoolTrimTo(p0, 512 * KiB));
    CHECK(RESERVED(p0) == 512 * KiB, "trimmed to 512 KiB: %llu", RESERVED(p0));
    CHECK(free_bytes() == GiB - 512 * KiB, "free %zu", free_bytes());
    OK(cudaMemPoolTrimTo(p0, 0));
    CHECK(RESERVED(p0) == 0 && free_bytes() == GiB, "trimmed to 0: %llu, free %zu",
          RESERVED(p0), free_bytes());
    OK(cudaMallocAsync(&a, 4096, s));
    OK(cudaMemPoolTrimTo(p0, 0));
    CHECK(USED(p0) == 4096 && RESERVED(p0) == 4096, "used bytes are not trimmed");

    SECTION("high-water marks reset to the current value");
    CHECK(attr_u64(p0, cudaMemPoolAttrReservedMemHigh) == 1536 * KiB, "reserved high %llu",
          attr_u64(p0, cudaMemPoolAttrReservedMemHigh));
    CHECK(attr_u64(p0, cudaMemPoolAttrUsedMemHigh) == 1536 * KiB, "used high %llu",
          attr_u64(p0, cudaMemPoolAttrUsedMemHigh));
    v = 0;
    OK(cudaMemPoolSetAttribute(p0, cudaMemPoolAttrReservedMemHigh, &v));
    OK(cudaMemPoolSetAttribute(p0, cudaMemPoolAttrUsedMemHigh, &v));
    CHECK(attr_u64(p0, cudaMemPoolAttrReservedMemHigh) == 4096, "reserved high reset");
    CHECK(attr_u64(p0, cudaMemPoolAttrUsedMemHigh) == 4096, "used high reset");
    OK(cudaFree(a)); /* a synchronous free of a pool allocation gives it to the pool */
    CHECK(USED(p0) == 0 && RESERVED(p0) == 4096, "kept after cudaFree: %llu", RESERVED(p0));
    OK(cudaMemPoolTrimTo(p0, 0));
    v = 0;
    OK(cudaMemPoolSetAttribute(p0, cudaMemPoolAttrReleaseThreshold, &v));

    SECTION("cudaMallocFromPoolAsync: from another device's pool; the NULL stream on device 1");
    OK(cudaMallocFromPoolAsync(&c, 2048, p1, s));
    CHECK(USED(p1) == 2048 && USED(p0) == 0, "p1 %llu p0 %llu", USED(p1), USED(p0));
    OK(cudaPointerGetAttributes(&pa, c));
    CHECK(pa.type == cudaMemoryTypeDevice && pa.device == 1, "type %d device %d", pa.type,
          pa.device);
    CHECK(stats_of(1).async_mallocs == 1 && stats_of(1).pool_used_bytes == 2048, "stats(1)");
    EXPECT(cudaMallocFromPoolAsync(&a, 64, (cudaMemPool_t)&v, s), cudaErrorInvalidValue);
    EXPECT(cudaMallocFromPoolAsync(NULL, 64, p0, s), cudaErrorInvalidValue);
    EXPECT(cudaMallocFromPoolAsync(&a, 64, p0, (cudaStream_t)&v), cudaErrorInvalidResourceHandle);
    EXPECT(cudaMallocFromPoolAsync(&a, 2 * GiB, p0, s), cudaErrorMemoryAllocation);
    OK(cudaFreeAsync(c, s));
    OK(cudaSetDevice(1));
    OK(cudaMallocAsync(&c, 512, 0));
    CHECK(USED(p1) == 512 && RESERVED(p1) == 2048, "legacy stream of device 1: %llu %llu",
          USED(p1), RESERVED(p1));
    OK(cudaFreeAsync(c, 0));
    OK(cudaStreamSynchronize(s));
    OK(cudaDeviceSynchronize());
    CHECK(USED(p1) == 0 && RESERVED(p1) == 0, "device 1 pool %llu %llu", USED(p1),
          RESERVED(p1));
    OK(cudaSetDevice(0));

    SECTION("cudaDeviceReset drops the pool, keeps its handle");
    v = 1 * GiB;
    OK(cudaMemPoolSetAttribute(p0, cudaMemPoolAttrReleaseThreshold, &v));
    OK(cudaMallocAsync(&a, 8192, s));
    OK(cudaFreeAsync(a, s));
    OK(cudaStreamSynchronize(s));
    CHECK(RESERVED(p0) == 8192, "kept %llu", RESERVED(p0));
    OK(cudaDeviceReset());
    {
        cudaMemPool_t again = NULL;
        OK(cudaDeviceGetDefaultMemPool(&again, 0));
        CHECK(again == p0, "handle changed");
    }
    CHECK(RESERVED(p0) == 0 && attr_u64(p0, cudaMemPoolAttrReleaseThreshold) == 0,
          "reset pool: %llu", RESERVED(p0));
    CHECK(free_bytes() == GiB, "free %zu", free_bytes());
    return 0;
}

static unsigned long long mallocs_of(cudaMemPool_t pool)
{
    unsigned long long n = 0xdeadbeef;
    if (cudasimGetPoolMallocs(pool, &n) != 0) return 0xdeadbeef;
    return n;
}

static struct cudaMemPoolProps device_props(int device)
{
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    return props;
}

static int created_pools(void)
{
    cudaMemPool_t p0 = NULL, p1 = NULL, mine = NULL, other = NULL, cur = NULL, ipc = NULL;
    struct cudaMemPoolProps props = device_props(0);
    cudaStream_t s = NULL;
    void *a = NULL, *b = NULL, *c = NULL;
    unsigned long long v = 0, n = 0;

    OK(cudaDeviceGetDefaultMemPool(&p0, 0));
    OK(cudaDeviceGetDefaultMemPool(&p1, 1));
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudasimResetStats();

    SECTION("cudaMemPoolCreate: checked properties");
    CHECK(sizeof(struct cudaMemPoolProps) == 88, "props are %zu bytes",
          sizeof(struct cudaMemPoolProps));
    EXPECT(cudaMemPoolCreate(NULL, &props), cudaErrorInvalidValue);
    EXPECT(cudaMemPoolCreate(&mine, NULL), cudaErrorInvalidValue);
    props.allocType = cudaMemAllocationTypeInvalid;
    EXPECT(cudaMemPoolCreate(&mine, &props), cudaErrorInvalidValue);
    props = device_props(2);
    EXPECT(cudaMemPoolCreate(&mine, &props), cudaErrorInvalidValue);
    props = device_props(0);
    props.location.type = cudaMemLocationTypeHost;
    EXPECT(cudaMemPoolCreate(&mine, &props), cudaErrorNotSupported);
    props = device_props(0);
    props.handleTypes = cudaMemHandleTypeFabric;
    EXPECT(cudaMemPoolCreate(&mine, &props), cudaErrorNotSupported);
    props = device_props(0);
    props.reserved[3] = 1;
    EXPECT(cudaMemPoolCreate(&mine, &props), cudaErrorInvalidValue);
    CHECK(mine == NULL, "a refused create wrote %p", (void *)mine);
    props = device_props(0);
    OK(cudaMemPoolCreate(&mine, &props));
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    OK(cudaMemPoolCreate(&ipc, &props));
    props = device_props(1);
    OK(cudaMemPoolCreate(&other, &props));
    CHECK(mine && ipc && other && mine != p0 && mine != ipc && other != p1, "handles %p %p %p",
          (void *)mine, (void *)ipc, (void *)other);

    SECTION("cudaDeviceGetMemPool/SetMemPool: the default at first; a pool of that device only");
    OK(cudaDeviceGetMemPool(&cur, 0));
    CHECK(cur == p0, "current %p, default %p", (void *)cur, (void *)p0);
    EXPECT(cudaDeviceGetMemPool(NULL, 0), cudaErrorInvalidValue);
    EXPECT(cudaDeviceGetMemPool(&cur, 2), cudaErrorInvalidDevice);
    EXPECT(cudaDeviceSetMemPool(0, other), cudaErrorInvalidValue);
    EXPECT(cudaDeviceSetMemPool(0, (cudaMemPool_t)&v), cudaErrorInvalidValue);
    EXPECT(cudaDeviceSetMemPool(0, NULL), cudaErrorInvalidValue);
    EXPECT(cudaDeviceSetMemPool(2, mine), cudaErrorInvalidDevice);
    OK(cudaDeviceGetMemPool(&cur, 0));
    CHECK(cur == p0, "a refused set changed the current pool");
    OK(cudaDeviceSetMemPool(0, mine));
    OK(cudaDeviceGetMemPool(&cur, 0));
    CHECK(cur == mine, "current %p", (void *)cur);

    SECTION("cudaMallocAsync allocates from the current pool, counted per pool");
    OK(cudaMallocAsync(&a, 1000, s));
    CHECK(USED(mine) == 1024 && USED(p0) == 0, "mine %llu default %llu", USED(mine), USED(p0));
    CHECK(mallocs_of(mine) == 1 && mallocs_of(p0) == 0, "mallocs %llu %llu", mallocs_of(mine),
          mallocs_of(p0));
    CHECK(stats_of(0).pool_used_bytes == 0, "the stats' pool is the default one");
    OK(cudaMallocFromPoolAsync(&b, 512, p0, s));
    CHECK(mallocs_of(p0) == 1 && USED(p0) == 512, "from the default pool by name");
    v = 1 * MiB;
    OK(cudaMemPoolSetAttribute(mine, cudaMemPoolAttrReleaseThreshold, &v));
    OK(cudaFreeAsync(a, s));
    OK(cudaFreeAsync(b, s));
    OK(cudaStreamSynchronize(s));
    CHECK(USED(mine) == 0 && RESERVED(mine) == 1024 && RESERVED(p0) == 0,
          "mine keeps to its threshold: %llu, the default releases: %llu", RESERVED(mine),
          RESERVED(p0));
    CHECK(free_bytes() == GiB - 1024, "kept bytes of a created pool count: free %zu",
          free_bytes());
    OK(cudaMemPoolTrimTo(mine, 0));
    CHECK(RESERVED(mine) == 0 && free_bytes() == GiB, "trimmed: %llu", RESERVED(mine));
    EXPECT(cudasimGetPoolMallocs((cudaMemPool_t)&v, &n), cudaErrorInvalidValue);
    EXPECT(cudasimGetPoolMallocs(mine, NULL), cudaErrorInvalidValue);

    SECTION("the default pool set back is current again; destroy of the current pool too");
    OK(cudaDeviceSetMemPool(0, p0));
    OK(cudaMallocAsync(&a, 512, s));
    CHECK(mallocs_of(p0) == 2 && mallocs_of(mine) == 1, "mallocs %llu %llu", mallocs_of(p0),
          mallocs_of(mine));
    OK(cudaFreeAsync(a, s));
    OK(cudaDeviceSetMemPool(0, mine));
    OK(cudaMallocAsync(&c, 4096, s));
    EXPECT(cudaMemPoolDestroy(p0), cudaErrorInvalidValue);
    EXPECT(cudaMemPoolDestroy(NULL), cudaErrorInvalidValue);
    OK(cudaMemPoolDestroy(mine));
    OK(cudaDeviceGetMemPool(&cur, 0));
    CHECK(cur == p0, "destroying the current pool makes the default current: %p", (void *)cur);
    EXPECT(cudaMemPoolDestroy(mine), cudaErrorInvalidValue);
    EXPECT(cudaMemPoolGetAttribute(mine, cudaMemPoolAttrUsedMemCurrent, &v),
           cudaErrorInvalidValue);
    EXPECT(cudaDeviceSetMemPool(0, mine), cudaErrorInvalidValue);
    OK(cudasim_launch_fill(c, 4096, 0, 3, s));
    OK(cudaFreeAsync(c, s)); /* an allocation outlives its destroyed pool */
    OK(cudaStreamSynchronize(s));
    CHECK(free_bytes() == GiB, "free %zu", free_bytes());

    SECTION("cudaDeviceReset destroys the device's created pools; the default is current");
    OK(cudaDeviceSetMemPool(0, ipc));
    OK(cudaDeviceReset());
    OK(cudaDeviceGetMemPool(&cur, 0));
    CHECK(cur == p0, "current after reset %p", (void *)cur);
    EXPECT(cudaDeviceSetMemPool(0, ipc), cudaErrorInvalidValue);
    OK(cudaDeviceSetMemPool(1, other));
    OK(cudaDeviceSetMemPool(1, p1));
    OK(cudaMemPoolDestroy(other));
    CHECK(stats_of(0).live_allocations == 0, "live %llu", stats_of(0).live_allocations);
    return 0;
}

static int capture(void)
{
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaMemPool_t p0 = NULL;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusInvalidated;
    void *a = NULL, *m = NULL;
    cudasimStats before, after;

    OK(cudaDeviceGetDefaultMemPool(&p0, 0));
    OK(cudaStreamCreate(&s));

    SECTION("stream capture: status, errors");
    OK(cudaStreamIsCapturing(s, &cs));
    CHECK(cs == cudaStreamCaptureStatusNone, "status %d", cs);
    EXPECT(cudaStreamBeginCapture(s, (enum cudaStreamCaptureMode)3), cudaErrorInvalidValue);
    EXPECT(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal),
           cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeRelaxed),
           cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamBeginCapture((cudaStream_t)&cs, cudaStreamCaptureModeGlobal),
           cudaErrorInvalidResourceHandle);
    EXPECT(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    OK(cudaStreamIsCapturing(s, &cs));
    CHECK(cs == cudaStreamCaptureStatusActive, "status %d", cs);
    /* s is a blocking stream: the legacy stream cannot be asked, and the query invalidates
     * nothing. */
    EXPECT(cudaStreamIsCapturing(0, &cs), cudaErrorStreamCaptureImplicit);
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);

    SECTION("a cudaMallocAsync during capture belongs to the graph and is counted");
    before = stats_of(0);
    OK(cudaMallocAsync(&a, 4096, s));
    CHECK(a != NULL, "NULL");
    after = stats_of(0);
    CHECK(after.captured_mallocs == before.captured_mallocs + 1 &&
              after.async_mallocs == before.async_mallocs + 1,
          "captured %llu async %llu", after.captured_mallocs, after.async_mallocs);
    CHECK(USED(p0) == 0, "a graph allocation is not the default pool's: %llu", USED(p0));
    OK(cudasim_launch_fill(a, 4096, 0, 1, s));
    OK(cudaFreeAsync(a, s));

    EXPECT(cudaStreamEndCapture(s, NULL), cudaErrorInvalidValue);
    OK(cudaStreamEndCapture(s, &g));
    CHECK(g != NULL, "graph NULL");
    OK(cudaStreamIsCapturing(s, &cs));
    CHECK(cs == cudaStreamCaptureStatusNone, "status after end %d", cs);
    EXPECT(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);
    OK(cudaMalloc(&m, 512));
    OK(cudaFree(m));
    OK(cudaGraphDestroy(g));
    EXPECT(cudaGraphDestroy(g), cudaErrorInvalidResourceHandle);
    EXPECT(cudaGraphDestroy(NULL), cudaErrorInvalidValue);

    SECTION("global mode: cudaMalloc on any thread is refused and invalidates the capture");
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    EXPECT(cudaMalloc(&m, 512), cudaErrorStreamCaptureUnsupported);
    EXPECT(malloc_on_other_thread(), cudaErrorStreamCaptureUnsupported);
    CHECK(stats_of(0).malloc_failures == after.malloc_failures + 2, "failures");
    OK(cudaStreamIsCapturing(s, &cs));
    CHECK(cs == cudaStreamCaptureStatusInvalidated, "status %d", cs);
    g = (cudaGraph_t)0x1;
    EXPECT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    CHECK(g == NULL, "a graph from an invalidated capture");
    EXPECT(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);

    SECTION("a device synchronization, and the legacy stream with a blocking stream captured");
    cudaEvent_t e = NULL;
    OK(cudaEventCreate(&e));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    EXPECT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaEventRecord(e, 0), cudaErrorStreamCaptureImplicit);
    EXPECT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    EXPECT(cudaStreamWaitEvent(0, e, 0), cudaErrorStreamCaptureImplicit);
    EXPECT(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    /* A non-blocking stream's capture leaves the legacy stream usable. */
    cudaStream_t nb = NULL;
    OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    OK(cudaStreamBeginCapture(nb, cudaStreamCaptureModeRelaxed));
    OK(cudaEventRecord(e, 0));
    OK(cudaStreamWaitEvent(0, e, 0));
    OK(cudaStreamIsCapturing(0, &cs));
    CHECK(cs == cudaStreamCaptureStatusNone, "legacy status %d", cs);
    OK(cudaStreamEndCapture(nb, &g));
    OK(cudaGraphDestroy(g));
    OK(cudaStreamDestroy(nb));
    OK(cudaEventDestroy(e));

    SECTION("thread-local mode: only the capturing thread; relaxed: none");
    OK(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
    OK(cudaStreamIsCapturing(cudaStreamPerThread, &cs));
    CHECK(cs == cudaStreamCaptureStatusActive, "per-thread status %d", cs);
    EXPECT(cudaMalloc(&m, 512), cudaErrorStreamCaptureUnsupported);
    OK(malloc_on_other_thread());
    EXPECT(cudaStreamEndCapture(cudaStreamPerThread, &g), cudaErrorStreamCaptureInvalidated);
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    OK(cudaMalloc(&m, 512));
    OK(cudaFree(m));
    OK(cudaStreamEndCapture(s, &g));
    OK(cudaGraphDestroy(g));
    OK(cudaStreamSynchronize(s));
    OK(cudaStreamDestroy(s));
    CHECK(stats_of(0).live_allocations == 0, "live %llu", stats_of(0).live_allocations);
    return 0;
}

static int faults(void)
{
    cudaMemPool_t p0 = (cudaMemPool_t)0x1;
    unsigned long long v = 77;
    cudaStream_t s = NULL;

    SECTION("fault injection in the new functions");
    OK(cudasimFailNext("cudaDeviceGetDefaultMemPool", 1, cudaErrorUnknown));
    EXPECT(cudaDeviceGetDefaultMemPool(&p0, 0), cudaErrorUnknown);
    CHECK(p0 == (cudaMemPool_t)0x1, "out-pointer written");
    OK(cudaDeviceGetDefaultMemPool(&p0, 0));
    OK(cudasimFailNext("cudaMemPoolGetAttribute", 2, cudaErrorInitializationError));
    OK(cudaMemPoolGetAttribute(p0, cudaMemPoolAttrUsedMemCurrent, &v));
    v = 77;
    EXPECT(cudaMemPoolGetAttribute(p0, cudaMemPoolAttrUsedMemCurrent, &v),
           cudaErrorInitializationError);
    CHECK(v == 77, "value written");
    OK(cudaStreamCreate(&s));
    OK(cudasimFailNext("cudaStreamBeginCapture", 1, cudaErrorUnknown));
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaErrorUnknown);
    {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusInvalidated;
        OK(cudaStreamIsCapturing(s, &cs));
        CHECK(cs == cudaStreamCaptureStatusNone, "an injected failure began a capture");
    }
    OK(cudaStreamDestroy(s));
    CHECK(strcmp(cudaGetErrorName(cudaErrorStreamCaptureUnsupported),
                 "cudaErrorStreamCaptureUnsupported") == 0,
          "name of 900");
    CHECK(strcmp(cudaGetErrorName(cudaErrorIllegalState), "cudaErrorIllegalState") == 0,
          "name of 401");
    return 0;
}

int main(void)
{
    if (pools() || stream_ordered() || created_pools() || capture() || faults()) return 1;
    printf("sim_mempool: all checks passed\n");
    return 0;
}
