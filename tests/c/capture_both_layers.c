/* A capture the driver begins and the runtime ends, then one the runtime begins and the driver
 * ends, on the same stream: the pool notes each once and forgets it at its end, whichever layer
 * saw which. Freed blocks wait for a fence (strict mode); during the first capture, in relaxed
 * mode, a request the waiting blocks would serve after a fence (CUDA refuses a device
 * synchronization during a capture and invalidates it). After the ends, the pool fences again:
 * gpupool_empty_cache gives the cache back. Linked with the runtime and -lcuda. Prints
 * "malloc=", "first_end=", "second_end=", "graphs=", "released=" (-1 without the pool),
 * "live_after=" and "capture_both_layers ok". */
#include "driver_proc.h"

int main(void)
{
    cudaStream_t s;
    cudaGraph_t graph = NULL;
    CUgraph second = NULL;
    void *held[64], *p = NULL;
    long long released = -1;
    cudasimStats st;

    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 64; i++)
        CHECK_CUDA(cudaMalloc(&held[i], 1 << 20));
    for (int i = 0; i < 64; i++)
        CHECK_CUDA(cudaFree(held[i]));

    CHECK(cuStreamBeginCapture_v2((CUstream)s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS,
          "cuStreamBeginCapture_v2");
    int malloc_result = (int)cudaMalloc(&p, 100 << 20);
    if (malloc_result == 0)
        CHECK_CUDA(cudaFree(p));
    int first_end = (int)cudaStreamEndCapture(s, &graph);
    if (graph)
        CHECK_CUDA(cudaGraphDestroy(graph));

    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    int second_end = (int)cuStreamEndCapture((CUstream)s, &second);
    if (second)
        CHECK(cuGraphDestroy(second) == CUDA_SUCCESS, "cuGraphDestroy");
    (void)cudaGetLastError();
    CHECK_CUDA(cudaDeviceSynchronize());

    released = empty_cache_if_pooled(0);
    st = sim_stats(0);
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("malloc=%d\nfirst_end=%d\nsecond_end=%d\ngraphs=%d\n", malloc_result, first_end,
           second_end, (graph != NULL) + (second != NULL));
    printf("released=%lld\nlive_after=%llu\n", released, st.live_bytes);
    printf("capture_both_layers ok\n");
    return 0;
}
