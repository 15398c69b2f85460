/* cudasim: allocations, accounting, return codes, copies, pointer queries, handles, reset.
 * Run with CUDASIM_MEM=1GiB CUDASIM_CONTEXT_BYTES=100MiB (one device). */
#include "check.h"

#include <stdint.h>

#define GiB (1024ull * 1024 * 1024)
#define MiB (1024ull * 1024)

int main(void)
{
    size_t free_b = 0, total_b = 0;
    void *p = NULL, *q = NULL;
    int n = -1;
    cudasimStats st;

    SECTION("versions and devices");
    OK(cudaDriverGetVersion(&n));
    CHECK(n == 12080, "driver %d", n);
    OK(cudaRuntimeGetVersion(&n));
    CHECK(n == 12080, "runtime %d", n);
    OK(cudaGetDeviceCount(&n));
    CHECK(n == 1, "count %d", n);
    OK(cudaGetDevice(&n));
    CHECK(n == 0, "device %d", n);
    EXPECT(cudaGetDevice(NULL), cudaErrorInvalidValue);
    EXPECT(cudaSetDevice(1), cudaErrorInvalidDevice);
    EXPECT(cudaSetDevice(-1), cudaErrorInvalidDevice);
    OK(cudaSetDevice(0));

    SECTION("capacity and context bytes");
    st = stats_of(0);
    CHECK(st.live_bytes == 0 && st.malloc_calls == 0, "fresh stats");
    OK(cudaMemGetInfo(&free_b, &total_b));
    CHECK(total_b == GiB, "total %zu", total_b);
    CHECK(free_b == GiB - 100 * MiB, "free %zu (context not taken)", free_b);
    EXPECT(cudaMemGetInfo(NULL, &total_b), cudaErrorInvalidValue);

    SECTION("last error");
    (void)cudaGetLastError();
    EXPECT(cudaMalloc(NULL, 16), cudaErrorInvalidValue);
    EXPECT(cudaPeekAtLastError(), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    EXPECT(cudaGetLastError(), cudaSuccess);
    CHECK(strcmp(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation") == 0,
          "name");
    CHECK(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0, "string");
    CHECK(strcmp(cudaGetErrorString((cudaError_t)12345), "unrecognized error code") == 0, "?");

    SECTION("cudaMalloc / cudaFree return codes and accounting");
    p = (void *)0x1;
    OK(cudaMalloc(&p, 0));
    CHECK(p == NULL, "cudaMalloc(&p, 0) gave %p", p);
    OK(cudaMalloc(&p, 1000));
    CHECK(p != NULL, "NULL");
    memset(p, 7, 1000); /* device pointers are host pointers */
    st = stats_of(0);
    CHECK(st.live_allocations == 1 && st.live_bytes == 1024, "live %llu/%llu",
          st.live_allocations, st.live_bytes);
    OK(cudaMemGetInfo(&free_b, &total_b));
    CHECK(free_b == GiB - 100 * MiB - 1024, "free %zu", free_b);
    EXPECT(cudaFree((char *)p + 8), cudaErrorInvalidValue);
    EXPECT(cudaFree(&n), cudaErrorInvalidValue);
    OK(cudaFree(NULL));
    OK(cudaFree(p));
    EXPECT(cudaFree(p), cudaErrorInvalidValue);
    st = stats_of(0);
    CHECK(st.live_allocations == 0 && st.live_bytes == 0, "live after free");
    CHECK(st.malloc_calls == 3 && st.malloc_failures == 1, "malloc calls %llu failures %llu",
          st.malloc_calls, st.malloc_failures);
    CHECK(st.free_calls == 4, "free calls %llu", st.free_calls);
    CHECK(st.peak_live_bytes == 1024, "peak %llu", st.peak_live_bytes);

    SECTION("capacity exhaustion");
    EXPECT(cudaMalloc(&q, GiB), cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
    EXPECT(cudaMalloc(&q, (size_t)-1), cudaErrorMemoryAllocation);
    OK(cudaMemGetInfo(&free_b, &total_b));
    OK(cudaMalloc(&q, free_b)); /* exactly what is left */
    EXPECT(cudaMalloc(&p, 1), cudaErrorMemoryAllocation);
    OK(cudaMemGetInfo(&free_b, &total_b));
    CHECK(free_b == 0, "free %zu", free_b);
    OK(cudaFree(q));
    OK(cudaMalloc(&p, 1));
    OK(cudaFree(p));

    SECTION("pitch, managed, host memory");
    {
        size_t pitch = 0;
        void *h = NULL, *m = NULL;
        st = stats_of(0);
        OK(cudaMallocPitch(&p, &pitch, 100, 3));
        CHECK(pitch == 512, "pitch %zu", pitch);
        EXPECT(cudaMallocPitch(&p, NULL, 100, 3), cudaErrorInvalidValue);
        EXPECT(cudaMallocManaged(&m, 64, 0), cudaErrorInvalidValue);
        OK(cudaMallocManaged(&m, 64, cudaMemAttachGlobal));
        OK(cudaMallocHost(&h, 100));
        cudasimStats s2 = stats_of(0);
        CHECK(s2.live_bytes - st.live_bytes == 1536 + 512, "pitch+managed bytes %llu",
              s2.live_bytes - st.live_bytes);
        EXPECT(cudaFree(h), cudaErrorInvalidValue);
        EXPECT(cudaFreeHost(p), cudaErrorInvalidValue);

        struct cudaPointerAttributes a;
        OK(cudaPointerGetAttributes(&a, (char *)p + 700));
        CHECK(a.type == cudaMemoryTypeDevice && a.device == 0 &&
                  a.devicePointer == (char *)p + 700,
              "device attrs type %d", (int)a.type);
        OK(cudaPointerGetAttributes(&a, m));
        CHECK(a.type == cudaMemoryTypeManaged && a.devicePointer == m, "managed attrs");
        OK(cudaPointerGetAttributes(&a, h));
        CHECK(a.type == cudaMemoryTypeHost && a.hostPointer == h, "host attrs");
        OK(cudaPointerGetAttributes(&a, &n));
        CHECK(a.type == cudaMemoryTypeUnregistered, "stack attrs type %d", (int)a.type);
        EXPECT(cudaPointerGetAttributes(NULL, p), cudaErrorInvalidValue);

        cudaIpcMemHandle_t ipc;
        uint64_t base = 0;
        int dev = -1;
        OK(cudaIpcGetMemHandle(&ipc, (char *)p + 700));
        memcpy(&base, ipc.reserved, 8);
        memcpy(&dev, ipc.reserved + 8, 4);
        CHECK(base == (uint64_t)(uintptr_t)p && dev == 0, "ipc base %llx dev %d",
              (unsigned long long)base, dev);
        EXPECT(cudaIpcGetMemHandle(&ipc, &n), cudaErrorInvalidValue);
        EXPECT(cudaIpcGetMemHandle(NULL, p), cudaErrorInvalidValue);

        OK(cudaFreeHost(h));
        OK(cudaFree(m));
        OK(cudaFree(p));
    }

    SECTION("copies and sets");
    {
        char host[256], back[256];
        for (int i = 0; i < 256; i++) host[i] = (char)i;
        OK(cudaMalloc(&p, 256));
        OK(cudaMalloc(&q, 256));
        OK(cudaMemcpy(p, host, 256, cudaMemcpyHostToDevice));
        OK(cudaMemcpy(q, p, 256, cudaMemcpyDeviceToDevice));
        memset(back, 0, sizeof back);
        OK(cudaMemcpy(back, q, 256, cudaMemcpyDeviceToHost));
        CHECK(memcmp(host, back, 256) == 0, "round trip");
        OK(cudaMemset((char *)p + 10, 0x5a, 20));
        OK(cudaMemcpy(back, p, 256, cudaMemcpyDefault));
        CHECK(back[9] == 9 && back[10] == 0x5a && back[29] == 0x5a && back[30] == 30, "memset");
        OK(cudaMemsetAsync(p, 1, 256, 0));
        OK(cudaMemcpyAsync(back, p, 256, cudaMemcpyDeviceToHost, cudaStreamPerThread));
        CHECK(back[0] == 1 && back[255] == 1, "async");
        EXPECT(cudaMemcpy(back, host, 256, (enum cudaMemcpyKind)7), cudaErrorInvalidValue);
        EXPECT(cudaMemcpy(back, host, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
        EXPECT(cudaMemcpy(p, host, 257, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
        EXPECT(cudaMemset(host, 0, 16), cudaErrorInvalidValue);
        OK(cudaMemcpy(back, host, 0, cudaMemcpyDeviceToHost));
        OK(cudaFree(p));
        OK(cudaFree(q));
    }

    SECTION("stream and event handles");
    {
        cudaStream_t s = NULL;
        cudaEvent_t e = NULL, e2 = NULL;
        OK(cudaStreamCreate(&s));
        OK(cudaStreamQuery(s));
        OK(cudaStreamSynchronize(s));
        OK(cudaStreamDestroy(s));
        EXPECT(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
        EXPECT(cudaStreamSynchronize((cudaStream_t)&n), cudaErrorInvalidResourceHandle);
        EXPECT(cudaStreamDestroy(0), cudaErrorInvalidResourceHandle);
        EXPECT(cudaStreamCreateWithFlags(&s, 7), cudaErrorInvalidValue);
        EXPECT(cudaStreamCreate(NULL), cudaErrorInvalidValue);
        OK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, -1));
        OK(cudaEventCreate(&e));
        OK(cudaEventQuery(e)); /* never recorded */
        OK(cudaEventSynchronize(e));
        float ms = -1;
        EXPECT(cudaEventElapsedTime(&ms, e, e), cudaErrorInvalidResourceHandle);
        OK(cudaEventRecord(e, s));
        OK(cudaEventRecord(e, cudaStreamLegacy));
        OK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
        OK(cudaEventRecord(e2, s));
        EXPECT(cudaEventElapsedTime(&ms, e, e2), cudaErrorInvalidResourceHandle);
        EXPECT(cudaEventElapsedTime(NULL, e, e), cudaErrorInvalidValue);
        OK(cudaStreamWaitEvent(s, e, 0));
        EXPECT(cudaStreamWaitEvent(s, (cudaEvent_t)&n, 0), cudaErrorInvalidResourceHandle);
        EXPECT(cudaEventRecord((cudaEvent_t)s, 0), cudaErrorInvalidResourceHandle);
        OK(cudaEventDestroy(e));
        OK(cudaEventDestroy(e2));
        EXPECT(cudaEventDestroy(e), cudaErrorInvalidResourceHandle);
        OK(cudaStreamDestroy(s));
        st = stats_of(0);
        CHECK(st.event_records == 3 && st.stream_wait_events == 1 && st.stream_syncs == 1 &&
                  st.event_syncs == 1,
              "records %llu waits %llu", st.event_records, st.stream_wait_events);
    }

    SECTION("stream-ordered allocation");
    {
        cudaStream_t s = NULL;
        OK(cudaStreamCreate(&s));
        st = stats_of(0);
        OK(cudaMallocAsync(&p, 4096, s));
        EXPECT(cudaMallocAsync(&q, 16, (cudaStream_t)&n), cudaErrorInvalidResourceHandle);
        OK(cudaFreeAsync(p, s));
        EXPECT(cudaFree(p), cudaErrorInvalidValue); /* already being freed */
        OK(cudaStreamSynchronize(s));
        cudasimStats s2 = stats_of(0);
        CHECK(s2.live_allocations == st.live_allocations, "async free retired");
        OK(cudaFreeAsync(NULL, s));
        OK(cudaStreamDestroy(s));
    }

    SECTION("counters reset");
    cudasimResetStats();
    st = stats_of(0);
    CHECK(st.malloc_calls == 0 && st.free_calls == 0 && st.event_records == 0, "reset");
    {
        cudasimStats small;
        memset(&small, 0xee, sizeof small);
        small.struct_size = offsetof(cudasimStats, live_allocations);
        OK(cudasimGetStats(0, &small));
        CHECK(small.free_calls == 0 && small.live_allocations == 0xeeeeeeeeeeeeeeeeull,
              "struct_size honoured");
        EXPECT(cudasimGetStats(1, &small), cudaErrorInvalidDevice);
        EXPECT(cudasimGetStats(0, NULL), cudaErrorInvalidValue);
    }

    SECTION("cudaDeviceReset drops live bytes");
    {
        void *a = NULL, *b = NULL;
        cudaStream_t s = NULL;
        OK(cudaMalloc(&a, 1 * MiB));
        OK(cudaMalloc(&b, 3 * MiB));
        OK(cudaStreamCreate(&s));
        st = stats_of(0);
        CHECK(st.live_bytes == 4 * MiB && st.live_allocations == 2, "live %llu",
              st.live_bytes);
        OK(cudaDeviceReset());
        st = stats_of(0);
        CHECK(st.live_bytes == 0 && st.live_allocations == 0, "after reset %llu",
              st.live_bytes);
        CHECK(st.peak_live_bytes == 4 * MiB, "peak %llu", st.peak_live_bytes);
        EXPECT(cudaStreamQuery(s), cudaErrorInvalidResourceHandle);
        EXPECT(cudaFree(a), cudaErrorInvalidValue);
        OK(cudaMemGetInfo(&free_b, &total_b));
        CHECK(free_b == GiB - 100 * MiB, "free after reset %zu", free_b);
    }

    printf("sim_basic: all checks passed\n");
    return 0;
}
