/* A driver-only program frees a 64 MiB block while a 300 ms kernel of its primary context still
 * writes it, on a non-blocking stream, then makes a context of its own current (cuCtxCreate)
 * and calls gpupool_empty_cache(0). CUDA's cuCtxSynchronize waits for the current context's
 * work only: the pool's fence must be made in the primary context, or it unmaps the block
 * under the kernel. Prints "released=N" (what gpupool_empty_cache says it gave back),
 * "unmapped_while_busy=N" (the simulator's count of ranges unmapped under a kernel),
 * "own_current=1" when the program's context is current again after the call,
 * and "driver_own_context ok". Linked with -lcuda; of the runtime it calls only the
 * simulator's statistics and kernel. */
#include <cuda.h>
#include <dlfcn.h>

#include "check.h"

#define MIB (1024ull * 1024ull)
#define CU(x) CHECK((x) == CUDA_SUCCESS, "%s", #x)

static CUresult launch_fill(CUstream s, CUdeviceptr p, size_t bytes, unsigned usec)
{
    void (*kernel)(void) = cudasim_fill_kernel;
    CUfunction f;
    int fill = 0x5c;
    void *args[4] = {&p, &bytes, &usec, &fill};
    memcpy(&f, &kernel, sizeof f);
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
}

int main(void)
{
    CUcontext primary = NULL, own = NULL, now = NULL;
    CUstream s;
    CUdeviceptr p;
    unsigned long long released = 0;
    int (*empty)(int, unsigned long long *) =
        (int (*)(int, unsigned long long *))dlsym(RTLD_DEFAULT, "gpupool_empty_cache");

    CU(cuInit(0));
    CU(cuDevicePrimaryCtxRetain(&primary, 0));
    CU(cuCtxSetCurrent(primary));
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU(cuMemAlloc(&p, 64 * MIB));
    CU(launch_fill(s, p, 64 * MIB, 300000));
    CU(cuMemFree(p));
    CU(cuCtxCreate(&own, 0, 0));
    if (empty != NULL)
        CHECK(empty(0, &released) == 0, "gpupool_empty_cache(0)");
    CU(cuCtxGetCurrent(&now));
    cudasimStats st = sim_stats(0);
    printf("released=%llu\n", released);
    printf("unmapped_while_busy=%llu\n", st.unmapped_while_busy);
    printf("own_current=%d\n", now == own);
    CU(cuCtxDestroy(own));
    CU(cuCtxSetCurrent(primary));
    CU(cuCtxSynchronize());
    CU(cuStreamDestroy(s));
    printf("driver_own_context ok\n");
    return 0;
}
