/* Expandable segments over a device's life: what a reset gives back, and the fallback to
 * classic segments when the driver refuses virtual memory. Modes (one per run):
 *   expandable_lifecycle reset-runtime   cudaDeviceReset with blocks live and cached
 *   expandable_lifecycle reset-driver    cuDevicePrimaryCtxReset_v2 likewise
 *   expandable_lifecycle fallback        run with CUDASIM_FAIL=cuMemCreate@1=801
 *   expandable_lifecycle calls           the driver calls made for five blocks, and what
 *                                        the mapped memory was created with
 *   expandable_lifecycle slack           a freed 100 MiB block, then a 150 MiB request that
 *                                        no hole holds (GPUPOOL_EXPANDABLE_SLACK moves memory)
 *   expandable_lifecycle sizes           7 MiB, 100 MiB and 2 GiB blocks (run with a split cap
 *                                        and CUDASIM_MEM=4GiB), the 2 GiB one then reused
 *   expandable_lifecycle other-trim      blocks of device 1 freed under kernels, then device
 *   expandable_lifecycle other-empty     1's cache given back with device 0 current
 *                                        (cudaMemPoolTrimTo, gpupool_empty_cache; run with
 *                                        CUDASIM_DEVICES=2)
 *   expandable_lifecycle worker          a thread whose first CUDA call is a 5 MiB cudaMalloc,
 *                                        after the main thread used the device
 *   expandable_lifecycle worker-first    the same, the thread being the first to use CUDA
 * Each prints key=value lines and ends with "expandable_lifecycle ok". Run with
 * CUDASIM_MEM=1GiB and CUDASIM_CONTEXT_BYTES=0. */
#include <dlfcn.h>
#include <pthread.h>

#include "check.h"
#include "cuda.h"

#define MiB ((size_t)1 << 20)

static size_t free_bytes(void)
{
    size_t free_b = 0, total_b = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return free_b;
}

/* Blocks live and cached, then the reset: the driver frees the context's allocations but not
 * virtual memory, so the pool must have unmapped and released its granules. */
static void reset(int driver)
{
    void *live = NULL, *cached = NULL, *again = NULL;
    CHECK_CUDA(cudaMalloc(&live, 64 * MiB));
    CHECK_CUDA(cudaMalloc(&cached, 96 * MiB));
    tag_block(live, 64 * MiB, 0x11);
    CHECK_CUDA(cudaFree(cached));
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("mapped_before=%llu\n", sim_stats(0).vmm_mapped_bytes);
    if (driver) {
        CHECK(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS, "cuDevicePrimaryCtxReset_v2");
    } else {
        CHECK_CUDA(cudaDeviceReset());
    }
    cudasimStats st = sim_stats(0);
    printf("mapped_after_reset=%llu\n", st.vmm_mapped_bytes);
    printf("created_after_reset=%llu\n", st.vmm_created_bytes);
    printf("live_after_reset=%llu\n", st.live_allocations);
    printf("free_after_reset=%zu\n", free_bytes());
    /* The device works as new: memory comes from the driver again and keeps its content. */
    CHECK_CUDA(cudaMalloc(&again, 64 * MiB));
    tag_block(again, 64 * MiB, 0x22);
    check_tag(again, 64 * MiB, 0x22);
    CHECK_CUDA(cudaFree(again));
    printf("unmapped_while_busy=%llu\n", sim_stats(0).unmapped_while_busy);
}

