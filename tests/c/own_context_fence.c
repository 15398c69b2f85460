/* The pool's fence of the contexts the program made (cuCtxCreate), against hostile timing.
 * Linked with the runtime and -lcuda; two simulated devices. Modes (argv[1]):
 *   other-device: the main thread's fence of device 0 synchronizes the program's own context
 *     there, under a 1500 ms kernel (gpupool_empty_cache(0) after a block was freed). 300 ms
 *     into it, a second thread works on device 1 alone, where the program made no context and
 *     nothing runs: argv[2] "fence" (a block freed, then gpupool_empty_cache(1): the pool's
 *     fence of device 1), "sync" (its own cudaDeviceSynchronize) or "create" (cuCtxCreate and
 *     cuCtxDestroy on device 1). Prints how long that took (other_ms) and how long the fence
 *     of device 0 took (fence_ms).
 *   destroy-during-fence: as other-device, but the second thread destroys the context the fence
 *     synchronizes (it must wait for it), then makes and destroys another on device 0, while a
 *     third thread fences device 0 again. Prints destroyed=1.
 *   create-unused: the main thread allocates and frees on device 0; then a thread that made no
 *     CUDA call yet makes a context of its own on device 1, whose primary context nothing
 *     used. Prints primary1_before and primary1_after (cuDevicePrimaryCtxGetState's active
 *     flag for device 1) and own_current=1 when the new context is still the thread's.
 * Prints "key=value" lines and "own_context_fence MODE ok". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"
#include "check.h"

#define MiB (1024ull * 1024ull)

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

typedef int (*empty_fn)(int, size_t *);

static void empty(int device)
{
    empty_fn f = (empty_fn)dlsym(RTLD_DEFAULT, "gpupool_empty_cache");
    if (f != NULL)
        CHECK(f(device, NULL) == 0, "gpupool_empty_cache(%d)", device);
}

static const char *what;
static CUcontext own0;
/* The helper threads' setup is done before the fence begins: a thread's first use of a device
 * takes the other devices' locks once (`note_new_device_in_use`), which is not what is measured. */
static pthread_barrier_t ready;

static void *on_device_1(void *arg)
{
    void *p = NULL;
    double t;
    (void)arg;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaFree(0));
    CHECK_CUDA(cudaMalloc(&p, MiB));
    pthread_barrier_wait(&ready);
    usleep(300 * 1000);
    t = now_ms();
    if (strcmp(what, "fence") == 0) {
        CHECK_CUDA(cudaFree(p));
        empty(1);
        p = NULL;
    } else if (strcmp(what, "sync") == 0) {
        CHECK_CUDA(cudaDeviceSynchronize());
    } else if (strcmp(what, "create") == 0) {
        CUcontext c = NULL;
        CHECK_CU(cuCtxCreate(&c, 0, 1));
        CHECK_CU(cuCtxDestroy(c));
        CHECK_CUDA(cudaSetDevice(1));
    } else {
        CHECK(0, "unknown %s", what);
    }
    printf("other_ms=%.0f\n", now_ms() - t);
    if (p != NULL)
        CHECK_CUDA(cudaFree(p));
    return NULL;
}

static void *destroyer(void *arg)
{
    CUcontext again = NULL;
    (void)arg;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(0));
    pthread_barrier_wait(&ready);
    usleep(300 * 1000);
    CHECK_CU(cuCtxDestroy(own0));
    CHECK_CU(cuCtxCreate(&again, 0, 0));
    CHECK_CU(cuCtxDestroy(again));
    printf("destroyed=1\n");
    return NULL;
}

static void *second_fence(void *arg)
{
    void *p = NULL;
    (void)arg;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, MiB));
    pthread_barrier_wait(&ready);
    usleep(200 * 1000);
    CHECK_CUDA(cudaFree(p));
    empty(0);
    return NULL;
}

/* A block of device 0 under a 1500 ms kernel in the program's own context there, freed with the
 * primary context current; then the pool's fence of device 0 while `thread` runs. */
static void fence_under(void *(*thread)(void *), int with_second)
{
    void *p = NULL;
    CUcontext primary = NULL;
    CUstream s = NULL;
    pthread_t t, t2;
    double start;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, 64 * MiB));
    CHECK_CU(cuCtxGetCurrent(&primary));
    CHECK_CU(cuCtxCreate(&own0, 0, 0));
    CHECK_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cudasim_cu_launch_fill((CUdeviceptr)p, 64 * MiB, 1500000, 0x44, s));
    CHECK_CU(cuCtxPopCurrent(&own0));
    CHECK_CU(cuCtxSetCurrent(primary));
    CHECK_CUDA(cudaFree(p));
    CHECK(pthread_barrier_init(&ready, NULL, with_second ? 3 : 2) == 0, "barrier");
    CHECK(pthread_create(&t, NULL, thread, NULL) == 0, "pthread_create");
    if (with_second)
        CHECK(pthread_create(&t2, NULL, second_fence, NULL) == 0, "pthread_create");
    pthread_barrier_wait(&ready);
    start = now_ms();
    empty(0);
    printf("fence_ms=%.0f\n", now_ms() - start);
    printf("busy_after_fence=%zu\n", cudasimRangeBusy(p, 64 * MiB));
    pthread_join(t, NULL);
    if (with_second)
        pthread_join(t2, NULL);
}

static void *create_on_unused(void *arg)
{
    CUcontext mine = NULL, now = NULL;
    unsigned int flags = 0;
    int before = -1, after = -1;
    (void)arg;
    CHECK_CU(cuDevicePrimaryCtxGetState(1, &flags, &before));
    CHECK_CU(cuCtxCreate(&mine, 0, 1));
    CHECK_CU(cuCtxGetCurrent(&now));
    CHECK_CU(cuDevicePrimaryCtxGetState(1, &flags, &after));
    printf("primary1_before=%d\nprimary1_after=%d\nown_current=%d\n", before, after, now == mine);
    CHECK_CU(cuCtxDestroy(mine));
    return NULL;
}

/* create-unused (above). */
static void create_unused(void)
{
    void *p = NULL;
    pthread_t t;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, MiB));
    CHECK_CUDA(cudaFree(p));
    CHECK(pthread_create(&t, NULL, create_on_unused, NULL) == 0, "pthread_create");
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    what = argc > 2 ? argv[2] : "";
    if (strcmp(mode, "other-device") == 0)
        fence_under(on_device_1, 0);
    else if (strcmp(mode, "destroy-during-fence") == 0)
        fence_under(destroyer, 1);
    else if (strcmp(mode, "create-unused") == 0)
        create_unused();
    else
        CHECK(0, "unknown mode %s", mode);
    printf("own_context_fence %s ok\n", mode);
    return 0;
}
