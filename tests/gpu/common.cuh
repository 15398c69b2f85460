/* Helpers shared by the real-GPU check programs (the .cu files beside this one): checked CUDA
 * calls, a seeded RNG, a host clock, a calibrated clock64 spin kernel, and fill / count kernels.
 *
 * Every program here is built by scripts/gpu-check.sh with `nvcc -O2 -cudart shared`, so its
 * CUDA runtime calls go through libcudart.so and an LD_PRELOADed libgpupool.so sees them.
 * churn and hazard are also built with nvcc's default static runtime (NAME_static), whose calls
 * reach the pool through the driver hooks. */
#ifndef GPUPOOL_GPU_COMMON_CUH
#define GPUPOOL_GPU_COMMON_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Any failing CUDA call: file:line, the call, the runtime's error string; exit 1. */
#define CHECK(call)                                                                            \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "FAIL %s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,            \
                    cudaGetErrorString(e_), cudaGetErrorName(e_));                             \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* After every kernel launch: a bad configuration shows here, not at the next sync. */
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

/* A host-side condition with a printf-style message; exit 1 when false. */
#define REQUIRE(cond, ...)                                                                     \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                    \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* Any failing driver call: file:line, the call, its CUresult; exit 1. */
#define DRIVER_CHECK(call)                                                                     \
    do {                                                                                       \
        CUresult r_ = (call);                                                                  \
        REQUIRE(r_ == CUDA_SUCCESS, "%s returned %d", #call, (int)r_);                         \
    } while (0)

/* The driver, as a program that takes its functions with dlsym finds it (XLA's way): the
 * libcuda.so.1 the runtime loaded, else loaded now. */
static inline void *driver_library(void)
{
    void *d = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!d)
        d = dlopen("libcuda.so.1", RTLD_NOW);
    REQUIRE(d != NULL, "dlopen(libcuda.so.1): %s", dlerror());
    return d;
}

/* The driver's function `name`, taken with dlsym (under the pool: its hook, where it has one). */
static inline void *driver_symbol(void *driver, const char *name)
{
    void *f = dlsym(driver, name);
    REQUIRE(f != NULL, "dlsym(%s): %s", name, dlerror());
    return f;
}

static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

static inline double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Busy host work (not a sleep: a training loop's Python overhead keeps a core busy). */
static inline void host_busy_us(unsigned us)
{
    double end = now_ms() + us / 1e3;
    while (now_ms() < end) {
    }
}

/* Threads per block for the grid-stride kernels, and a grid size for `n` bytes. */
#define FILL_THREADS 256
static inline unsigned grid_for(size_t n)
{
    size_t blocks = (n + FILL_THREADS - 1) / FILL_THREADS;
    if (blocks > 2048)
        blocks = 2048;
    if (blocks < 1)
        blocks = 1;
    return (unsigned)blocks;
}

/* Thread 0 of every block spins for `cycles` SM clock cycles (clock64), then the whole grid
 * writes `fill` over p[0..n) when fill >= 0. With a grid no larger than the SM count, every
 * block is resident at once and the kernel lasts about `cycles` of one SM. */
__global__ void spin_then_fill(long long cycles, unsigned char *p, size_t n, int fill)
{
    if (threadIdx.x == 0) {
        long long start = clock64();
        while (clock64() - start < cycles) {
        }
    }
    __syncthreads();
    if (fill < 0 || p == NULL)
        return;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = (unsigned char)fill;
}

/* Fill p[0..n) with one byte. */
__global__ void fill_byte(unsigned char *p, size_t n, unsigned char v)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        p[i] = v;
}

/* Mismatch counter filled by the count kernels: how many bytes differ, and the lowest index
 * of one that does (~0 when none). */
struct Mismatch {
    unsigned long long bad;
    unsigned long long first;
};

/* Count bytes of p[0..n) that are not `v`. */
__global__ void count_not_byte(const unsigned char *p, size_t n, unsigned char v, Mismatch *m)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long bad = 0, first = ~0ull;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (p[i] != v) {
            if (bad == 0)
                first = i;
            bad++;
        }
    }
    if (bad) {
        atomicAdd(&m->bad, bad);
        atomicMin(&m->first, first);
    }
}

/* Reset a device Mismatch (bad = 0, first = ~0) on the legacy default stream. */
static inline void mismatch_reset(Mismatch *m)
{
    CHECK(cudaMemset(&m->bad, 0, sizeof m->bad));
    CHECK(cudaMemset(&m->first, 0xFF, sizeof m->first));
}

/* Copy a device Mismatch back (synchronous with the legacy default stream). */
static inline Mismatch mismatch_read(const Mismatch *m)
{
    Mismatch h;
    CHECK(cudaMemcpy(&h, m, sizeof h, cudaMemcpyDeviceToHost));
    return h;
}

/* SM clock cycles per microsecond, measured: the peak clock from the device attribute gives a
 * first guess, then a timed 20 ms spin corrects it for the clock the SMs actually run at. */
static inline double spin_cycles_per_us(void)
{
    int dev = 0, khz = 0;
    CHECK(cudaGetDevice(&dev));
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev) != cudaSuccess || khz <= 0) {
        (void)cudaGetLastError();
        khz = 1500000; /* 1.5 GHz; the timed launch below corrects it */
    }
    double cpu = khz / 1000.0;
    /* Warm-up: the first launch loads the module. */
    spin_then_fill<<<1, 32>>>(1000, NULL, 0, -1);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    const double target_us = 20000.0;
    CHECK(cudaEventRecord(a, 0));
    spin_then_fill<<<1, 32>>>((long long)(target_us * cpu), NULL, 0, -1);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(b, 0));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    if (ms > 0.5f)
        cpu = cpu * (target_us / 1000.0) / ms;
    return cpu;
}

/* Number of SMs of the current device. */
static inline int sm_count(void)
{
    int dev = 0, n = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n > 0 ? n : 1;
}

#endif
