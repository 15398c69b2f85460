/* An error the program has not read yet (cudaGetLastError) when the pool's own segment request
 * runs out of memory. The pool gives its cache back and serves the request, or the driver
 * refuses it, which sets no runtime error: either way the program reads the error it left, as
 * without the pool.
 *
 * usage: unread_error runtime|driver|own-context 1|101   (a 1 GiB device, classic segments;
 *        own-context: cudaMalloc with a context of cuCtxCreate current, which the runtime
 *        serves, and asks again once the pool's cache went back)
 *        unread_error refused                (a refused cudaMalloc, then a refused cuMemAlloc)
 * Prints key=value lines. Linked with the runtime and -lcuda. */
#include "cuda.h"

#include "check.h"

#define MiB (1024ull * 1024ull)

int main(int argc, char **argv)
{
    void *blocks[7], *p = NULL;
    CUdeviceptr d = 0;
    int i;

    CHECK(argc >= 2, "usage: unread_error runtime|driver 1|101, or unread_error refused");
    CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(NULL));
    if (strcmp(argv[1], "refused") == 0) {
        printf("runtime=%d\n", (int)cudaMalloc(&p, 5ull << 30));
        printf("driver=%d\n", (int)cuMemAlloc_v2(&d, 5ull << 30));
        printf("last=%d\n", (int)cudaGetLastError());
        return 0;
    }
    CHECK(argc == 3, "usage: unread_error runtime|driver|own-context 1|101");
    /* 630 MiB cached: the 700 MiB request below fits only once the cache goes back. */
    for (i = 0; i < 7; i++)
        CHECK_CUDA(cudaMalloc(&blocks[i], 90 * MiB));
    for (i = 0; i < 7; i++)
        CHECK_CUDA(cudaFree(blocks[i]));
    if (strcmp(argv[2], "1") == 0)
        CHECK(cudaGetDevice(NULL) == cudaErrorInvalidValue, "cudaGetDevice(NULL)");
    else
        CHECK(cudaSetDevice(99) == cudaErrorInvalidDevice, "cudaSetDevice(99)");
    printf("unread=%d\n", (int)cudaPeekAtLastError());
    if (strcmp(argv[1], "own-context") == 0) {
        CUdevice dev;
        CUcontext ctx;
        CHECK(cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "cuDeviceGet");
        CHECK(cuCtxCreate(&ctx, 0, dev) == CUDA_SUCCESS, "cuCtxCreate");
        printf("allocation=%d\n", (int)cudaMalloc(&p, 700 * MiB));
    } else if (strcmp(argv[1], "runtime") == 0)
        printf("allocation=%d\n", (int)cudaMalloc(&p, 700 * MiB));
    else
        printf("allocation=%d\n", (int)cuMemAlloc_v2(&d, 700 * MiB));
    printf("last=%d\n", (int)cudaGetLastError());
    return 0;
}
