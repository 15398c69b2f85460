/* Hostile stream-ordered allocation (cudaMallocAsync/cudaFreeAsync, the route of PyTorch's
 * cudaMallocAsync backend). Each scenario frees a block that a slow kernel still writes (0xEE
 * when it completes), on a device with room for little more than that block, so that the next
 * request can only be served by it or by a fence. The new owner writes 0x42 and checks it once
 * every stream is done: a block handed out before the old kernel's work is ordered before the
 * new owner's is caught by the late 0xEE.
 *
 * Linked with the runtime and -lcuda: the driver's scenarios (cu_*) take the same routes through
 * cuMemAllocAsync/cuMemFreeAsync and their _ptsz forms; cu_reborn_* are reborn_* with the
 * driver's stream calls.
 *
 * usage: async_hostile SCENARIO
 * Prints "reused=N" (rounds whose request got the freed block back), "reborn=N" (rounds whose
 * new stream got a destroyed one's handle) and "async_hostile ok". */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <pthread.h>

#include "cuda.h"

#include "check.h"

static size_t N = 12u << 20;
#define SLOW 200000 /* microseconds */
#define ROUNDS 3

static void own_and_check(void *b, size_t n, cudaStream_t s)
{
    CHECK_CUDA(cudasim_launch_fill(b, n, 0, 0x42, s));
    CHECK_CUDA(cudaDeviceSynchronize());
    check_tag(b, n, 0x42);
}

/* The stream calls of the scenarios that take either API (reborn_*): the driver's when set
 * (cu_reborn_*), as a static runtime's cudaStreamCreate, cudaMallocAsync and cudaFreeAsync
 * make them. */
static int cu_api;
/* The frees' API apart from the allocations' (mixed_*): the driver's when 1, the runtime's
 * when 2, else as cu_api says. */
static int free_api;
/* The device alloc_elsewhere's thread makes current. */
static int elsewhere_device;

static cudaStream_t make_stream(int nonblocking)
{
    cudaStream_t s;
    if (cu_api)
        CHECK_CU(cuStreamCreate((CUstream *)&s, nonblocking ? CU_STREAM_NON_BLOCKING : 0));
    else if (nonblocking)
        CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    else
        CHECK_CUDA(cudaStreamCreate(&s));
    return s;
}

static void destroy_stream(cudaStream_t s)
{
    if (cu_api)
        CHECK_CU(cuStreamDestroy((CUstream)s));
    else
        CHECK_CUDA(cudaStreamDestroy(s));
}

/* The kernel on S1, an event after it, S2 waits for the event and frees the block there: CUDA
 * orders S2's later work after the kernel, so the next request on S2 may take it at once. */
static int event_chain(int nonblocking)
{
    int reused = 0;
    cudaStream_t s1 = make_stream(nonblocking), s2 = make_stream(nonblocking);
    cudaEvent_t e;
    CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (int round = 0; round < ROUNDS; round++) {
        void *a, *b;
        CHECK_CUDA(cudaMallocAsync(&a, N, s1));
        CHECK_CUDA(cudasim_launch_fill(a, N, SLOW, 0xEE, s1));
        CHECK_CUDA(cudaEventRecord(e, s1));
        CHECK_CUDA(cudaStreamWaitEvent(s2, e, 0));
        CHECK_CUDA(cudaFreeAsync(a, s2));
        CHECK_CUDA(cudaMallocAsync(&b, N, s2));
        reused += b == a;
        own_and_check(b, N, s2);
        CHECK_CUDA(cudaFreeAsync(b, s2));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaEventDestroy(e));
    CHECK_CUDA(cudaStreamDestroy(s1));
    CHECK_CUDA(cudaStreamDestroy(s2));
    return reused;
}

/* Freed on S1 under its kernel, the block is split by a smaller request on S1 (which S1 orders),
 * and its remainder is asked for on another stream: not S1's to give. */
