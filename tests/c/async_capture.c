/* cudaMallocAsync under the pool: pooled on ordinary streams; the block the program's own
 * cudaFreeAsync gave back serves that stream's next request at once, in every reuse mode, and
 * another stream only after a fence; on a stream being captured into a graph the request goes
 * to the runtime (the graph owns it), and so does the driver's cuMemAllocAsync there. The
 * per-thread-default-stream forms (`_ptsz`) are the pool's too. Prints "captured_async=N" and
 * "captured_bytes=N" (the requests made during capture, and their bytes), "capture_queries=N"
 * (the cudaStreamIsCapturing calls one pooled cudaMallocAsync on a created stream made),
 * "pair_capture_queries=N" and "pair_id_queries=N" (the cudaStreamIsCapturing and
 * cudaStreamGetId calls of a cudaMallocAsync+cudaFreeAsync pair there), the same of the driver's
 * pair, cuMemAllocAsync+cuMemFreeAsync, there ("cu_pair_capture_queries=N", "cu_pair_id_queries=N")
 * and on the per-thread default stream through the _ptsz forms ("cu_ptsz_pair_id_queries=N"),
 * the ids both APIs asked for cudaMallocAsync+cuMemFreeAsync ("mixed_pair_id_queries=N"), and
 * "async_capture ok". */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>

#include "check.h"

typedef cudaError_t (*malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);
typedef int (*cu_mem_alloc_async_fn)(unsigned long long *, size_t, cudaStream_t);
typedef int (*cu_mem_free_async_fn)(unsigned long long, cudaStream_t);

/* The calls of `name` the simulator counted so far (counting starts at the first question). */
static unsigned long long calls(const char *name)
{
    unsigned long long n = 0;
    CHECK(cudasimCallCount(name, &n) == 0, "cudasimCallCount(%s)", name);
    return n;
}

/* Both APIs' stream id questions so far: their ids are the same. */
static unsigned long long id_calls(void)
{
    return calls("cudaStreamGetId") + calls("cuStreamGetId");
}

#define MIB (1 << 20)

