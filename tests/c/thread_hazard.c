/* In-flight work with several threads on one device (contract item 2, thread caches). Each
 * thread launches a short simulated kernel on every block it allocates, on a non-blocking
 * stream of its own, and frees blocks while their kernels may still run; every allocation
 * checks that no kernel in flight uses the block it got. Threads that allocate at the same time
 * on one device make the pool start thread caches (in `strict` and `barrier` mode too), where
 * a freed block waits for a fence in its thread's cache: this checks that the caches' epochs
 * and own fences never hand such a block out early. A fifth of the frees go through a shared
 * mailbox to whichever thread takes them (a free into another thread's cache), and now and then
 * a thread synchronizes the device (a program fence the caches' blocks wait on too). A
 * kernel's late write also lands on a block's tag, which is checked at the end.
 *
 * The threads first allocate and free small blocks in strict turns, so that the device's lock
 * goes from one to the next on every call and the pool starts the caches (however the machine
 * schedules them); then the checked loop runs.
 *
 * usage: thread_hazard THREADS ITERS [SEED] */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>

#include "check.h"

#define MAX_LIVE 6

static int g_iters;
static uint64_t g_seed = 1;
static unsigned long long g_checked;
static int g_threads;
static unsigned g_turn;

typedef struct {
    void *p;
    size_t n;
    unsigned char tag;
} block_t;

/* Blocks one thread hands to another to free. */
#define MAILBOX 32
static void *g_box[MAILBOX];
static int g_boxed;
static pthread_mutex_t g_box_lock = PTHREAD_MUTEX_INITIALIZER;

/* Put `p` in the mailbox; false when it is full. */
static int post(void *p)
{
    int ok;
    pthread_mutex_lock(&g_box_lock);
    ok = g_boxed < MAILBOX;
    if (ok)
        g_box[g_boxed++] = p;
    pthread_mutex_unlock(&g_box_lock);
    return ok;
}

/* A block from the mailbox, or NULL. */
static void *collect(void)
{
    void *p = NULL;
    pthread_mutex_lock(&g_box_lock);
    if (g_boxed > 0)
        p = g_box[--g_boxed];
    pthread_mutex_unlock(&g_box_lock);
    return p;
}

static void *worker(void *arg)
{
    uint64_t rng = g_seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(uintptr_t)arg + 1);
    static const size_t sizes[6] = {4096, 20000, 65536, 262144, 1u << 20, 3u << 20};
    block_t live[MAX_LIVE];
    int n = 0, i;
    unsigned long long checked = 0;
    cudaStream_t s;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (i = 0; i < 1500; i++) {
        void *p;
        while (__atomic_load_n(&g_turn, __ATOMIC_ACQUIRE) % (unsigned)g_threads !=
               (unsigned)(uintptr_t)arg)
            sched_yield();
        CHECK_CUDA(cudaMalloc(&p, 4096));
        CHECK_CUDA(cudaFree(p));
        __atomic_fetch_add(&g_turn, 1, __ATOMIC_RELEASE);
    }
    for (i = 0; i < g_iters; i++) {
        void *other;
        if (rng_next(&rng) % 100 < 20 && (other = collect()) != NULL)
            CHECK_CUDA(cudaFree(other)); /* another thread's block, its kernel maybe running */
        if (rng_next(&rng) % 500 == 0)
            CHECK_CUDA(cudaDeviceSynchronize());
        if (n == MAX_LIVE || (n > 0 && rng_next(&rng) % 100 < 45)) {
            int k = (int)(rng_next(&rng) % (uint64_t)n);
            /* Freed while its kernel may still run, here or by another thread. */
            if (rng_next(&rng) % 100 >= 20 || !post(live[k].p))
                CHECK_CUDA(cudaFree(live[k].p));
            live[k] = live[--n];
            continue;
        }
        block_t b;
        b.n = sizes[rng_next(&rng) % 6];
        b.tag = (unsigned char)(rng_next(&rng) % 255 + 1);
        CHECK_CUDA(cudaMalloc(&b.p, b.n));
        CHECK(cudasimRangeBusy(b.p, b.n) == 0,
              "thread %d: got %p (%zu bytes) while a kernel on it is in flight", (int)(uintptr_t)arg,
              b.p, b.n);
        checked++;
        /* Busy for 20-120 us, then writes the tag over the block. */
        CHECK_CUDA(cudasim_launch_fill(b.p, b.n, 20 + (unsigned)(rng_next(&rng) % 100), b.tag, s));
        live[n++] = b;
    }
    /* The last kernels done, every block still holds its own kernel's tag. */
    CHECK_CUDA(cudaStreamSynchronize(s));
    while (n > 0) {
        block_t b = live[--n];
        check_tag(b.p, b.n, b.tag);
        CHECK_CUDA(cudaFree(b.p));
    }
    CHECK_CUDA(cudaStreamDestroy(s));
    __atomic_fetch_add(&g_checked, checked, __ATOMIC_RELAXED);
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t tid[16];
    int threads, t;
    CHECK(argc >= 3, "usage: thread_hazard THREADS ITERS [SEED]");
    threads = atoi(argv[1]);
    g_iters = atoi(argv[2]);
    if (argc > 3)
        g_seed = strtoull(argv[3], NULL, 10) + 1;
    CHECK(threads >= 1 && threads <= 16 && g_iters > 0, "arguments");
    g_threads = threads;
    for (t = 0; t < threads; t++)
        CHECK(pthread_create(&tid[t], NULL, worker, (void *)(uintptr_t)t) == 0, "thread");
    for (t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    for (void *p = collect(); p != NULL; p = collect())
        CHECK_CUDA(cudaFree(p));
    printf("allocations checked %llu\n", g_checked);
    printf("thread hazard ok\n");
    return 0;
}