static int split_rest(int nonblocking)
{
    int reused = 0;
    cudaStream_t s1 = make_stream(nonblocking), s2 = make_stream(1);
    for (int round = 0; round < ROUNDS; round++) {
        void *a, *front, *rest;
        CHECK_CUDA(cudaMallocAsync(&a, N, s1));
        CHECK_CUDA(cudasim_launch_fill(a, N, SLOW, 0xEE, s1));
        CHECK_CUDA(cudaFreeAsync(a, s1));
        CHECK_CUDA(cudaMallocAsync(&front, N / 3, s1));
        CHECK_CUDA(cudaMallocAsync(&rest, N / 2, s2));
        reused += (char *)rest >= (char *)a && (char *)rest < (char *)a + N;
        CHECK_CUDA(cudasim_launch_fill(front, N / 3, 0, 0x42, s1));
        own_and_check(rest, N / 2, s2);
        check_tag(front, N / 3, 0x42);
        CHECK_CUDA(cudaFreeAsync(front, s1));
        CHECK_CUDA(cudaFreeAsync(rest, s2));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    CHECK_CUDA(cudaStreamDestroy(s1));
    CHECK_CUDA(cudaStreamDestroy(s2));
    return reused;
}

/* A cudaMallocAsync block freed with cudaFree under a kernel on a non-blocking stream, then
 * requested on another stream, in stream order and not. */
static int sync_free_of_async(void)
{
    int reused = 0;
    cudaStream_t s1 = make_stream(1), s2 = make_stream(1);
    for (int round = 0; round < ROUNDS; round++) {
        void *a, *b;
        CHECK_CUDA(cudaMallocAsync(&a, N, s1));
        CHECK_CUDA(cudasim_launch_fill(a, N, SLOW, 0xEE, s1));
        CHECK_CUDA(cudaFree(a));
        if (round % 2)
            CHECK_CUDA(cudaMalloc(&b, N));
        else
            CHECK_CUDA(cudaMallocAsync(&b, N, s2));
        reused += b == a;
        own_and_check(b, N, s2);
        CHECK_CUDA(cudaFree(b));
    }
    CHECK_CUDA(cudaStreamDestroy(s1));
    CHECK_CUDA(cudaStreamDestroy(s2));
    return reused;
}

/* A cudaMalloc block freed with cudaFreeAsync on a non-blocking stream under its kernel; the
 * next owner asks with cudaMalloc, or in stream order on the legacy or the per-thread stream. */
static int async_free_of_sync(void)
{
    int reused = 0;
    cudaStream_t s1 = make_stream(1);
    cudaStream_t next[ROUNDS] = {0, cudaStreamPerThread, 0};
    for (int round = 0; round < ROUNDS; round++) {
        void *a, *b;
        CHECK_CUDA(cudaMalloc(&a, N));
        CHECK_CUDA(cudasim_launch_fill(a, N, SLOW, 0xEE, s1));
        CHECK_CUDA(cudaFreeAsync(a, s1));
        if (round == 2)
            CHECK_CUDA(cudaMalloc(&b, N));
        else
            CHECK_CUDA(cudaMallocAsync(&b, N, next[round]));
        reused += b == a;
        own_and_check(b, N, next[round]);
        CHECK_CUDA(cudaFree(b));
    }
    CHECK_CUDA(cudaStreamDestroy(s1));
    return reused;
}

/* A non-blocking stream's free, then the legacy stream's request: the legacy stream does not
 * wait for a non-blocking stream. */
static int nonblocking_to_legacy(void)
{
    int reused = 0;
    cudaStream_t s1 = make_stream(1);
    for (int round = 0; round < ROUNDS; round++) {
        void *a, *b;
        CHECK_CUDA(cudaMallocAsync(&a, N, s1));
        CHECK_CUDA(cudasim_launch_fill(a, N, SLOW, 0xEE, s1));
        CHECK_CUDA(cudaFreeAsync(a, s1));
        CHECK_CUDA(cudaMallocAsync(&b, N, 0));
        reused += b == a;
        own_and_check(b, N, 0);
        CHECK_CUDA(cudaFreeAsync(b, 0));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    CHECK_CUDA(cudaStreamDestroy(s1));
    return reused;
}

/* A blocking stream destroyed with a free pending on it; the block is asked for on the legacy
 * stream, then on a stream created next, and the destroyed stream is refused as CUDA refuses. */
static int destroyed_blocking(void)
{
    int reused = 0;
    for (int round = 0; round < ROUNDS; round++) {
        cudaStream_t s = make_stream(0), t;
        void *a, *b, *c = NULL;
        CHECK_CUDA(cudaMallocAsync(&a, N, s));
        CHECK_CUDA(cudasim_launch_fill(a, N, SLOW, 0xEE, s));
        CHECK_CUDA(cudaFreeAsync(a, s));
        CHECK_CUDA(cudaStreamDestroy(s));
        cudaError_t r = cudaMallocAsync(&c, 4096, s);
        CHECK(r == cudaErrorInvalidResourceHandle, "cudaMallocAsync on a destroyed stream: %d",
              (int)r);
        CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle, "its last error");
        t = make_stream(0);
        CHECK_CUDA(cudaMallocAsync(&b, N, round % 2 ? t : 0));
        reused += b == a;
        own_and_check(b, N, round % 2 ? t : 0);
        CHECK_CUDA(cudaFreeAsync(b, t));
        CHECK_CUDA(cudaStreamDestroy(t));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    return reused;
}

/* cudaMallocAsync of `n` bytes on `s` by the calling thread (cuMemAllocAsync with cu_api). */
static void *alloc_here(cudaStream_t s, size_t n)
{
    if (cu_api) {
        CUdeviceptr p;
        CHECK_CU(cuMemAllocAsync(&p, n, (CUstream)s));
        return (void *)(uintptr_t)p;
    }
    void *p;
    CHECK_CUDA(cudaMallocAsync(&p, n, s));
    return p;
}

/* cudaFreeAsync of `p` on `s` (cuMemFreeAsync with cu_api). */
static void free_async(void *p, cudaStream_t s)
{
    if (free_api ? free_api == 1 : cu_api)
        CHECK_CU(cuMemFreeAsync((CUdeviceptr)(uintptr_t)p, (CUstream)s));
    else
        CHECK_CUDA(cudaFreeAsync(p, s));
}

/* `a`, written on `t` by a slow kernel and freed there, is asked for on a third stream made
 * now: 1 when that request got it. `own_and_check` fails the run if the kernel's late write
 * lands over the new owner's data. Destroys `t`. */
static int freed_under_a_kernel_then_asked_elsewhere(void *a, cudaStream_t t)
{
    CHECK_CUDA(cudasim_launch_fill(a, N, SLOW, 0xEE, t));
    free_async(a, t);
    cudaStream_t u = make_stream(1);
    void *b = alloc_here(u, N);
    int reused = b == a;
    own_and_check(b, N, u);
    free_async(b, u);
    CHECK_CUDA(cudaDeviceSynchronize());
    destroy_stream(t);
    destroy_stream(u);
    return reused;
}

/* A stream destroyed and another made at its handle (CUDA reuses handles, never ids): the block
 * the old stream allocated, written on the new one and freed there under the kernel, is not a
 * third stream's before the kernel is done. An allocation on the old stream came just before, so
 * the free on the new one may take the old one's id. Counts in `reborn` the rounds whose new
 * stream got the old one's handle. */
static int reborn_handle(int *reborn)
{
    int reused = 0;
    for (int round = 0; round < ROUNDS; round++) {
        cudaStream_t s = make_stream(1), t;
        void *a = alloc_here(s, N);
        free_async(alloc_here(s, 4096), s);
        CHECK_CUDA(cudaStreamSynchronize(s));
        destroy_stream(s);
        t = make_stream(1);
        *reborn += t == s;
        reused += freed_under_a_kernel_then_asked_elsewhere(a, t);
    }
    return reused;
}

/* cudaMallocAsync of `n` bytes on `s` by another thread, which then exits. */
struct alloc_on {
    cudaStream_t s;
    size_t n;
    void *p;
};

static void *alloc_thread(void *arg)
{
    struct alloc_on *a = arg;
    /* A new thread has no current context for the driver's calls: the runtime's make one. */
    if (cu_api || elsewhere_device)
        CHECK_CUDA(cudaSetDevice(elsewhere_device));
    a->p = alloc_here(a->s, a->n);
    return NULL;
}

static void *alloc_elsewhere(cudaStream_t s, size_t n)
{
    struct alloc_on a = {s, n, NULL};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, alloc_thread, &a) == 0, "pthread_create");
    pthread_join(th, NULL);
    return a.p;
}

