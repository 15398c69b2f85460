/* A block of device 0 freed in stream order on device 1's legacy stream, after a kernel there
 * that still uses it (device 1 may reach device 0's memory: peer access), by a thread that last
 * allocated on device 0. Then device 0's legacy stream asks for a block of that size in stream
 * order. That is another stream: the pool may hand the block out only once device 1's kernel is
 * done, or the new owner's kernel on device 0 runs first and the old one's late write (0xEE)
 * lands on its data (0x42). Once through the runtime (cudaFreeAsync, cudaMallocAsync), once
 * through the driver (cuMemFreeAsync, cuMemAllocAsync). Linked with the runtime and -lcuda; run
 * with CUDASIM_DEVICES=2. Prints "reused=N" (rounds that got the block back) and
 * "free_async_other_device ok". */
#include "check.h"
#include "cuda.h"

#define N (12u << 20)

static int round_trip(int driver)
{
    void *a, *b;
    CHECK_CUDA(cudaSetDevice(0));
    if (driver) {
        CUdeviceptr d;
        CHECK(cuMemAllocAsync(&d, N, NULL) == CUDA_SUCCESS, "cuMemAllocAsync");
        a = (void *)(uintptr_t)d;
    } else {
        CHECK_CUDA(cudaMallocAsync(&a, N, 0));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(1));
    /* 200 ms on device 1's legacy stream, then 0xEE over the block; freed after it there. */
    CHECK_CUDA(cudasim_launch_fill(a, N, 200000, 0xEE, 0));
    if (driver)
        CHECK(cuMemFreeAsync((CUdeviceptr)(uintptr_t)a, NULL) == CUDA_SUCCESS, "cuMemFreeAsync");
    else
        CHECK_CUDA(cudaFreeAsync(a, 0));
    CHECK_CUDA(cudaSetDevice(0));
    if (driver) {
        CUdeviceptr d;
        CHECK(cuMemAllocAsync(&d, N, NULL) == CUDA_SUCCESS, "cuMemAllocAsync");
        b = (void *)(uintptr_t)d;
    } else {
        CHECK_CUDA(cudaMallocAsync(&b, N, 0));
    }
    CHECK_CUDA(cudasim_launch_fill(b, N, 0, 0x42, 0));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaDeviceSynchronize());
    check_tag(b, N, 0x42);
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaDeviceSynchronize());
    return a == b;
}

int main(int argc, char **argv)
{
    int reused = 0;
    CHECK(argc == 2, "usage: free_async_other_device runtime|driver");
    int driver = strcmp(argv[1], "driver") == 0;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
    for (int round = 0; round < 3; round++)
        reused += round_trip(driver);
    printf("reused=%d\n", reused);
    printf("free_async_other_device ok\n");
    return 0;
}
