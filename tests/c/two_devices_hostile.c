/* Hostile uses of two devices. Every line it prints reads the same with and without the pool,
 * but peer-release's: CUDA's own cudaFree does not wait for the peer's kernel. Modes:
 *   two_devices_hostile reset-other   device 1 reset from another thread, blocks live on both
 *   two_devices_hostile peer-release  device 0's kernel on device 1's block while it is freed
 *   two_devices_hostile graph         cudaMallocAsync, cudaFreeAsync during a capture, its
 *                                     allocation freed after it by cudaFree
 *   two_devices_hostile ipc           IPC handles asked of blocks, of no handle, of freed memory
 *   two_devices_hostile own-context   cudaMalloc with a context of cuCtxCreate current, which
 *                                     cuCtxDestroy then destroys with its memory
 *   two_devices_hostile own-context-v3  the same, the context made by the cuCtxCreate that
 *                                     cuGetProcAddress gives at CUDA 12.0 (cuCtxCreate_v3)
 *   two_devices_hostile own-context-v4  the same, the context made by cuCtxCreate_v4 (CUDA 13's
 *                                     cuCtxCreate)
 *   two_devices_hostile fresh-thread  threads whose first CUDA call is cudaMalloc, cudaFree of
 *                                     device 1's block, cudaFreeAsync or cudaMallocAsync, then
 *                                     driver calls, which need the context the runtime binds
 *   two_devices_hostile lost-context  threads that lose their context (cuCtxSetCurrent(NULL),
 *                                     cuCtxPopCurrent, cuCtxDestroy), then call cudaMalloc,
 *                                     cudaFree, cudaMallocAsync, cudaFreeAsync or nothing, then
 *                                     a driver call */
#include <pthread.h>

#include "cuda.h"
#include "check.h"

#define MIB ((size_t)1 << 20)

static void *reset_device_1(void *arg)
{
    (void)arg;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaDeviceReset());
    return NULL;
}

static void mode_reset_other(void)
{
    void *a[4], *b[4];
    int i;
    for (i = 0; i < 4; i++) {
        CHECK_CUDA(cudaSetDevice(0));
        CHECK_CUDA(cudaMalloc(&a[i], (size_t)(i + 1) * 3 * MIB));
        tag_block(a[i], (size_t)(i + 1) * 3 * MIB, (unsigned char)(0x10 + i));
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMalloc(&b[i], (size_t)(i + 1) * 3 * MIB));
        tag_block(b[i], (size_t)(i + 1) * 3 * MIB, (unsigned char)(0x20 + i));
    }
    /* Some cached on each device. */
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaFree(a[0]));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaFree(b[0]));
    unsigned long long frees1 = sim_stats(1).free_calls;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, reset_device_1, NULL) == 0, "thread");
    CHECK(pthread_join(t, NULL) == 0, "join");
    printf("dev1_live_after_reset=%llu\n", sim_stats(1).live_bytes);
    printf("dev1_frees_by_reset=%llu\n", sim_stats(1).free_calls - frees1);
    /* Device 0's blocks are intact and free as ever, with device 1 current. */
    for (i = 1; i < 4; i++)
        check_tag(a[i], (size_t)(i + 1) * 3 * MIB, (unsigned char)(0x10 + i));
    printf("dev0_free_other_current=%d\n", (int)cudaFree(a[1]));
    /* Device 1's old blocks are gone: the runtime says so. */
    printf("dev1_stale_free=%d\n", (int)cudaFree(b[2]));
    (void)cudaGetLastError();
    void *c;
    CHECK_CUDA(cudaMalloc(&c, 7 * MIB));
    tag_block(c, 7 * MIB, 0x33);
    CHECK_CUDA(cudasim_launch_fill(c, 7 * MIB, 0, -1, 0));
    CHECK_CUDA(cudaDeviceSynchronize());
    check_tag(c, 7 * MIB, 0x33);
    CHECK_CUDA(cudaFree(c));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(0));
    for (i = 2; i < 4; i++)
        check_tag(a[i], (size_t)(i + 1) * 3 * MIB, (unsigned char)(0x10 + i));
    for (i = 2; i < 4; i++)
        CHECK_CUDA(cudaFree(a[i]));
    CHECK_CUDA(cudaDeviceSynchronize());
    size_t f1, t1;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMemGetInfo(&f1, &t1));
    printf("dev1_free_after=%zu\n", f1 >> 20);
}