/* A stream made at a destroyed one's handle is a stream like any other: its request takes the
 * block its free gave back under its kernel at once, in stream order, as the runtime's pool
 * would, without the host waiting for the kernel. This thread's frees named the destroyed
 * stream at that handle just before; `alloc` makes the allocations (this thread's or another's).
 * Counts the rounds whose request got the block while the kernel still ran, in `reborn` those
 * whose new stream got the old one's handle. */
static int reborn_reuse(void *(*alloc)(cudaStream_t, size_t), int *reborn)
{
    int reused = 0;
    for (int round = 0; round < ROUNDS; round++) {
        cudaStream_t s = make_stream(0), t;
        free_async(alloc(s, 4096), s);
        free_async(alloc(s, 4096), s);
        CHECK_CUDA(cudaStreamSynchronize(s));
        destroy_stream(s);
        t = make_stream(0);
        *reborn += t == s;
        void *a = alloc(t, N);
        CHECK_CUDA(cudasim_launch_fill(a, N, SLOW, 0xEE, t));
        free_async(a, t);
        void *b = alloc(t, N);
        cudaError_t busy = cudaStreamQuery(t);
        CHECK(busy == cudaSuccess || busy == cudaErrorNotReady, "cudaStreamQuery: %d", (int)busy);
        reused += b == a && busy == cudaErrorNotReady;
        own_and_check(b, N, t);
        free_async(b, t);
        CHECK_CUDA(cudaDeviceSynchronize());
        destroy_stream(t);
    }
    return reused;
}

