/* Hostile stream-ordered reuse: a block a kernel still uses is freed one way and requested
 * another, and the new owner's work runs on a stream of its own. If the pool handed the block
 * out so that the new owner's work could run before the old kernel ends, the old kernel's late
 * write (0xEE) lands on the new owner's data (0x42) and the check fails.
 *
 * usage: stream_reuse SCENARIO
 *   nb_after_free   a block freed with cudaFree under a kernel on a blocking stream, then a
 *                   non-blocking stream created, then the block requested with cudaMalloc and
 *                   used on that non-blocking stream.
 *   nb_requester    a block freed with cudaFreeAsync on a blocking stream under a kernel,
 *                   requested by cudaMallocAsync on a non-blocking stream created before.
 *   ptsz            a block freed on one thread's per-thread default stream under a kernel,
 *                   requested on another thread's per-thread default stream.
 *   destroyed       a block freed with cudaFreeAsync under a kernel on a stream then destroyed,
 *                   requested by cudaMallocAsync on a stream created next (perhaps at the same
 *                   handle): another stream, whose work does not wait for the destroyed one's.
 * Prints "reused=N" (how many of the rounds got the freed block back) and "stream_reuse ok". */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <pthread.h>

#include "check.h"

#define N (12u << 20) /* a large block: its own place in the index */
#define ROUNDS 3

typedef cudaError_t (*malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);

/* The new owner of `b` writes 0x42 over it on `s`; once every stream is done it must still
 * hold 0x42. */
static void own_and_check(void *b, cudaStream_t s)
{
    CHECK_CUDA(cudasim_launch_fill(b, N, 0, 0x42, s));
    CHECK_CUDA(cudaDeviceSynchronize());
    check_tag(b, N, 0x42);
}

static int nb_after_free(void)
{
    int reused = 0;
    for (int round = 0; round < ROUNDS; round++) {
        cudaStream_t blocking, nb;
        void *a, *b;
        CHECK_CUDA(cudaStreamCreate(&blocking));
        CHECK_CUDA(cudaMalloc(&a, N));
        CHECK_CUDA(cudasim_launch_fill(a, N, 200000, 0xEE, blocking));
        CHECK_CUDA(cudaFree(a));
        CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
        CHECK_CUDA(cudaMalloc(&b, N));
        reused += b == a;
        own_and_check(b, nb);
        CHECK_CUDA(cudaFree(b));
        CHECK_CUDA(cudaStreamDestroy(blocking));
        CHECK_CUDA(cudaStreamDestroy(nb));
    }
    return reused;
}

