/* Requests the device cannot hold beside what is live, on a 4 GiB device (CUDASIM_MEM=4GiB):
 * 1 GiB kept live, then 5 GiB (more than the device) and 3.5 GiB (more than it has free)
 * asked; both must fail with cudaErrorMemoryAllocation. Prints "creates N" and "maps N", the
 * simulator's cuMemCreate and cuMemMap calls made for those two requests, and the live block's
 * tag still intact. */
#include "check.h"

#define MIB (1ull << 20)

int main(void)
{
    void *kept, *doomed = NULL;
    cudasimStats before, after;
    CHECK_CUDA(cudaMalloc(&kept, 1024 * MIB));
    tag_block(kept, 1024 * MIB, 0x5a);
    before = sim_stats(0);
    CHECK(cudaMalloc(&doomed, 5120 * MIB) == cudaErrorMemoryAllocation, "5 GiB: expected OOM");
    (void)cudaGetLastError();
    CHECK(cudaMalloc(&doomed, 3584 * MIB) == cudaErrorMemoryAllocation, "3.5 GiB: expected OOM");
    (void)cudaGetLastError();
    after = sim_stats(0);
    printf("creates %llu\nmaps %llu\n", after.vmm_creates - before.vmm_creates,
           after.vmm_maps - before.vmm_maps);
    check_tag(kept, 1024 * MIB, 0x5a);
    CHECK_CUDA(cudaFree(kept));
    printf("doomed_request ok\n");
    return 0;
}