/* Two devices: this thread's last allocation named a stream of device 0, destroyed; a stream
 * of device 1 made at its handle, where another thread allocates a block that this thread frees
 * under a kernel with device 1 current: the free takes the destroyed stream's id, and the block
 * is not device 1's next stream's before the kernel is done. */
static int reborn_other_device(int *reborn)
{
    int reused = 0;
    for (int round = 0; round < ROUNDS; round++) {
        CHECK_CUDA(cudaSetDevice(0));
        cudaStream_t s = make_stream(1), t;
        free_async(alloc_here(s, 4096), s);
        CHECK_CUDA(cudaStreamSynchronize(s));
        destroy_stream(s);
        CHECK_CUDA(cudaSetDevice(1));
        t = make_stream(1);
        *reborn += t == s;
        elsewhere_device = 1;
        void *a = alloc_elsewhere(t, N);
        elsewhere_device = 0;
        reused += freed_under_a_kernel_then_asked_elsewhere(a, t);
    }
    CHECK_CUDA(cudaSetDevice(0));
    return reused;
}

/* Two devices: a block of device 1 freed on device 1's stream while device 0 is current, then
 * asked for on that stream with device 1 current, and on device 1's legacy stream. */
static int two_devices(void)
{
    int reused = 0;
    cudaStream_t s1;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    for (int round = 0; round < ROUNDS; round++) {
        void *a, *b;
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMallocAsync(&a, N, s1));
        CHECK_CUDA(cudasim_launch_fill(a, N, SLOW, 0xEE, s1));
        CHECK_CUDA(cudaSetDevice(0));
        CHECK_CUDA(cudaFreeAsync(a, s1));
        CHECK_CUDA(cudaSetDevice(1));
        cudaStream_t on = round % 2 ? 0 : s1;
        CHECK_CUDA(cudaMallocAsync(&b, N, on));
        reused += b == a;
        own_and_check(b, N, on);
        CHECK_CUDA(cudaFreeAsync(b, on));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    CHECK_CUDA(cudaStreamDestroy(s1));
    CHECK_CUDA(cudaSetDevice(0));
    return reused;
}

/* The driver's _ptsz forms on two threads: each thread's per-thread default stream is its own,
 * so a block one frees there is not the other's to take at once. */
static CUdeviceptr cu_freed;
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

