/* overlap: the loop a training step is made of, on the legacy default stream: cudaMalloc a
 * block, launch a kernel that runs ~KERNEL_US on it (clock64 spin, calibrated against the real
 * SM clock, then a write over the block), cudaFree it, do HOST_US of busy host work. The
 * driver's cudaFree waits for the device each time, so without a pool host and device work run
 * one after the other (wall ~ serial_ms); a pool lets them overlap (wall ~ ideal_ms).
 * (The real-GPU version of tests/c/overlap.c; a benchmark, not a correctness check.)
 *
 * usage: overlap ITERATIONS KERNEL_US HOST_US BYTES [chevron|api]
 *   chevron (default): kernels launched with <<<>>>; with CUDA 13 these call the runtime's
 *   internal __cudaLaunchKernel, which a preloaded library does not see. api: launched with an
 *   explicit cudaLaunchKernel call, which libgpupool interposes (GPUPOOL_REUSE=barrier counts a
 *   legacy-stream kernel as a barrier only when it sees it).
 * Prints key=value lines: the launch, the kernel time a timed single launch measured, wall_ms,
 * ideal_ms and serial_ms. */
#include "common.cuh"

/* One loop kernel on the legacy default stream, through <<<>>> or through cudaLaunchKernel. */
static void launch(int api, long long cycles, unsigned char *p, size_t bytes, int fill)
{
    if (api) {
        void *args[] = {&cycles, &p, &bytes, &fill};
        CHECK(cudaLaunchKernel((const void *)spin_then_fill, dim3(1), dim3(FILL_THREADS), args, 0,
                               0));
    } else {
        spin_then_fill<<<1, FILL_THREADS>>>(cycles, p, bytes, fill);
    }
    CHECK_LAUNCH();
}

int main(int argc, char **argv)
{
    REQUIRE(argc == 5 || argc == 6,
            "usage: overlap ITERATIONS KERNEL_US HOST_US BYTES [chevron|api]");
    int iters = atoi(argv[1]);
    unsigned kernel_us = (unsigned)atoi(argv[2]);
    unsigned host_us = (unsigned)atoi(argv[3]);
    size_t bytes = (size_t)strtoull(argv[4], NULL, 0);
    int api = argc == 6 && strcmp(argv[5], "api") == 0;
    REQUIRE(iters >= 1 && bytes >= 1, "arguments");
    CHECK(cudaFree(NULL));
    const double cpu = spin_cycles_per_us();
    const long long cycles = (long long)(kernel_us * cpu);

    /* One timed launch: what KERNEL_US really is on this device. */
    unsigned char *p = NULL;
    CHECK(cudaMalloc((void **)&p, bytes));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a, 0));
    spin_then_fill<<<1, FILL_THREADS>>>(cycles, p, bytes, 0x11);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(b, 0));
    CHECK(cudaEventSynchronize(b));
    float kernel_ms = 0;
    CHECK(cudaEventElapsedTime(&kernel_ms, a, b));
    CHECK(cudaFree(p));
    CHECK(cudaDeviceSynchronize());

    double t0 = now_ms();
    for (int i = 0; i < iters; i++) {
        CHECK(cudaMalloc((void **)&p, bytes));
        launch(api, cycles, p, bytes, i & 0xff);
        CHECK(cudaFree(p));
        host_busy_us(host_us);
    }
    CHECK(cudaDeviceSynchronize());
    double t1 = now_ms();
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    double k = kernel_us, h = host_us;
    printf("launch=%s cycles_per_us=%.1f measured_kernel_ms=%.3f\n", api ? "api" : "chevron", cpu,
           kernel_ms);
    printf("wall_ms=%.1f\n", t1 - t0);
    printf("ideal_ms=%.1f\n", iters * (k > h ? k : h) / 1e3);
    printf("serial_ms=%.1f\n", iters * (k + h) / 1e3);
    return 0;
}
