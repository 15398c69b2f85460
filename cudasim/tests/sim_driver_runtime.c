/* cudasim's runtime on its driver: a runtime program's calls reach the driver (mode "driver")
 * unless CUDASIM_NO_DRIVER=1 (mode "nodriver"); runtime and driver calls mixed on one state. */
#include "check.h"
#include "cuda.h"

#define CU_OK_PLAIN(call)                                                   \
    do {                                                                    \
        CUresult got_ = (call);                                             \
        CHECK(got_ == CUDA_SUCCESS, "%s returned %d", #call, (int)got_);    \
    } while (0)

/* The work both modes do through the runtime. */
static int runtime_work(void)
{
    void *p = NULL, *z = (void *)0x1;
    cudaStream_t s = NULL;
    size_t free_b = 0, total_b = 0;
    OK(cudaMalloc(&p, 1 << 20));
    OK(cudaMalloc(&z, 0));
    CHECK(z == NULL, "0 bytes gave %p", z);
    OK(cudaMemGetInfo(&free_b, &total_b));
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudasim_launch_fill(p, 4096, 1000, 1, s));
    EXPECT(cudasim_launch_fill(p, 4096, 1000, 1, (cudaStream_t)0x99), 400);
    OK(cudaStreamSynchronize(s));
    OK(cudaDeviceSynchronize());
    OK(cudaFree(p));
    EXPECT(cudaFree(p), cudaErrorInvalidValue);
    OK(cudaStreamDestroy(s));
    CHECK(stats_of(0).malloc_calls == 2 && stats_of(0).free_calls == 2, "runtime counters");
    CHECK(stats_of(0).kernel_writes == 1 && stats_of(0).stream_syncs == 1, "in flight");
    return 0;
}

static int driver_mode(void)
{
    CUdeviceptr d = 0;
    void *p = NULL;
    cudaStream_t s = NULL;
    CUcontext ctx = NULL, primary = NULL;

    SECTION("the runtime's calls reach the driver");
    if (runtime_work() != 0) {
        return 1;
    }
    CHECK(stats_of(0).driver_mallocs == 1, "driver mallocs %llu", stats_of(0).driver_mallocs);
    CHECK(stats_of(0).driver_frees == 2, "driver frees %llu", stats_of(0).driver_frees);
    SECTION("the runtime made the driver ready: initialized, primary context current");
    CU_OK_PLAIN(cuCtxGetCurrent(&ctx));
    CU_OK_PLAIN(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK(ctx == primary && ctx != NULL, "current %p, primary %p", (void *)ctx, (void *)primary);

    SECTION("each runtime call binds the primary context again when the thread has none");
    OK(cudaMalloc(&p, 64));
    CU_OK_PLAIN(cuCtxPopCurrent(&ctx));
    CU_OK_PLAIN(cuCtxGetCurrent(&ctx));
    CHECK(ctx == NULL, "still current after the pop: %p", (void *)ctx);
    CHECK(cuMemcpyHtoD((CUdeviceptr)p, &ctx, 1) == CUDA_ERROR_INVALID_CONTEXT, "no context");
    OK(cudaFree(p));
    CU_OK_PLAIN(cuCtxGetCurrent(&ctx));
    CHECK(ctx == primary, "cudaFree bound %p, primary %p", (void *)ctx, (void *)primary);
    CU_OK_PLAIN(cuCtxSetCurrent(NULL));
    OK(cudaMalloc(&p, 64));
    CU_OK_PLAIN(cuCtxGetCurrent(&ctx));
    CHECK(ctx == primary, "cudaMalloc bound %p, primary %p", (void *)ctx, (void *)primary);
    OK(cudaFree(p));

    SECTION("a driver failure is the runtime's error; a driver call sets no last error");
    OK(cudasimFailNext("cuMemAlloc_v2", 1, CUDA_ERROR_OUT_OF_MEMORY));
    EXPECT(cudaMalloc(&p, 64), cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK(cuMemAlloc(&d, 0) == CUDA_ERROR_INVALID_VALUE, "0 bytes");
    EXPECT(cudaGetLastError(), cudaSuccess);

    SECTION("mixing: cudaFree of cuMemAlloc memory, cuMemFree of cudaMalloc memory");
    cudasimResetStats();
    CU_OK_PLAIN(cuMemAlloc(&d, 4096));
    OK(cudaFree((void *)d));
    OK(cudaMalloc(&p, 4096));
    CU_OK_PLAIN(cuMemFree((CUdeviceptr)p));
    CHECK(stats_of(0).live_allocations == 0, "live %llu", stats_of(0).live_allocations);

    SECTION("in flight through the driver: cuMemFreeAsync keeps the block until the stream passes");
    OK(cudaStreamCreate(&s));
    OK(cudaMalloc(&p, 4096));
    OK(cudasim_launch_fill(p, 4096, 100000, 0x5a, s));
    CU_OK_PLAIN(cuMemFreeAsync((CUdeviceptr)p, (CUstream)s));
    CHECK(cudasimRangeBusy(p, 4096) == 1, "the kernel is not in flight");
    CHECK(stats_of(0).live_allocations == 1, "freed before the stream got there");
    CU_OK_PLAIN(cuStreamSynchronize((CUstream)s));
    CHECK(stats_of(0).kernel_writes == 1, "the block was unmapped under the kernel");
    CHECK(stats_of(0).live_allocations == 0, "not freed after the stream passed");
    OK(cudaStreamDestroy(s));
    printf("sim_driver_runtime driver: all checks passed\n");
    return 0;
}

static int nodriver_mode(void)
{
    CUdeviceptr d = 0;
    SECTION("CUDASIM_NO_DRIVER=1: the runtime works without reaching the driver");
    if (runtime_work() != 0) {
        return 1;
    }
    CHECK(stats_of(0).driver_mallocs == 0 && stats_of(0).driver_frees == 0, "driver calls");
    CHECK(cuMemAlloc(&d, 64) == CUDA_ERROR_NOT_INITIALIZED, "the runtime called cuInit");
    printf("sim_driver_runtime nodriver: all checks passed\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "nodriver") == 0) {
        return nodriver_mode();
    }
    return driver_mode();
}