static void *cu_ptsz_freer(void *arg)
{
    (void)arg;
    CHECK_CUDA(cudaSetDevice(0));
    for (int round = 0; round < ROUNDS; round++) {
        wait_turn(2 * round);
        CUdeviceptr a;
        CHECK_CU(cuMemAllocAsync_ptsz(&a, N, NULL));
        CHECK_CU(cudasim_cu_launch_fill(a, N, SLOW, 0xEE, CU_STREAM_PER_THREAD));
        CHECK_CU(cuMemFreeAsync_ptsz(a, NULL));
        cu_freed = a;
        give_turn(2 * round + 1);
    }
    return NULL;
}

static void *cu_ptsz_taker(void *arg)
{
    int *reused = arg;
    CHECK_CUDA(cudaSetDevice(0));
    for (int round = 0; round < ROUNDS; round++) {
        wait_turn(2 * round + 1);
        CUdeviceptr b;
        CHECK_CU(cuMemAllocAsync_ptsz(&b, N, NULL));
        *reused += b == cu_freed;
        CHECK_CU(cudasim_cu_launch_fill(b, N, 0, 0x42, CU_STREAM_PER_THREAD));
        CHECK_CUDA(cudaDeviceSynchronize());
        check_tag((void *)b, N, 0x42);
        CHECK_CU(cuMemFreeAsync_ptsz(b, NULL));
        CHECK_CUDA(cudaDeviceSynchronize());
        give_turn(2 * round + 2);
    }
    return NULL;
}

static int cu_ptsz(void)
{
    pthread_t t1, t2;
    int reused = 0;
    CHECK(pthread_create(&t1, NULL, cu_ptsz_freer, NULL) == 0, "pthread_create");
    CHECK(pthread_create(&t2, NULL, cu_ptsz_taker, &reused) == 0, "pthread_create");
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    return reused;
}

/* cuMemFreeAsync on a non-blocking stream under its kernel, then cuMemAllocAsync on the legacy
 * stream, on another non-blocking stream, and cuMemAlloc. */
