/* In-flight work (contract item 2). A block freed while a simulated kernel on a non-blocking
 * stream still uses it must not be handed out while that kernel is in flight: if it were, the
 * kernel's late write would land on the new owner's data.
 *
 * usage: hazard [tight]   "tight": the device has room for one block only, so the second
 * allocation can only be served by reusing the first block's memory (run with
 * CUDASIM_MEM=64MiB CUDASIM_CONTEXT_BYTES=0). */
#include "check.h"

#define N (48u << 20)

int main(int argc, char **argv)
{
    int tight = argc > 1 && strcmp(argv[1], "tight") == 0;
    cudaStream_t s;
    void *a, *b;
    int round;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (round = 0; round < 3; round++) {
        CHECK_CUDA(cudaMalloc(&a, N));
        /* 200 ms of work on `a`, then the kernel writes 0xEE over it. */
        CHECK_CUDA(cudasim_launch_fill(a, N, 200000, 0xEE, s));
        CHECK_CUDA(cudaFree(a));
        CHECK_CUDA(cudaMalloc(&b, N));
        CHECK(cudasimRangeBusy(b, N) == 0,
              "round %d: got %p while a kernel on it is in flight", round, b);
        tag_block(b, N, 0x42);
        CHECK_CUDA(cudaStreamSynchronize(s));
        check_tag(b, N, 0x42);
        if (tight)
            CHECK(a == b, "tight device: expected reuse of the only block");
        CHECK_CUDA(cudaFree(b));
    }
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("hazard ok\n");
    return 0;
}
