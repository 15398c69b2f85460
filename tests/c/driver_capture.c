/* A double free in stream order on a stream being captured into a graph, of a block that starts
 * a pool segment: cuMemFreeAsync, then cudaFreeAsync. The driver and the runtime would free the
 * whole segment there; the answer is the one a double free gets without the pool,
 * CUDA_ERROR_INVALID_VALUE / cudaErrorInvalidValue, and the segment's other block stays usable.
 * Linked with the runtime and -lcuda. Ends with "driver_capture: all checks passed". */
#include "check.h"
#include "cuda.h"

#define MiB (1024ull * 1024ull)

/* A block of `bytes` that starts its allocation, as cuMemGetAddressRange says. */
static CUdeviceptr starting_block(size_t bytes)
{
    CUdeviceptr p = 0, base = 0;
    CHECK(cuMemAlloc_v2(&p, bytes) == CUDA_SUCCESS, "cuMemAlloc_v2");
    CHECK(cuMemGetAddressRange_v2(&base, NULL, p) == CUDA_SUCCESS && base == p,
          "0x%llx does not start its allocation", (unsigned long long)p);
    return p;
}

int main(void)
{
    static unsigned char data[MiB], back[MiB];
    CUdeviceptr first, other = 0;
    cudaStream_t s;
    cudaGraph_t graph;
    void *again, *kept[16];
    int n, i;
    CUresult r;
    cudaError_t e;

    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(NULL));
    first = starting_block(MiB);
    CHECK(cuMemAlloc_v2(&other, MiB) == CUDA_SUCCESS, "the segment's other block");
    CHECK(cuMemFree_v2(first) == CUDA_SUCCESS, "the first free");
    CHECK_CUDA(cudaStreamCreate(&s));

    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    r = cuMemFreeAsync(first, (CUstream)s);
    CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    CHECK_CUDA(cudaGraphDestroy(graph));
    printf("driver_double_free=%d\n", (int)r);
    CHECK(r == CUDA_ERROR_INVALID_VALUE, "cuMemFreeAsync of a freed block: %d", (int)r);

    /* A runtime block that starts its allocation (a new segment), the ones before it kept. */
    for (n = 0; n < 16; n++) {
        CUdeviceptr base = 0;
        CHECK_CUDA(cudaMalloc(&kept[n], MiB));
        CHECK(cuMemGetAddressRange_v2(&base, NULL, (CUdeviceptr)kept[n]) == CUDA_SUCCESS,
              "cuMemGetAddressRange_v2");
        if (base == (CUdeviceptr)kept[n])
            break;
    }
    CHECK(n < 16, "no block started an allocation");
    again = kept[n];
    CHECK_CUDA(cudaFree(again));
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    e = cudaFreeAsync(again, s);
    CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    CHECK_CUDA(cudaGraphDestroy(graph));
    (void)cudaGetLastError();
    printf("runtime_double_free=%d\n", (int)e);
    CHECK(e == cudaErrorInvalidValue, "cudaFreeAsync of a freed block: %d", (int)e);

    /* The segment is intact: its other block keeps what it is given. */
    memset(data, 0x5a, sizeof data);
    CHECK(cuMemcpyHtoD_v2(other, data, MiB) == CUDA_SUCCESS, "copy to the other block");
    CHECK(cuMemcpyDtoH_v2(back, other, MiB) == CUDA_SUCCESS, "copy from the other block");
    CHECK(memcmp(back, data, MiB) == 0, "the other block lost its content");
    CHECK(cuMemFree_v2(other) == CUDA_SUCCESS, "free the other block");
    for (i = 0; i < n; i++)
        CHECK_CUDA(cudaFree(kept[i]));
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("driver_capture: all checks passed\n");
    return 0;
}
