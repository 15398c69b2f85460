/* A program whose every allocation passes through the pool to CUDA. Mode "own-pool" makes its
 * own memory pool current (cudaDeviceSetMemPool), then makes N cudaMallocAsync calls of 1, 2,
 * ... N MiB, which that pool serves; mode "capture" makes them on a stream being captured into
 * a graph, which owns them. With a third argument, it sleeps that many milliseconds before it
 * frees them (for the periodic summary). Prints "passed=N", "passed_bytes=N" and
 * "passed_through ok". */
#define _GNU_SOURCE /* nanosleep under -std=c11 */
#include <time.h>

#include "check.h"

#define MIB (1024ull * 1024ull)
#define MOST 64

static void pause_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

int main(int argc, char **argv)
{
    CHECK(argc >= 3, "usage: passed_through own-pool|capture N [SLEEP_MS]");
    int capture = strcmp(argv[1], "capture") == 0;
    CHECK(capture || strcmp(argv[1], "own-pool") == 0, "unknown mode %s", argv[1]);
    int n = atoi(argv[2]);
    CHECK(n > 0 && n <= MOST, "N must be 1 to %d", MOST);
    long sleep_ms = argc > 3 ? atol(argv[3]) : 0;

    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaMemPool_t mine = NULL, def = NULL;
    cudaGraph_t graph = NULL;
    if (capture) {
        CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    } else {
        struct cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = 0;
        CHECK_CUDA(cudaMemPoolCreate(&mine, &props));
        CHECK_CUDA(cudaDeviceGetDefaultMemPool(&def, 0));
        CHECK_CUDA(cudaDeviceSetMemPool(0, mine));
    }
    cudasimStats before = sim_stats(0);
    void *blocks[MOST];
    unsigned long long bytes = 0;
    for (int i = 0; i < n; i++) {
        CHECK_CUDA(cudaMallocAsync(&blocks[i], (size_t)(i + 1) * MIB, s));
        bytes += (unsigned long long)(i + 1) * MIB;
    }
    cudasimStats after = sim_stats(0);
    unsigned long long reached = capture ? after.captured_mallocs - before.captured_mallocs
                                         : after.async_mallocs - before.async_mallocs;
    CHECK(reached == (unsigned long long)n, "the runtime served %llu of %d requests", reached, n);
    if (sleep_ms > 0)
        pause_ms(sleep_ms);
    for (int i = 0; i < n; i++)
        CHECK_CUDA(cudaFreeAsync(blocks[i], s));
    if (capture) {
        CHECK_CUDA(cudaStreamEndCapture(s, &graph));
        CHECK_CUDA(cudaGraphDestroy(graph));
    } else {
        CHECK_CUDA(cudaStreamSynchronize(s));
        CHECK_CUDA(cudaDeviceSetMemPool(0, def));
        CHECK_CUDA(cudaMemPoolDestroy(mine));
    }
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("passed=%d\n", n);
    printf("passed_bytes=%llu\n", bytes);
    printf("passed_through ok\n");
    return 0;
}
