/* A driver allocation in device 65's primary context (beyond the 64 devices the pool serves),
 * and one in device 0's: neither context is one the program created. Prints
 * "driver_high_device ok". Linked with -lcuda; run with CUDASIM_DEVICES=66. */
#include <cuda.h>
#include "check.h"

#define CU(x) CHECK((x) == CUDA_SUCCESS, "%s", #x)

int main(void)
{
    CUcontext c0, c65;
    CUdeviceptr a, b;

    CU(cuInit(0));
    CU(cuDevicePrimaryCtxRetain(&c0, 0));
    CU(cuDevicePrimaryCtxRetain(&c65, 65));
    CU(cuCtxSetCurrent(c0));
    CU(cuMemAlloc(&a, 1 << 20));
    CU(cuCtxSetCurrent(c65));
    CU(cuMemAlloc(&b, 1 << 20));
    CU(cuMemFree(b));
    CU(cuCtxSetCurrent(c0));
    CU(cuMemFree(a));
    printf("driver_high_device ok\n");
    return 0;
}
