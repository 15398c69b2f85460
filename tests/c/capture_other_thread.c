/* While one thread captures a stream into a graph in global mode, another thread allocates: the
 * pool's own segment cudaMalloc runs in relaxed capture mode, as PyTorch's allocator makes its
 * own, so the request is served (the runtime alone refuses it: an unsafe call during a global
 * capture, which the refusal invalidates). The allocating thread's own mode is left as it was.
 * Prints "other_thread_malloc=CODE", "mode_after=MODE" and "end=CODE" (the capture's end), then
 * "capture_other_thread ok". */
#include <pthread.h>

#include "check.h"

static int malloc_result = -1;
static int mode_after = -1;

static void *allocate(void *arg)
{
    void *p = NULL;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    (void)arg;
    malloc_result = (int)cudaMalloc(&p, 64u << 20);
    (void)cudaGetLastError();
    /* Swap the mode in and back out: what the pool left on this thread. */
    CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
    mode_after = (int)mode;
    CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode));
    return NULL;
}

int main(void)
{
    cudaStream_t s;
    cudaGraph_t graph = NULL;
    pthread_t t;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(pthread_create(&t, NULL, allocate, NULL) == 0, "pthread_create");
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
    int end = (int)cudaStreamEndCapture(s, &graph);
    if (end == 0)
        CHECK_CUDA(cudaGraphDestroy(graph));
    printf("other_thread_malloc=%d\nmode_after=%d\nend=%d\n", malloc_result, mode_after, end);
    printf("capture_other_thread ok\n");
    return 0;
}
