/* cudaMemPoolTrimTo on a device's default pool, when the runtime holds part of it. With two
 * devices, device 0 current: a cudaMallocAsync on a stream of device 1 goes to the runtime's
 * default pool of device 1, while the pool caches the blocks of cudaMallocs freed on device 1.
 * The trim keeps at most the bytes asked for, the two parts together, as
 * cudaMemPoolAttrReservedMemCurrent reads them; a trim to 0 after the last free leaves
 * nothing. A stream of device 0 made by the program is the pool's (the simulator has no
 * cudaStreamGetDevice: the pool asks the driver for the stream's context). Runs with and
 * without the pool, CUDASIM_DEVICES=2; prints "keep=N", "reserved_before=N",
 * "reserved_after=N", "unplaced=N", "unplaced_bytes=N" (the allocations on device 1's stream),
 * "placed=N" (those on device 0's) and "default_pool_trim ok". */
#include "check.h"

#define MIB (1024ull * 1024ull)

static unsigned long long reserved(cudaMemPool_t pool)
{
    unsigned long long v = 0;
    CHECK_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v));
    return v;
}

int main(void)
{
    cudaMemPool_t def1;
    cudaStream_t s0, s1;
    void *unplaced, *placed, *cached[4];
    unsigned long long keep = 35 * MIB, before, after;
    int i;

    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&def1, 1));
    /* Four large blocks of their own segments on device 1, freed: the pool keeps them (no
     * threshold). */
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaStreamCreate(&s1));
    for (i = 0; i < 4; i++)
        CHECK_CUDA(cudaMalloc(&cached[i], 30 * MIB));
    for (i = 0; i < 4; i++)
        CHECK_CUDA(cudaFree(cached[i]));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreate(&s0));
    CHECK_CUDA(cudaMallocAsync(&placed, MIB, s0));
    CHECK_CUDA(cudaFreeAsync(placed, s0));
    CHECK_CUDA(cudaMallocAsync(&unplaced, 8 * MIB, s1));
    CHECK_CUDA(cudaStreamSynchronize(s1));
    before = reserved(def1);
    CHECK_CUDA(cudaMemPoolTrimTo(def1, keep));
    after = reserved(def1);
    printf("keep=%llu\nreserved_before=%llu\nreserved_after=%llu\n", keep, before, after);
    printf("unplaced=1\nunplaced_bytes=%llu\nplaced=1\n", 8 * MIB);
    CHECK(before >= 8 * MIB, "the runtime's part is reserved: %llu", before);
    CHECK(after <= keep, "trimmed to %llu, %llu stay", keep, after);
    CHECK(after >= 8 * MIB, "the live block stays reserved: %llu", after);

    CHECK_CUDA(cudaFreeAsync(unplaced, s1));
    CHECK_CUDA(cudaStreamSynchronize(s1));
    CHECK_CUDA(cudaMemPoolTrimTo(def1, 0));
    CHECK(reserved(def1) == 0, "a trim to 0 leaves %llu", reserved(def1));
    CHECK_CUDA(cudaStreamDestroy(s0));
    CHECK_CUDA(cudaStreamDestroy(s1));
    printf("default_pool_trim ok\n");
    return 0;
}
