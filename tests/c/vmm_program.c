/* What a program sees of pool blocks in CUDA virtual memory (expandable segments), against
 * classic segments and no pool. Linked with the runtime and -lcuda. Modes:
 *   peer-runtime, peer-driver: two devices. A block of device 0 allocated before device 1 is
 *     given peer access (cudaDeviceEnablePeerAccess, or cuCtxEnablePeerAccess with device 0's
 *     primary context) and one after; then a kernel and a copy on device 1 use each.
 *   copy-current: two devices, each with a block, no peer access enabled; device 0's block
 *     copied with device 1 current before device 1 allocated, then each block copied to the
 *     host and to the other device's block with the other device current, as cudaMalloc
 *     memory allows.
 *   driver-set, driver-push, driver-create: two devices, driver calls only. Device 0's block
 *     (cuMemAlloc_v2) copied from and into with device 1 made current by cuCtxSetCurrent or
 *     cuCtxPushCurrent_v2 of its primary context, or by cuCtxCreate of a context of its own,
 *     device 1 never allocated on.
 *   ipc: cudaIpcGetMemHandle and cuIpcGetMemHandle of a 7 MiB block, and of a small block.
 *   queries: cuMemGetAddressRange of a block beside another, cudaPointerGetAttributes of a
 *     block on each of two devices.
 *   fence-runtime, fence-driver, fence-pool-access, fence-pool-access-driver, fence-sync,
 *     fence-none: two devices. Device 1 given peer access to device 0
 *     (cudaDeviceEnablePeerAccess, cuCtxEnablePeerAccess, cudaMemPoolSetAccess or
 *     cuMemPoolSetAccess of device 0's default pool as PyTorch's cudaMallocAsync backend and
 *     static-runtime programs do; none for fence-none) runs kernels on device 0's blocks, which device 0 then frees; then
 *     device 0's default pool trimmed (fence-sync: cudaDeviceSynchronize on device 0 instead),
 *     and a block of the freed size asked for.
 *   fence-barrier: two devices, device 1 given peer access to device 0. A block of device 0
 *     freed under device 1's kernel is asked for again at once (run in `barrier` mode) and
 *     filled by a kernel on device 0's legacy stream: that fill must land last. fence-launch:
 *     the same with a kernel of the program's on device 0's legacy stream before the request.
 *   fence-driver-only: fence-driver through driver calls alone (no runtime call, so the pool's
 *     own calls go to the driver), run in `strict` mode with a fence budget of 512 KiB: device
 *     0's block freed under device 1's kernel, then a request that only it fits.
 *   own-context: a block of device 1 freed, then, with a context the program made on device
 *     0 current, device 1's default pool trimmed: the program's context stays current.
 * Prints "key=value" lines and "vmm_program MODE: all checks passed". */
#include "cuda.h"
#include "check.h"

#define MiB (1024ull * 1024ull)

/* A fill kernel on device 1 over `bytes` of `p`, then a copy back there: 0 when both work,
 * else the first error. The bytes must hold `tag` afterwards. */
static int use_on_device_1(void *p, size_t bytes, unsigned char tag)
{
    cudaError_t r;
    unsigned char *h = (unsigned char *)malloc(bytes);
    CHECK(h != NULL, "host buffer");
    CHECK_CUDA(cudaSetDevice(1));
    r = cudasim_launch_fill(p, bytes, 100, tag, NULL);
    if (r == cudaSuccess) {
        CHECK_CUDA(cudaDeviceSynchronize());
        r = cudaMemcpy(h, p, bytes, cudaMemcpyDeviceToHost);
    }
    (void)cudaGetLastError();
    if (r == cudaSuccess) {
        for (size_t i = 0; i < bytes; i += 4096)
            CHECK(h[i] == tag, "byte %zu is %u, not %u", i, (unsigned)h[i], (unsigned)tag);
    }
    free(h);
    return (int)r;
}

