/* An allocation storm for the live dump: THREADS threads (default 4) allocate, tag, check and
 * free blocks of random sizes for MILLISECONDS, while the test sends SIGUSR1. The main thread
 * makes one allocation first (which installs the pool's SIGUSR1 handler), then prints "ready".
 *
 * usage: storm MILLISECONDS [THREADS]
 * Prints "ready", then "program mallocs N" and "storm ok". */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "check.h"

#define MAX_LIVE 8

static double g_deadline;
static int g_threads;
static unsigned long long g_counts[64];

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *worker(void *arg)
{
    int id = (int)(uintptr_t)arg;
    uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
    void *p[MAX_LIVE];
    size_t n[MAX_LIVE];
    unsigned char tag[MAX_LIVE];
    int live = 0;
    while (now_ms() < g_deadline) {
        if (live < MAX_LIVE && (live == 0 || rng_next(&rng) % 100 < 55)) {
            n[live] = (size_t)(rng_next(&rng) % (512u << 10)) + 1;
            tag[live] = (unsigned char)(rng_next(&rng) % 255 + 1);
            CHECK_CUDA(cudaMalloc(&p[live], n[live]));
            tag_block(p[live], n[live], tag[live]);
            g_counts[id]++;
            live++;
        } else {
            int k = (int)(rng_next(&rng) % (uint64_t)live);
            check_tag(p[k], n[k], tag[k]);
            CHECK_CUDA(cudaFree(p[k]));
            live--;
            p[k] = p[live];
            n[k] = n[live];
            tag[k] = tag[live];
        }
    }
    while (live > 0) {
        live--;
        check_tag(p[live], n[live], tag[live]);
        CHECK_CUDA(cudaFree(p[live]));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t tid[64];
    unsigned long long total = 1;
    void *first = NULL;
    int t;
    CHECK(argc >= 2, "usage: storm MILLISECONDS [THREADS]");
    g_threads = argc > 2 ? atoi(argv[2]) : 4;
    CHECK(g_threads >= 1 && g_threads <= 64, "threads");
    CHECK_CUDA(cudaMalloc(&first, 4096));
    printf("ready\n");
    fflush(stdout);
    g_deadline = now_ms() + atof(argv[1]);
    for (t = 0; t < g_threads; t++)
        CHECK(pthread_create(&tid[t], NULL, worker, (void *)(uintptr_t)t) == 0, "thread");
    for (t = 0; t < g_threads; t++)
        pthread_join(tid[t], NULL);
    CHECK_CUDA(cudaFree(first));
    for (t = 0; t < g_threads; t++)
        total += g_counts[t];
    printf("program mallocs %llu\n", total);
    printf("storm ok\n");
    return 0;
}
