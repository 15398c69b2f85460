/* capture_fence.c in a process with no runtime, as XLA (JAX) and the static runtime capture:
 * freed blocks wait for a fence (strict) or a barrier (barrier mode); the program then begins a
 * capture in relaxed mode through the driver and allocates with cuMemAlloc_v2: on a
 * non-blocking stream, a request the waiting blocks would serve after a fence; on a blocking
 * stream, one a barrier would. The driver refuses a context synchronization during a capture,
 * and a use of the legacy stream while a blocking stream is captured, and either invalidates
 * the capture. Usage: driver_capture_fence MODE MIB BLOCKING [TO_GRAPH], MODE one of
 *   lcuda        linked with -lcuda: cuStreamBeginCapture_v2 and cuStreamEndCapture by symbol;
 *   static       as the static runtime: everything through cuGetProcAddress_v2, flags 0;
 *   static-ptsz  the same with flags 2 (the _ptsz forms); a blocking capture is of the
 *                thread's per-thread default stream, named NULL.
 * With TO_GRAPH 1 the capture goes into a graph the program made (cuStreamBeginCaptureToGraph).
 * Then the capture's end lets the pool's fences resume: gpupool_empty_cache gives the cache
 * back. Prints "malloc=", "status=" (cuStreamIsCapturing before the end), "end=", "graph=",
 * "released=" (-1 without the pool), "live_after=" (the bytes the simulator still holds for the
 * process after it) and "driver_capture_fence ok". */
#include "driver_proc.h"

#define MiB (1024ull * 1024ull)
#define CU_OK(call)                                                                          \
    do {                                                                                     \
        CUresult r_ = (call);                                                                \
        CHECK(r_ == CUDA_SUCCESS, "%s returned %d", #call, (int)r_);                         \
    } while (0)

static struct {
    CUresult (*init)(unsigned);
    CUresult (*retain)(CUcontext *, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*sync)(void);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*is_capturing)(CUstream, int *);
    CUresult (*begin)(CUstream, CUstreamCaptureMode);
    CUresult (*end)(CUstream, CUgraph *);
    CUresult (*begin_to_graph)(CUstream, CUgraph, const CUgraphNode *, const CUgraphEdgeData *,
                               size_t, CUstreamCaptureMode);
    CUresult (*graph_create)(CUgraph *, unsigned);
    CUresult (*graph_destroy)(CUgraph);
} cu;

static void link_directly(void)
{
    cu.init = cuInit;
    cu.retain = cuDevicePrimaryCtxRetain;
    cu.set_current = cuCtxSetCurrent;
    cu.alloc = cuMemAlloc_v2;
    cu.free = cuMemFree_v2;
    cu.sync = cuCtxSynchronize;
    cu.stream_create = cuStreamCreate;
    cu.stream_destroy = cuStreamDestroy_v2;
    cu.is_capturing = cuStreamIsCapturing;
    cu.begin = cuStreamBeginCapture_v2;
    cu.end = cuStreamEndCapture;
    cu.begin_to_graph = cuStreamBeginCaptureToGraph;
    cu.graph_create = cuGraphCreate;
    cu.graph_destroy = cuGraphDestroy;
}

static void link_as_static_runtime(cuuint64_t flags)
{
    void *h;
    get_proc_t get = static_runtime_get_proc(&h);
    *(void **)&cu.init = proc(get, "cuInit", flags);
    *(void **)&cu.retain = proc(get, "cuDevicePrimaryCtxRetain", flags);
    *(void **)&cu.set_current = proc(get, "cuCtxSetCurrent", flags);
    *(void **)&cu.alloc = proc(get, "cuMemAlloc", flags);
    *(void **)&cu.free = proc(get, "cuMemFree", flags);
    *(void **)&cu.sync = proc(get, "cuCtxSynchronize", flags);
    *(void **)&cu.stream_create = proc(get, "cuStreamCreate", flags);
    *(void **)&cu.stream_destroy = proc(get, "cuStreamDestroy", flags);
    *(void **)&cu.is_capturing = proc(get, "cuStreamIsCapturing", flags);
    *(void **)&cu.begin = proc(get, "cuStreamBeginCapture", flags);
    *(void **)&cu.end = proc(get, "cuStreamEndCapture", flags);
    *(void **)&cu.begin_to_graph = proc(get, "cuStreamBeginCaptureToGraph", flags);
    *(void **)&cu.graph_create = proc(get, "cuGraphCreate", flags);
    *(void **)&cu.graph_destroy = proc(get, "cuGraphDestroy", flags);
}

int main(int argc, char **argv)
{
    CHECK(argc == 4 || argc == 5, "usage: driver_capture_fence MODE MIB BLOCKING [TO_GRAPH]");
    int to_graph = argc == 5 && atoi(argv[4]);
    const char *mode = argv[1];
    size_t request = (size_t)atoi(argv[2]) * MiB;
    int blocking = atoi(argv[3]);
    int ptsz = strcmp(mode, "static-ptsz") == 0;
    CUcontext ctx;
    CUstream s = NULL;
    CUgraph graph = NULL, mine = NULL;
    CUdeviceptr held[64], p = 0;
    int status = -1;
    long long released = -1;
    cudasimStats st;

    if (strcmp(mode, "lcuda") == 0)
        link_directly();
    else
        link_as_static_runtime(ptsz ? 2 : 0);
    CU_OK(cu.init(0));
    CU_OK(cu.retain(&ctx, 0));
    CU_OK(cu.set_current(ctx));
    /* The per-thread default stream is blocking; NULL names it in a _ptsz form. */
    if (!(ptsz && blocking))
        CU_OK(cu.stream_create(&s, blocking ? 0 : 1));
    for (int i = 0; i < 64; i++)
        CU_OK(cu.alloc(&held[i], MiB));
    for (int i = 0; i < 64; i++)
        CU_OK(cu.free(held[i]));

    if (to_graph) {
        CU_OK(cu.graph_create(&mine, 0));
        CU_OK(cu.begin_to_graph(s, mine, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED));
    } else {
        CU_OK(cu.begin(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    }
    int malloc_result = (int)cu.alloc(&p, request);
    if (malloc_result == 0)
        CU_OK(cu.free(p));
    /* The simulator's cuStreamIsCapturing has no _ptsz form: the per-thread stream by name. */
    CU_OK(cu.is_capturing(s ? s : CU_STREAM_PER_THREAD, &status));
    int end = (int)cu.end(s, &graph);
    CHECK(!to_graph || graph == NULL || graph == mine, "another graph than the program's");
    if (to_graph)
        CU_OK(cu.graph_destroy(mine));
    else if (graph)
        CU_OK(cu.graph_destroy(graph));
    CU_OK(cu.sync());

    released = empty_cache_if_pooled(0);
    st = sim_stats(0);
    if (s)
        CU_OK(cu.stream_destroy(s));
    printf("malloc=%d\nstatus=%d\nend=%d\ngraph=%d\n", malloc_result, status, end, graph != NULL);
    printf("released=%lld\nlive_after=%llu\n", released, st.live_bytes);
    printf("driver_capture_fence ok\n");
    return 0;
}