static void peer(int driver)
{
    void *before = NULL, *after = NULL;
    int can = 0;
    CUcontext zero = NULL;

    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&before, 7 * MiB));
    CHECK_CUDA(cudaMemset(before, 0, 7 * MiB));
    CHECK_CUDA(cudaDeviceCanAccessPeer(&can, 1, 0));
    CHECK(can == 1, "device 1 cannot reach device 0");

    CHECK_CUDA(cudaSetDevice(1));
    if (driver) {
        CHECK(cuDevicePrimaryCtxRetain(&zero, 0) == CUDA_SUCCESS, "retain device 0's context");
        CHECK(cuCtxEnablePeerAccess(zero, 0) == CUDA_SUCCESS, "cuCtxEnablePeerAccess");
        printf("enable_again=%d\n", (int)cuCtxEnablePeerAccess(zero, 0));
    } else {
        CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
        printf("enable_again=%d\n", (int)cudaDeviceEnablePeerAccess(0, 0));
        (void)cudaGetLastError();
    }

    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&after, 12 * MiB));
    CHECK_CUDA(cudaMemset(after, 0, 12 * MiB));

    printf("use_before=%d\n", use_on_device_1(before, 7 * MiB, 0x5a));
    printf("use_after=%d\n", use_on_device_1(after, 12 * MiB, 0xa5));
    printf("denied=%llu\n", sim_stats(1).accessed_without_access);

    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(before));
    CHECK_CUDA(cudaFree(after));
    if (driver)
        CHECK(cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS, "release");
}

static void ipc(void)
{
    void *big = NULL, *small = NULL;
    cudaIpcMemHandle_t h;
    CUipcMemHandle ch;

    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&big, 7 * MiB));
    CHECK_CUDA(cudaMalloc(&small, 256 * 1024));
    printf("ipc_runtime=%d\n", (int)cudaIpcGetMemHandle(&h, big));
    (void)cudaGetLastError();
    printf("ipc_driver=%d\n", (int)cuIpcGetMemHandle(&ch, (CUdeviceptr)big));
    printf("ipc_small=%d\n", (int)cudaIpcGetMemHandle(&h, small));
    (void)cudaGetLastError();
    CHECK_CUDA(cudaFree(big));
    CHECK_CUDA(cudaFree(small));
}

static void queries(void)
{
    void *a = NULL, *b = NULL, *c = NULL;
    CUdeviceptr base = 0;
    size_t size = 0;
    struct cudaPointerAttributes at;
    uintptr_t p;

    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&a, 7 * MiB));
    CHECK_CUDA(cudaMalloc(&b, 7 * MiB));
    p = (uintptr_t)b;
    CHECK(cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)(p + 100)) == CUDA_SUCCESS,
          "cuMemGetAddressRange");
    printf("range_covers=%d\n", base <= p && p + 7 * MiB <= base + size);
    CHECK(cuMemGetAddressRange_v2(NULL, &size, (CUdeviceptr)p) == CUDA_SUCCESS, "NULL base");
    printf("range_size_alone=%d\n", size >= 7 * MiB);

    CHECK_CUDA(cudaPointerGetAttributes(&at, (void *)(p + 100)));
    printf("attr_type=%d\nattr_device=%d\nattr_pointer=%d\nattr_host_null=%d\n", (int)at.type,
           at.device, at.devicePointer == (void *)(p + 100), at.hostPointer == NULL);
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMalloc(&c, 12 * MiB));
    CHECK_CUDA(cudaPointerGetAttributes(&at, c));
    printf("attr1_type=%d\nattr1_device=%d\n", (int)at.type, at.device);
    CHECK_CUDA(cudaFree(c));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(b));
}

/* A copy needs no peer access on cudaMalloc memory: the devices in use reach each other's
 * blocks in virtual memory too. */
static void copy_current(void)
{
    void *b[2] = {NULL, NULL};
    unsigned char *h = (unsigned char *)malloc(7 * MiB);
    int d;
    CHECK(h != NULL, "host buffer");
    for (d = 0; d < 2; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaMalloc(&b[d], 7 * MiB));
        CHECK_CUDA(cudaMemset(b[d], 0x40 + d, 7 * MiB));
        CHECK_CUDA(cudaDeviceSynchronize());
        if (d == 0) {
            /* Device 1 made current before it allocated anything. */
            CHECK_CUDA(cudaSetDevice(1));
            printf("only_current_copy=%d\n",
                   (int)cudaMemcpy(h, b[0], 7 * MiB, cudaMemcpyDeviceToHost));
            (void)cudaGetLastError();
        }
    }
    for (d = 0; d < 2; d++) {
        int other = 1 - d;
        CHECK_CUDA(cudaSetDevice(other));
        printf("to_host_%d=%d\n", d, (int)cudaMemcpy(h, b[d], 7 * MiB, cudaMemcpyDeviceToHost));
        CHECK(h[0] == 0x40 + d && h[7 * MiB - 1] == 0x40 + d, "block %d holds %u", d,
              (unsigned)h[0]);
        printf("to_peer_%d=%d\n", d,
               (int)cudaMemcpy(b[other], b[d], 7 * MiB, cudaMemcpyDeviceToDevice));
        (void)cudaGetLastError();
        CHECK_CUDA(cudaMemset(b[other], 0x40 + other, 7 * MiB));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    printf("denied=%llu\n",
           sim_stats(0).accessed_without_access + sim_stats(1).accessed_without_access);
    for (d = 0; d < 2; d++)
        CHECK_CUDA(cudaFree(b[d]));
    free(h);
}