static int cu_other_stream(void)
{
    int reused = 0;
    CUstream s1, s2;
    CHECK_CU(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CUstream next[ROUNDS] = {NULL, s2, NULL};
    for (int round = 0; round < ROUNDS; round++) {
        CUdeviceptr a, b;
        CHECK_CU(cuMemAllocAsync(&a, N, s1));
        CHECK_CU(cudasim_cu_launch_fill(a, N, SLOW, 0xEE, s1));
        CHECK_CU(cuMemFreeAsync(a, s1));
        if (round == 2)
            CHECK_CU(cuMemAlloc(&b, N));
        else
            CHECK_CU(cuMemAllocAsync(&b, N, next[round]));
        reused += b == a;
        CHECK_CU(cudasim_cu_launch_fill(b, N, 0, 0x42, next[round]));
        CHECK_CUDA(cudaDeviceSynchronize());
        check_tag((void *)b, N, 0x42);
        CHECK_CU(cuMemFree(b));
    }
    CHECK_CU(cuStreamDestroy(s1));
    CHECK_CU(cuStreamDestroy(s2));
    return reused;
}

/* Churn on two devices: threads allocate on either device, in stream order on one of its four
 * kinds of stream or not, a kernel writes the block's tag, and the block is freed with either
 * device current: cudaFree, or cudaFreeAsync on its stream (a created stream names its own
 * device whatever is current; the default streams only while the block's device is current).
 * A tag replaced by another block's late write, or a block handed out over a live one, fails. */
#define C_THREADS 4
#define C_LIVE 10
static struct {
    uintptr_t at;
    size_t n;
} c_all[C_THREADS * C_LIVE];
static pthread_mutex_t c_lock = PTHREAD_MUTEX_INITIALIZER;
static int c_relaxed;

static void c_enter(int slot, void *p, size_t n)
{
    pthread_mutex_lock(&c_lock);
    for (int i = 0; i < C_THREADS * C_LIVE; i++) {
        CHECK(c_all[i].n == 0 || (uintptr_t)p + n <= c_all[i].at ||
                  c_all[i].at + c_all[i].n <= (uintptr_t)p,
              "%p+%zu handed out over a live block", p, n);
    }
    c_all[slot].at = (uintptr_t)p;
    c_all[slot].n = n;
    pthread_mutex_unlock(&c_lock);
}

static void *c_worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    uint64_t rng = 977 + (uint64_t)t * 7919;
    cudaStream_t streams[2][4];
    struct {
        void *p;
        size_t n;
        int dev, s;
        unsigned char tag;
    } live[C_LIVE];
    static const size_t sizes[] = {4096, 300 << 10, 3u << 20, 12u << 20};
    memset(live, 0, sizeof live);
    for (int d = 0; d < 2; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        streams[d][0] = 0;
        streams[d][1] = cudaStreamPerThread;
        CHECK_CUDA(cudaStreamCreate(&streams[d][2]));
        CHECK_CUDA(cudaStreamCreateWithFlags(&streams[d][3], cudaStreamNonBlocking));
    }
    for (int it = 0; it < 600; it++) {
        int k = (int)(rng_next(&rng) % C_LIVE);
        if (live[k].p) {
            CHECK_CUDA(cudaSetDevice(live[k].dev));
            CHECK_CUDA(cudaStreamSynchronize(streams[live[k].dev][live[k].s]));
            check_tag(live[k].p, live[k].n, live[k].tag);
            pthread_mutex_lock(&c_lock);
            c_all[t * C_LIVE + k].n = 0;
            pthread_mutex_unlock(&c_lock);
            int other = (int)(rng_next(&rng) % 2);
            CHECK_CUDA(cudaSetDevice(other ? 1 - live[k].dev : live[k].dev));
            int async = c_relaxed || rng_next(&rng) % 2;
            if (async && (!other || live[k].s >= 2))
                CHECK_CUDA(cudaFreeAsync(live[k].p, streams[live[k].dev][live[k].s]));
            else if (!c_relaxed)
                CHECK_CUDA(cudaFree(live[k].p));
            else {
                CHECK_CUDA(cudaSetDevice(live[k].dev));
                CHECK_CUDA(cudaFreeAsync(live[k].p, streams[live[k].dev][live[k].s]));
            }
            live[k].p = NULL;
            continue;
        }
        live[k].dev = (int)(rng_next(&rng) % 2);
        live[k].s = (int)(rng_next(&rng) % 4);
        live[k].n = sizes[rng_next(&rng) % 4] - (rng_next(&rng) % 3) * 512;
        live[k].tag = (unsigned char)(1 + rng_next(&rng) % 250);
        CHECK_CUDA(cudaSetDevice(live[k].dev));
        cudaStream_t st = streams[live[k].dev][live[k].s];
        if (rng_next(&rng) % 2)
            CHECK_CUDA(cudaMallocAsync(&live[k].p, live[k].n, st));
        else
            CHECK_CUDA(cudaMalloc(&live[k].p, live[k].n));
        c_enter(t * C_LIVE + k, live[k].p, live[k].n);
        CHECK_CUDA(cudasim_launch_fill(live[k].p, live[k].n,
                                       (unsigned)(rng_next(&rng) % 3000), live[k].tag, st));
    }
    for (int k = 0; k < C_LIVE; k++) {
        if (live[k].p) {
            CHECK_CUDA(cudaSetDevice(live[k].dev));
            CHECK_CUDA(cudaStreamSynchronize(streams[live[k].dev][live[k].s]));
            check_tag(live[k].p, live[k].n, live[k].tag);
            pthread_mutex_lock(&c_lock);
            c_all[t * C_LIVE + k].n = 0;
            pthread_mutex_unlock(&c_lock);
            CHECK_CUDA(cudaFreeAsync(live[k].p, streams[live[k].dev][live[k].s]));
        }
    }
    for (int d = 0; d < 2; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaStreamDestroy(streams[d][2]));
        CHECK_CUDA(cudaStreamDestroy(streams[d][3]));
    }
    return NULL;
}

