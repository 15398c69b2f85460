/* hazard: a block freed while a kernel still writes it must not be handed out again until that
 * kernel is done (the real-GPU version of tests/c/hazard.c).
 *
 * Each round: allocate A; on a NON-BLOCKING stream launch a kernel that spins ~100 ms (clock64)
 * and then writes 0xEE over A; free A right after the launch; allocate B of the same size;
 * immediately fill B with 0x42 by a kernel on the legacy default stream (which does not wait
 * for the non-blocking stream); synchronize the device; count the bytes of B that are not 0x42.
 * If the allocator gave A's memory to B while the spinning kernel was in flight, the kernel's
 * late 0xEE write lands on B: "clobbered".
 *
 * Without the pool the driver's cudaFree waits for the device, so this always passes. Under
 * GPUPOOL_REUSE=strict and barrier it must pass. Under relaxed (the pool trusts stream order,
 * as PyTorch does for one stream) a clobber is the documented behaviour.
 *
 * "blocking": the spinning kernel runs on a BLOCKING stream and B is filled on another blocking
 * stream. Barrier mode then really uses its barrier (with a non-blocking stream in the program
 * it falls back to fences): B may be A's memory, handed out behind the pool's barrier on the
 * legacy stream, which must order the fill after the spinning kernel.
 *
 * usage: hazard [ROUNDS [SPIN_MS [blocking]]]   (defaults 5, 100). Prints key=value lines: one
 * per round, then the totals, then "hazard=ok", or "hazard=CLOBBERED" and exit 1. */
#include "common.cuh"

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    double spin_ms = argc > 2 ? atof(argv[2]) : 100.0;
    const int blocking = argc > 3 && strcmp(argv[3], "blocking") == 0;
    REQUIRE(rounds >= 1 && spin_ms > 0 && (argc <= 3 || blocking),
            "usage: hazard [ROUNDS [SPIN_MS [blocking]]]");
    CHECK(cudaFree(NULL));
    const double cpu = spin_cycles_per_us();
    const int sms = sm_count();
    printf("cycles_per_us=%.1f sms=%d\n", cpu, sms);

    cudaStream_t s, s2 = NULL;
    if (blocking) {
        CHECK(cudaStreamCreate(&s));
        CHECK(cudaStreamCreate(&s2));
    } else {
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
    printf("streams=%s\n", blocking ? "two_blocking" : "nonblocking_spin_legacy_fill");
    Mismatch *m = NULL;
    CHECK(cudaMalloc((void **)&m, sizeof *m));

    int clobbered_rounds = 0, reused_rounds = 0;
    for (int round = 0; round < rounds; round++) {
        /* Alternate a size under the pool's default fence budget (64 MiB) and one above it. */
        size_t n = (round % 2 == 0) ? ((size_t)48 << 20) : ((size_t)160 << 20);
        unsigned char *a = NULL, *b = NULL;
        CHECK(cudaMalloc((void **)&a, n));
        double t0 = now_ms();
        spin_then_fill<<<sms, FILL_THREADS, 0, s>>>((long long)(spin_ms * 1000.0 * cpu), a, n,
                                                      0xEE);
        CHECK_LAUNCH();
        CHECK(cudaFree(a));
        CHECK(cudaMalloc((void **)&b, n));
        double t_alloc = now_ms() - t0;
        fill_byte<<<grid_for(n), FILL_THREADS, 0, s2>>>(b, n, 0x42);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        mismatch_reset(m);
        count_not_byte<<<grid_for(n), FILL_THREADS>>>(b, n, 0x42, m);
        CHECK_LAUNCH();
        Mismatch h = mismatch_read(m);
        int same = a == b;
        reused_rounds += same;
        printf("round=%d size_mib=%zu same_address=%s free_malloc_ms=%.1f clobbered_bytes=%llu",
               round, n >> 20, same ? "yes" : "no", t_alloc, h.bad);
        if (h.bad) {
            unsigned char got = 0;
            CHECK(cudaMemcpy(&got, b + h.first, 1, cudaMemcpyDeviceToHost));
            printf(" first_at=%llu value=0x%02x", h.first, (unsigned)got);
            clobbered_rounds++;
        }
        printf("\n");
        CHECK(cudaFree(b));
    }
    CHECK(cudaFree(m));
    CHECK(cudaStreamDestroy(s));
    if (s2)
        CHECK(cudaStreamDestroy(s2));
    printf("rounds=%d reused_address=%d clobbered=%d\n", rounds, reused_rounds, clobbered_rounds);
    if (clobbered_rounds) {
        printf("hazard=CLOBBERED\n");
        return 1;
    }
    printf("hazard=ok\n");
    return 0;
}