static void mode_peer_release(void)
{
    void *p, *q;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaDeviceEnablePeerAccess(1, 0));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMalloc(&p, 8 * MIB));
    tag_block(p, 8 * MIB, 0x44);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(0));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK_CUDA(cudasim_launch_fill(p, 8 * MIB, 200000, 0x55, s));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMalloc(&q, 8 * MIB));
    tag_block(q, 8 * MIB, 0x66);
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(1));
    check_tag(q, 8 * MIB, 0x66);
    printf("unmapped_while_busy=%llu\n", sim_stats(1).unmapped_while_busy);
    CHECK_CUDA(cudaFree(q));
    /* Disabled, then enabled again: the same answers as the runtime's. */
    CHECK_CUDA(cudaSetDevice(0));
    printf("disable=%d\n", (int)cudaDeviceDisablePeerAccess(1));
    printf("disable_again=%d\n", (int)cudaDeviceDisablePeerAccess(1));
    (void)cudaGetLastError();
    printf("enable_again=%d\n", (int)cudaDeviceEnablePeerAccess(1, 0));
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMalloc(&p, 8 * MIB));
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudasim_launch_fill(p, 8 * MIB, 0, 0x77, s));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaSetDevice(1));
    check_tag(p, 8 * MIB, 0x77);
    printf("accessed_without_access=%llu\n", sim_stats(1).accessed_without_access);
    CHECK_CUDA(cudaFree(p));
}

/* The answers, and the summary's count of handles the pool refused, read after it. */
static void mode_ipc(void)
{
    cudaIpcMemHandle_t h;
    CUipcMemHandle ch;
    void *big, *first, *second;
    CHECK_CUDA(cudaMalloc(&big, 64 * MIB));
    CHECK_CUDA(cudaMalloc(&first, MIB));
    CHECK_CUDA(cudaMalloc(&second, MIB));
    printf("ipc_second_inside=%d\n", (int)cudaIpcGetMemHandle(&h, (char *)second + 4096));
    (void)cudaGetLastError();
    printf("ipc_no_handle=%d\n", (int)cudaIpcGetMemHandle(NULL, second));
    (void)cudaGetLastError();
    printf("cu_ipc_no_handle=%d\n", (int)cuIpcGetMemHandle(NULL, (CUdeviceptr)second));
    CHECK_CUDA(cudaFree(big));
    CHECK_CUDA(cudaFree(second));
    printf("ipc_freed=%d\n", (int)cudaIpcGetMemHandle(&h, big));
    (void)cudaGetLastError();
    printf("ipc_freed_inside=%d\n", (int)cudaIpcGetMemHandle(&h, (char *)second + 4096));
    (void)cudaGetLastError();
    printf("cu_ipc_freed=%d\n", (int)cuIpcGetMemHandle(&ch, (CUdeviceptr)second));
    CHECK_CUDA(cudaFree(first));
}

static void mode_graph(void)
{
    cudaStream_t s;
    cudaGraph_t graph;
    void *g1, *g2, *pooled;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&pooled, 3 * MIB));
    unsigned long long frees0 = sim_stats(0).free_calls;
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK_CUDA(cudaMallocAsync(&g1, 5 * MIB, s));
    CHECK_CUDA(cudaMallocAsync(&g2, 5 * MIB, s));
    printf("free_async_in_capture=%d\n", (int)cudaFreeAsync(g1, s));
    CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    printf("captured_mallocs=%llu\n", sim_stats(0).captured_mallocs);
    printf("graph_free_outside=%d\n", (int)cudaFree(g2));
    printf("graph_frees_reaching_cuda=%llu\n", sim_stats(0).free_calls - frees0);
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaFree(pooled));
    CHECK_CUDA(cudaStreamDestroy(s));
}

/* The runtime allocates in the current context, here one the program made: its memory dies with
 * it. What the program is then given in the primary context must be live memory. */
