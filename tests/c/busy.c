/* Reports while another thread holds the device's pool for a fence (found in review): a 1.5 s
 * kernel runs on a freed block; with GPUPOOL_FENCE_BYTES=1 the next allocation fences, that is
 * waits for the kernel, inside the pool.
 *
 * usage: busy stats   gpupool_get_stats meanwhile: success means the pool's real figures
 *                     (it waits for the fence), never zeros
 *        busy exit    exits meanwhile: the exit summary still names the device (as not read)
 * Linked with -lgpupool ahead of the runtime. */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "check.h"
#include "gpupool.h"

static void *fence_in_pool(void *arg)
{
    (void)arg;
    void *a, *b;
    CHECK_CUDA(cudaMalloc(&a, 4 << 20));
    CHECK_CUDA(cudasim_launch_fill(a, 4 << 20, 1500000, -1, 0));
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaMalloc(&b, 4 << 20)); /* fences: waits for the kernel inside the pool */
    CHECK_CUDA(cudaFree(b));
    return NULL;
}

int main(int argc, char **argv)
{
    CHECK(argc == 2, "usage: busy stats|exit");
    void *w;
    for (int i = 0; i < 100; i++) {
        CHECK_CUDA(cudaMalloc(&w, 1000));
        CHECK_CUDA(cudaFree(w));
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, fence_in_pool, NULL) == 0, "thread");
    struct timespec pause = {0, 400 * 1000 * 1000};
    nanosleep(&pause, NULL);
    if (strcmp(argv[1], "exit") == 0) {
        printf("exiting while the other thread fences\n");
        fflush(stdout);
        exit(0);
    }
    gpupool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    int r = gpupool_get_stats(0, &st);
    CHECK(r == 0, "gpupool_get_stats returned %d", r);
    CHECK(st.alloc_calls >= 102, "success with %llu allocations counted",
          (unsigned long long)st.alloc_calls);
    CHECK(pthread_join(t, NULL) == 0, "join");
    printf("busy stats ok\n");
    return 0;
}
