/* In-flight work (contract item 2). A block freed while a simulated kernel still uses it must not
 * be handed out in a way that lets the new owner's work run before that kernel is done: if it
 * were, the kernel's late write would land on the new owner's data.
 *
 * usage: hazard [tight] [blocking]
 *   (default) the kernel runs on a non-blocking stream: the block must not be handed out while
 *   the kernel is in flight at all.
 *   blocking: the kernel runs on a blocking stream, the new owner's kernel on another one; the
 *   block may come back before the first kernel ends only behind a barrier on the legacy stream
 *   that orders the second kernel after the first (barrier mode).
 *   tight: the device has room for one block only, so the second allocation can only be served
 *   by reusing the first block's memory (run with CUDASIM_MEM=64MiB CUDASIM_CONTEXT_BYTES=0). */
#include "check.h"

#define N (48u << 20)

static int has(int argc, char **argv, const char *word)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], word) == 0)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    int tight = has(argc, argv, "tight");
    int blocking = has(argc, argv, "blocking");
    cudaStream_t s, s2;
    void *a, *b;
    int round;
    if (blocking) {
        CHECK_CUDA(cudaStreamCreate(&s));
        CHECK_CUDA(cudaStreamCreate(&s2));
    } else {
        CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
    for (round = 0; round < 3; round++) {
        CHECK_CUDA(cudaMalloc(&a, N));
        /* 200 ms of work on `a`, then the kernel writes 0xEE over it. */
        CHECK_CUDA(cudasim_launch_fill(a, N, 200000, 0xEE, s));
        CHECK_CUDA(cudaFree(a));
        CHECK_CUDA(cudaMalloc(&b, N));
        if (blocking) {
            /* The new owner fills its block on the other blocking stream; it must run after
             * the first kernel, whose late write would otherwise clobber it. */
            CHECK_CUDA(cudasim_launch_fill(b, N, 0, 0x42, s2));
            CHECK_CUDA(cudaDeviceSynchronize());
        } else {
            CHECK(cudasimRangeBusy(b, N) == 0,
                  "round %d: got %p while a kernel on it is in flight", round, b);
            tag_block(b, N, 0x42);
            CHECK_CUDA(cudaStreamSynchronize(s));
        }
        check_tag(b, N, 0x42);
        if (tight)
            CHECK(a == b, "tight device: expected reuse of the only block");
        CHECK_CUDA(cudaFree(b));
    }
    CHECK_CUDA(cudaStreamDestroy(s));
    if (blocking)
        CHECK_CUDA(cudaStreamDestroy(s2));
    printf("hazard ok\n");
    return 0;
}
