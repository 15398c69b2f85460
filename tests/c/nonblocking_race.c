/* A cudaFree that races the program's first non-blocking stream (`barrier` and `relaxed` mode).
 * A kernel on a blocking stream still uses block `a` when thread B frees it; B's free waits for
 * the device's lock, which thread C holds while it gets a new segment from a slow driver
 * (CUDASIM_MALLOC_US). Meanwhile the main thread creates a non-blocking stream. Once both calls
 * returned, the main thread asks for a block of `a`'s size and uses it on that stream: if the
 * pool handed `a` out after a barrier alone, the old kernel's late write (0xEE) lands on the new
 * owner's data (0x42).
 *
 * usage: nonblocking_race  (run with CUDASIM_MALLOC_US=300000, GPUPOOL_EXPANDABLE=0)
 * Prints "reused=0|1" and "nonblocking_race ok". */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <time.h>

#include "check.h"

#define N (1u << 20)

static void *g_a;

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Holds the device's lock while the driver takes its time over a new segment. */
static void *grower(void *arg)
{
    void *p;
    (void)arg;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, 64u << 20));
    CHECK_CUDA(cudaFree(p));
    return NULL;
}

/* Frees `a` while the grower holds the lock. */
static void *freer(void *arg)
{
    (void)arg;
    CHECK_CUDA(cudaSetDevice(0));
    sleep_ms(60);
    CHECK_CUDA(cudaFree(g_a));
    return NULL;
}

int main(void)
{
    cudaStream_t blocking, nb;
    pthread_t c, b;
    void *got, *fill[3];
    int i;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&blocking));
    CHECK_CUDA(cudaMalloc(&g_a, N));
    for (i = 0; i < 3; i++) /* the rest of the small segment: only `a` can serve below */
        CHECK_CUDA(cudaMalloc(&fill[i], N));
    CHECK_CUDA(cudaDeviceSynchronize()); /* every free so far is fenced */
    /* Runs 3 s, then writes 0xEE over `a`. */
    CHECK_CUDA(cudasim_launch_fill(g_a, N, 3000000, 0xEE, blocking));
    CHECK(pthread_create(&c, NULL, grower, NULL) == 0, "thread");
    sleep_ms(20);
    CHECK(pthread_create(&b, NULL, freer, NULL) == 0, "thread");
    sleep_ms(150); /* B waits for the lock; C still holds it */
    CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    pthread_join(b, NULL);
    pthread_join(c, NULL);
    CHECK_CUDA(cudaMalloc(&got, N));
    printf("reused=%d\n", got == g_a);
    CHECK_CUDA(cudasim_launch_fill(got, N, 0, 0x42, nb));
    CHECK_CUDA(cudaDeviceSynchronize());
    check_tag(got, N, 0x42);
    CHECK_CUDA(cudaFree(got));
    for (i = 0; i < 3; i++)
        CHECK_CUDA(cudaFree(fill[i]));
    printf("nonblocking_race ok\n");
    return 0;
}
