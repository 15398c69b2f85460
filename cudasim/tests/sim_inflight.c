/* cudasim: the in-flight model. Streams and events ordering, simulated kernels writing at
 * completion, waits in cudaFree and cudaDeviceReset, cudasimRangeBusy. One device. */
#include "check.h"

#include <pthread.h>
#include <stdint.h>

#define SLACK_MS 3.0 /* timer granularity */

/* Another thread's view of cudaStreamPerThread: its own stream (id), not busy with the main
 * thread's kernel. */
static void *other_thread(void *arg)
{
    unsigned long long *id = arg;
    if (cudaStreamGetId(cudaStreamPerThread, id) != cudaSuccess)
        return (void *)1;
    if (cudaStreamQuery(cudaStreamPerThread) != cudaSuccess)
        return (void *)2;
    double t0 = now_ms();
    if (cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess || now_ms() - t0 > 40)
        return (void *)3;
    return NULL;
}

int main(void)
{
    unsigned char *a = NULL, *b = NULL, *c = NULL;
    unsigned char host[4096];
    cudaStream_t sb = NULL, snb = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL, e2 = NULL;
    double t0, dt;
    float ms = 0;
    cudasimStats st;

    OK(cudaMalloc((void **)&a, 4096));
    OK(cudaMalloc((void **)&b, 4096));
    OK(cudaMalloc((void **)&c, 4096));
    OK(cudaMemset(a, 0, 4096));
    OK(cudaStreamCreate(&sb));
    OK(cudaStreamCreateWithFlags(&snb, cudaStreamNonBlocking));
    OK(cudaEventCreate(&e0));
    OK(cudaEventCreate(&e1));
    OK(cudaEventCreateWithFlags(&e2, cudaEventBlockingSync));
    cudasimResetStats();

    SECTION("stream flags tell non-blocking streams apart");
    {
        unsigned int flags = 99;
        OK(cudaStreamGetFlags(snb, &flags));
        CHECK(flags == cudaStreamNonBlocking, "non-blocking flags %u", flags);
        OK(cudaStreamGetFlags(sb, &flags));
        CHECK(flags == 0, "blocking flags %u", flags);
        OK(cudaStreamGetFlags(0, &flags));
        CHECK(flags == 0, "legacy flags %u", flags);
        EXPECT(cudaStreamGetFlags(sb, NULL), cudaErrorInvalidValue);
        EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    }

    SECTION("stream ids are unique and never reused");
    {
        unsigned long long ib = 0, inb = 0, il = 0, il2 = 0, inew = 0;
        cudaStream_t s2;
        OK(cudaStreamGetId(sb, &ib));
        OK(cudaStreamGetId(snb, &inb));
        OK(cudaStreamGetId(0, &il));
        OK(cudaStreamGetId(cudaStreamLegacy, &il2));
        CHECK(ib != inb && ib != il && inb != il && il == il2, "ids %llu %llu %llu %llu", ib,
              inb, il, il2);
        OK(cudaStreamCreate(&s2));
        OK(cudaStreamDestroy(s2));
        OK(cudaStreamCreate(&s2));
        OK(cudaStreamGetId(s2, &inew));
        CHECK(inew != ib && inew != inb && inew != il, "a new stream reused id %llu", inew);
        OK(cudaStreamDestroy(s2));
        EXPECT(cudaStreamGetId(sb, NULL), cudaErrorInvalidValue);
        EXPECT(cudaGetLastError(), cudaErrorInvalidValue);
    }

    SECTION("a fill kernel writes its byte when it completes");
    t0 = now_ms();
    OK(cudasim_launch_fill(a, 4096, 150000, 0xab, sb));
    EXPECT(cudaStreamQuery(sb), cudaErrorNotReady);
    EXPECT(cudaGetLastError(), cudaSuccess); /* not-ready is not an error */
    CHECK(cudasimRangeBusy(a + 100, 1) == 1, "busy %zu", cudasimRangeBusy(a + 100, 1));
    CHECK(cudasimRangeBusy(a + 4096, 100) == 0, "adjacent range busy");
    CHECK(cudasimRangeBusy(b, 4096) == 0, "other buffer busy");
    CHECK(a[0] == 0 && a[4095] == 0, "written before completion");
    OK(cudaStreamSynchronize(sb));
    dt = now_ms() - t0;
    CHECK(dt >= 150 - SLACK_MS, "stream sync after %.1f ms", dt);
    OK(cudaStreamQuery(sb));
    CHECK(cudasimRangeBusy(a, 4096) == 0, "still busy");
    memset(host, 0, sizeof host);
    OK(cudaMemcpy(host, a, 4096, cudaMemcpyDeviceToHost));
    CHECK(host[0] == 0xab && host[4095] == 0xab, "fill not applied: %x", host[0]);
    st = stats_of(0);
    CHECK(st.kernels_launched == 1 && st.kernel_writes == 1 && st.stream_syncs == 1,
          "launched %llu writes %llu", st.kernels_launched, st.kernel_writes);

    SECTION("fill -1 writes nothing");
    OK(cudasim_launch_fill(a, 16, 0, -1, sb));
    OK(cudaStreamSynchronize(sb));
    CHECK(a[0] == 0xab, "written");
    CHECK(stats_of(0).kernel_writes == 1, "counted a write");

    SECTION("events: not ready, then ready after sync; elapsed time");
    OK(cudaEventRecord(e0, sb));
    OK(cudasim_launch_fill(b, 4096, 100000, 1, sb));
    OK(cudaEventRecord(e1, sb));
    EXPECT(cudaEventQuery(e1), cudaErrorNotReady);
    EXPECT(cudaEventElapsedTime(&ms, e0, e1), cudaErrorNotReady);
    t0 = now_ms();
    OK(cudaEventSynchronize(e1));
    dt = now_ms() - t0;
    CHECK(dt >= 100 - SLACK_MS - 5, "event sync after %.1f ms", dt);
    OK(cudaEventQuery(e1));
    OK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(ms >= 99.9f && ms < 150.0f, "elapsed %.3f ms", ms);
    CHECK(b[0] == 1, "fill");

    SECTION("the legacy stream waits for blocking streams");
    t0 = now_ms();
    OK(cudasim_launch_fill(b, 4096, 150000, 2, sb));
    OK(cudaMemset(c, 0, 16)); /* a legacy-stream operation the host waits for */
    dt = now_ms() - t0;
    CHECK(dt >= 150 - SLACK_MS, "memset returned after %.1f ms", dt);
    CHECK(b[0] == 2, "kernel write not applied by the wait");

    SECTION("blocking streams wait for the legacy stream");
    OK(cudasim_launch_fill(c, 16, 100000, 3, 0));
    OK(cudaEventRecord(e2, sb));
    EXPECT(cudaEventQuery(e2), cudaErrorNotReady);
    OK(cudaEventSynchronize(e2));
    CHECK(c[0] == 3, "legacy kernel write");

    SECTION("non-blocking streams escape the legacy stream");
    OK(cudasim_launch_fill(b, 4096, 200000, 4, snb));
    t0 = now_ms();
    OK(cudaMemset(c, 0, 16));
    dt = now_ms() - t0;
    CHECK(dt < 100, "memset waited %.1f ms for a non-blocking stream", dt);
    OK(cudaEventRecord(e2, 0));
    OK(cudaEventQuery(e2));
    CHECK(cudasimRangeBusy(b, 1) == 1, "kernel done too early");
    EXPECT(cudaStreamQuery(snb), cudaErrorNotReady);

    SECTION("cudaStreamWaitEvent orders streams");
    OK(cudaEventRecord(e1, snb));
    OK(cudaStreamWaitEvent(sb, e1, 0));
    OK(cudaEventRecord(e2, sb));
    EXPECT(cudaEventQuery(e2), cudaErrorNotReady);

    SECTION("cudaDeviceSynchronize waits for every stream");
    t0 = now_ms();
    OK(cudaDeviceSynchronize());
    dt = now_ms() - t0;
    CHECK(dt >= 150, "device sync after %.1f ms", dt);
    OK(cudaStreamQuery(snb));
    OK(cudaEventQuery(e2));
    CHECK(b[0] == 4, "non-blocking fill");
    CHECK(stats_of(0).device_syncs == 1, "device_syncs");

    SECTION("cudaStreamPerThread is a blocking stream");
    OK(cudasim_launch_fill(c, 16, 80000, 5, cudaStreamPerThread));
    EXPECT(cudaStreamQuery(cudaStreamPerThread), cudaErrorNotReady);
    t0 = now_ms();
    OK(cudaMemcpy(host, c, 16, cudaMemcpyDeviceToHost));
    dt = now_ms() - t0;
    CHECK(dt >= 80 - SLACK_MS && host[0] == 5, "memcpy after %.1f ms saw %d", dt, host[0]);

    SECTION("cudaStreamPerThread is each thread's own stream");
    {
        unsigned long long mine = 0, theirs = 0;
        pthread_t t;
        void *r = (void *)9;
        OK(cudasim_launch_fill(c, 16, 100000, 6, cudaStreamPerThread));
        OK(cudaStreamGetId(cudaStreamPerThread, &mine));
        CHECK(pthread_create(&t, NULL, other_thread, &theirs) == 0, "pthread_create");
        pthread_join(t, &r);
        CHECK(r == NULL, "the other thread's per-thread stream: step %d", (int)(intptr_t)r);
        CHECK(mine != 0 && theirs != 0 && mine != theirs, "ids %llu and %llu", mine, theirs);
        EXPECT(cudaStreamQuery(cudaStreamPerThread), cudaErrorNotReady);
        OK(cudaStreamSynchronize(cudaStreamPerThread));
        OK(cudaMemcpy(host, c, 16, cudaMemcpyDeviceToHost));
        CHECK(host[0] == 6, "per-thread fill");
    }

    SECTION("cudaFree waits for in-flight kernels (implicit sync)");
    st = stats_of(0);
    OK(cudaFree(c)); /* idle device: no wait */
    CHECK(stats_of(0).implicit_syncs == st.implicit_syncs, "idle free counted a wait");
    OK(cudaMalloc((void **)&c, 4096));
    OK(cudaEventRecord(e0, snb));
    OK(cudasim_launch_fill(a, 4096, 200000, 6, snb));
    OK(cudaEventRecord(e1, snb));
    t0 = now_ms();
    OK(cudaFree(c)); /* a different buffer: still waits for the device */
    dt = now_ms() - t0;
    CHECK(dt >= 200 - SLACK_MS, "cudaFree returned after %.1f ms", dt);
    OK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(ms >= 199.9f && (double)ms <= dt + SLACK_MS, "elapsed %.3f ms, free waited %.1f", ms,
          dt);
    CHECK(a[0] == 6, "kernel write before free returned");
    CHECK(stats_of(0).implicit_syncs == st.implicit_syncs + 1, "implicit_syncs");

    SECTION("cudaFreeAsync unmaps when the stream gets there");
    OK(cudaMalloc((void **)&c, 4096));
    st = stats_of(0);
    OK(cudasim_launch_fill(c, 4096, 100000, 7, sb));
    OK(cudaFreeAsync(c, sb));
    CHECK(stats_of(0).live_allocations == st.live_allocations, "freed before the stream");
    OK(cudaStreamSynchronize(sb));
    CHECK(stats_of(0).live_allocations == st.live_allocations - 1, "not freed");

    SECTION("launch errors");
    {
        void *args[4] = {0, 0, 0, 0};
        dim3 one = {1, 1, 1};
        EXPECT(cudaLaunchKernel((const void *)host, one, one, args, 0, 0),
               cudaErrorInvalidDeviceFunction);
        EXPECT(cudasim_launch_fill(host, 16, 0, 1, 0), cudaErrorInvalidValue);
        EXPECT(cudasim_launch_fill(a, 4097, 0, 1, 0), cudaErrorInvalidValue);
        EXPECT(cudasim_launch_fill(a, 16, 0, 1, (cudaStream_t)host), cudaErrorInvalidResourceHandle);
    }

    SECTION("a destroyed stream's work still runs, and device and legacy syncs wait for it");
    {
        cudaStream_t gone_nb, gone_b;
        OK(cudaStreamCreateWithFlags(&gone_nb, cudaStreamNonBlocking));
        OK(cudasim_launch_fill(a, 4096, 120000, 9, gone_nb));
        OK(cudaStreamDestroy(gone_nb));
        CHECK(cudasimRangeBusy(a, 4096) == 1, "the kernel stopped with its stream");
        t0 = now_ms();
        OK(cudaDeviceSynchronize());
        dt = now_ms() - t0;
        CHECK(dt >= 120 - SLACK_MS, "device sync returned after %.1f ms", dt);
        CHECK(cudasimRangeBusy(a, 4096) == 0 && a[0] == 9, "the kernel did not finish");
        OK(cudaStreamCreate(&gone_b));
        OK(cudasim_launch_fill(b, 4096, 120000, 10, gone_b));
        OK(cudaStreamDestroy(gone_b));
        t0 = now_ms();
        OK(cudaMemset(a + 2048, 0, 16)); /* legacy: after every blocking stream's work */
        dt = now_ms() - t0;
        CHECK(dt >= 120 - SLACK_MS, "legacy memset returned after %.1f ms", dt);
        CHECK(b[0] == 10, "the destroyed blocking stream's kernel did not finish first");
    }

    SECTION("cudaDeviceReset waits, then drops the device's work and memory");
    OK(cudasim_launch_fill(a, 4096, 100000, 8, snb));
    t0 = now_ms();
    OK(cudaDeviceReset());
    dt = now_ms() - t0;
    CHECK(dt >= 100 - SLACK_MS, "reset returned after %.1f ms", dt);
    st = stats_of(0);
    CHECK(st.live_allocations == 0 && st.live_bytes == 0, "live after reset");
    CHECK(st.kernel_writes >= 8, "writes %llu", st.kernel_writes);
    EXPECT(cudaStreamQuery(snb), cudaErrorInvalidResourceHandle);
    EXPECT(cudaEventQuery(e0), cudaErrorInvalidResourceHandle);

    printf("sim_inflight: all checks passed\n");
    return 0;
}
