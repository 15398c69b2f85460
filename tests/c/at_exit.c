/* A program that gives its device memory back in an atexit handler registered after its first
 * CUDA call, as C++ static objects made after that call do in their destructors: the handler
 * frees its blocks, allocates and frees once more, and empties the pool's cache. Before the
 * handler, a second thread allocated (so the thread caches are on) and the main thread freed
 * half its blocks into its own cache. NVIDIA's runtime tears down after such a handler, so
 * every call must succeed and the driver must get every byte back.
 *
 * Prints "at exit: released N bytes, driver keeps L live bytes, V VMM bytes".
 * usage: at_exit */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

#include "check.h"
#include "gpupool.h"

#define BLOCKS 16

static void *g_blocks[BLOCKS];

static size_t block_size(int i)
{
    return 4096 + (size_t)i * 70000;
}

static void *other_thread(void *arg)
{
    (void)arg;
    void *p;
    for (int i = 0; i < 8; i++) {
        CHECK_CUDA(cudaMalloc(&p, block_size(i)));
        CHECK_CUDA(cudaFree(p));
    }
    return NULL;
}

/* A check inside the handler: exit() must not be called again from an atexit handler. */
static void must(int code, const char *what)
{
    if (code != 0) {
        fprintf(stderr, "FAIL at exit: %s returned %d\n", what, code);
        fflush(NULL);
        _exit(1);
    }
}

static void give_back_at_exit(void)
{
    for (int i = 1; i < BLOCKS; i += 2) {
        unsigned char seen[256];
        must(cudaMemcpy(seen, g_blocks[i], sizeof seen, cudaMemcpyDeviceToHost), "cudaMemcpy");
        for (size_t k = 0; k < sizeof seen; k++)
            must(seen[k] != (unsigned char)i, "a live block's content");
        must(cudaFree(g_blocks[i]), "cudaFree");
    }
    void *late;
    must(cudaMalloc(&late, 3 << 20), "cudaMalloc");
    must(cudaMemset(late, 0x5A, 256), "cudaMemset");
    must(cudaFree(late), "cudaFree of the late block");
    uint64_t released = 0;
    must(gpupool_empty_cache(GPUPOOL_ALL_DEVICES, &released), "gpupool_empty_cache");
    cudasimStats st = sim_stats(0);
    printf("at exit: released %llu bytes, driver keeps %llu live bytes, %llu VMM bytes\n",
           (unsigned long long)released, st.live_bytes, st.vmm_created_bytes);
}

int main(void)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0, "pthread_create");
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
    for (int i = 0; i < BLOCKS; i++) {
        CHECK_CUDA(cudaMalloc(&g_blocks[i], block_size(i)));
        tag_block(g_blocks[i], 256, (unsigned char)i);
    }
    for (int i = 0; i < BLOCKS; i += 2)
        CHECK_CUDA(cudaFree(g_blocks[i]));
    CHECK(atexit(give_back_at_exit) == 0, "atexit");
    printf("main done\n");
    return 0;
}