/* A driver-API program: a block of device 0 from cuMemAlloc, then device 1 made current only
 * through the driver (cuCtxSetCurrent of its primary context, cuCtxPushCurrent_v2 with `push`
 * 1, or cuCtxCreate of a context of the program's with `push` 2), never allocated on: a copy
 * from the block and one into it, as cudaMalloc memory allows. Then no context at all (a NULL
 * context set or pushed). */
static void driver_current(int push)
{
    enum { BYTES = 7 * MiB };
    CUcontext ctx[2] = {NULL, NULL}, now = NULL, own = NULL;
    CUdeviceptr b = 0;
    unsigned char *h = (unsigned char *)malloc(BYTES);
    int d;
    CHECK(h != NULL, "host buffer");
    for (d = 0; d < 2; d++)
        CHECK(cuDevicePrimaryCtxRetain(&ctx[d], d) == CUDA_SUCCESS, "retain %d", d);
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "device 0 current");
    CHECK(cuMemAlloc_v2(&b, BYTES) == CUDA_SUCCESS, "cuMemAlloc_v2");
    memset(h, 0x5a, BYTES);
    CHECK(cuMemcpyHtoD_v2(b, h, BYTES) == CUDA_SUCCESS, "fill on device 0");
    memset(h, 0, BYTES);
    if (push == 2) {
        CHECK(cuCtxCreate(&own, 0, 1) == CUDA_SUCCESS, "create on device 1");
        ctx[1] = own;
    } else if (push)
        CHECK(cuCtxPushCurrent_v2(ctx[1]) == CUDA_SUCCESS, "push device 1");
    else
        CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS, "set device 1");
    CHECK(cuCtxGetCurrent(&now) == CUDA_SUCCESS && now == ctx[1], "device 1 is current");
    printf("from_block=%d\n", (int)cuMemcpyDtoH_v2(h, b, BYTES));
    printf("content=%d\n", h[0] == 0x5a && h[BYTES / 2] == 0x5a && h[BYTES - 1] == 0x5a);
    memset(h, 0x6b, BYTES);
    printf("into_block=%d\n", (int)cuMemcpyHtoD_v2(b, h, BYTES));
    printf("denied=%llu\n", sim_stats(1).accessed_without_access);
    /* No context: passed through, and the thread has none. */
    if (push) {
        CHECK(cuCtxPopCurrent_v2(&now) == CUDA_SUCCESS && now == ctx[1], "pop device 1");
        printf("no_context=%d\n", (int)cuCtxPushCurrent_v2(NULL));
    } else {
        printf("no_context=%d\n", (int)cuCtxSetCurrent(NULL));
        CHECK(cuCtxGetCurrent(&now) == CUDA_SUCCESS && now == NULL, "a context is current");
    }
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "device 0 current again");
    memset(h, 0, BYTES);
    CHECK(cuMemcpyDtoH_v2(h, b, BYTES) == CUDA_SUCCESS, "read back on device 0");
    printf("written=%d\n", h[0] == 0x6b && h[BYTES - 1] == 0x6b);
    CHECK(cuMemFree_v2(b) == CUDA_SUCCESS, "cuMemFree_v2");
    if (own)
        CHECK(cuCtxDestroy(own) == CUDA_SUCCESS, "destroy the context made");
    free(h);
}

/* Kernels of device 1 on device 0's blocks, freed before they end: device 0's fence must wait
 * for device 1 before it unmaps a granule or reuses a block (`strict`). `enable`: 0 none, 1
 * through the runtime, 2 through the driver; `sync`: the program's cudaDeviceSynchronize on
 * device 0 instead of the trim. */
