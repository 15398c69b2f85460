/* A capture that CUDA lets run must survive the pool. Freed blocks wait for a fence (strict)
 * or a barrier (barrier mode); the program then begins a capture in relaxed mode and allocates:
 * on a non-blocking stream, a request the waiting blocks would serve after a fence; on a
 * blocking stream, one a barrier would. CUDA refuses a device synchronization during a
 * capture, and a use of the legacy stream while a blocking stream is captured, and either
 * invalidates the capture. Usage: capture_fence MIB BLOCKING [FORM]: with FORM 1, the capture
 * goes into a graph the program made (cudaStreamBeginCaptureToGraph); with FORM 2 or 3, it is of
 * the per-thread default stream through the `_ptsz` forms that `nvcc --default-stream per-thread`
 * compiles the plain names to (stream NULL; 3 into the program's graph), and BLOCKING is moot (that
 * stream is blocking). With FORM 4 the capture is in thread-local mode, and another thread first
 * tries to end it, which CUDA refuses (908, the capture goes on: "wrong_thread_end=CODE"), then
 * makes the request (the capturing thread's own would be refused in that mode). Prints
 * "malloc=CODE", "status=STATUS" (cudaStreamIsCapturing before the end), "end=CODE" and
 * "capture_fence ok". */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <pthread.h>

#include "check.h"

typedef cudaError_t (*begin_fn)(cudaStream_t, enum cudaStreamCaptureMode);
typedef cudaError_t (*begin_to_graph_fn)(cudaStream_t, cudaGraph_t, const cudaGraphNode_t *,
                                         const cudaGraphEdgeData *,
                                         size_t, enum cudaStreamCaptureMode);
typedef cudaError_t (*end_fn)(cudaStream_t, cudaGraph_t *);
typedef cudaError_t (*is_capturing_fn)(cudaStream_t, enum cudaStreamCaptureStatus *);

/* The runtime's `_ptsz` form `name`, as the preload or the runtime exports it. */
static void *ptsz(const char *name)
{
    void *f = dlsym(RTLD_DEFAULT, name);
    CHECK(f != NULL, "no %s in the process", name);
    return f;
}

static cudaStream_t captured;
static size_t request;
static int malloc_result = -1, wrong_thread_end = -1;

/* The request during the capture, freed at once if served. */
static void *allocate(void *arg)
{
    void *p = NULL;
    (void)arg;
    malloc_result = (int)cudaMalloc(&p, request);
    if (malloc_result == 0)
        CHECK_CUDA(cudaFree(p));
    return NULL;
}

/* FORM 4's other thread: an end CUDA refuses, then the request. */
static void *end_then_allocate(void *arg)
{
    cudaGraph_t graph = NULL;
    wrong_thread_end = (int)cudaStreamEndCapture(captured, &graph);
    (void)cudaGetLastError();
    return allocate(arg);
}

int main(int argc, char **argv)
{
    CHECK(argc == 3 || argc == 4, "usage: capture_fence MIB BLOCKING [FORM]");
    int form = argc == 4 ? atoi(argv[3]) : 0;
    int to_graph = form == 1 || form == 3, per_thread = form == 2 || form == 3;
    request = (size_t)atoi(argv[1]) << 20;
    int blocking = atoi(argv[2]);
    cudaStream_t s;
    cudaGraph_t graph = NULL, mine = NULL;
    void *held[64];
    if (per_thread)
        s = NULL; /* the `_ptsz` forms' own stream */
    else if (blocking)
        CHECK_CUDA(cudaStreamCreate(&s));
    else
        CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 64; i++)
        CHECK_CUDA(cudaMalloc(&held[i], 1 << 20));
    for (int i = 0; i < 64; i++)
        CHECK_CUDA(cudaFree(held[i]));

    begin_fn begin = cudaStreamBeginCapture;
    begin_to_graph_fn begin_to_graph = cudaStreamBeginCaptureToGraph;
    end_fn end_capture = cudaStreamEndCapture;
    is_capturing_fn is_capturing = cudaStreamIsCapturing;
    if (per_thread) {
        begin = (begin_fn)ptsz("cudaStreamBeginCapture_ptsz");
        begin_to_graph = (begin_to_graph_fn)ptsz("cudaStreamBeginCaptureToGraph_ptsz");
        end_capture = (end_fn)ptsz("cudaStreamEndCapture_ptsz");
        is_capturing = (is_capturing_fn)ptsz("cudaStreamIsCapturing_ptsz");
    }
    if (to_graph) {
        CHECK_CUDA(cudaGraphCreate(&mine, 0));
        CHECK_CUDA(begin_to_graph(s, mine, NULL, NULL, 0, cudaStreamCaptureModeRelaxed));
    } else if (form == 4) {
        CHECK_CUDA(begin(s, cudaStreamCaptureModeThreadLocal));
    } else {
        CHECK_CUDA(begin(s, cudaStreamCaptureModeRelaxed));
    }
    if (form == 4) {
        pthread_t t;
        captured = s;
        CHECK(pthread_create(&t, NULL, end_then_allocate, NULL) == 0, "pthread_create");
        CHECK(pthread_join(t, NULL) == 0, "pthread_join");
        printf("wrong_thread_end=%d\n", wrong_thread_end);
    } else {
        allocate(NULL);
    }
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CHECK_CUDA(is_capturing(s, &status));
    int end = (int)end_capture(s, &graph);
    CHECK(!to_graph || graph == NULL || graph == mine, "another graph than the program's");
    if (to_graph)
        CHECK_CUDA(cudaGraphDestroy(mine));
    else if (graph)
        CHECK_CUDA(cudaGraphDestroy(graph));
    (void)cudaGetLastError();
    CHECK_CUDA(cudaDeviceSynchronize());
    if (!per_thread)
        CHECK_CUDA(cudaStreamDestroy(s));
    printf("malloc=%d\nstatus=%d\nend=%d\n", malloc_result, (int)status, end);
    printf("capture_fence ok\n");
    return 0;
}
