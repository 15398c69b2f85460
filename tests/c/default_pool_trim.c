/* cudaMemPoolTrimTo on a device's default pool, when the runtime holds part of it: a
 * cudaMallocAsync on a stream the pool cannot place (two devices, and the simulator has no
 * cudaStreamGetDevice) goes to the runtime's default pool, while the pool caches the blocks
 * of freed cudaMallocs. The trim keeps at most the bytes asked for, the two parts together,
 * as cudaMemPoolAttrReservedMemCurrent reads them; a trim to 0 after the last free leaves
 * nothing. Runs with and without the pool, CUDASIM_DEVICES=2; prints "keep=N",
 * "reserved_before=N", "reserved_after=N", "unplaced=N", "unplaced_bytes=N" (the
 * allocations on that stream) and "default_pool_trim ok". */
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
    cudaMemPool_t def;
    cudaStream_t s;
    void *unplaced, *cached[4];
    unsigned long long keep = 35 * MIB, before, after;
    int i;

    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&def, 0));
    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK_CUDA(cudaMallocAsync(&unplaced, 8 * MIB, s));
    /* Four large blocks of their own segments, freed: the pool keeps them (no threshold). */
    for (i = 0; i < 4; i++)
        CHECK_CUDA(cudaMalloc(&cached[i], 30 * MIB));
    for (i = 0; i < 4; i++)
        CHECK_CUDA(cudaFree(cached[i]));
    CHECK_CUDA(cudaStreamSynchronize(s));
    before = reserved(def);
    CHECK_CUDA(cudaMemPoolTrimTo(def, keep));
    after = reserved(def);
    printf("keep=%llu\nreserved_before=%llu\nreserved_after=%llu\n", keep, before, after);
    printf("unplaced=1\nunplaced_bytes=%llu\n", 8 * MIB);
    CHECK(before >= 8 * MIB, "the runtime's part is reserved: %llu", before);
    CHECK(after <= keep, "trimmed to %llu, %llu stay", keep, after);
    CHECK(after >= 8 * MIB, "the live block stays reserved: %llu", after);

    CHECK_CUDA(cudaFreeAsync(unplaced, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemPoolTrimTo(def, 0));
    CHECK(reserved(def) == 0, "a trim to 0 leaves %llu", reserved(def));
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("default_pool_trim ok\n");
    return 0;
}
