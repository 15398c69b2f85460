/* vmm_cost: what the driver's virtual memory calls cost per granule, the figures that decide
 * whether GPUPOOL_EXPANDABLE_SLACK can be the default (docs/design-notes.md, "Note: the mapped
 * slack"). Run without the pool: it measures the driver, not us.
 *
 * usage: vmm_cost [GRANULES]   (default 512). Prints granule_bytes, then per granule in
 * microseconds: map_us (cuMemCreate + cuMemMap + cuMemSetAccess + cuMemRelease, as the pool
 * maps), unmap_us (cuMemUnmap, the memory going back), move_us (an unmap in one place and a map
 * in another, what the slack does per granule), then two cheaper ways a move could go, for the
 * slack's next step: remap_us (the physical memory kept: cuMemRetainAllocationHandle, cuMemUnmap,
 * cuMemMap of the same handle elsewhere, cuMemSetAccess, cuMemRelease) and run_map_us (a run
 * of granules mapped one handle each, with one cuMemSetAccess for the whole run), then
 * "vmm_cost=ok".
 *
 * The driver is reached with dlopen and dlsym, so the program builds without libcuda.so. */
#include "common.cuh"

struct Vmm {
    decltype(&cuMemGetAllocationGranularity) granularity;
    decltype(&cuMemAddressReserve) reserve;
    decltype(&cuMemAddressFree) address_free;
    decltype(&cuMemCreate) create;
    decltype(&cuMemMap) map;
    decltype(&cuMemSetAccess) set_access;
    decltype(&cuMemRelease) release;
    decltype(&cuMemUnmap) unmap;
    decltype(&cuMemRetainAllocationHandle) retain;
};

static Vmm load(void)
{
    void *d = driver_library();
    Vmm v;
    v.granularity = (decltype(v.granularity))driver_symbol(d, "cuMemGetAllocationGranularity");
    v.reserve = (decltype(v.reserve))driver_symbol(d, "cuMemAddressReserve");
    v.address_free = (decltype(v.address_free))driver_symbol(d, "cuMemAddressFree");
    v.create = (decltype(v.create))driver_symbol(d, "cuMemCreate");
    v.map = (decltype(v.map))driver_symbol(d, "cuMemMap");
    v.set_access = (decltype(v.set_access))driver_symbol(d, "cuMemSetAccess");
    v.release = (decltype(v.release))driver_symbol(d, "cuMemRelease");
    v.unmap = (decltype(v.unmap))driver_symbol(d, "cuMemUnmap");
    v.retain = (decltype(v.retain))driver_symbol(d, "cuMemRetainAllocationHandle");
    return v;
}

