/* Peaks restarted while other threads' caches hold free blocks. Four threads allocate and free
 * small blocks with cudaMalloc, first in strict turns (the device's lock goes from one to the
 * next on every call, which starts thread caches however the machine schedules them), then
 * freely; then they wait, their caches full, while the main thread restarts the default pool's
 * high-water marks (writes of 0, as torch.cuda.reset_peak_memory_stats() does) or, with
 * argument "api", calls gpupool_reset_peak_stats. Prints the figures read right after
 * ("used=N", "used_high=N", "reserved=N", "reserved_high=N"), then "peak_reset_threads ok".
 * Run under LD_PRELOAD=libgpupool.so only: without the pool, cudaMalloc is not the default
 * pool's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include "check.h"

#define THREADS 4
#define BLOCKS 32

typedef int (*reset_fn)(int device);

static pthread_barrier_t done, go;
static unsigned turn;

static unsigned long long figure(cudaMemPool_t pool, enum cudaMemPoolAttr attr)
{
    unsigned long long v = 0;
    CHECK_CUDA(cudaMemPoolGetAttribute(pool, attr, &v));
    return v;
}

static void *churn(void *arg)
{
    void *b[BLOCKS];
    int i, k;
    CHECK_CUDA(cudaSetDevice(0));
    for (i = 0; i < 1500; i++) {
        while (__atomic_load_n(&turn, __ATOMIC_ACQUIRE) % THREADS != (unsigned)(uintptr_t)arg)
            sched_yield();
        CHECK_CUDA(cudaMalloc(&b[0], 4096));
        CHECK_CUDA(cudaFree(b[0]));
        __atomic_fetch_add(&turn, 1, __ATOMIC_RELEASE);
    }
    for (k = 0; k < 500; k++) {
        for (i = 0; i < BLOCKS; i++)
            CHECK_CUDA(cudaMalloc(&b[i], 512 * (1 + i % 8)));
        for (i = 0; i < BLOCKS; i++)
            CHECK_CUDA(cudaFree(b[i]));
    }
    /* The cache keeps its blocks while the thread lives. */
    pthread_barrier_wait(&done);
    pthread_barrier_wait(&go);
    return NULL;
}

int main(int argc, char **argv)
{
    cudaMemPool_t def;
    pthread_t t[THREADS];
    unsigned long long zero = 0;
    int i;

    CHECK_CUDA(cudaFree(0));
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&def, 0));
    CHECK(pthread_barrier_init(&done, NULL, THREADS + 1) == 0, "barrier");
    CHECK(pthread_barrier_init(&go, NULL, THREADS + 1) == 0, "barrier");
    for (i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)i) == 0, "thread %d", i);
    pthread_barrier_wait(&done);
    CHECK_CUDA(cudaDeviceSynchronize());
    if (argc > 1 && strcmp(argv[1], "api") == 0) {
        reset_fn reset = (reset_fn)dlsym(RTLD_DEFAULT, "gpupool_reset_peak_stats");
        CHECK(reset != NULL, "run under the pool");
        CHECK(reset(0) == 0, "gpupool_reset_peak_stats(0)");
    } else {
        CHECK_CUDA(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &zero));
        CHECK_CUDA(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReservedMemHigh, &zero));
    }
    printf("used=%llu\nused_high=%llu\nreserved=%llu\nreserved_high=%llu\n",
           figure(def, cudaMemPoolAttrUsedMemCurrent), figure(def, cudaMemPoolAttrUsedMemHigh),
           figure(def, cudaMemPoolAttrReservedMemCurrent),
           figure(def, cudaMemPoolAttrReservedMemHigh));
    pthread_barrier_wait(&go);
    for (i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    printf("peak_reset_threads ok\n");
    return 0;
}
