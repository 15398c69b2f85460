/* cudaDeviceReset: the driver frees everything; the pool forgets (never frees twice) and serves
 * new allocations afterwards. */
#include "check.h"

int main(void)
{
    void *p[10], *old;
    int i;
    for (i = 0; i < 10; i++)
        CHECK_CUDA(cudaMalloc(&p[i], (size_t)(i + 1) << 20));
    for (i = 0; i < 5; i++)
        CHECK_CUDA(cudaFree(p[i]));
    old = p[9];
    CHECK(sim_stats(0).live_bytes > 0, "segments held before reset");
    unsigned long long frees_before = sim_stats(0).free_calls;
    CHECK_CUDA(cudaDeviceReset());
    CHECK(sim_stats(0).live_bytes == 0, "reset left %llu bytes", sim_stats(0).live_bytes);
    CHECK(sim_stats(0).free_calls == frees_before, "the pool freed memory the reset had freed");
    /* A pointer from before the reset is no longer valid: the runtime says so. */
    CHECK(cudaFree(old) == cudaErrorInvalidValue, "free after reset");
    for (i = 0; i < 10; i++) {
        CHECK_CUDA(cudaMalloc(&p[i], (size_t)(i + 1) << 20));
        tag_block(p[i], (size_t)(i + 1) << 20, (unsigned char)(i + 1));
    }
    for (i = 0; i < 10; i++) {
        check_tag(p[i], (size_t)(i + 1) << 20, (unsigned char)(i + 1));
        CHECK_CUDA(cudaFree(p[i]));
    }
    /* Reuse after the reset: in barrier mode this issues a barrier on the reset device (its
     * old barrier event died with the context). */
    for (i = 0; i < 4; i++) {
        void *q;
        CHECK_CUDA(cudaMalloc(&q, 12u << 20));
        tag_block(q, 12u << 20, 0x77);
        CHECK_CUDA(cudaFree(q));
    }
    CHECK_CUDA(cudaDeviceReset());
    for (i = 0; i < 4; i++) {
        void *q;
        CHECK_CUDA(cudaMalloc(&q, 12u << 20));
        CHECK_CUDA(cudaFree(q));
    }
    printf("reset ok\n");
    return 0;
}
