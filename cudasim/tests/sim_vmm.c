/* cudasim's virtual memory management on the driver face, mixed with runtime calls: granularity,
 * reservations, physical handles on the device's capacity, mappings that the runtime's copies,
 * sets and kernels use, access, whole-mapping unmaps, release while mapped, unmap under a
 * running kernel, fault injection, cuGetProcAddress_v2, a forked child and device reset.
 * Run with CUDASIM_MEM=1GiB and CUDASIM_CONTEXT_BYTES=0. */
#include "check.h"
#include "cuda.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1ull << 20)
#define G (2 * MiB)

#define CU_EXPECT(call, want)                                                          \
    do {                                                                               \
        CUresult got_ = (call);                                                        \
        const char *name_ = NULL;                                                      \
        cuGetErrorName(got_, &name_);                                                  \
        CHECK(got_ == (want), "%s returned %d (%s), expected %d", #call, (int)got_,    \
              name_ ? name_ : "?", (int)(want));                                       \
    } while (0)
#define CU_OK(call) CU_EXPECT(call, CUDA_SUCCESS)

static CUmemAllocationProp device_prop(int device)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

static CUresult set_access(CUdeviceptr p, size_t size, CUmemAccess_flags flags)
{
    CUmemAccessDesc desc;
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = 0;
    desc.flags = flags;
    return cuMemSetAccess(p, size, &desc, 1);
}

static size_t free_bytes(void)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        return (size_t)-1;
    }
    return free_b;
}

/* Whether touching `p` from a child process kills it with SIGSEGV (a GPU would fault). */
static int faults_on_touch(CUdeviceptr p)
{
    int status = 0;
    pid_t pid;
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        *(volatile char *)(size_t)p = 1;
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
        return 0;
    }
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

static int granularity(void)
{
    CUmemAllocationProp prop = device_prop(0);
    size_t g = 0;
    SECTION("granularity: 2 MiB minimum and recommended; bad properties refused");
    CU_OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK(g == G, "minimum %zu", g);
    g = 0;
    CU_OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CHECK(g == G, "recommended %zu", g);
    CU_EXPECT(cuMemGetAllocationGranularity(&g, &prop, (CUmemAllocationGranularity_flags)7),
              CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuMemGetAllocationGranularity(&g, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_ERROR_INVALID_VALUE);
    prop.location.id = 1;
    CU_EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_ERROR_INVALID_DEVICE);
    prop = device_prop(0);
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CU_EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_ERROR_INVALID_VALUE);
    prop = device_prop(0);
    prop.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    CU_EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
              CUDA_ERROR_INVALID_VALUE);
    return 0;
}

