/* Hostile uses of expandable segments (CUDA virtual memory under the pool). Linked with the
 * runtime and -lcuda. Modes (argv[1]):
 *   own-vmm: 1 GiB device. 700 MiB allocated, written and freed through cudaMalloc, then the
 *     program's own cuMemCreate of 800 MiB, mapped, given access and written.
 *   own-vmm-map: the same, but the program reserved and created its own small mapping first.
 *     argv[2] "lookup": cuMemCreate found through cuGetProcAddress_v2, as the static runtime
 *     and PyTorch find it; else called by symbol.
 *   trim-busy: relaxed or any mode. A 64 MiB block freed under a 200 ms kernel on a
 *     non-blocking stream; then the cache is given back by argv[2]: sync (another stream's
 *     synchronization, threshold 0), trim (cudaMemPoolTrimTo), empty (gpupool_empty_cache),
 *     oom (a request that fits only once the cache goes back).
 *   peer-small: two devices. Device 1 given access to device 0 before (argv[2] "before") or
 *     after ("after") device 0 maps a small (64 KiB) and a 3 MiB block; kernels on device 1
 *     fill both.
 *   info-busy: a 600 MiB block freed under a 300 ms kernel; cudaMemGetInfo's free, and a
 *     request of all of it.
 * Prints "key=value" lines and "expandable_hostile MODE ok". */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "cuda.h"
#include "check.h"

#define MiB (1024ull * 1024ull)

#define CHECK_CU(call)                                                                         \
    do {                                                                                       \
        CUresult e_ = (call);                                                                  \
        CHECK(e_ == CUDA_SUCCESS, "%s returned %d", #call, (int)e_);                           \
    } while (0)

static CUmemAllocationProp prop_of(int device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);

/* cuMemCreate as the program reaches it: by symbol (-lcuda), or through cuGetProcAddress as
 * the static runtime and PyTorch do (`lookup`). */
static create_fn create_of(int lookup)
{
    void *f = NULL;
    CUdriverProcAddressQueryResult found;
    if (!lookup)
        return cuMemCreate;
    CHECK(cuGetProcAddress_v2("cuMemCreate", &f, 12000, 0, &found) == CUDA_SUCCESS && f != NULL,
          "cuGetProcAddress_v2(cuMemCreate)");
    return (create_fn)f;
}

/* The program's own mapping of `bytes` on device 0: created, reserved, mapped, given access and
 * set. The cuMemCreate's answer is printed as `key`; on success the mapping is undone. */
static void own_mapping(const char *key, size_t bytes, int lookup)
{
    CUmemAllocationProp prop = prop_of(0);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    CUmemAccessDesc access;
    CUresult r = create_of(lookup)(&h, bytes, &prop, 0);
    printf("%s=%d\n", key, (int)r);
    if (r != CUDA_SUCCESS)
        return;
    CHECK_CU(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    CHECK_CU(cuMemMap(va, bytes, 0, h, 0));
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_CU(cuMemSetAccess(va, bytes, &access, 1));
    CHECK_CUDA(cudaMemset((void *)va, 7, bytes));
    CHECK_CU(cuMemUnmap(va, bytes));
    CHECK_CU(cuMemRelease(h));
    CHECK_CU(cuMemAddressFree(va, bytes));
}

static void own_vmm(int first_own, int lookup)
{
    void *p = NULL;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(0));
    if (first_own)
        own_mapping("own_first", 64 * MiB, lookup);
    CHECK_CUDA(cudaMalloc(&p, 700 * MiB));
    CHECK_CUDA(cudaMemset(p, 1, 700 * MiB));
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaDeviceSynchronize());
    own_mapping("own_create", 800 * MiB, lookup);
}

static void trim_busy(const char *how)
{
    void *p = NULL, *q = NULL;
    cudaStream_t s, other;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&p, 64 * MiB));
    CHECK_CUDA(cudasim_launch_fill(p, 64 * MiB, 200000, 0x11, s));
    CHECK_CUDA(cudaFree(p));
    if (strcmp(how, "sync") == 0) {
        CHECK_CUDA(cudaStreamSynchronize(other));
    } else if (strcmp(how, "trim") == 0) {
        cudaMemPool_t pool;
        CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
        CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
    } else if (strcmp(how, "empty") == 0) {
        typedef int (*empty_fn)(int, size_t *);
        empty_fn f = (empty_fn)dlsym(RTLD_DEFAULT, "gpupool_empty_cache");
        if (f != NULL)
            CHECK(f(0, NULL) == 0, "gpupool_empty_cache");
    } else if (strcmp(how, "oom") == 0) {
        size_t free_b = 0, total = 0;
        CHECK_CUDA(cudaMemGetInfo(&free_b, &total));
        printf("oom_free=%zu\n", free_b);
        CHECK_CUDA(cudaMalloc(&q, 1000 * MiB));
        CHECK_CUDA(cudaFree(q));
    }
    printf("mapped_after=%llu\n", sim_stats(0).vmm_mapped_bytes);
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("unmapped_while_busy=%llu\n", sim_stats(0).unmapped_while_busy);
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK_CUDA(cudaStreamDestroy(other));
}

static void peer_small(int before)
{
    void *small = NULL, *big = NULL;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaFree(0));
    if (before)
        CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&small, 64 * 1024));
    CHECK_CUDA(cudaMalloc(&big, 3 * MiB));
    CHECK_CUDA(cudaSetDevice(1));
    if (!before)
        CHECK_CUDA(cudaDeviceEnablePeerAccess(0, 0));
    printf("fill_small=%d\n", (int)cudasim_launch_fill(small, 64 * 1024, 10, 0x22, NULL));
    printf("fill_big=%d\n", (int)cudasim_launch_fill(big, 3 * MiB, 10, 0x22, NULL));
    (void)cudaGetLastError();
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("denied=%llu\n", sim_stats(1).accessed_without_access + sim_stats(0).accessed_without_access);
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(small));
    CHECK_CUDA(cudaFree(big));
}

static void info_busy(void)
{
    void *p = NULL, *q = NULL;
    size_t free_b = 0, total = 0;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, 600 * MiB));
    CHECK_CUDA(cudasim_launch_fill(p, 600 * MiB, 300000, 0x33, NULL));
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total));
    printf("info_free=%zu\n", free_b);
    cudaError_t r = cudaMalloc(&q, free_b);
    printf("info_all=%d\n", (int)r);
    (void)cudaGetLastError();
    if (r == cudaSuccess)
        CHECK_CUDA(cudaFree(q));
    printf("unmapped_while_busy=%llu\n", sim_stats(0).unmapped_while_busy);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    const char *arg = argc > 2 ? argv[2] : "";
    CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
    if (strcmp(mode, "own-vmm") == 0)
        own_vmm(0, strcmp(arg, "lookup") == 0);
    else if (strcmp(mode, "own-vmm-map") == 0)
        own_vmm(1, strcmp(arg, "lookup") == 0);
    else if (strcmp(mode, "trim-busy") == 0)
        trim_busy(arg);
    else if (strcmp(mode, "peer-small") == 0)
        peer_small(strcmp(arg, "before") == 0);
    else if (strcmp(mode, "info-busy") == 0)
        info_busy();
    else
        CHECK(0, "unknown mode %s", mode);
    printf("expandable_hostile %s ok\n", mode);
    return 0;
}
