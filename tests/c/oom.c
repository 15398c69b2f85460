/* Out-of-memory recovery: after many small blocks are freed, one large allocation fits only if
 * the pool gives its cache back first. Run with CUDASIM_MEM=1GiB CUDASIM_CONTEXT_BYTES=0. */
#include "check.h"

#define SMALL (1u << 20)
#define COUNT 900

int main(void)
{
    static void *p[COUNT];
    void *big = NULL, *huge = NULL;
    int i;
    for (i = 0; i < COUNT; i++)
        CHECK_CUDA(cudaMalloc(&p[i], SMALL));
    for (i = 0; i < COUNT; i++)
        CHECK_CUDA(cudaFree(p[i]));
    CHECK(sim_stats(0).live_bytes >= (unsigned long long)COUNT * SMALL, "cache held");
    /* 800 MiB: only fits once the ~900 MiB of cached small segments are released. */
    CHECK_CUDA(cudaMalloc(&big, 800u << 20));
    CHECK(cudaGetLastError() == cudaSuccess, "a recovered OOM left a last error");
    tag_block(big, 800u << 20, 0x5A);
    CHECK(sim_stats(0).live_bytes <= (900ull << 20), "live %llu", sim_stats(0).live_bytes);
    /* A request that cannot fit is reported as out-of-memory, as the runtime would. */
    CHECK(cudaMalloc(&huge, 512u << 20) == cudaErrorMemoryAllocation, "expected OOM");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "last error after OOM");
    check_tag(big, 800u << 20, 0x5A);
    CHECK_CUDA(cudaFree(big));
    CHECK_CUDA(cudaMalloc(&huge, 512u << 20));
    CHECK_CUDA(cudaFree(huge));
    printf("oom ok\n");
    return 0;
}
