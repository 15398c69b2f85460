/* dlopen and dlclose of a library whose constructor and destructor use CUDA, while new threads
 * make their first CUDA calls: each asks for sizes no segment holds yet, so the pool grows
 * under its device lock while the main thread, inside dlopen or dlclose, holds the dynamic
 * linker's lock and waits for that device lock.
 *
 * usage: loader_lock LIBRARY ROUNDS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>

#include "check.h"

#define THREADS 2
#define PER_THREAD 4

static void *first_calls(void *arg)
{
    size_t base = (size_t)(uintptr_t)arg;
    void *p[PER_THREAD];
    for (int i = 0; i < PER_THREAD; i++) {
        CHECK_CUDA(cudaMalloc(&p[i], base + (size_t)i * 3000000));
        CHECK_CUDA(cudaMemset(p[i], 0x5A, 256));
    }
    for (int i = 0; i < PER_THREAD; i++)
        CHECK_CUDA(cudaFree(p[i]));
    return NULL;
}

typedef void *(*block_fn)(int);

int main(int argc, char **argv)
{
    CHECK(argc == 3, "usage: loader_lock LIBRARY ROUNDS");
    int rounds = atoi(argv[2]);
    void *warm;
    CHECK_CUDA(cudaMalloc(&warm, 10));
    CHECK_CUDA(cudaFree(warm));
    for (int r = 0; r < rounds; r++) {
        pthread_t t[THREADS];
        for (int i = 0; i < THREADS; i++) {
            size_t base = 1000 + (size_t)(r * THREADS + i) * 4096;
            CHECK(pthread_create(&t[i], NULL, first_calls, (void *)(uintptr_t)base) == 0,
                  "pthread_create");
        }
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        CHECK(h != NULL, "dlopen %s: %s", argv[1], dlerror());
        block_fn block = (block_fn)dlsym(h, "cuda_ctor_block");
        CHECK(block != NULL, "dlsym cuda_ctor_block");
        CHECK(block(0) != NULL && block(0) != block(1), "round %d: the constructor's blocks", r);
        CHECK(dlclose(h) == 0, "dlclose: %s", dlerror());
        for (int i = 0; i < THREADS; i++)
            CHECK(pthread_join(t[i], NULL) == 0, "pthread_join");
    }
    printf("loader lock ok: %d rounds\n", rounds);
    return 0;
}
