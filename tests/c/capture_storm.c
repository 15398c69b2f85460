/* Many threads begin and end graph captures, every form (runtime, driver, `_ptsz`; global,
 * thread-local and relaxed modes; new graphs and the program's own), while other threads
 * allocate and free on two devices, in relaxed mode so that nothing of the program's own
 * refuses or invalidates a capture: every begin and end succeeds without the pool. The pool
 * fences and issues barriers meanwhile. Capture threads pause GAP_US (random up to it) between
 * captures. Usage: capture_storm NCAPTURE NALLOC ITERS GAP_US. Prints "begin_fail=N",
 * "end_fail=N" (with the first failure's form and code), "malloc_fail=N" and
 * "capture_storm ok". */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <pthread.h>
#include <time.h>

#include "cuda.h"
#include "check.h"

cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);

#define FORMS 9

static int iters;
static long gap_us;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int begin_fail, end_fail, malloc_fail, first_form = -1, first_code, first_begin;

static void pause_us(long us)
{
    struct timespec pause = {us / 1000000, (us % 1000000) * 1000L};
    nanosleep(&pause, NULL);
}

static void failed(int *count, int form, int code, int begin)
{
    pthread_mutex_lock(&lock);
    if (*count == 0 && first_form < 0) {
        first_form = form;
        first_code = code;
        first_begin = begin;
    }
    (*count)++;
    pthread_mutex_unlock(&lock);
}

/* One capture of form `form` on `s` (blocking) or `nb` (non-blocking). */
static void capture(int form, cudaStream_t s, cudaStream_t nb, cudaGraph_t own)
{
    cudaGraph_t graph = NULL;
    int b, e = -1;
    switch (form) {
    case 0:
        b = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        if (b == 0)
            e = cudaStreamEndCapture(s, &graph);
        break;
    case 1:
        b = cudaStreamBeginCapture(nb, cudaStreamCaptureModeThreadLocal);
        if (b == 0)
            e = cudaStreamEndCapture(nb, &graph);
        break;
    case 2:
        b = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
        if (b == 0)
            e = cudaStreamEndCapture(s, &graph);
        break;
    case 3:
        b = cudaStreamBeginCapture_ptsz(NULL, cudaStreamCaptureModeGlobal);
        if (b == 0)
            e = cudaStreamEndCapture_ptsz(NULL, &graph);
        break;
    case 4:
        b = cudaStreamBeginCaptureToGraph(s, own, NULL, NULL, 0, cudaStreamCaptureModeGlobal);
        if (b == 0)
            e = cudaStreamEndCapture(s, &graph);
        graph = NULL; /* the program's own */
        break;
    case 5:
        b = cuStreamBeginCapture_v2((CUstream)s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        if (b == 0)
            e = cuStreamEndCapture((CUstream)s, (CUgraph *)&graph);
        break;
    case 6:
        b = cuStreamBeginCapture((CUstream)nb);
        if (b == 0)
            e = cuStreamEndCapture((CUstream)nb, (CUgraph *)&graph);
        break;
    case 7:
        b = cuStreamBeginCapture_v2_ptsz(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_GLOBAL);
        if (b == 0)
            e = cuStreamEndCapture_ptsz(CU_STREAM_PER_THREAD, (CUgraph *)&graph);
        break;
    default:
        b = cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed);
        if (b == 0)
            e = cudaStreamEndCapture(cudaStreamPerThread, &graph);
        break;
    }
    if (b != 0)
        failed(&begin_fail, form, b, 1);
    else if (e != 0)
        failed(&end_fail, form, e, 0);
    if (graph)
        cudaGraphDestroy(graph);
    (void)cudaGetLastError();
}

static void *capturer(void *arg)
{
    long id = (long)arg;
    uint64_t seed = 0x9e3779b97f4a7c15ULL * (uint64_t)(id + 1);
    CHECK_CUDA(cudaSetDevice((int)(id % 2)));
    cudaStream_t s, nb;
    cudaGraph_t own;
    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK_CUDA(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    CHECK_CUDA(cudaGraphCreate(&own, 0));
    for (int i = 0; i < iters; i++) {
        capture((int)((i + id) % FORMS), s, nb, own);
        if (gap_us > 0)
            pause_us((long)(rng_next(&seed) % (uint64_t)gap_us));
    }
    CHECK_CUDA(cudaGraphDestroy(own));
    CHECK_CUDA(cudaStreamDestroy(nb));
    CHECK_CUDA(cudaStreamDestroy(s));
    return NULL;
}

static void *allocator(void *arg)
{
    long id = (long)arg;
    uint64_t seed = 0x2545f4914f6cdd1dULL * (uint64_t)(id + 7);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
    CHECK_CUDA(cudaSetDevice((int)(id % 2)));
    void *held[4];
    for (int i = 0; i < iters; i++) {
        int n = 0;
        for (int k = 0; k < 4; k++) {
            size_t bytes = (size_t)(1 + rng_next(&seed) % 4) << 20;
            void *p = NULL;
            int r = cudaMalloc(&p, bytes);
            if (r == 0)
                held[n++] = p;
            else
                failed(&malloc_fail, 100 + k, r, 0);
            (void)cudaGetLastError();
        }
        for (int k = 0; k < n; k++)
            CHECK_CUDA(cudaFree(held[k]));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    CHECK(argc == 5, "usage: capture_storm NCAPTURE NALLOC ITERS GAP_US");
    int ncap = atoi(argv[1]), nalloc = atoi(argv[2]);
    iters = atoi(argv[3]);
    gap_us = atol(argv[4]);
    CHECK(ncap <= 64 && nalloc <= 64, "at most 64 threads of each");
    pthread_t t[128];
    int n = 0;
    for (long i = 0; i < nalloc; i++)
        CHECK(pthread_create(&t[n++], NULL, allocator, (void *)i) == 0, "pthread_create");
    for (long i = 0; i < ncap; i++)
        CHECK(pthread_create(&t[n++], NULL, capturer, (void *)i) == 0, "pthread_create");
    for (int i = 0; i < n; i++)
        CHECK(pthread_join(t[i], NULL) == 0, "pthread_join");
    printf("begin_fail=%d\nend_fail=%d\nmalloc_fail=%d\n", begin_fail, end_fail, malloc_fail);
    if (first_form >= 0)
        printf("first: form=%d code=%d begin=%d\n", first_form, first_code, first_begin);
    printf("capture_storm ok\n");
    return 0;
}
