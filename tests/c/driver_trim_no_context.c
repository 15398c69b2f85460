/* A driver-only program trims device 0's default pool to 0 from a thread with no current
 * context (cuMemPoolTrimTo needs none). Four 30 MiB cuMemAllocs are freed first, with the
 * primary context current. Prints "trim=N" (its CUresult), "live=N" (device 0's bytes still
 * allocated, as the simulator counts them) and "driver_trim_no_context ok". Argument
 * "current": the primary context stays current for the trim. Linked with -lcuda; of the
 * runtime it calls only the simulator's statistics. */
#include <cuda.h>
#include "check.h"

#define MIB (1024ull * 1024ull)
#define CU(x) CHECK((x) == CUDA_SUCCESS, "%s", #x)

int main(int argc, char **argv)
{
    CUcontext ctx;
    CUdeviceptr p[4];
    CUmemoryPool pool;
    CUresult trim;
    int i;

    CU(cuInit(0));
    CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU(cuCtxSetCurrent(ctx));
    for (i = 0; i < 4; i++)
        CU(cuMemAlloc(&p[i], 30 * MIB));
    for (i = 0; i < 4; i++)
        CU(cuMemFree(p[i]));
    CU(cuDeviceGetDefaultMemPool(&pool, 0));
    if (argc < 2 || strcmp(argv[1], "current") != 0)
        CU(cuCtxSetCurrent(NULL));
    trim = cuMemPoolTrimTo(pool, 0);
    printf("trim=%d\nlive=%llu\n", (int)trim, sim_stats(0).live_bytes);
    printf("driver_trim_no_context ok\n");
    return 0;
}
