/* cudaDeviceReset (or cuDevicePrimaryCtxReset_v2 with `p`) of device 0 again and again while
 * other threads allocate and free on device 0 and, with DEVICES 2, on device 1. A block from
 * before a reset is dead: its free may be refused, as CUDA refuses it. Blocks handed out after
 * the last reset are tagged and checked.
 *
 * Checks: no call fails but with the answers a reset allows, the pool reports no internal
 * error, and at the end, everything freed and the caches emptied, the pool reserves on each
 * device what the driver holds: no segment taken from the new context is forgotten with the
 * old one.
 *
 * usage: reset_race THREADS RESETS DEVICES [p] */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "cuda.h"
#include "check.h"
#include "../../include/gpupool.h"

#define MIB ((size_t)1 << 20)
#define SLOTS 16

static atomic_int g_stop;
static int g_devices;

static void *worker(void *arg)
{
    uintptr_t id = (uintptr_t)arg;
    uint64_t s = 0x9E3779B97F4A7C15ull * (id + 1);
    void *live[SLOTS] = {0};
    CHECK_CUDA(cudaSetDevice((int)(id % (uintptr_t)g_devices)));
    while (!atomic_load(&g_stop)) {
        int i = (int)(rng_next(&s) % SLOTS);
        if (live[i]) {
            cudaError_t e = cudaFree(live[i]);
            CHECK(e == cudaSuccess || e == cudaErrorInvalidValue, "cudaFree: %d", (int)e);
            (void)cudaGetLastError();
            live[i] = NULL;
        } else {
            size_t n = rng_next(&s) % 4 == 0 ? (size_t)(rng_next(&s) % 24 + 1) * MIB
                                             : (size_t)(rng_next(&s) % 65536 + 1);
            CHECK_CUDA(cudaMalloc(&live[i], n));
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (live[i]) {
            (void)cudaFree(live[i]);
            (void)cudaGetLastError();
        }
    return NULL;
}

int main(int argc, char **argv)
{
    CHECK(argc >= 4, "usage: reset_race THREADS RESETS DEVICES [p]");
    int threads = atoi(argv[1]), resets = atoi(argv[2]);
    int primary = argc > 4 && strchr(argv[4], 'p') != NULL;
    g_devices = atoi(argv[3]);
    CHECK(threads >= 1 && threads <= 16 && g_devices >= 1 && g_devices <= 2, "arguments");
    int (*stats)(int, gpupool_stats *);
    int (*empty)(int, uint64_t *);
    *(void **)&stats = dlsym(RTLD_DEFAULT, "gpupool_get_stats");
    *(void **)&empty = dlsym(RTLD_DEFAULT, "gpupool_empty_cache");
    CHECK(stats != NULL && empty != NULL, "run under the pool");
    void *p;
    CHECK_CUDA(cudaMalloc(&p, MIB));
    CHECK_CUDA(cudaFree(p));
    pthread_t tid[16];
    for (int t = 0; t < threads; t++)
        CHECK(pthread_create(&tid[t], NULL, worker, (void *)(uintptr_t)t) == 0, "thread");
    for (int r = 0; r < resets; r++) {
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL);
        if (primary)
            CHECK(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS, "cuDevicePrimaryCtxReset_v2");
        else
            CHECK_CUDA(cudaDeviceReset());
    }
    atomic_store(&g_stop, 1);
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    /* Blocks after the last reset are live memory that keeps its bytes. */
    void *after[4];
    for (int i = 0; i < 4; i++) {
        CHECK_CUDA(cudaMalloc(&after[i], (size_t)(i + 1) * 3 * MIB));
        tag_block(after[i], (size_t)(i + 1) * 3 * MIB, (unsigned char)(0x40 + i));
    }
    for (int i = 0; i < 4; i++) {
        check_tag(after[i], (size_t)(i + 1) * 3 * MIB, (unsigned char)(0x40 + i));
        CHECK_CUDA(cudaFree(after[i]));
    }
    for (int d = 0; d < g_devices; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK(empty(d, NULL) == 0, "gpupool_empty_cache(%d)", d);
        gpupool_stats ps;
        memset(&ps, 0, sizeof ps);
        ps.struct_size = sizeof ps;
        CHECK(stats(d, &ps) == 0, "gpupool_get_stats(%d)", d);
        cudasimStats st = sim_stats(d);
        printf("device %d: pool reserves %llu (%llu resets), driver holds %llu\n", d,
               (unsigned long long)ps.reserved_bytes, (unsigned long long)ps.resets,
               st.live_bytes);
        CHECK(ps.reserved_bytes == st.live_bytes,
              "device %d: the pool reserves %llu, the driver holds %llu", d,
              (unsigned long long)ps.reserved_bytes, st.live_bytes);
    }
    printf("reset_race ok\n");
    return 0;
}