static void mode_own_context(int abi)
{
    typedef CUresult (*create_v3)(CUcontext *, void *, int, unsigned int, CUdevice);
    CUcontext ctx;
    CUctxCreateParams params;
    void *gone, *kept, *p;
    void *found = NULL;
    memset(&params, 0, sizeof params);
    CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
    CHECK_CUDA(cudaSetDevice(1));
    if (abi == 4) {
        CHECK(cuCtxCreate_v4(&ctx, &params, 0, 1) == CUDA_SUCCESS, "cuCtxCreate_v4");
    } else if (abi == 3) {
        /* As a program built with CUDA 12.0 that asks the driver for its cuCtxCreate. */
        CHECK(cuGetProcAddress("cuCtxCreate", &found, 12000, 0) == CUDA_SUCCESS,
              "cuGetProcAddress(cuCtxCreate)");
        CHECK(((create_v3)found)(&ctx, NULL, 0, 0, 1) == CUDA_SUCCESS, "cuCtxCreate_v3");
    } else {
        CHECK(cuCtxCreate(&ctx, 0, 1) == CUDA_SUCCESS, "cuCtxCreate");
    }
    CHECK_CUDA(cudaMalloc(&gone, 8 * MIB));
    tag_block(gone, 8 * MIB, 0x18);
    CHECK_CUDA(cudaMalloc(&kept, 8 * MIB));
    CHECK_CUDA(cudaFree(gone));
    CHECK(cuCtxDestroy(ctx) == CUDA_SUCCESS, "cuCtxDestroy");
    printf("own_context_live_after_destroy=%llu\n", sim_stats(1).live_bytes);
    CHECK_CUDA(cudaSetDevice(1));
    /* Died with the context: the runtime refuses its free. */
    printf("own_context_stale_free=%d\n", (int)cudaFree(kept));
    (void)cudaGetLastError();
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMalloc(&p, 8 * MIB));
    printf("own_context_next_block_set=%d\n", (int)cudaMemset(p, 0x28, 8 * MIB));
    (void)cudaGetLastError();
    check_tag(p, 8 * MIB, 0x28);
    CHECK_CUDA(cudaFree(p));
}

/* A thread's first CUDA call, one of the runtime's, makes the current device's primary context
 * the thread's: a driver call after it has a context to act in. */
static const char *fresh_case;
static void *fresh_block;
static void *fresh_live;

static void *fresh_thread(void *arg)
{
    void *p = NULL;
    CUcontext ctx = NULL;
    CUdeviceptr q = 0;
    unsigned char byte = 0x5b;
    int r;
    (void)arg;
    if (strcmp(fresh_case, "malloc") == 0)
        r = (int)cudaMalloc(&p, MIB);
    else if (strcmp(fresh_case, "malloc-async") == 0)
        r = (int)cudaMallocAsync(&p, MIB, 0);
    else if (strcmp(fresh_case, "free-async") == 0)
        r = (int)cudaFreeAsync(fresh_block, 0);
    else
        r = (int)cudaFree(fresh_block);
    CHECK(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS, "cuCtxGetCurrent");
    CUresult copied = cuMemcpyHtoD((CUdeviceptr)(p != NULL ? p : fresh_live), &byte, 1);
    CUresult allocated = cuMemAlloc(&q, 4096);
    printf("fresh_%s=%d context=%d copy=%d driver_alloc=%d\n", fresh_case, r, ctx != NULL,
           (int)copied, (int)allocated);
    if (allocated == CUDA_SUCCESS)
        CHECK(cuMemFree(q) == CUDA_SUCCESS, "cuMemFree");
    if (p != NULL)
        CHECK_CUDA(cudaFree(p));
    return NULL;
}

static void mode_fresh_thread(void)
{
    static const char *cases[] = {"malloc", "free-other", "free-async", "malloc-async"};
    CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *cached, *other, *mine;
        pthread_t t;
        /* A block of device 1 for the thread to free; two of device 0, one to free and one it
         * copies into; and a freed one of device 0 that its allocation is served from. */
        CHECK_CUDA(cudaSetDevice(1));
        CHECK_CUDA(cudaMalloc(&other, 4 * MIB));
        CHECK_CUDA(cudaSetDevice(0));
        CHECK_CUDA(cudaMalloc(&mine, 4 * MIB));
        CHECK_CUDA(cudaMalloc(&fresh_live, 4 * MIB));
        CHECK_CUDA(cudaMalloc(&cached, MIB));
        CHECK_CUDA(cudaFree(cached));
        CHECK_CUDA(cudaDeviceSynchronize());
        fresh_case = cases[i];
        fresh_block = strcmp(cases[i], "free-async") == 0 ? mine : other;
        CHECK(pthread_create(&t, NULL, fresh_thread, NULL) == 0, "thread");
        CHECK(pthread_join(t, NULL) == 0, "join");
        if (fresh_block != other) {
            CHECK_CUDA(cudaFree(other));
        } else {
            CHECK_CUDA(cudaFree(mine));
        }
        CHECK_CUDA(cudaFree(fresh_live));
        CHECK_CUDA(cudaDeviceSynchronize());
    }
}

/* A thread that loses its context gets it back from its next runtime call that needs one, as
 * its first call gave it one; with no such call between, its driver call has none. */
static const char *lost_way;
static const char *lost_call;
static CUcontext lost_own;