static void fence_peer(int enable, int sync)
{
    void *big = NULL, *small = NULL, *beside = NULL, *again = NULL;
    CUcontext zero = NULL;
    cudaMemPool_t pool = NULL;

    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&big, 64 * MiB));
    CHECK_CUDA(cudaMalloc(&beside, MiB / 2));
    CHECK_CUDA(cudaMalloc(&small, MiB / 2));
    CHECK_CUDA(cudaSetDevice(1));
    if (enable == 1) {
        CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
    } else if (enable == 2) {
        CHECK(cuDevicePrimaryCtxRetain(&zero, 0) == CUDA_SUCCESS, "retain device 0's context");
        CHECK(cuCtxEnablePeerAccess(zero, 0) == CUDA_SUCCESS, "cuCtxEnablePeerAccess");
    } else if (enable == 3) {
        struct cudaMemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location.type = cudaMemLocationTypeDevice;
        access.location.id = 1;
        access.flags = cudaMemAccessFlagsProtReadWrite;
        CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
        CHECK_CUDA(cudaMemPoolSetAccess(pool, &access, 1));
    } else if (enable == 4) {
        CUmemoryPool zero_pool = NULL;
        CUmemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = 1;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CHECK(cuDeviceGetDefaultMemPool(&zero_pool, 0) == CUDA_SUCCESS, "default pool");
        CHECK(cuMemPoolSetAccess(zero_pool, &access, 1) == CUDA_SUCCESS, "cuMemPoolSetAccess");
    }
    CHECK_CUDA(cudasim_launch_fill(big, 64 * MiB, 200000, 0x66, NULL));
    CHECK_CUDA(cudasim_launch_fill(small, MiB / 2, 200000, 0x67, NULL));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(big));
    CHECK_CUDA(cudaFree(small));
    if (sync) {
        CHECK_CUDA(cudaDeviceSynchronize());
    } else {
        CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
        CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
    }
    printf("unmapped_while_busy=%llu\n", sim_stats(0).unmapped_while_busy);
    CHECK_CUDA(cudaMalloc(&again, MiB / 2));
    printf("reused_busy=%d\n", cudasimRangeBusy(again, MiB / 2) > 0);
    /* The program never synchronized device 1: only the pool's fences did. */
    printf("peer_syncs=%llu\n", sim_stats(1).device_syncs);
    CHECK_CUDA(cudaFree(again));
    CHECK_CUDA(cudaFree(beside));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaDeviceSynchronize());
    if (zero != NULL)
        CHECK(cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS, "release");
}

/* A block of device 0 freed under a kernel of device 1, reused at once after the pool's barrier:
 * the barrier must order device 0's later work after device 1's kernel. `launch`: the program
 * launches a kernel on device 0's legacy stream after the free, which orders nothing of device
 * 1's. */
static void barrier_peer(int launch)
{
    void *small = NULL, *beside[7] = {NULL}, *again = NULL;
    unsigned char h[16];
    int i;

    /* Eight blocks fill a 4 MiB small segment: only the freed one fits the next request. */
    CHECK_CUDA(cudaSetDevice(0));
    for (i = 0; i < 7; i++)
        CHECK_CUDA(cudaMalloc(&beside[i], MiB / 2));
    CHECK_CUDA(cudaMalloc(&small, MiB / 2));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
    CHECK_CUDA(cudasim_launch_fill(small, MiB / 2, 200000, 0x67, NULL));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(small));
    if (launch)
        CHECK_CUDA(cudasim_launch_fill(beside[0], MiB / 2, 1, -1, NULL));
    CHECK_CUDA(cudaMalloc(&again, MiB / 2));
    printf("reused=%d\n", again == small);
    CHECK_CUDA(cudasim_launch_fill(again, MiB / 2, 1, 0x11, NULL));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMemcpy(h, again, sizeof h, cudaMemcpyDeviceToHost));
    printf("clobbered=%d\n", h[0] != 0x11);
    CHECK_CUDA(cudaFree(again));
    for (i = 0; i < 7; i++)
        CHECK_CUDA(cudaFree(beside[i]));
}

/* fence_peer's strict case through the driver alone: the pool's fence of device 0 reaches
 * device 1 through its primary context. */
