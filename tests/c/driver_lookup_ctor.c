/* A library whose constructor makes the process's first calls of hooked driver entry points
 * (cuCtxSetCurrent, cuMemAlloc_v2, cuCtxSynchronize), inside dlopen: under the dynamic linker's
 * lock. The driver's functions come from the program (linked with -lcuda). */
#include "check.h"
#include "cuda.h"

__attribute__((constructor)) static void first_driver_calls(void)
{
    CUcontext ctx = NULL;
    CUdeviceptr p = 0;
    CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK_CU(cuCtxSetCurrent(ctx));
    CHECK_CU(cuMemAlloc_v2(&p, 1 << 20));
    CHECK_CU(cuCtxSynchronize());
}
