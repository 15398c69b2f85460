/* What a program on several devices is told of memory, and what it then gets:
 *   exact:        on each device, with a 7 MiB block live and then with nothing live:
 *                 cudaMemGetInfo, then cudaMalloc of exactly the free bytes it gave. Prints
 *                 "devD_live_free", "devD_live_rc", "devD_idle_free", "devD_idle_total",
 *                 "devD_idle_rc".
 *   release HOW:  512 MiB allocated on device 1 and freed with device 0 current, so device 1
 *                 caches it; then, device 0 still current, device 1's release threshold is set
 *                 to 0 (HOW: "env", set by the test as GPUPOOL_RELEASE_THRESHOLD; "api",
 *                 gpupool_set_release_threshold; "mempool", cudaMemPoolSetAttribute on device
 *                 1's default pool), and the program synchronizes device 0
 *                 (cudaDeviceSynchronize), then a stream of device 1 (cudaStreamSynchronize).
 *                 Prints what the driver holds of device 1 at each step: "held_cached",
 *                 "held_after_device_sync", "held_after_stream_sync".
 *   ipc:          cudaIpcGetMemHandle of a 1 KiB allocation made after another and of a
 *                 64 MiB one; prints each code and what cudaGetLastError says after it
 *                 ("small_rc", "small_last", "large_rc", "large_last").
 * Lines are "key value" pairs, sizes in bytes; the last line is "memory devices ok". */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "check.h"

#define MIB (1ull << 20)

typedef int (*set_threshold_fn)(int device, unsigned long long bytes);

/* cudaMalloc of exactly what cudaMemGetInfo says is free on the current device. */
static void take_free(int dev, const char *key)
{
    size_t free_b = 0, total_b = 0;
    void *p = NULL;
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    cudaError_t r = cudaMalloc(&p, free_b);
    printf("dev%d_%s_free %zu\ndev%d_%s_total %zu\ndev%d_%s_rc %d\n", dev, key, free_b, dev, key,
           total_b, dev, key, (int)r);
    if (r == cudaSuccess)
        CHECK_CUDA(cudaFree(p));
    (void)cudaGetLastError();
}

static void exact(void)
{
    int n = 0;
    CHECK_CUDA(cudaGetDeviceCount(&n));
    for (int d = 0; d < n; d++) {
        void *live = NULL;
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaMalloc(&live, 7 * MIB));
        take_free(d, "live");
        CHECK_CUDA(cudaFree(live));
        CHECK_CUDA(cudaDeviceSynchronize());
        take_free(d, "idle");
    }
}

static void release(const char *how)
{
    void *p[8];
    cudaStream_t s1;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaStreamCreate(&s1));
    for (int i = 0; i < 8; i++)
        CHECK_CUDA(cudaMalloc(&p[i], 64 * MIB));
    CHECK_CUDA(cudaSetDevice(0));
    for (int i = 0; i < 8; i++)
        CHECK_CUDA(cudaFree(p[i]));
    printf("held_cached %llu\n", sim_stats(1).live_bytes);
    if (strcmp(how, "api") == 0) {
        set_threshold_fn set =
            (set_threshold_fn)dlsym(RTLD_DEFAULT, "gpupool_set_release_threshold");
        if (set != NULL)
            CHECK(set(1, 0) == 0, "gpupool_set_release_threshold(1, 0)");
    } else if (strcmp(how, "mempool") == 0) {
        cudaMemPool_t pool;
        unsigned long long zero = 0;
        CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 1));
        CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero));
    } else {
        CHECK(strcmp(how, "env") == 0, "unknown release mode %s", how);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("held_after_device_sync %llu\n", sim_stats(1).live_bytes);
    CHECK_CUDA(cudaStreamSynchronize(s1));
    printf("held_after_stream_sync %llu\n", sim_stats(1).live_bytes);
    int dev = -1;
    CHECK_CUDA(cudaGetDevice(&dev));
    CHECK(dev == 0, "the current device became %d", dev);
}

static void ipc(void)
{
    void *first = NULL, *small = NULL, *large = NULL;
    cudaIpcMemHandle_t h;
    CHECK_CUDA(cudaMalloc(&first, 1024));
    CHECK_CUDA(cudaMalloc(&small, 1024));
    CHECK_CUDA(cudaMalloc(&large, 64 * MIB));
    CHECK(cudaGetLastError() == cudaSuccess, "no error before");
    cudaError_t r = cudaIpcGetMemHandle(&h, small);
    printf("small_rc %d\nsmall_last %d\n", (int)r, (int)cudaGetLastError());
    r = cudaIpcGetMemHandle(&h, large);
    printf("large_rc %d\nlarge_last %d\n", (int)r, (int)cudaGetLastError());
    CHECK_CUDA(cudaFree(large));
    CHECK_CUDA(cudaFree(small));
    CHECK_CUDA(cudaFree(first));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "exact") == 0)
        exact();
    else if (strcmp(mode, "release") == 0 && argc > 2)
        release(argv[2]);
    else if (strcmp(mode, "ipc") == 0)
        ipc();
    else
        CHECK(0, "usage: memory_devices exact | release env|api|mempool | ipc");
    printf("memory devices ok\n");
    return 0;
}
