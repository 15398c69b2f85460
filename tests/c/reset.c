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
    /* The current device cannot be read just before the reset: the pool asks again after it,
     * and still forgets the device's memory. */
    void *kept;
    CHECK_CUDA(cudaMalloc(&kept, 3u << 20));
    CHECK_CUDA(cudaFree(kept));
    CHECK(cudasimFailNext("cudaGetDevice", 1, (int)cudaErrorUnknown) == 0, "arm");
    CHECK_CUDA(cudaDeviceReset());
    (void)cudaGetLastError();
    CHECK(sim_stats(0).live_bytes == 0, "reset left %llu bytes", sim_stats(0).live_bytes);
    void *fresh;
    CHECK_CUDA(cudaMalloc(&fresh, 3u << 20));
    CHECK(sim_stats(0).live_bytes >= (3u << 20), "a block of memory the reset freed: %p", fresh);
    CHECK_CUDA(cudasim_launch_fill(fresh, 3u << 20, 0, 0x5A, 0));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFree(fresh));
    printf("reset ok\n");
    return 0;
}