int main(void)
{
    cudaStream_t s, t;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    cudasimStats before = sim_stats(0);

    void *a, *b, *c;
    unsigned long long queries_before = 0, queries_after = 0;
    CHECK(cudasimCallCount("cudaStreamIsCapturing", &queries_before) == 0, "cudasimCallCount");
    CHECK_CUDA(cudaMallocAsync(&a, MIB, s));
    CHECK(cudasimCallCount("cudaStreamIsCapturing", &queries_after) == 0, "cudasimCallCount");
    CHECK_CUDA(cudaFreeAsync(a, s));
    unsigned long long pair_capture[2] = {0, 0}, pair_id[2] = {0, 0};
    CHECK(cudasimCallCount("cudaStreamIsCapturing", &pair_capture[0]) == 0, "cudasimCallCount");
    CHECK(cudasimCallCount("cudaStreamGetId", &pair_id[0]) == 0, "cudasimCallCount");
    CHECK_CUDA(cudaMallocAsync(&b, MIB, s));
    CHECK(b == a, "the stream that freed %p got %p", a, b);
    CHECK_CUDA(cudaFreeAsync(b, s));
    CHECK(cudasimCallCount("cudaStreamIsCapturing", &pair_capture[1]) == 0, "cudasimCallCount");
    CHECK(cudasimCallCount("cudaStreamGetId", &pair_id[1]) == 0, "cudasimCallCount");
    CHECK_CUDA(cudaMallocAsync(&c, MIB, t));
    CHECK(c != a, "another stream got %p before a fence", a);
    CHECK_CUDA(cudaFreeAsync(c, t));
    /* Freed with cudaFree, a cudaMallocAsync block goes back to the pool too. */
    CHECK_CUDA(cudaMallocAsync(&c, 3 * MIB, 0));
    CHECK_CUDA(cudaFree(c));
    cudasimStats after = sim_stats(0);
    CHECK(after.async_mallocs == before.async_mallocs, "the runtime served %llu pooled requests",
          after.async_mallocs - before.async_mallocs);
    CHECK(after.free_calls == before.free_calls, "a pooled block reached the runtime's free");

    /* nvcc --default-stream per-thread calls the _ptsz forms; a pooled block freed through one
     * must come back to the pool, never reach the runtime. */
    malloc_async_fn malloc_ptsz = (malloc_async_fn)dlsym(RTLD_DEFAULT, "cudaMallocAsync_ptsz");
    free_async_fn free_ptsz = (free_async_fn)dlsym(RTLD_DEFAULT, "cudaFreeAsync_ptsz");
    CHECK(malloc_ptsz && free_ptsz, "the pool exports the _ptsz forms");
    CHECK_CUDA(cudaMalloc(&c, MIB));
    CHECK_CUDA(free_ptsz(c, 0));
    CHECK_CUDA(malloc_ptsz(&c, 2 * MIB, 0));
    CHECK_CUDA(free_ptsz(c, 0));
    after = sim_stats(0);
    CHECK(after.free_calls == before.free_calls && after.async_mallocs == before.async_mallocs,
          "a _ptsz call of a pooled block reached the runtime");

    /* The driver's pair, as a static runtime's cudaMallocAsync/cudaFreeAsync make it, on the
     * same created stream (a cudaStream_t is a CUstream), then through the _ptsz forms on the
     * per-thread default stream, whose one handle is a stream per thread: its id is asked at
     * both ends. Then the runtime's allocation and the driver's free. */
    cu_mem_alloc_async_fn cu_alloc_async =
        (cu_mem_alloc_async_fn)dlsym(RTLD_DEFAULT, "cuMemAllocAsync");
    cu_mem_free_async_fn cu_free_async =
        (cu_mem_free_async_fn)dlsym(RTLD_DEFAULT, "cuMemFreeAsync");
    cu_mem_alloc_async_fn cu_alloc_ptsz =
        (cu_mem_alloc_async_fn)dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz");
    cu_mem_free_async_fn cu_free_ptsz =
        (cu_mem_free_async_fn)dlsym(RTLD_DEFAULT, "cuMemFreeAsync_ptsz");
    CHECK(cu_alloc_async && cu_free_async && cu_alloc_ptsz && cu_free_ptsz,
          "no cuMemAllocAsync/cuMemFreeAsync in the process");
    unsigned long long cu_a = 0, cu_b = 0;
    CHECK(cu_alloc_async(&cu_a, MIB, s) == 0, "cuMemAllocAsync");
    CHECK(cu_free_async(cu_a, s) == 0, "cuMemFreeAsync");
    unsigned long long cu_capture = calls("cuStreamIsCapturing"), cu_id = calls("cuStreamGetId");
    CHECK(cu_alloc_async(&cu_b, MIB, s) == 0, "cuMemAllocAsync");
    CHECK(cu_b == cu_a, "the stream that freed 0x%llx got 0x%llx", cu_a, cu_b);
    CHECK(cu_free_async(cu_b, s) == 0, "cuMemFreeAsync");
    cu_capture = calls("cuStreamIsCapturing") - cu_capture;
    cu_id = calls("cuStreamGetId") - cu_id;
    CHECK(cu_alloc_ptsz(&cu_a, MIB, NULL) == 0, "cuMemAllocAsync_ptsz");
    CHECK(cu_free_ptsz(cu_a, NULL) == 0, "cuMemFreeAsync_ptsz");
    unsigned long long cu_ptsz_id = calls("cuStreamGetId");
    CHECK(cu_alloc_ptsz(&cu_b, MIB, NULL) == 0, "cuMemAllocAsync_ptsz");
    CHECK(cu_free_ptsz(cu_b, NULL) == 0, "cuMemFreeAsync_ptsz");
    cu_ptsz_id = calls("cuStreamGetId") - cu_ptsz_id;
    unsigned long long mixed_id = id_calls();
    CHECK_CUDA(cudaMallocAsync(&b, MIB, s));
    CHECK(cu_free_async((unsigned long long)(uintptr_t)b, s) == 0, "cuMemFreeAsync");
    mixed_id = id_calls() - mixed_id;

    cudaGraph_t graph;
    void *g, *kept;
    unsigned long long captured, captured_bytes = 0;
    CHECK_CUDA(cudaMallocAsync(&kept, 5 * MIB, s));
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK_CUDA(cudaMallocAsync(&g, MIB, s));
    captured_bytes += MIB;
    CHECK(sim_stats(0).captured_mallocs == before.captured_mallocs + 1,
          "a request during capture did not reach the runtime");
    CHECK_CUDA(cudaFreeAsync(g, s));
    /* The driver's own call on the stream being captured (the pool's hook, which the preload
     * puts first). */
    unsigned long long cu_g = 0;
    CHECK(cu_alloc_async(&cu_g, 2 * MIB, s) == 0, "cuMemAllocAsync during capture");
    captured_bytes += 2 * MIB;
    CHECK(sim_stats(0).captured_mallocs == before.captured_mallocs + 2,
          "the driver's request during capture did not reach the driver");
    CHECK_CUDA(cudaFreeAsync((void *)(uintptr_t)cu_g, s));
    /* A pooled block freed into the graph: the graph frees it when it runs, so the pool must
     * never hand it out again (and never give it to the runtime's free either). */
    CHECK_CUDA(cudaFreeAsync(kept, s));
    CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    captured = sim_stats(0).captured_mallocs - before.captured_mallocs;
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaDeviceSynchronize());
    for (int i = 0; i < 8; i++) {
        void *again;
        CHECK_CUDA(cudaMallocAsync(&again, 5 * MIB, i % 2 ? s : t));
        CHECK(again != kept, "a block freed during capture was handed out again (%p)", kept);
        CHECK_CUDA(cudaFreeAsync(again, i % 2 ? s : t));
        CHECK_CUDA(cudaDeviceSynchronize());
    }

    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK_CUDA(cudaStreamDestroy(t));
    printf("captured_async=%llu\n", captured);
    printf("captured_bytes=%llu\n", captured_bytes);
    printf("capture_queries=%llu\n", queries_after - queries_before);
    printf("pair_capture_queries=%llu\n", pair_capture[1] - pair_capture[0]);
    printf("pair_id_queries=%llu\n", pair_id[1] - pair_id[0]);
    printf("cu_pair_capture_queries=%llu\n", cu_capture);
    printf("cu_pair_id_queries=%llu\n", cu_id);
    printf("cu_ptsz_pair_id_queries=%llu\n", cu_ptsz_id);
    printf("mixed_pair_id_queries=%llu\n", mixed_id);
    printf("async_capture ok\n");
    return 0;
}
