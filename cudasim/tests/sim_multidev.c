/* cudasim: several devices (CUDASIM_DEVICES=2, CUDASIM_MEM=1GiB, CUDASIM_CONTEXT_BYTES=0) and
 * several threads: per-device accounting, per-thread current device, concurrent use. */
#include "check.h"

#include <pthread.h>
#include <stdint.h>

#define THREADS 4
#define ROUNDS 200

static void *worker(void *arg)
{
    int device = (int)(intptr_t)arg % 2, current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != 0) return (void *)1;
    if (cudaSetDevice(device) != cudaSuccess) return (void *)2;
    for (int i = 0; i < ROUNDS; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, 512 * (size_t)(i % 7 + 1)) != cudaSuccess) return (void *)3;
        if (cudasim_launch_fill(p, 512, 0, i & 0xff, cudaStreamPerThread) != cudaSuccess)
            return (void *)4;
        if (cudaFree(p) != cudaSuccess) return (void *)5;
        if (cudaGetDevice(&current) != cudaSuccess || current != device) return (void *)6;
    }
    return NULL;
}

int main(void)
{
    void *p0 = NULL, *p1 = NULL;
    int n = -1;
    size_t free_b, total_b;

    SECTION("device count and selection");
    OK(cudaGetDeviceCount(&n));
    CHECK(n == 2, "count %d", n);
    EXPECT(cudaSetDevice(2), cudaErrorInvalidDevice);
    OK(cudaSetDevice(1));
    OK(cudaGetDevice(&n));
    CHECK(n == 1, "current %d", n);

    SECTION("per-device accounting");
    OK(cudaMalloc(&p1, 1 << 20));
    OK(cudaSetDevice(0));
    OK(cudaMalloc(&p0, 1 << 10));
    CHECK(stats_of(1).live_bytes == 1 << 20 && stats_of(0).live_bytes == 1 << 10, "live");
    {
        cudasimStats s;
        s.struct_size = sizeof s;
        EXPECT(cudasimGetStats(2, &s), cudaErrorInvalidDevice);
        EXPECT(cudasimGetStats(-1, &s), cudaErrorInvalidDevice);
    }
    OK(cudaMemGetInfo(&free_b, &total_b));
    CHECK(total_b - free_b == 1 << 10, "device 0 used %zu", total_b - free_b);
    {
        struct cudaPointerAttributes a;
        cudaIpcMemHandle_t h;
        int dev = -1;
        OK(cudaPointerGetAttributes(&a, (char *)p1 + 5));
        CHECK(a.type == cudaMemoryTypeDevice && a.device == 1, "attrs device %d", a.device);
        OK(cudaIpcGetMemHandle(&h, p1));
        memcpy(&dev, h.reserved + 8, 4);
        CHECK(dev == 1, "ipc device %d", dev);
    }
    OK(cudaFree(p1)); /* freeing another device's memory */
    CHECK(stats_of(1).live_bytes == 0 && stats_of(1).free_calls == 1, "device 1 after free");

    SECTION("a stream belongs to its device");
    {
        cudaStream_t s1 = NULL;
        OK(cudaSetDevice(1));
        OK(cudaMalloc(&p1, 4096));
        OK(cudaStreamCreate(&s1));
        cudaEvent_t e0 = NULL;
        OK(cudaSetDevice(0));
        OK(cudaEventCreate(&e0));
        /* As in CUDA: a launch fails on a stream of another device than the current one, and
         * an event cannot be recorded on another device's stream. */
        EXPECT(cudasim_launch_fill(p1, 4096, 100000, 9, s1), cudaErrorInvalidResourceHandle);
        EXPECT(cudaGetLastError(), cudaErrorInvalidResourceHandle);
        EXPECT(cudaEventRecord(e0, s1), cudaErrorInvalidResourceHandle);
        EXPECT(cudaGetLastError(), cudaErrorInvalidResourceHandle);
        OK(cudaEventDestroy(e0));
        OK(cudaSetDevice(1));
        OK(cudasim_launch_fill(p1, 4096, 100000, 9, s1));
        OK(cudaSetDevice(0));
        double t0 = now_ms();
        OK(cudaDeviceSynchronize()); /* device 0 has no work */
        CHECK(now_ms() - t0 < 50, "device 0 waited for device 1");
        EXPECT(cudaStreamQuery(s1), cudaErrorNotReady);
        CHECK(stats_of(1).kernels_launched == 1 && stats_of(0).kernels_launched == 0,
              "launch counted on the stream's device");
        OK(cudaSetDevice(1));
        OK(cudaDeviceReset()); /* waits for the kernel, drops device 1 only */
        CHECK(stats_of(1).live_bytes == 0 && stats_of(0).live_bytes == 1 << 10, "reset");
        OK(cudaSetDevice(0));
    }

    SECTION("threads: current device is per thread; concurrent malloc/launch/free");
    {
        pthread_t t[THREADS];
        for (intptr_t i = 0; i < THREADS; i++)
            CHECK(pthread_create(&t[i], NULL, worker, (void *)i) == 0, "pthread_create");
        for (int i = 0; i < THREADS; i++) {
            void *r = NULL;
            pthread_join(t[i], &r);
            CHECK(r == NULL, "worker %d failed at step %d", i, (int)(intptr_t)r);
        }
        OK(cudaGetDevice(&n));
        CHECK(n == 0, "main thread's device changed to %d", n);
        CHECK(stats_of(0).live_bytes == 1 << 10 && stats_of(1).live_bytes == 0, "leak");
    }
    OK(cudaFree(p0));

    printf("sim_multidev: all checks passed\n");
    return 0;
}