static int round_trip(void)
{
    CUmemAllocationProp prop = device_prop(0);
    CUdeviceptr r = 0, aligned = 0, base = 0;
    CUmemGenericAllocationHandle a = 0, b = 0;
    size_t before, size = 0;
    struct cudaPointerAttributes attr;
    cudaIpcMemHandle_t ipc;
    static char buf[8192], back[8192];
    unsigned i;

    SECTION("reserve: address space only, aligned, not device memory");
    before = free_bytes();
    CU_EXPECT(cuMemAddressReserve(&r, G + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuMemAddressReserve(&r, 8 * G, 3 * G, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuMemAddressReserve(&r, 8 * G, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemAddressReserve(&r, 8 * G, 0, 0, 0));
    CHECK(r != 0 && r % G == 0, "reserved at %llx", r);
    CU_OK(cuMemAddressReserve(&aligned, 8 * G, 8 * G, 0, 0));
    CHECK(aligned % (8 * G) == 0, "16 MiB alignment: %llx", aligned);
    CHECK(free_bytes() == before, "a reservation took device memory");
    OK(cudaPointerGetAttributes(&attr, (void *)(size_t)r));
    CHECK(attr.type == cudaMemoryTypeUnregistered, "unmapped space is type %d", attr.type);

    SECTION("create: physical memory taken from the capacity cudaMalloc uses");
    CU_EXPECT(cuMemCreate(&a, G + 512, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemCreate(&a, G, &prop, 0));
    CU_OK(cuMemCreate(&b, 2 * G, &prop, 0));
    CHECK(a != 0 && b != 0 && a != b, "handles %llu %llu", a, b);
    CHECK(free_bytes() == before - 3 * G, "free %zu, expected %llu", free_bytes(),
          (unsigned long long)(before - 3 * G));
    CHECK(stats_of(0).vmm_created_bytes == 3 * G && stats_of(0).live_bytes == 3 * G,
          "created %llu live %llu", stats_of(0).vmm_created_bytes, stats_of(0).live_bytes);
    CHECK(stats_of(0).live_allocations == 2 && stats_of(0).vmm_creates == 2, "handles counted");

    SECTION("map: whole handles at granules of free reserved space");
    CU_EXPECT(cuMemMap(r, G, 0, b, 0), CUDA_ERROR_INVALID_VALUE);      /* part of b */
    CU_EXPECT(cuMemMap(r, 2 * G, G, b, 0), CUDA_ERROR_INVALID_VALUE);  /* an offset */
    CU_EXPECT(cuMemMap(r + 4096, G, 0, a, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuMemMap(r + 7 * G, 2 * G, 0, b, 0), CUDA_ERROR_INVALID_VALUE); /* past the end */
    CU_EXPECT(cuMemMap(r, G, 0, 12345, 0), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemMap(r, G, 0, a, 0));
    CU_OK(cuMemMap(r + G, 2 * G, 0, b, 0));
    CU_EXPECT(cuMemMap(r + G, G, 0, a, 0), CUDA_ERROR_INVALID_VALUE); /* over a mapping */
    CHECK(stats_of(0).vmm_mapped_bytes == 3 * G && stats_of(0).vmm_maps == 2, "mapped %llu",
          stats_of(0).vmm_mapped_bytes);
    CHECK(free_bytes() == before - 3 * G, "mapping took device memory");

    SECTION("no access before cuMemSetAccess: copies, sets and launches refused");
    memset(buf, 0x3c, sizeof buf);
    EXPECT(cudaMemcpy((void *)(size_t)r, buf, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    EXPECT(cudaMemset((void *)(size_t)r, 0, 64), cudaErrorInvalidValue);
    EXPECT(cudasim_launch_fill((void *)(size_t)r, 64, 0, 1, 0), cudaErrorInvalidValue);
    CHECK(stats_of(0).accessed_without_access == 3, "refusals %llu",
          stats_of(0).accessed_without_access);
    CHECK(faults_on_touch(r), "the host could touch a mapping without access");
    CU_EXPECT(set_access(r + G, G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(set_access(r, 4 * G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(set_access(r, 3 * G, (CUmemAccess_flags)2), CUDA_ERROR_INVALID_VALUE);

    SECTION("read-write access: copies, sets and kernels across two mappings");
    CU_OK(set_access(r, 3 * G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    for (i = 0; i < sizeof buf; i++) {
        buf[i] = (char)(i * 7);
    }
    OK(cudaMemcpy((void *)(size_t)(r + G - 4096), buf, sizeof buf, cudaMemcpyHostToDevice));
    CU_OK(cuMemcpyDtoH(back, r + G - 4096, sizeof back));
    CHECK(memcmp(buf, back, sizeof buf) == 0, "the copy across mappings does not round-trip");
    OK(cudaMemcpy(back, (void *)(size_t)(r + G - 4096), sizeof back, cudaMemcpyDefault));
    CHECK(memcmp(buf, back, sizeof buf) == 0, "cudaMemcpyDefault from mapped memory");
    OK(cudaMemset((void *)(size_t)r, 0x11, 3 * G));
    CU_OK(cuMemcpyDtoH(back, r + 3 * G - sizeof back, sizeof back));
    CHECK(back[0] == 0x11 && back[sizeof back - 1] == 0x11, "the set missed the second mapping");
    OK(cudasim_launch_fill((void *)(size_t)(r + G - 16), 32, 1000, 0x22, 0));
    OK(cudaDeviceSynchronize());
    CU_OK(cuMemcpyDtoH(back, r + G - 32, 64));
    CHECK(back[15] == 0x11 && back[16] == 0x22 && back[47] == 0x22 && back[48] == 0x11,
          "the kernel's fill across mappings: %x %x %x %x", back[15], back[16], back[47],
          back[48]);
    EXPECT(cudaMemcpy((void *)(size_t)(r + 3 * G - 8), buf, 64, cudaMemcpyHostToDevice),
           cudaErrorInvalidValue); /* runs past the mapped memory */

    SECTION("one handle, two mappings: the bytes are the handle's; read-only access");
    CU_OK(cuMemMap(r + 6 * G, G, 0, a, 0));
    CU_OK(set_access(r + 6 * G, G, CU_MEM_ACCESS_FLAGS_PROT_READ));
    CU_OK(cuMemcpyDtoH(back, r + 6 * G + G - 16, 16));
    CHECK(back[0] == 0x22 && back[15] == 0x22, "the second mapping shows other bytes");
    EXPECT(cudaMemset((void *)(size_t)(r + 6 * G), 0, 64), cudaErrorInvalidValue);
    CHECK(stats_of(0).accessed_without_access == 4, "a write to read-only memory was not refused");
    CHECK(stats_of(0).vmm_mapped_bytes == 4 * G, "mapped %llu", stats_of(0).vmm_mapped_bytes);

    SECTION("queries: the mapping's range, device memory of device 0, no IPC, no cudaFree");
    CU_OK(cuMemGetAddressRange(&base, &size, r + G + 5));
    CHECK(base == r + G && size == 2 * G, "range %llx %zu", base, size);
    OK(cudaPointerGetAttributes(&attr, (void *)(size_t)(r + 100)));
    CHECK(attr.type == cudaMemoryTypeDevice && attr.device == 0 &&
              attr.devicePointer == (void *)(size_t)(r + 100) && attr.hostPointer == NULL,
          "attributes %d %d", attr.type, attr.device);
    EXPECT(cudaIpcGetMemHandle(&ipc, (void *)(size_t)r), cudaErrorInvalidValue);
    EXPECT(cudaFree((void *)(size_t)r), cudaErrorInvalidValue);

    SECTION("unmap takes whole mappings only; a reservation with mappings is not freed");
    CU_EXPECT(cuMemUnmap(r + G, G), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuMemUnmap(r, 2 * G), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuMemUnmap(r + 4 * G, G), CUDA_ERROR_INVALID_VALUE); /* nothing mapped */
    CU_EXPECT(cuMemAddressFree(r, 8 * G), CUDA_ERROR_INVALID_VALUE);
    CHECK(stats_of(0).vmm_mapped_bytes == 4 * G, "a refused unmap unmapped");

    SECTION("a handle released while mapped keeps its memory until its last unmap");
    CU_OK(cuMemRelease(a));
    CU_EXPECT(cuMemRelease(a), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuMemMap(r + 4 * G, G, 0, a, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK(free_bytes() == before - 3 * G, "released memory still mapped was given back");
    CHECK(stats_of(0).vmm_created_bytes == 3 * G, "created %llu", stats_of(0).vmm_created_bytes);
    CU_OK(cuMemcpyDtoH(back, r + G - 16, 16));
    CHECK(back[0] == 0x22, "released memory lost its bytes");
    CU_OK(cuMemUnmap(r + 6 * G, G));
    CHECK(free_bytes() == before - 3 * G, "freed with a mapping left");
    CU_OK(cuMemUnmap(r, 3 * G)); /* both remaining mappings at once */
    CHECK(free_bytes() == before - 2 * G, "the last unmap did not free the released handle");
    CHECK(stats_of(0).vmm_created_bytes == 2 * G && stats_of(0).vmm_mapped_bytes == 0,
          "created %llu mapped %llu", stats_of(0).vmm_created_bytes, stats_of(0).vmm_mapped_bytes);
    CHECK(faults_on_touch(r + G), "unmapped memory did not fault");
    EXPECT(cudaMemcpy((void *)(size_t)r, buf, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CU_EXPECT(cuMemGetAddressRange(&base, &size, r), CUDA_ERROR_NOT_FOUND);
    CU_OK(cuMemRelease(b));
    CHECK(free_bytes() == before, "free %zu after release, expected %zu", free_bytes(), before);
    CHECK(stats_of(0).live_allocations == 0 && stats_of(0).live_bytes == 0, "live %llu",
          stats_of(0).live_bytes);
    CU_EXPECT(cuMemAddressFree(r, 4 * G), CUDA_ERROR_INVALID_VALUE);
    CU_OK(cuMemAddressFree(r, 8 * G));
    CU_OK(cuMemAddressFree(aligned, 8 * G));
    CU_EXPECT(cuMemAddressFree(r, 8 * G), CUDA_ERROR_INVALID_VALUE);
    return 0;
}

static int capacity(void)
{
    CUmemAllocationProp prop = device_prop(0);
    CUmemGenericAllocationHandle a = 0, b = 7, c = 0;
    CUdeviceptr d = 0;
    void *p = NULL;
    SECTION("out of memory: one budget for cuMemCreate, cudaMalloc and cuMemAlloc");
    CHECK(free_bytes() == 1024 * MiB, "free %zu at the start", free_bytes());
    CU_EXPECT(cuMemCreate(&b, 1024 * MiB + G, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(b == 7, "a failed cuMemCreate wrote its handle");
    CU_OK(cuMemCreate(&a, 512 * MiB, &prop, 0));
    EXPECT(cudaMalloc(&p, 600 * MiB), cudaErrorMemoryAllocation);
    CU_EXPECT(cuMemAlloc(&d, 600 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    CU_OK(cuMemCreate(&c, 512 * MiB, &prop, 0));
    CHECK(free_bytes() == 0, "free %zu with the device full", free_bytes());
    CU_EXPECT(cuMemCreate(&b, G, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(stats_of(0).peak_live_bytes == 1024 * MiB, "peak %llu", stats_of(0).peak_live_bytes);
    CU_OK(cuMemRelease(a));
    CU_OK(cuMemRelease(c));
    CHECK(free_bytes() == 1024 * MiB, "free %zu after the releases", free_bytes());
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CU_EXPECT(cuMemCreate(&b, G, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
    return 0;
}

static int busy_unmap(void)
{
    CUmemAllocationProp prop = device_prop(0);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr r = 0;
    cudaStream_t s = NULL;
    unsigned long long writes, unmaps = stats_of(0).vmm_unmaps;
    char back[16];

    SECTION("unmap under a running kernel proceeds and is counted; after a sync it is not");
    CU_OK(cuMemAddressReserve(&r, G, 0, 0, 0));
    CU_OK(cuMemCreate(&h, G, &prop, 0));
    CU_OK(cuMemMap(r, G, 0, h, 0));
    CU_OK(set_access(r, G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    writes = stats_of(0).kernel_writes;
    OK(cudasim_launch_fill((void *)(size_t)r, G, 200000, 0x77, s));
    CHECK(cudasimRangeBusy((void *)(size_t)(r + 4096), 16) == 1, "the kernel is not in flight");
    CU_OK(cuMemUnmap(r, G));
    CHECK(stats_of(0).unmapped_while_busy == 1, "busy unmaps %llu",
          stats_of(0).unmapped_while_busy);
    OK(cudaDeviceSynchronize());
    CHECK(stats_of(0).kernel_writes == writes, "the kernel wrote into unmapped memory");

    CU_OK(cuMemMap(r, G, 0, h, 0));
    CU_OK(set_access(r, G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    OK(cudasim_launch_fill((void *)(size_t)r, G, 50000, 0x55, s));
    OK(cudaDeviceSynchronize());
    CHECK(cudasimRangeBusy((void *)(size_t)r, G) == 0, "still busy after the sync");
    CU_OK(cuMemcpyDtoH(back, r + G - sizeof back, sizeof back));
    CHECK(back[0] == 0x55 && stats_of(0).kernel_writes == writes + 1, "the fill is missing");
    CU_OK(cuMemUnmap(r, G));
    CHECK(stats_of(0).unmapped_while_busy == 1, "an unmap after the sync counted as busy");
    CHECK(stats_of(0).vmm_unmaps == unmaps + 2, "unmaps %llu", stats_of(0).vmm_unmaps);
    CU_OK(cuMemRelease(h));
    CU_OK(cuMemAddressFree(r, G));
    OK(cudaStreamDestroy(s));
    return 0;
}

static int faults(void)
{
    CUmemAllocationProp prop = device_prop(0);
    CUmemGenericAllocationHandle h = 99;
    unsigned long long creates = stats_of(0).vmm_creates;
    size_t before = free_bytes();
    SECTION("fault injection on cuMemCreate");
    OK(cudasimFailNext("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY));
    CU_EXPECT(cuMemCreate(&h, G, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(h == 99, "an injected failure wrote the handle");
    CHECK(stats_of(0).vmm_creates == creates && free_bytes() == before, "it acted");
    CU_OK(cuMemCreate(&h, G, &prop, 0));
    CU_OK(cuMemRelease(h));
    OK(cudasimFailNext("cuMemUnmap", 2, CUDA_ERROR_UNKNOWN));
    CU_EXPECT(cuMemUnmap(0, G), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuMemUnmap(0, G), CUDA_ERROR_UNKNOWN);
    return 0;
}

typedef CUresult (*create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                             unsigned long long);
typedef CUresult (*granularity_t)(size_t *, const CUmemAllocationProp *,
                                  CUmemAllocationGranularity_flags);

static int lookups(void)
{
    static const char *names[] = {"cuMemGetAllocationGranularity", "cuMemAddressReserve",
                                  "cuMemAddressFree", "cuMemCreate", "cuMemRelease", "cuMemMap",
                                  "cuMemUnmap", "cuMemSetAccess"};
    CUdriverProcAddressQueryResult status;
    CUmemAllocationProp prop = device_prop(0);
    void *pfn = NULL;
    create_t create;
    granularity_t gran;
    size_t g = 0;
    unsigned i;
    SECTION("cuGetProcAddress_v2 answers every VMM name from CUDA 10.2");
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        pfn = NULL;
        CU_OK(cuGetProcAddress_v2(names[i], &pfn, 12080, 0, &status));
        CHECK(pfn != NULL && status == CU_GET_PROC_ADDRESS_SUCCESS, "%s", names[i]);
        CU_EXPECT(cuGetProcAddress_v2(names[i], &pfn, 10010, 0, &status), CUDA_ERROR_NOT_FOUND);
        CHECK(pfn == NULL && status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "%s at 10010",
              names[i]);
    }
    CU_OK(cuGetProcAddress_v2("cuMemCreate", &pfn, 10020, 0, &status));
    memcpy(&create, &pfn, sizeof create);
    CHECK(create == cuMemCreate, "cuMemCreate is another function");
    CU_OK(cuGetProcAddress_v2("cuMemGetAllocationGranularity", &pfn, 12080, 2, &status));
    memcpy(&gran, &pfn, sizeof gran);
    CU_OK(gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CHECK(g == G, "granularity %zu through the lookup", g);
    CU_EXPECT(cuGetProcAddress_v2("cuMemCreate_v2", &pfn, 12080, 0, &status),
              CUDA_ERROR_NOT_FOUND);
    CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "status %d", status);
    return 0;
}

/* GPUDirect RDMA on virtual memory: the attribute says whether the device supports it
 * (`supported`: CUDASIM_VMM_RDMA is not 0), cuMemCreate counts the flag where it does and
 * refuses it where it does not; without the flag, creation works either way. */
static int rdma(int supported)
{
    CUmemAllocationProp prop = device_prop(0);
    CUmemGenericAllocationHandle h = 0;
    unsigned long long before = stats_of(0).vmm_rdma_creates;
    int value = -1;
    SECTION(supported ? "GPUDirect RDMA with VMM is supported and counted"
                      : "GPUDirect RDMA with VMM is refused where unsupported");
    CU_OK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                               0));
    CHECK(value == supported, "attribute %d", value);
    CU_OK(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    CHECK(value == 1, "VMM attribute %d", value);
    CU_EXPECT(cuDeviceGetAttribute(&value, (CUdevice_attribute)1, 0), CUDA_ERROR_INVALID_VALUE);
    CU_EXPECT(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                                   7),
              CUDA_ERROR_INVALID_DEVICE);
    CU_EXPECT(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
              CUDA_ERROR_INVALID_VALUE);
    prop.allocFlags.gpuDirectRDMACapable = 1;
    if (supported) {
        CU_OK(cuMemCreate(&h, G, &prop, 0));
        CU_OK(cuMemRelease(h));
    } else {
        CU_EXPECT(cuMemCreate(&h, G, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
    }
    CHECK(stats_of(0).vmm_rdma_creates == before + (unsigned)supported, "rdma creates %llu",
          stats_of(0).vmm_rdma_creates);
    prop.allocFlags.gpuDirectRDMACapable = 0;
    CU_OK(cuMemCreate(&h, G, &prop, 0));
    CU_OK(cuMemRelease(h));
    CHECK(stats_of(0).vmm_rdma_creates == before + (unsigned)supported, "a plain create counted");
    return 0;
}

/* `reset` 0: cudaDeviceReset, 1: cuDevicePrimaryCtxReset_v2. */
static int reset(int how)
{
    CUmemAllocationProp prop = device_prop(0);
    CUmemGenericAllocationHandle kept = 0, released = 0;
    CUdeviceptr r = 0;
    SECTION(how ? "cuDevicePrimaryCtxReset_v2 keeps mappings and handles"
                : "cudaDeviceReset keeps mappings and handles");
    CU_OK(cuMemAddressReserve(&r, 2 * G, 0, 0, 0));
    CU_OK(cuMemCreate(&kept, G, &prop, 0));
    CU_OK(cuMemCreate(&released, G, &prop, 0));
    CU_OK(cuMemMap(r, G, 0, kept, 0));
    CU_OK(cuMemMap(r + G, G, 0, released, 0));
    CU_OK(cuMemRelease(released));
    CU_OK(set_access(r, 2 * G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    CHECK(free_bytes() == 1024 * MiB - 2 * G, "free %zu", free_bytes());
    if (how) {
        CU_OK(cuDevicePrimaryCtxReset(0));
    } else {
        OK(cudaDeviceReset());
    }
    /* As cuCtxDestroy documents: memory from cuMemCreate outlives the context. */
    CHECK(stats_of(0).vmm_created_bytes == 2 * G && stats_of(0).vmm_mapped_bytes == 2 * G &&
              stats_of(0).live_allocations == 2,
          "created %llu mapped %llu", stats_of(0).vmm_created_bytes, stats_of(0).vmm_mapped_bytes);
    CHECK(free_bytes() == 1024 * MiB - 2 * G, "free %zu after the reset", free_bytes());
    CHECK(!faults_on_touch(r), "the reset unmapped the range");
    CU_OK(cuMemUnmap(r, 2 * G));
    CU_OK(cuMemRelease(kept));
    CHECK(free_bytes() == 1024 * MiB, "free %zu once unmapped and released", free_bytes());
    CU_OK(cuMemAddressFree(r, 2 * G));
    return 0;
}

/* No argument: every check, on devices with GPUDirect RDMA; "rdma-off": the RDMA check alone,
 * run with CUDASIM_VMM_RDMA=0. */
/* A forked child's runtime does not finish its parent's kernels, and its writes to mapped
 * memory stay its own. Mapped memory is a memfd mapped shared, so without care the child's
 * mappings are the parent's memory: a kernel the parent launched before the fork, retired
 * again by the child's next call, or the child's own store, would land over what the parent
 * stored there since. */
static int fork_child(void)
{
    CUmemAllocationProp prop = device_prop(0);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr r = 0;
    cudaStream_t s = NULL;
    int go[2], status = 0;
    char back[16];
    pid_t pid;

    SECTION("a forked child does not write its parent's kernels into mapped memory");
    CU_OK(cuMemAddressReserve(&r, G, 0, 0, 0));
    CU_OK(cuMemCreate(&h, G, &prop, 0));
    CU_OK(cuMemMap(r, G, 0, h, 0));
    CU_OK(set_access(r, G, CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
    OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    OK(cudasim_launch_fill((void *)(size_t)r, G, 50000, 0x77, s));
    CHECK(pipe(go) == 0, "pipe");
    fflush(stdout);
    pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        char c;
        /* Once the parent has its kernel's fill and wrote over it: a call that retires. */
        if (read(go[0], &c, 1) != 1)
            _exit(2);
        if (cudaFree(NULL) != cudaSuccess)
            _exit(3);
        /* The child's own write: a GPU's memory is no forked child's, so it stays the
         * child's (a private copy), never the parent's. */
        memset((void *)(size_t)r, 0x13, sizeof back);
        _exit(0);
    }
    OK(cudaStreamSynchronize(s));
    CU_OK(cuMemcpyDtoH(back, r, sizeof back));
    CHECK(back[0] == 0x77, "the parent's kernel did not write");
    OK(cudaMemset((void *)(size_t)r, 0x42, G));
    CHECK(write(go[1], "x", 1) == 1, "write");
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "child status %d", status);
    CU_OK(cuMemcpyDtoH(back, r, sizeof back));
    CHECK(back[0] == 0x42,
          "the child wrote over the parent's memory (0x77: its kernel, 0x13: its store): %#x",
          (unsigned)(unsigned char)back[0]);
    close(go[0]);
    close(go[1]);
    CU_OK(cuMemUnmap(r, G));
    CU_OK(cuMemRelease(h));
    CU_OK(cuMemAddressFree(r, G));
    OK(cudaStreamDestroy(s));
    return 0;
}

int main(int argc, char **argv)
{
    CUcontext primary = NULL;
    CU_OK(cuInit(0));
    CU_OK(cuDevicePrimaryCtxRetain(&primary, 0));
    CU_OK(cuCtxSetCurrent(primary));
    if (argc > 1 && strcmp(argv[1], "rdma-off") == 0) {
        if (rdma(0)) {
            return 1;
        }
    } else if (granularity() || round_trip() || capacity() || busy_unmap() || faults() ||
               lookups() || rdma(1) || fork_child() || reset(0) || reset(1)) {
        return 1;
    }
    printf("sim_vmm: all checks passed\n");
    return 0;
}
