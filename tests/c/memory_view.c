/* What a program sees of device memory: cudaMemGetInfo, how much fits, the pool's limit.
 *   info:    cudaMemGetInfo at start, with one 7 MiB block live (in a 20 MiB segment), with
 *            1 GiB live, with 8 GiB live, and with all of it freed and synchronized.
 *   cached:  cudaMemGetInfo at start; after 500 blocks of 7 MiB are freed, and again once
 *            synchronized; with one 7 MiB block live beside that cache; after 300 blocks of
 *            5 MiB are allocated beside it, freed and synchronized; then how many 1 GiB blocks
 *            fit beside it (the memory it was told is free, it can have); and with all freed.
 *   fill M:  M MiB blocks until out of memory; prints the count.
 *   half M:  M MiB blocks until out of memory, every other one freed, then 2*M MiB blocks
 *            until out of memory; prints both counts.
 *   limit M: M MiB blocks until out of memory (checks the code and cudaGetLastError), with
 *            cudaMemGetInfo when full and after freeing one; then frees everything and fills
 *            again (the same count must fit).
 *   devices M: "limit M" on device 0 and then on device 1.
 *   threads: two threads each take 1 MiB blocks until out of memory and free them, twice;
 *            prints the most one of them held.
 * Lines are "key value" pairs, sizes in bytes. */
#include <pthread.h>

#include "check.h"

#define MIB (1ull << 20)
#define MAX_BLOCKS 8192

static void *blocks[MAX_BLOCKS];

static void info(const char *key)
{
    size_t free_b = 0, total_b = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    printf("%s_free %zu\n%s_total %zu\n", key, free_b, key, total_b);
}

/* Blocks of `size` bytes until out of memory; the program's last error must say so too. */
static int fill(size_t size, int from)
{
    int n = from;
    for (;;) {
        CHECK(n < MAX_BLOCKS, "too many blocks");
        cudaError_t r = cudaMalloc(&blocks[n], size);
        if (r == cudaErrorMemoryAllocation) {
            CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "last error after OOM");
            CHECK(cudaGetLastError() == cudaSuccess, "last error read twice");
            return n;
        }
        CHECK_CUDA(r);
        n++;
    }
}

static void free_all(int n)
{
    for (int i = 0; i < n; i++)
        if (blocks[i])
            CHECK_CUDA(cudaFree(blocks[i]));
    memset(blocks, 0, sizeof blocks);
}

static void limit_run(size_t size, const char *key)
{
    char name[64];
    int n = fill(size, 0);
    printf("%s_blocks %d\n", key, n);
    snprintf(name, sizeof name, "%s_full", key);
    info(name);
    CHECK_CUDA(cudaFree(blocks[n - 1]));
    blocks[n - 1] = NULL;
    CHECK_CUDA(cudaDeviceSynchronize());
    snprintf(name, sizeof name, "%s_one_freed", key);
    info(name);
    free_all(n);
    CHECK_CUDA(cudaDeviceSynchronize());
    int again = fill(size, 0);
    CHECK(again == n, "%d blocks fit the first time, %d the second", n, again);
    free_all(again);
    CHECK_CUDA(cudaDeviceSynchronize());
}

struct worker {
    size_t held_max;
};

static void *thread_fill(void *arg)
{
    struct worker *w = arg;
    void *mine[2048];
    for (int round = 0; round < 2; round++) {
        int n = 0;
        while (n < 2048 && cudaMalloc(&mine[n], MIB) == cudaSuccess)
            n++;
        (void)cudaGetLastError();
        if ((size_t)n * MIB > w->held_max)
            w->held_max = (size_t)n * MIB;
        for (int i = 0; i < n; i++)
            CHECK_CUDA(cudaFree(mine[i]));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    size_t size = (argc > 2 ? strtoull(argv[2], NULL, 10) : 1) * MIB;
    if (strcmp(mode, "info") == 0) {
        info("start");
        void *one = NULL;
        CHECK_CUDA(cudaMalloc(&one, 7 * MIB));
        info("seven_mib_live");
        CHECK_CUDA(cudaFree(one));
        CHECK_CUDA(cudaMalloc(&one, 1024 * MIB));
        info("one_gib_live");
        CHECK_CUDA(cudaFree(one));
        int n = 0;
        for (; n < 8; n++)
            CHECK_CUDA(cudaMalloc(&blocks[n], 1024 * MIB));
        info("eight_gib_live");
        free_all(n);
        CHECK_CUDA(cudaDeviceSynchronize());
        info("all_freed");
    } else if (strcmp(mode, "cached") == 0) {
        info("start");
        int n = 0;
        for (; n < 500; n++)
            CHECK_CUDA(cudaMalloc(&blocks[n], 7 * MIB));
        free_all(n);
        info("freed");
        CHECK_CUDA(cudaDeviceSynchronize());
        info("synced");
        void *one = NULL;
        CHECK_CUDA(cudaMalloc(&one, 7 * MIB));
        info("seven_mib_live");
        for (n = 0; n < 300; n++)
            CHECK_CUDA(cudaMalloc(&blocks[n], 5 * MIB));
        free_all(n);
        CHECK_CUDA(cudaDeviceSynchronize());
        info("churned");
        n = fill(1024 * MIB, 0);
        printf("gib_blocks %d\n", n);
        free_all(n);
        CHECK_CUDA(cudaFree(one));
        CHECK_CUDA(cudaDeviceSynchronize());
        info("all_freed");
    } else if (strcmp(mode, "fill") == 0) {
        int n = fill(size, 0);
        printf("blocks %d\n", n);
        free_all(n);
    } else if (strcmp(mode, "half") == 0) {
        int n = fill(size, 0);
        printf("blocks %d\n", n);
        for (int i = 0; i < n; i += 2) {
            CHECK_CUDA(cudaFree(blocks[i]));
            blocks[i] = NULL;
        }
        CHECK_CUDA(cudaDeviceSynchronize());
        int m = fill(2 * size, n);
        printf("double_blocks %d\n", m - n);
        free_all(m);
    } else if (strcmp(mode, "limit") == 0) {
        limit_run(size, "dev0");
    } else if (strcmp(mode, "devices") == 0) {
        CHECK_CUDA(cudaSetDevice(0));
        limit_run(size, "dev0");
        CHECK_CUDA(cudaSetDevice(1));
        limit_run(size, "dev1");
    } else if (strcmp(mode, "threads") == 0) {
        pthread_t t[2];
        struct worker w[2] = {{0}, {0}};
        for (int i = 0; i < 2; i++)
            CHECK(pthread_create(&t[i], NULL, thread_fill, &w[i]) == 0, "thread");
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], NULL);
        printf("held_max %zu\n", w[0].held_max > w[1].held_max ? w[0].held_max : w[1].held_max);
    } else {
        CHECK(0, "mode: info, cached, fill, half, limit, devices or threads");
    }
    printf("memory view ok\n");
    return 0;
}