static void drop_context(void)
{
    CUcontext popped = NULL;
    if (strcmp(lost_way, "set-null") == 0) {
        CHECK_CU(cuCtxSetCurrent(NULL));
    } else if (strcmp(lost_way, "pop") == 0) {
        CHECK_CU(cuCtxPopCurrent(&popped));
    } else {
        /* A context of its own in place of the primary one, destroyed: the driver pops it. */
        CHECK_CU(cuCtxSetCurrent(lost_own));
        CHECK_CU(cuCtxDestroy(lost_own));
    }
}

static void *lost_thread(void *arg)
{
    void *live = NULL, *p = NULL, *q = NULL;
    CUcontext ctx = NULL;
    unsigned char byte = 0x5c;
    int r = 0;
    int allocates = strncmp(lost_call, "malloc", 6) == 0;
    (void)arg;
    CHECK_CUDA(cudaMalloc(&live, MIB));
    CHECK_CUDA(cudaMalloc(&p, MIB));
    if (allocates) {
        /* Cached and reusable: the allocation below is a hit. */
        CHECK_CUDA(cudaFree(p));
        p = NULL;
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    drop_context();
    cudasimStats before = sim_stats(0);
    if (strcmp(lost_call, "malloc") == 0)
        r = (int)cudaMalloc(&q, MIB);
    else if (strcmp(lost_call, "malloc-async") == 0)
        r = (int)cudaMallocAsync(&q, MIB, 0);
    else if (strcmp(lost_call, "free") == 0)
        r = (int)cudaFree(p);
    else if (strcmp(lost_call, "free-async") == 0)
        r = (int)cudaFreeAsync(p, 0);
    cudasimStats after = sim_stats(0);
    /* What reached CUDA's allocator: nothing where the pool answered. */
    fprintf(stderr, "lost_%s_%s runtime_calls=%llu\n", lost_way, lost_call,
            after.malloc_calls + after.free_calls - before.malloc_calls - before.free_calls);
    CHECK_CU(cuCtxGetCurrent(&ctx));
    CUresult copied = cuMemcpyHtoD((CUdeviceptr)live, &byte, 1);
    printf("lost_%s_%s=%d context=%d copy=%d\n", lost_way, lost_call, r, ctx != NULL,
           (int)copied);
    if (strncmp(lost_call, "free", 4) == 0)
        p = NULL;
    if (q != NULL)
        CHECK_CUDA(cudaFree(q));
    if (p != NULL)
        CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFree(live));
    CHECK_CUDA(cudaDeviceSynchronize());
    return NULL;
}

static void mode_lost_context(void)
{
    /* The destroys last: once the program made a context, the pool asks which is current. */
    static const char *ways[] = {"set-null", "pop", "destroy"};
    static const char *calls[] = {"malloc", "free", "malloc-async", "free-async", "none"};
    CUcontext popped = NULL;
    CHECK_CU(cuInit(0));
    CHECK_CUDA(cudaSetDevice(0));
    for (size_t w = 0; w < sizeof ways / sizeof ways[0]; w++) {
        for (size_t c = 0; c < sizeof calls / sizeof calls[0]; c++) {
            pthread_t t;
            lost_way = ways[w];
            lost_call = calls[c];
            if (strcmp(lost_way, "destroy") == 0) {
                CHECK_CU(cuCtxCreate(&lost_own, 0, 0));
                CHECK_CU(cuCtxPopCurrent(&popped));
                CHECK(popped == lost_own, "popped %p, made %p", (void *)popped, (void *)lost_own);
            }
            CHECK(pthread_create(&t, NULL, lost_thread, NULL) == 0, "thread");
            CHECK(pthread_join(t, NULL) == 0, "join");
        }
    }
}

int main(int argc, char **argv)
{
    CHECK(argc == 2, "usage: two_devices_hostile MODE");
    if (strcmp(argv[1], "reset-other") == 0)
        mode_reset_other();
    else if (strcmp(argv[1], "peer-release") == 0)
        mode_peer_release();
    else if (strcmp(argv[1], "ipc") == 0)
        mode_ipc();
    else if (strcmp(argv[1], "graph") == 0)
        mode_graph();
    else if (strcmp(argv[1], "own-context") == 0)
        mode_own_context(2);
    else if (strcmp(argv[1], "own-context-v3") == 0)
        mode_own_context(3);
    else if (strcmp(argv[1], "own-context-v4") == 0)
        mode_own_context(4);
    else if (strcmp(argv[1], "fresh-thread") == 0)
        mode_fresh_thread();
    else if (strcmp(argv[1], "lost-context") == 0)
        mode_lost_context();
    else
        CHECK(0, "unknown mode %s", argv[1]);
    printf("two devices hostile ok\n");
    return 0;
}