/* Four 7 MiB blocks, each tagged and checked before it is freed. */
static void four_blocks(void)
{
    void *p[4];
    int i;
    for (i = 0; i < 4; i++) {
        CHECK_CUDA(cudaMalloc(&p[i], 7 * MiB));
        tag_block(p[i], 7 * MiB, (unsigned char)(0x30 + i));
    }
    for (i = 0; i < 4; i++) {
        check_tag(p[i], 7 * MiB, (unsigned char)(0x30 + i));
        CHECK_CUDA(cudaFree(p[i]));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
}

/* The driver refuses the first cuMemCreate as not supported: the pool serves from classic
 * segments, and keeps doing so. */
static void fallback(void)
{
    four_blocks();
    cudasimStats st = sim_stats(0);
    printf("fallback_maps=%llu\n", st.vmm_maps);
    printf("fallback_mallocs=%llu\n", st.malloc_calls);
    printf("fallback_last_error=%d\n", (int)cudaGetLastError());
}

/* The driver calls the pool made for four blocks, as the simulator counted them, and what the
 * physical memory was created with: GPUDirect RDMA capable or not (CUDASIM_VMM_RDMA=0: a device
 * without the support). */
static void calls(void)
{
    unsigned long long access = 0;
    void *big = NULL;
    /* The simulator counts a call from the first question about it. */
    CHECK(cudasimCallCount("cuMemSetAccess", &access) == 0, "cudasimCallCount");
    four_blocks();
    /* A fifth block beyond the four's granules: 100 MiB, most of it mapped for it. */
    CHECK_CUDA(cudaMalloc(&big, 100 * MiB));
    tag_block(big, 100 * MiB, 0x3F);
    CHECK_CUDA(cudaFree(big));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK(cudasimCallCount("cuMemSetAccess", &access) == 0, "cudasimCallCount");
    printf("calls_blocks=5\n");
    printf("calls_access=%llu\n", access);
    cudasimStats st = sim_stats(0);
    printf("calls_mallocs=%llu\n", st.malloc_calls);
    printf("calls_frees=%llu\n", st.free_calls);
    printf("calls_creates=%llu\n", st.vmm_creates);
    printf("calls_rdma=%llu\n", st.vmm_rdma_creates);
    printf("calls_maps=%llu\n", st.vmm_maps);
    printf("calls_unmaps=%llu\n", st.vmm_unmaps);
}

/* Two 100 MiB blocks, 2.5 GiB of 64 MiB traffic after them, the first block freed after a
 * memset with no fence since, then 150 MiB: what is mapped after it, and the content kept. */
static void slack(void)
{
    void *a = NULL, *b = NULL, *d = NULL;
    CHECK_CUDA(cudaMalloc(&a, 100 * MiB));
    CHECK_CUDA(cudaMalloc(&b, 100 * MiB));
    tag_block(b, 100 * MiB, 0x0B);
    for (int i = 0; i < 40; i++) {
        void *x = NULL;
        CHECK_CUDA(cudaMalloc(&x, 64 * MiB));
        tag_block(x, 64 * MiB, 0x40);
        CHECK_CUDA(cudaFree(x));
        /* The program's fence: the next request reuses the block. */
        CHECK_CUDA(cudaDeviceSynchronize());
    }
    tag_block(a, 100 * MiB, 0x0A);
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaMalloc(&d, 150 * MiB));
    tag_block(d, 150 * MiB, 0x0D);
    cudasimStats st = sim_stats(0);
    printf("slack_mapped=%llu\n", st.vmm_mapped_bytes);
    printf("slack_unmaps=%llu\n", st.vmm_unmaps);
    printf("unmapped_while_busy=%llu\n", st.unmapped_while_busy);
    check_tag(b, 100 * MiB, 0x0B);
    check_tag(d, 150 * MiB, 0x0D);
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaFree(d));
    CHECK_CUDA(cudaDeviceSynchronize());
}

/* The first and last MiB of a block: a whole 2 GiB block would cost the host 4 GiB. */
static void tag_ends(void *p, size_t n, unsigned char tag)
{
    tag_block(p, MiB, tag);
    tag_block((char *)p + n - MiB, MiB, tag);
}

static void check_ends(void *p, size_t n, unsigned char tag)
{
    check_tag(p, MiB, tag);
    check_tag((char *)p + n - MiB, MiB, tag);
}

/* Blocks below and above a split cap, each tagged and checked; then the 2 GiB block, freed,
 * serves a 100 MiB one. Prints the driver's calls and the bytes mapped before and after the
 * reuse. */
static void sizes(void)
{
    static const size_t size[3] = {7 * MiB, 100 * MiB, 2048 * MiB};
    void *p[3], *again = NULL;
    int i;
    for (i = 0; i < 3; i++) {
        CHECK_CUDA(cudaMalloc(&p[i], size[i]));
        tag_ends(p[i], size[i], (unsigned char)(0x40 + i));
    }
    for (i = 0; i < 3; i++)
        check_ends(p[i], size[i], (unsigned char)(0x40 + i));
    cudasimStats st = sim_stats(0);
    printf("sizes_mallocs=%llu\n", st.malloc_calls);
    printf("sizes_mapped=%llu\n", st.vmm_mapped_bytes);
    CHECK_CUDA(cudaFree(p[2]));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMalloc(&again, 100 * MiB));
    tag_ends(again, 100 * MiB, 0x50);
    check_ends(p[0], size[0], 0x40);
    check_ends(p[1], size[1], 0x41);
    printf("sizes_reused=%d\n", again == p[2]);
    printf("sizes_mapped_after_reuse=%llu\n", sim_stats(0).vmm_mapped_bytes);
    CHECK_CUDA(cudaFree(again));
    CHECK_CUDA(cudaFree(p[0]));
    CHECK_CUDA(cudaFree(p[1]));
}

