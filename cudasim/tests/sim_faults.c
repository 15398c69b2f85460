/* cudasim: fault injection, by CUDASIM_FAIL (mode "env") and by cudasimFailNext (mode
 * "api"); a bad configuration (mode "badconfig"). */
#include "check.h"

static int env_mode(void)
{
    /* CUDASIM_FAIL=cudaMalloc@2=2,cudaStreamCreate@1=999,cudaSetDevice@1=cudaErrorInvalidDevice */
    void *p = NULL, *q = (void *)0x1;
    cudaStream_t s = NULL;
    SECTION("CUDASIM_FAIL: the 2nd cudaMalloc fails with 2 and does nothing");
    OK(cudaMalloc(&p, 64));
    EXPECT(cudaMalloc(&q, 64), cudaErrorMemoryAllocation);
    CHECK(q == (void *)0x1, "out-pointer written");
    EXPECT(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK(stats_of(0).live_allocations == 1, "injected malloc allocated");
    OK(cudaMalloc(&q, 64));
    SECTION("CUDASIM_FAIL: first cudaStreamCreate and cudaSetDevice fail");
    EXPECT(cudaStreamCreate(&s), cudaErrorUnknown);
    OK(cudaStreamCreate(&s));
    EXPECT(cudaSetDevice(0), cudaErrorInvalidDevice);
    OK(cudaSetDevice(0));
    OK(cudaStreamDestroy(s));
    OK(cudaFree(p));
    OK(cudaFree(q));
    printf("sim_faults env: all checks passed\n");
    return 0;
}

static int api_mode(void)
{
    void *p = NULL;
    int n = -1;
    SECTION("cudasimFailNext: cudaFree");
    OK(cudaMalloc(&p, 64));
    OK(cudasimFailNext("cudaFree", 1, cudaErrorInvalidValue));
    EXPECT(cudaFree(p), cudaErrorInvalidValue);
    CHECK(stats_of(0).live_allocations == 1, "injected free freed");
    OK(cudaFree(p));
    SECTION("cudasimFailNext: the 2nd next launch");
    OK(cudaMalloc(&p, 64));
    OK(cudasimFailNext("cudaLaunchKernel", 2, cudaErrorUnknown));
    OK(cudasim_launch_fill(p, 64, 0, 1, 0));
    EXPECT(cudasim_launch_fill(p, 64, 0, 2, 0), cudaErrorUnknown);
    OK(cudasim_launch_fill(p, 64, 0, 3, 0));
    OK(cudaDeviceSynchronize());
    CHECK(stats_of(0).kernels_launched == 2, "launched %llu", stats_of(0).kernels_launched);
    OK(cudaFree(p));
    SECTION("cudasimFailNext: lock-free functions and queries");
    OK(cudasimFailNext("cudaGetDevice", 1, cudaErrorInitializationError));
    EXPECT(cudaGetDevice(&n), cudaErrorInitializationError);
    OK(cudaGetDevice(&n));
    OK(cudasimFailNext("cudaEventQuery", 1, cudaErrorNotReady));
    {
        cudaEvent_t e = NULL;
        OK(cudaEventCreate(&e));
        EXPECT(cudaEventQuery(e), cudaErrorNotReady);
        OK(cudaEventQuery(e));
        OK(cudaEventDestroy(e));
    }
    OK(cudasimFailNext("cudaMemGetInfo", 1, 35));
    {
        size_t f, t;
        EXPECT(cudaMemGetInfo(&f, &t), cudaErrorInsufficientDriver);
    }
    SECTION("cudasimFailNext: bad arguments");
    EXPECT(cudasimFailNext("cudaNope", 1, 2), 1);
    EXPECT(cudasimFailNext("cudaMalloc", 0, 2), 1);
    EXPECT(cudasimFailNext(NULL, 1, 2), 1);
    printf("sim_faults api: all checks passed\n");
    return 0;
}

static int badconfig_mode(void)
{
    void *p = NULL;
    int n = -1;
    SECTION("a bad configuration fails every call with 3");
    EXPECT(cudaMalloc(&p, 64), cudaErrorInitializationError);
    EXPECT(cudaGetDeviceCount(&n), cudaErrorInitializationError);
    EXPECT(cudaSetDevice(0), cudaErrorInitializationError);
    printf("sim_faults badconfig: all checks passed\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "env") == 0) return env_mode();
    if (strcmp(mode, "api") == 0) return api_mode();
    if (strcmp(mode, "badconfig") == 0) return badconfig_mode();
    printf("usage: sim_faults env|api|badconfig\n");
    return 2;
}
