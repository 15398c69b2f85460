/* cudasim's peer access, through the runtime and the driver: which devices can reach which,
 * enabling and disabling with CUDA's errors, and mapped memory reachable only where
 * cuMemSetAccess gave access, peer access enabled or not.
 * Run with CUDASIM_DEVICES=2, CUDASIM_MEM=1GiB and CUDASIM_CONTEXT_BYTES=0. */
#include "check.h"
#include "cuda.h"

#define G (2ull << 20)

#define CU_EXPECT(call, want)                                                          \
    do {                                                                               \
        CUresult got_ = (call);                                                        \
        CHECK(got_ == (want), "%s returned %d, expected %d", #call, (int)got_, (int)(want)); \
    } while (0)
#define CU_OK(call) CU_EXPECT(call, CUDA_SUCCESS)

static CUresult grant(CUdeviceptr p, int device)
{
    CUmemAccessDesc desc;
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cuMemSetAccess(p, G, &desc, 1);
}

int main(void)
{
    CUcontext zero = NULL, one = NULL;
    CUmemAllocationProp prop;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr r = 0;
    int can = -1;

    CU_OK(cuInit(0));
    CU_OK(cuDevicePrimaryCtxRetain(&zero, 0));
    CU_OK(cuDevicePrimaryCtxRetain(&one, 1));

    SECTION("distinct devices can reach each other");
    OK(cudaDeviceCanAccessPeer(&can, 0, 1));
    CHECK(can == 1, "0 to 1: %d", can);
    OK(cudaDeviceCanAccessPeer(&can, 1, 1));
    CHECK(can == 0, "1 to itself: %d", can);
    EXPECT(cudaDeviceCanAccessPeer(&can, 0, 2), cudaErrorInvalidDevice);
    EXPECT(cudaDeviceCanAccessPeer(NULL, 0, 1), cudaErrorInvalidValue);
    CU_OK(cuDeviceCanAccessPeer(&can, 1, 0));
    CHECK(can == 1, "driver, 1 to 0: %d", can);

    SECTION("the runtime: enable once, again is 704, itself 101, flags 1; disable once");
    OK(cudaSetDevice(1));
    EXPECT(cudaDeviceEnablePeerAccess(1, 0), cudaErrorInvalidDevice);
    EXPECT(cudaDeviceEnablePeerAccess(0, 1), cudaErrorInvalidValue);
    EXPECT(cudaDeviceEnablePeerAccess(2, 0), cudaErrorInvalidDevice);
    OK(cudaDeviceEnablePeerAccess(0, 0));
    EXPECT(cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessAlreadyEnabled);
    CHECK(cudaGetLastError() == cudaErrorPeerAccessAlreadyEnabled, "the last error");
    OK(cudaDeviceDisablePeerAccess(0));
    EXPECT(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    (void)cudaGetLastError();

    SECTION("the driver, by context: the same pairs");
    CU_OK(cuCtxSetCurrent(one));
    CU_EXPECT(cuCtxEnablePeerAccess(one, 0), CUDA_ERROR_INVALID_DEVICE);
    CU_OK(cuCtxEnablePeerAccess(zero, 0));
    CU_EXPECT(cuCtxEnablePeerAccess(zero, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    CU_EXPECT(cuCtxEnablePeerAccess(NULL, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_OK(cuCtxDisablePeerAccess(zero));
    CU_EXPECT(cuCtxDisablePeerAccess(zero), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);

    SECTION("mapped memory of device 0: device 1 reaches it once cuMemSetAccess says so");
    CU_OK(cuCtxSetCurrent(zero));
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CU_OK(cuMemAddressReserve(&r, G, 0, 0, 0));
    CU_OK(cuMemCreate(&h, G, &prop, 0));
    CU_OK(cuMemMap(r, G, 0, h, 0));
    CU_OK(grant(r, 0));
    OK(cudaSetDevice(1));
    OK(cudaDeviceEnablePeerAccess(0, 0));
    EXPECT(cudasim_launch_fill((void *)(size_t)r, 64, 0, 7, 0), cudaErrorInvalidValue);
    CHECK(stats_of(1).accessed_without_access == 1, "counted on device 1: %llu",
          stats_of(1).accessed_without_access);
    CU_OK(grant(r, 1));
    OK(cudasim_launch_fill((void *)(size_t)r, 64, 0, 7, 0));
    OK(cudaDeviceSynchronize());
    OK(cudaDeviceDisablePeerAccess(0));
    OK(cudasim_launch_fill((void *)(size_t)r, 64, 0, 8, 0));
    OK(cudaDeviceSynchronize());

    CU_OK(cuMemUnmap(r, G));
    CU_OK(cuMemRelease(h));
    CU_OK(cuMemAddressFree(r, G));
    printf("sim_peer: all checks passed\n");
    return 0;
}