static void fence_driver_only(void)
{
    CUcontext ctx[2] = {NULL, NULL};
    CUdeviceptr beside[7], small = 0, again = 0;
    int d, i;
    for (d = 0; d < 2; d++)
        CHECK(cuDevicePrimaryCtxRetain(&ctx[d], d) == CUDA_SUCCESS, "retain %d", d);
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS, "device 1 current");
    CHECK(cuCtxEnablePeerAccess(ctx[0], 0) == CUDA_SUCCESS, "cuCtxEnablePeerAccess");
    /* Eight blocks fill a 4 MiB small segment: only the freed one fits the next request. */
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "device 0 current");
    for (i = 0; i < 7; i++)
        CHECK(cuMemAlloc_v2(&beside[i], MiB / 2) == CUDA_SUCCESS, "cuMemAlloc_v2");
    CHECK(cuMemAlloc_v2(&small, MiB / 2) == CUDA_SUCCESS, "cuMemAlloc_v2");
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS, "device 1 current");
    CHECK(cudasim_cu_launch_fill(small, MiB / 2, 200000, 0x67, NULL) == CUDA_SUCCESS, "launch on 1");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "device 0 current");
    CHECK(cuMemFree_v2(small) == CUDA_SUCCESS, "cuMemFree_v2");
    CHECK(cuMemAlloc_v2(&again, MiB / 2) == CUDA_SUCCESS, "cuMemAlloc_v2");
    printf("reused=%d\n", again == small);
    printf("reused_busy=%d\n", cudasimRangeBusy((void *)(uintptr_t)again, MiB / 2) > 0);
    printf("peer_syncs=%llu\n", sim_stats(1).device_syncs);
    CUcontext now = NULL;
    CHECK(cuCtxGetCurrent(&now) == CUDA_SUCCESS, "cuCtxGetCurrent");
    printf("context_kept=%d\n", now == ctx[0]);
    CHECK(cuMemFree_v2(again) == CUDA_SUCCESS, "cuMemFree_v2");
    for (i = 0; i < 7; i++)
        CHECK(cuMemFree_v2(beside[i]) == CUDA_SUCCESS, "cuMemFree_v2");
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS, "device 1 current");
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS, "cuCtxSynchronize");
    for (d = 0; d < 2; d++)
        CHECK(cuDevicePrimaryCtxRelease_v2(d) == CUDA_SUCCESS, "release %d", d);
}

/* A context the program made on device 0 is current while the pool acts on device 1: after it,
 * the program's context is current still, not device 0's primary one. */
static void own_context(void)
{
    void *b = NULL;
    CUcontext own = NULL, now = NULL;
    cudaMemPool_t pool = NULL;
    int current = -1;

    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMalloc(&b, MiB / 2));
    CHECK_CUDA(cudasim_launch_fill(b, MiB / 2, 1000, 0x21, NULL));
    CHECK_CUDA(cudaFree(b));
    CHECK(cuCtxCreate_v2(&own, 0, 0) == CUDA_SUCCESS, "cuCtxCreate_v2");
    CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 1));
    CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
    CHECK(cuCtxGetCurrent(&now) == CUDA_SUCCESS, "cuCtxGetCurrent");
    printf("own_context_current=%d\n", now == own);
    CHECK_CUDA(cudaGetDevice(&current));
    printf("current_device=%d\n", current);
    CHECK(cuCtxDestroy_v2(own) == CUDA_SUCCESS, "cuCtxDestroy_v2");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
    if (strcmp(mode, "peer-runtime") == 0)
        peer(0);
    else if (strcmp(mode, "peer-driver") == 0)
        peer(1);
    else if (strcmp(mode, "copy-current") == 0)
        copy_current();
    else if (strcmp(mode, "driver-set") == 0)
        driver_current(0);
    else if (strcmp(mode, "driver-push") == 0)
        driver_current(1);
    else if (strcmp(mode, "driver-create") == 0)
        driver_current(2);
    else if (strcmp(mode, "ipc") == 0)
        ipc();
    else if (strcmp(mode, "queries") == 0)
        queries();
    else if (strcmp(mode, "fence-runtime") == 0)
        fence_peer(1, 0);
    else if (strcmp(mode, "fence-driver") == 0)
        fence_peer(2, 0);
    else if (strcmp(mode, "fence-sync") == 0)
        fence_peer(1, 1);
    else if (strcmp(mode, "fence-none") == 0)
        fence_peer(0, 0);
    else if (strcmp(mode, "fence-pool-access") == 0)
        fence_peer(3, 0);
    else if (strcmp(mode, "fence-pool-access-driver") == 0)
        fence_peer(4, 0);
    else if (strcmp(mode, "fence-barrier") == 0)
        barrier_peer(0);
    else if (strcmp(mode, "fence-launch") == 0)
        barrier_peer(1);
    else if (strcmp(mode, "fence-driver-only") == 0)
        fence_driver_only();
    else if (strcmp(mode, "own-context") == 0)
        own_context();
    else
        CHECK(0, "unknown mode '%s'", mode);
    printf("vmm_program %s: all checks passed\n", mode);
    return 0;
}