static int churn_two_devices(int relaxed)
{
    pthread_t th[C_THREADS];
    c_relaxed = relaxed;
    for (int t = 0; t < C_THREADS; t++)
        CHECK(pthread_create(&th[t], NULL, c_worker, (void *)(intptr_t)t) == 0, "pthread_create");
    for (int t = 0; t < C_THREADS; t++)
        pthread_join(th[t], NULL);
    CHECK(sim_stats(1).unmapped_while_busy == 0, "granules unmapped under a kernel on device 1");
    return 0;
}

int main(int argc, char **argv)
{
    int reused = -1, reborn = 0;
    CHECK(argc == 2, "usage: async_hostile SCENARIO");
    CHECK_CUDA(cudaFree(0));
    if (getenv("ASYNC_HOSTILE_BYTES"))
        N = strtoull(getenv("ASYNC_HOSTILE_BYTES"), NULL, 10);
    const char *s = argv[1];
    if (strcmp(s, "event_chain") == 0)
        reused = event_chain(0);
    else if (strcmp(s, "event_chain_nb") == 0)
        reused = event_chain(1);
    else if (strcmp(s, "split_rest") == 0)
        reused = split_rest(0);
    else if (strcmp(s, "split_rest_nb") == 0)
        reused = split_rest(1);
    else if (strcmp(s, "sync_free_of_async") == 0)
        reused = sync_free_of_async();
    else if (strcmp(s, "async_free_of_sync") == 0)
        reused = async_free_of_sync();
    else if (strcmp(s, "nonblocking_to_legacy") == 0)
        reused = nonblocking_to_legacy();
    else if (strcmp(s, "destroyed_blocking") == 0)
        reused = destroyed_blocking();
    else if (strcmp(s, "reborn_handle") == 0)
        reused = reborn_handle(&reborn);
    else if (strcmp(s, "reborn_own_reuse") == 0)
        reused = reborn_reuse(alloc_here, &reborn);
    else if (strcmp(s, "reborn_free_only") == 0)
        reused = reborn_reuse(alloc_elsewhere, &reborn);
    else if (strncmp(s, "cu_reborn_", 10) == 0) {
        cu_api = 1;
        if (strcmp(s + 10, "handle") == 0)
            reused = reborn_handle(&reborn);
        else if (strcmp(s + 10, "own_reuse") == 0)
            reused = reborn_reuse(alloc_here, &reborn);
        else if (strcmp(s + 10, "free_only") == 0)
            reused = reborn_reuse(alloc_elsewhere, &reborn);
        else if (strcmp(s + 10, "other_device") == 0)
            reused = reborn_other_device(&reborn);
        else
            CHECK(0, "unknown scenario %s", s);
    }
    else if (strncmp(s, "mixed_", 6) == 0) {
        /* mixed_cu_*: the driver's allocations, the runtime's frees; mixed_*: the reverse. */
        cu_api = strncmp(s + 6, "cu_", 3) == 0;
        free_api = cu_api ? 2 : 1;
        const char *what = s + 6 + 3 * cu_api;
        if (strcmp(what, "reborn_handle") == 0)
            reused = reborn_handle(&reborn);
        else if (strcmp(what, "reborn_own_reuse") == 0)
            reused = reborn_reuse(alloc_here, &reborn);
        else if (strcmp(what, "reborn_other_device") == 0)
            reused = reborn_other_device(&reborn);
        else
            CHECK(0, "unknown scenario %s", s);
    }
    else if (strcmp(s, "reborn_other_device") == 0)
        reused = reborn_other_device(&reborn);
    else if (strcmp(s, "two_devices") == 0)
        reused = two_devices();
    else if (strcmp(s, "churn_two_devices") == 0)
        reused = churn_two_devices(0);
    else if (strcmp(s, "churn_two_devices_relaxed") == 0)
        reused = churn_two_devices(1);
    else if (strcmp(s, "cu_ptsz") == 0)
        reused = cu_ptsz();
    else if (strcmp(s, "cu_other_stream") == 0)
        reused = cu_other_stream();
    else
        CHECK(0, "unknown scenario %s", s);
    CHECK(sim_stats(0).unmapped_while_busy == 0, "granules unmapped under a kernel");
    printf("reused=%d\n", reused);
    printf("reborn=%d\n", reborn);
    printf("async_hostile ok\n");
    return 0;
}
