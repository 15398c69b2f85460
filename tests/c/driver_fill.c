/* Issue 20's targets through the driver API (cuMemAlloc_v2 in the primary context), the path of
 * static-runtime programs and XLA. One run does it all and prints key=value lines:
 *   driver_fill KIB   blocks of KIB KiB until out of memory (fill_count, fill_error); every
 *                     other one freed, then blocks of twice the size (half_count); everything
 *                     freed and synchronized (held_after_free: device bytes taken from the
 *                     driver, pool or not); filled again with all but the first and the last
 *                     freed (held_two_ends); ends with "driver_fill ok". */
#include "check.h"
#include "cuda.h"

#define MAX_BLOCKS 65536

#define CU_OK(call)                                                                           \
    do {                                                                                      \
        CUresult got_ = (call);                                                               \
        CHECK(got_ == CUDA_SUCCESS, "%s returned %d", #call, (int)got_);                     \
    } while (0)

static CUdeviceptr blocks[MAX_BLOCKS];
static CUdeviceptr doubles[MAX_BLOCKS];

/* Blocks of `size` into `into` until the driver (or the pool) refuses; the refusal's code. */
static int fill(CUdeviceptr *into, size_t size, int *count)
{
    CUresult r = CUDA_SUCCESS;
    *count = 0;
    while (*count < MAX_BLOCKS) {
        r = cuMemAlloc_v2(&into[*count], size);
        if (r != CUDA_SUCCESS) {
            break;
        }
        (*count)++;
    }
    return (int)r;
}

/* Device memory taken from the driver: allocations and mapped handles alike. */
static unsigned long long held(void)
{
    CU_OK(cuCtxSynchronize());
    return sim_stats(0).live_bytes;
}

int main(int argc, char **argv)
{
    size_t size = (size_t)strtoull(argc > 1 ? argv[1] : "7168", NULL, 10) * 1024;
    CUcontext ctx = NULL;
    int n = 0, m = 0, i;
    CU_OK(cuInit(0));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU_OK(cuCtxSetCurrent(ctx));

    int err = fill(blocks, size, &n);
    printf("fill_count=%d\nfill_error=%d\n", n, err);
    for (i = 0; i < n; i += 2) {
        CU_OK(cuMemFree_v2(blocks[i]));
    }
    CU_OK(cuCtxSynchronize());
    err = fill(doubles, 2 * size, &m);
    printf("half_count=%d\nhalf_error=%d\n", m, err);
    for (i = 1; i < n; i += 2) {
        CU_OK(cuMemFree_v2(blocks[i]));
    }
    for (i = 0; i < m; i++) {
        CU_OK(cuMemFree_v2(doubles[i]));
    }
    printf("held_after_free=%llu\n", held());

    fill(blocks, size, &n);
    CHECK(n >= 2, "refill: %d blocks", n);
    for (i = 1; i + 1 < n; i++) {
        CU_OK(cuMemFree_v2(blocks[i]));
    }
    printf("held_two_ends=%llu\n", held());
    CU_OK(cuMemFree_v2(blocks[0]));
    CU_OK(cuMemFree_v2(blocks[n - 1]));
    CU_OK(cuDevicePrimaryCtxRelease_v2(0));
    printf("unmapped_while_busy=%llu\n", sim_stats(0).unmapped_while_busy);
    printf("driver_fill ok\n");
    return 0;
}