static int nb_requester(void)
{
    int reused = 0;
    cudaStream_t blocking, nb;
    CHECK_CUDA(cudaStreamCreate(&blocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    for (int round = 0; round < ROUNDS; round++) {
        void *a, *b;
        CHECK_CUDA(cudaMallocAsync(&a, N, blocking));
        CHECK_CUDA(cudasim_launch_fill(a, N, 200000, 0xEE, blocking));
        CHECK_CUDA(cudaFreeAsync(a, blocking));
        CHECK_CUDA(cudaMallocAsync(&b, N, nb));
        reused += b == a;
        own_and_check(b, nb);
        CHECK_CUDA(cudaFreeAsync(b, nb));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    CHECK_CUDA(cudaStreamDestroy(blocking));
    CHECK_CUDA(cudaStreamDestroy(nb));
    return reused;
}

/* ptsz: thread 1 frees on its per-thread stream; thread 2 then allocates on its own. */
static void *freed_block;
static pthread_mutex_t turn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_cond = PTHREAD_COND_INITIALIZER;
static int turn;

static void wait_turn(int t)
{
    pthread_mutex_lock(&turn_lock);
    while (turn != t)
        pthread_cond_wait(&turn_cond, &turn_lock);
    pthread_mutex_unlock(&turn_lock);
}

static void give_turn(int t)
{
    pthread_mutex_lock(&turn_lock);
    turn = t;
    pthread_cond_broadcast(&turn_cond);
    pthread_mutex_unlock(&turn_lock);
}

static void *ptsz_freer(void *arg)
{
    free_async_fn free_ptsz = (free_async_fn)dlsym(RTLD_DEFAULT, "cudaFreeAsync_ptsz");
    malloc_async_fn malloc_ptsz = (malloc_async_fn)dlsym(RTLD_DEFAULT, "cudaMallocAsync_ptsz");
    (void)arg;
    for (int round = 0; round < ROUNDS; round++) {
        wait_turn(2 * round);
        void *a;
        CHECK_CUDA(malloc_ptsz(&a, N, 0));
        CHECK_CUDA(cudasim_launch_fill(a, N, 200000, 0xEE, cudaStreamPerThread));
        CHECK_CUDA(free_ptsz(a, 0));
        freed_block = a;
        give_turn(2 * round + 1);
    }
    return NULL;
}

static void *ptsz_taker(void *arg)
{
    free_async_fn free_ptsz = (free_async_fn)dlsym(RTLD_DEFAULT, "cudaFreeAsync_ptsz");
    malloc_async_fn malloc_ptsz = (malloc_async_fn)dlsym(RTLD_DEFAULT, "cudaMallocAsync_ptsz");
    int *reused = arg;
    for (int round = 0; round < ROUNDS; round++) {
        wait_turn(2 * round + 1);
        void *b;
        CHECK_CUDA(malloc_ptsz(&b, N, 0));
        *reused += b == freed_block;
        own_and_check(b, cudaStreamPerThread);
        CHECK_CUDA(free_ptsz(b, 0));
        CHECK_CUDA(cudaDeviceSynchronize());
        give_turn(2 * round + 2);
    }
    return NULL;
}

static int destroyed(void)
{
    int reused = 0;
    for (int round = 0; round < ROUNDS; round++) {
        cudaStream_t s, t;
        void *a, *b;
        CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CHECK_CUDA(cudaMallocAsync(&a, N, s));
        CHECK_CUDA(cudasim_launch_fill(a, N, 200000, 0xEE, s));
        CHECK_CUDA(cudaFreeAsync(a, s));
        CHECK_CUDA(cudaStreamDestroy(s));
        CHECK_CUDA(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
        CHECK_CUDA(cudaMallocAsync(&b, N, t));
        reused += b == a;
        own_and_check(b, t);
        CHECK_CUDA(cudaFreeAsync(b, t));
        CHECK_CUDA(cudaStreamDestroy(t));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    return reused;
}

static int ptsz(void)
{
    pthread_t t1, t2;
    int reused = 0;
    CHECK(dlsym(RTLD_DEFAULT, "cudaFreeAsync_ptsz") && dlsym(RTLD_DEFAULT, "cudaMallocAsync_ptsz"),
          "the _ptsz forms");
    CHECK(pthread_create(&t1, NULL, ptsz_freer, NULL) == 0, "pthread_create");
    CHECK(pthread_create(&t2, NULL, ptsz_taker, &reused) == 0, "pthread_create");
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    return reused;
}

int main(int argc, char **argv)
{
    int reused;
    CHECK(argc == 2, "usage: stream_reuse SCENARIO");
    CHECK_CUDA(cudaFree(0));
    if (strcmp(argv[1], "nb_after_free") == 0)
        reused = nb_after_free();
    else if (strcmp(argv[1], "nb_requester") == 0)
        reused = nb_requester();
    else if (strcmp(argv[1], "ptsz") == 0)
        reused = ptsz();
    else if (strcmp(argv[1], "destroyed") == 0)
        reused = destroyed();
    else
        CHECK(0, "unknown scenario %s", argv[1]);
    printf("reused=%d\n", reused);
    printf("stream_reuse ok\n");
    return 0;
}