/* A 64 MiB block of device 1 under a 200 ms kernel, freed, and a 512 KiB one beside a live
 * one in its small segment, likewise; then device 1's cache given back with device 0 current:
 * through its default pool (`trim`) or `gpupool_empty_cache(1)`. The pool's fence must wait
 * for device 1 before it unmaps, or makes the small block reusable (`strict`), and leave
 * device 0 current. */
static void other_device(int trim)
{
    void *p = NULL, *small = NULL, *beside = NULL, *again = NULL;
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMalloc(&p, 64 * MiB));
    CHECK_CUDA(cudaMalloc(&beside, MiB / 2));
    CHECK_CUDA(cudaMalloc(&small, MiB / 2));
    CHECK_CUDA(cudasim_launch_fill(p, 64 * MiB, 200000, 0x66, 0));
    CHECK_CUDA(cudasim_launch_fill(small, MiB / 2, 200000, 0x67, 0));
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaFree(small));
    CHECK_CUDA(cudaSetDevice(0));
    if (trim) {
        cudaMemPool_t pool = NULL;
        CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, 1));
        CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
    } else {
        int (*empty)(int, unsigned long long *) =
            (int (*)(int, unsigned long long *))dlsym(RTLD_DEFAULT, "gpupool_empty_cache");
        unsigned long long released = 0;
        CHECK(empty != NULL, "gpupool_empty_cache not found");
        CHECK(empty(1, &released) == 0, "gpupool_empty_cache(1)");
        printf("other_released=%llu\n", released);
    }
    int current = -1;
    CHECK_CUDA(cudaGetDevice(&current));
    printf("other_current=%d\n", current);
    cudasimStats st = sim_stats(1);
    printf("other_mapped_after=%llu\n", st.vmm_mapped_bytes);
    printf("other_unmapped_while_busy=%llu\n", st.unmapped_while_busy);
    CHECK_CUDA(cudaSetDevice(1));
    CHECK_CUDA(cudaMalloc(&again, MiB / 2));
    printf("other_reused_busy=%d\n", cudasimRangeBusy(again, MiB / 2) > 0);
    CHECK_CUDA(cudaFree(again));
    CHECK_CUDA(cudaFree(beside));
    CHECK_CUDA(cudaDeviceSynchronize());
}

/* A thread's first CUDA call is an allocation: it has no current context yet, and the pool's
 * driver calls for the block come before the runtime binds one. */
static void *worker_thread(void *arg)
{
    (void)arg;
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, 5 * MiB));
    tag_block(p, 5 * MiB, 0x5a);
    printf("worker_mapped=%llu\n", sim_stats(0).vmm_mapped_bytes);
    check_tag(p, 5 * MiB, 0x5a);
    CHECK_CUDA(cudaFree(p));
    return NULL;
}

static void worker(int first)
{
    if (!first) {
        void *w = NULL;
        CHECK_CUDA(cudaMalloc(&w, 10));
        CHECK_CUDA(cudaFree(w));
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, worker_thread, NULL) == 0, "pthread_create");
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
    void *again = NULL;
    CHECK_CUDA(cudaMalloc(&again, 5 * MiB));
    CHECK_CUDA(cudaFree(again));
    CHECK_CUDA(cudaDeviceSynchronize());
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "reset-runtime") == 0) {
        reset(0);
    } else if (strcmp(mode, "reset-driver") == 0) {
        reset(1);
    } else if (strcmp(mode, "fallback") == 0) {
        fallback();
    } else if (strcmp(mode, "calls") == 0) {
        calls();
    } else if (strcmp(mode, "slack") == 0) {
        slack();
    } else if (strcmp(mode, "sizes") == 0) {
        sizes();
    } else if (strcmp(mode, "other-trim") == 0) {
        other_device(1);
    } else if (strcmp(mode, "other-empty") == 0) {
        other_device(0);
    } else if (strcmp(mode, "worker") == 0) {
        worker(0);
    } else if (strcmp(mode, "worker-first") == 0) {
        worker(1);
    } else {
        CHECK(0, "mode: reset-runtime, reset-driver, fallback, calls, slack, sizes, other-trim, "
                 "other-empty, worker or worker-first");
    }
    printf("expandable_lifecycle ok\n");
    return 0;
}
