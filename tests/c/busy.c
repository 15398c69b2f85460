/* Reports while another thread holds the device's pool for a fence: a 1.5 s
 * kernel runs on a freed block; with GPUPOOL_FENCE_BYTES=1 the next allocation fences, that is
 * waits for the kernel, inside the pool.
 *
 * usage: busy stats   gpupool_get_stats meanwhile: success means the pool's real figures
 *                     (it waits for the fence), never zeros
 *        busy exit    exits meanwhile: the exit summary still names the device (as not read)
 *        busy signal  the thread that fences is interrupted by a signal whose handler calls
 *                     gpupool_get_stats: it fails (999) after a short wait instead of waiting
 *                     for the lock its own thread holds
 * Linked with -lgpupool ahead of the runtime. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
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

static pthread_t fencing;
static volatile sig_atomic_t in_handler = -1;

static void on_usr2(int sig)
{
    (void)sig;
    gpupool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    in_handler = gpupool_get_stats(0, &st);
}

static void *interrupt(void *arg)
{
    (void)arg;
    struct timespec pause = {0, 400 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECK(pthread_kill(fencing, SIGUSR2) == 0, "pthread_kill");
    return NULL;
}

int main(int argc, char **argv)
{
    CHECK(argc == 2, "usage: busy stats|exit|signal");
    if (strcmp(argv[1], "signal") == 0) {
        fencing = pthread_self();
        CHECK(signal(SIGUSR2, on_usr2) != SIG_ERR, "signal");
        pthread_t t;
        CHECK(pthread_create(&t, NULL, interrupt, NULL) == 0, "thread");
        fence_in_pool(NULL);
        CHECK(pthread_join(t, NULL) == 0, "join");
        CHECK(in_handler == 999, "gpupool_get_stats in the handler returned %d", (int)in_handler);
        printf("busy signal ok\n");
        return 0;
    }
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
