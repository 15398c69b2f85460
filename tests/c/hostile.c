/* The runtime's return codes for bad and edge-case arguments, unchanged under the pool, and a
 * pool left intact by them. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <sys/types.h>

#include "check.h"

typedef void *(*torch_malloc_fn)(ssize_t size, int device, cudaStream_t stream);
typedef void (*torch_free_fn)(void *ptr, ssize_t size, int device, cudaStream_t stream);

int main(void)
{
    void *a = NULL, *b = NULL, *p = NULL, *q = NULL;
    cudaStream_t s;

    /* cudaFree(NULL) creates the context and succeeds. */
    CHECK(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL)");
    /* A NULL out-pointer is an invalid value. */
    CHECK(cudaMalloc(NULL, 4096) == cudaErrorInvalidValue, "cudaMalloc(NULL, n)");
    /* Size 0 is the runtime's business: success with a NULL pointer. */
    p = (void *)0x1;
    CHECK(cudaMalloc(&p, 0) == cudaSuccess && p == NULL, "cudaMalloc(&p, 0) gave %p", p);
    /* Sizes near SIZE_MAX are out-of-memory, never an overflowed small block. */
    CHECK(cudaMalloc(&p, (size_t)-1) == cudaErrorMemoryAllocation, "SIZE_MAX");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "last error after SIZE_MAX");
    CHECK(cudaMalloc(&p, (size_t)-1 - 4096) == cudaErrorMemoryAllocation, "SIZE_MAX - 4096");
    CHECK(cudaMalloc(&p, ((size_t)1 << 62)) == cudaErrorMemoryAllocation, "2^62");
    cudaGetLastError();

    CHECK_CUDA(cudaMalloc(&a, 100000));
    CHECK_CUDA(cudaMalloc(&b, 100000));
    tag_block(a, 100000, 0xA1);
    tag_block(b, 100000, 0xB2);

    /* Interior, wild and double frees: invalid value, and nothing else happens. */
    /* As the runtime, each refusal is also the last error. */
    CHECK(cudaGetLastError() == cudaSuccess, "clean start");
    CHECK(cudaFree((char *)a + 512) == cudaErrorInvalidValue, "interior free");
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "last error after an interior free");
    CHECK(cudaFree((void *)0x7777000) == cudaErrorInvalidValue, "wild free");
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "last error after a wild free");
    CHECK_CUDA(cudaFree(a));
    CHECK(cudaFree(a) == cudaErrorInvalidValue, "double free");
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "last error after a double free");
    CHECK(cudaFreeAsync(a, 0) == cudaErrorInvalidValue, "double free async");
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "last error after a double free async");
    check_tag(b, 100000, 0xB2);

    /* The pool still works: new blocks never overlap b. */
    for (int i = 0; i < 100; i++) {
        CHECK_CUDA(cudaMalloc(&p, 100000));
        CHECK((char *)p + 100000 <= (char *)b || (char *)b + 100000 <= (char *)p, "overlap");
        tag_block(p, 100000, 0x33);
        CHECK_CUDA(cudaFree(p));
    }
    check_tag(b, 100000, 0xB2);

    /* cudaFreeAsync of a pooled pointer returns it to the pool; the runtime never sees it. */
    cudasimStats before = sim_stats(0);
    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK_CUDA(cudaFreeAsync(b, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK(sim_stats(0).free_calls == before.free_calls, "a pooled pointer reached cudaFreeAsync");
    CHECK_CUDA(cudaStreamDestroy(s));

    /* cudaMallocAsync is pooled, whichever call frees it; memory from other allocators passes
     * through untouched. */
    CHECK_CUDA(cudaMallocAsync(&q, 8192, 0));
    CHECK_CUDA(cudaFree(q));
    CHECK_CUDA(cudaMallocAsync(&q, 8192, 0));
    CHECK_CUDA(cudaFreeAsync(q, 0));
    size_t pitch = 0;
    CHECK_CUDA(cudaMallocPitch(&q, &pitch, 64, 64));
    CHECK_CUDA(cudaFree(q));
    CHECK_CUDA(cudaMallocManaged(&q, 8192, cudaMemAttachGlobal));
    CHECK_CUDA(cudaFree(q));
    CHECK(sim_stats(0).free_calls == before.free_calls + 2, "pass-through frees");

    /* Pointer attributes of a sub-allocated pointer are the runtime's (device memory). */
    CHECK_CUDA(cudaMalloc(&p, 4096));
    struct cudaPointerAttributes attr;
    CHECK_CUDA(cudaPointerGetAttributes(&attr, p));
    CHECK(attr.type == cudaMemoryTypeDevice && attr.devicePointer == p, "attributes");
    /* An IPC handle of a block that does not start its segment is refused, not wrong. */
    CHECK_CUDA(cudaMalloc(&q, 4096));
    cudaIpcMemHandle_t h;
    void *first = p < q ? p : q, *second = p < q ? q : p;
    CHECK(cudaIpcGetMemHandle(&h, second) == cudaErrorInvalidValue, "IPC of an interior block");
    (void)first;
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFree(q));

    /* cudaFreeAsync of a block on a stream already destroyed: the runtime's refusal (invalid
     * resource handle), also the last error, and the block stays the program's. */
    {
        cudaStream_t gone;
        CHECK_CUDA(cudaMalloc(&p, 4096));
        CHECK_CUDA(cudaStreamCreate(&gone));
        CHECK_CUDA(cudaStreamDestroy(gone));
        cudaError_t r = cudaFreeAsync(p, gone);
        CHECK(r == cudaErrorInvalidResourceHandle, "cudaFreeAsync on a destroyed stream: %d", (int)r);
        CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle, "last error after it");
        CHECK_CUDA(cudaFree(p));
    }
    /* PyTorch's free of a block on a stream destroyed since: its free returns nothing to
     * refuse with, so the block goes back all the same, and a later cudaFree of it is a double
     * free, not a block kept for good. */
    {
        torch_malloc_fn torch_malloc = (torch_malloc_fn)dlsym(RTLD_DEFAULT, "gpupool_torch_malloc");
        torch_free_fn torch_free = (torch_free_fn)dlsym(RTLD_DEFAULT, "gpupool_torch_free");
        cudaStream_t gone;
        CHECK(torch_malloc && torch_free, "the pool's PyTorch entry points");
        CHECK_CUDA(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking));
        p = torch_malloc(4096, 0, gone);
        CHECK(p != NULL, "gpupool_torch_malloc");
        CHECK_CUDA(cudaStreamDestroy(gone));
        torch_free(p, 4096, 0, gone);
        CHECK(cudaGetLastError() == cudaSuccess, "last error after PyTorch's free");
        CHECK(cudaFree(p) == cudaErrorInvalidValue, "PyTorch's free left the block allocated");
        cudaGetLastError();
    }

    /* More sizes near SIZE_MAX, through both free entry points afterwards: never a block. */
    size_t huge[] = {(size_t)-1 - 511, (size_t)-1 - 512, ((size_t)-1 >> 1) + 1, (size_t)-1 - 20971520};
    for (unsigned i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        p = (void *)0x1;
        CHECK(cudaMalloc(&p, huge[i]) == cudaErrorMemoryAllocation, "size %zu", huge[i]);
        CHECK(p == (void *)0x1, "out-pointer written on failure");
    }
    cudaGetLastError();
    /* Wild frees at the ends of the address space, NULL through cudaFreeAsync. */
    CHECK(cudaFree((void *)(uintptr_t)-512) == cudaErrorInvalidValue, "free near the top");
    CHECK(cudaFree((void *)512) == cudaErrorInvalidValue, "free near zero");
    CHECK(cudaFreeAsync(NULL, 0) == cudaSuccess, "cudaFreeAsync(NULL)");
    cudaGetLastError();

    /* Cross-device frees: a block of device 1 freed with device 0 current is fine; an interior
     * or double free of it is refused whichever device is current. */
    int devices = 0;
    CHECK_CUDA(cudaGetDeviceCount(&devices));
    if (devices >= 2) {
        void *d1;
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMalloc(&d1, 300000));
        tag_block(d1, 300000, 0xD1);
        CHECK_CUDA(cudaMalloc(&q, 300000));
        CHECK_CUDA(cudaSetDevice(0));
        CHECK(cudaFree((char *)d1 + 4096) == cudaErrorInvalidValue, "cross-device interior");
        check_tag(d1, 300000, 0xD1);
        CHECK_CUDA(cudaFree(d1));
        CHECK(cudaFree(d1) == cudaErrorInvalidValue, "cross-device double free");
        CHECK(cudaFreeAsync(d1, 0) == cudaErrorInvalidValue, "cross-device double free async");
        CHECK_CUDA(cudaFreeAsync(q, 0));
        cudaGetLastError();
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMalloc(&d1, 300000));
        tag_block(d1, 300000, 0xD2);
        check_tag(d1, 300000, 0xD2);
        CHECK_CUDA(cudaFree(d1));
        CHECK_CUDA(cudaSetDevice(0));
        printf("cross-device ok\n");
    }
    printf("hostile ok\n");
    return 0;
}
