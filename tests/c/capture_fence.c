/* A capture that CUDA lets run must survive the pool. Freed blocks wait for a fence (strict)
 * or a barrier (barrier mode); the program then begins a capture in relaxed mode and allocates:
 * on a non-blocking stream, a request the waiting blocks would serve after a fence; on a
 * blocking stream, one a barrier would. CUDA refuses a device synchronization during a
 * capture, and a use of the legacy stream while a blocking stream is captured, and either
 * invalidates the capture. Usage: capture_fence MIB BLOCKING [TO_GRAPH]: with TO_GRAPH 1, the
 * capture goes into a graph the program made (cudaStreamBeginCaptureToGraph). Prints "malloc=CODE",
 * "status=STATUS" (cudaStreamIsCapturing before the end), "end=CODE" and "capture_fence ok". */
#include "check.h"

int main(int argc, char **argv)
{
    CHECK(argc == 3 || argc == 4, "usage: capture_fence MIB BLOCKING [TO_GRAPH]");
    int to_graph = argc == 4 && atoi(argv[3]);
    size_t request = (size_t)atoi(argv[1]) << 20;
    int blocking = atoi(argv[2]);
    cudaStream_t s;
    cudaGraph_t graph = NULL, mine = NULL;
    void *held[64], *p = NULL;
    if (blocking)
        CHECK_CUDA(cudaStreamCreate(&s));
    else
        CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 64; i++)
        CHECK_CUDA(cudaMalloc(&held[i], 1 << 20));
    for (int i = 0; i < 64; i++)
        CHECK_CUDA(cudaFree(held[i]));

    if (to_graph) {
        CHECK_CUDA(cudaGraphCreate(&mine, 0));
        CHECK_CUDA(cudaStreamBeginCaptureToGraph(s, mine, NULL, NULL, 0,
                                                 cudaStreamCaptureModeRelaxed));
    } else {
        CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    }
    int malloc_result = (int)cudaMalloc(&p, request);
    if (malloc_result == 0)
        CHECK_CUDA(cudaFree(p));
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CHECK_CUDA(cudaStreamIsCapturing(s, &status));
    int end = (int)cudaStreamEndCapture(s, &graph);
    CHECK(!to_graph || graph == NULL || graph == mine, "another graph than the program's");
    if (to_graph)
        CHECK_CUDA(cudaGraphDestroy(mine));
    else if (graph)
        CHECK_CUDA(cudaGraphDestroy(graph));
    (void)cudaGetLastError();
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("malloc=%d\nstatus=%d\nend=%d\n", malloc_result, (int)status, end);
    printf("capture_fence ok\n");
    return 0;
}