/* One granule mapped at `at`, as the pool maps one (src/cuda/backend.rs, vmm_map). */
static void map_one(const Vmm &v, CUdeviceptr at, size_t g, const CUmemAllocationProp &prop,
                    const CUmemAccessDesc &access)
{
    CUmemGenericAllocationHandle h = 0;
    DRIVER_CHECK(v.create(&h, g, &prop, 0));
    DRIVER_CHECK(v.map(at, g, 0, h, 0));
    DRIVER_CHECK(v.set_access(at, g, &access, 1));
    DRIVER_CHECK(v.release(h));
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 512;
    REQUIRE(n > 0, "GRANULES must be positive");
    CHECK(cudaFree(NULL));
    int device = 0;
    CHECK(cudaGetDevice(&device));
    Vmm v = load();

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t g = 0;
    DRIVER_CHECK(v.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    /* Two ranges of n granules: the moves go from the first to the second. */
    CUdeviceptr from = 0, to = 0;
    DRIVER_CHECK(v.reserve(&from, (size_t)n * g, 0, 0, 0));
    DRIVER_CHECK(v.reserve(&to, (size_t)n * g, 0, 0, 0));

    double t = now_ms();
    for (int k = 0; k < n; k++)
        map_one(v, from + (CUdeviceptr)k * g, g, prop, access);
    double map_ms = now_ms() - t;

    t = now_ms();
    for (int k = 0; k < n; k++)
        DRIVER_CHECK(v.unmap(from + (CUdeviceptr)k * g, g));
    double unmap_ms = now_ms() - t;

    for (int k = 0; k < n; k++)
        map_one(v, from + (CUdeviceptr)k * g, g, prop, access);
    t = now_ms();
    for (int k = 0; k < n; k++) {
        DRIVER_CHECK(v.unmap(from + (CUdeviceptr)k * g, g));
        map_one(v, to + (CUdeviceptr)k * g, g, prop, access);
    }
    double move_ms = now_ms() - t;
    /* The moved memory works: a set and a copy back. */
    CHECK(cudaMemset((void *)to, 0x5A, (size_t)n * g));
    unsigned char last = 0;
    CHECK(cudaMemcpy(&last, (void *)(to + (CUdeviceptr)n * g - 1), 1, cudaMemcpyDeviceToHost));
    REQUIRE(last == 0x5A, "moved memory reads %#x", last);

    /* Back to the first range, keeping the physical memory: no allocation, no memory given
     * back in between, and the contents go with it. */
    t = now_ms();
    for (int k = 0; k < n; k++) {
        CUdeviceptr src = to + (CUdeviceptr)k * g, dst = from + (CUdeviceptr)k * g;
        CUmemGenericAllocationHandle h = 0;
        DRIVER_CHECK(v.retain(&h, (void *)src));
        DRIVER_CHECK(v.unmap(src, g));
        DRIVER_CHECK(v.map(dst, g, 0, h, 0));
        DRIVER_CHECK(v.set_access(dst, g, &access, 1));
        DRIVER_CHECK(v.release(h));
    }
    double remap_ms = now_ms() - t;
    last = 0;
    CHECK(cudaMemcpy(&last, (void *)(from + (CUdeviceptr)n * g - 1), 1, cudaMemcpyDeviceToHost));
    REQUIRE(last == 0x5A, "remapped memory reads %#x", last);

    for (int k = 0; k < n; k++)
        DRIVER_CHECK(v.unmap(from + (CUdeviceptr)k * g, g));
    /* A run: one handle and one mapping per granule (each can go back alone), one access
     * call for the run. */
    t = now_ms();
    for (int k = 0; k < n; k++) {
        CUmemGenericAllocationHandle h = 0;
        DRIVER_CHECK(v.create(&h, g, &prop, 0));
        DRIVER_CHECK(v.map(to + (CUdeviceptr)k * g, g, 0, h, 0));
        DRIVER_CHECK(v.release(h));
    }
    DRIVER_CHECK(v.set_access(to, (size_t)n * g, &access, 1));
    double run_ms = now_ms() - t;
    CHECK(cudaMemset((void *)to, 0x3C, (size_t)n * g));
    CHECK(cudaMemcpy(&last, (void *)(to + (CUdeviceptr)n * g - 1), 1, cudaMemcpyDeviceToHost));
    REQUIRE(last == 0x3C, "memory mapped as a run reads %#x", last);

    for (int k = 0; k < n; k++)
        DRIVER_CHECK(v.unmap(to + (CUdeviceptr)k * g, g));
    DRIVER_CHECK(v.address_free(from, (size_t)n * g));
    DRIVER_CHECK(v.address_free(to, (size_t)n * g));

    printf("granules=%d granule_bytes=%zu\n", n, g);
    printf("map_us=%.2f unmap_us=%.2f move_us=%.2f remap_us=%.2f run_map_us=%.2f\n",
           map_ms * 1000.0 / n, unmap_ms * 1000.0 / n, move_ms * 1000.0 / n,
           remap_ms * 1000.0 / n, run_ms * 1000.0 / n);
    printf("vmm_cost=ok\n");
    return 0;
}
