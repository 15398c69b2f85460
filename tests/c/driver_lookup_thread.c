/* How the driver hooks' first calls look up the driver: which threads the pool starts for it,
 * and how long the first calls made inside a library's constructor in dlopen wait.
 *   driver_lookup_thread calls        first calls of cuCtxSetCurrent, cuMemAlloc_v2,
 *                                     cuCtxSynchronize on the program's thread
 *   driver_lookup_thread ctor LIB     the same calls inside LIB's constructor (dlopen)
 * Counts the pthread_create calls made in the process (this program's pthread_create is found
 * first, the pool's calls included) and prints how long the calls (or the dlopen) took. The
 * program handles SIGUSR1 itself, so the pool starts no live-dump thread: only lookup threads
 * are counted. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "check.h"
#include "cuda.h"

typedef int (*create_t)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static create_t real_create;
static int created;

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg)
{
    __atomic_add_fetch(&created, 1, __ATOMIC_SEQ_CST);
    return real_create(t, a, f, arg);
}

static void on_usr1(int sig)
{
    (void)sig;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    CUcontext ctx = NULL;
    CUdeviceptr p = 0;
    double start;
    CHECK(argc >= 2, "usage: driver_lookup_thread calls | ctor LIB");
    *(void **)&real_create = dlvsym(RTLD_NEXT, "pthread_create", "GLIBC_2.34");
    if (!real_create)
        *(void **)&real_create = dlvsym(RTLD_NEXT, "pthread_create", "GLIBC_2.2.5");
    CHECK(real_create != NULL, "no pthread_create");
    CHECK(signal(SIGUSR1, on_usr1) != SIG_ERR, "signal");
    /* Neither is hooked. */
    CHECK_CU(cuInit(0));
    CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    start = now_ms();
    if (strcmp(argv[1], "calls") == 0) {
        CHECK_CU(cuCtxSetCurrent(ctx));
        CHECK_CU(cuMemAlloc_v2(&p, 1 << 20));
        CHECK_CU(cuCtxSynchronize());
    } else if (strcmp(argv[1], "ctor") == 0 && argc == 3) {
        CHECK(dlopen(argv[2], RTLD_NOW) != NULL, "dlopen: %s", dlerror());
    } else {
        CHECK(0, "unknown mode %s", argv[1]);
    }
    printf("elapsed_ms=%.0f\n", now_ms() - start);
    printf("threads_created=%d\n", created);
    printf("driver_lookup_thread %s: done\n", argv[1]);
    return 0;
}
