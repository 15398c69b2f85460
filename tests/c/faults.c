/* Fault injection: a runtime call fails with an injected error, either a call the program makes
 * itself (the program must see exactly what it sees without the pool) or a call the pool makes
 * on its own (segment allocation and release, fence, barrier, memory sample: the program must
 * not notice, except through the runtime's own answer to a call it made). After each fault the
 * pool's figures must agree with the runtime's, blocks keep their contents, no block busy with
 * a kernel is handed out, and later calls work.
 *
 * usage: faults FUNCTION ERROR [unread]
 * FUNCTION: cudaMalloc, cudaFree, cudaDeviceSynchronize, cudaEventCreateWithFlags,
 * cudaEventRecord, cudaStreamWaitEvent, cudaMemGetInfo (calls the pool makes itself), cudaStreamSynchronize,
 * cudaEventSynchronize, cudaLaunchKernel (calls the pool only watches: a failed one is no
 * synchronization and no barrier). Run with and without the pool (the program finds out which
 * with dlsym). With `unread` (pooled only), the program leaves an error unread just before the
 * pool's own call fails, and must read it afterwards, as it would without the pool. */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "check.h"
#include "gpupool.h"

#define MIB ((size_t)1 << 20)

typedef int (*stats_fn)(int, gpupool_stats *);
static stats_fn g_stats;
static cudaError_t g_err;
/* The error the program left unread before the pool's own call failed (`unread`), or none. */
static cudaError_t g_unread = cudaSuccess;

static void leave_unread(void)
{
    if (g_unread != cudaSuccess)
        CHECK(cudaGetDevice(NULL) == g_unread, "cudaGetDevice(NULL) refused");
}

/* With the pool: reserved = allocated + cached, and the runtime holds exactly the segments the
 * pool believes it holds (every allocation of this program goes through the pool). */
static void consistent(const char *where)
{
    if (!g_stats)
        return;
    gpupool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(g_stats(0, &st) == 0, "gpupool_get_stats");
    CHECK(st.allocated_bytes + st.cached_bytes == st.reserved_bytes,
          "%s: allocated %llu + cached %llu != reserved %llu", where,
          (unsigned long long)st.allocated_bytes, (unsigned long long)st.cached_bytes,
          (unsigned long long)st.reserved_bytes);
    unsigned long long live = sim_stats(0).live_bytes;
    CHECK(live == st.reserved_bytes, "%s: the runtime holds %llu bytes, the pool thinks %llu",
          where, live, (unsigned long long)st.reserved_bytes);
}

/* A block that a kernel still uses for `usec` (and then fills with 0xEE), freed by the program:
 * the pool must not hand it out again before a fence or barrier covers it. */
static void free_while_busy(size_t n, unsigned usec)
{
    void *p;
    CHECK_CUDA(cudaMalloc(&p, n));
    CHECK_CUDA(cudasim_launch_fill(p, n, usec, 0xEE, 0));
    CHECK_CUDA(cudaFree(p));
}

/* Allocations that must never be a block still in use by a kernel; tagged and checked. The
 * last error is then the one the program left unread, if any. */
static void fresh_blocks(const char *where, size_t n, int count)
{
    void *p[16];
    for (int i = 0; i < count; i++) {
        CHECK_CUDA(cudaMalloc(&p[i], n));
        CHECK(cudasimRangeBusy(p[i], n) == 0, "%s: block %p handed out while a kernel uses it",
              where, p[i]);
        tag_block(p[i], n, (unsigned char)(0x10 + i));
    }
    for (int i = 0; i < count; i++) {
        check_tag(p[i], n, (unsigned char)(0x10 + i));
        CHECK_CUDA(cudaFree(p[i]));
    }
    cudaError_t last = cudaGetLastError();
    CHECK(last == g_unread, "%s: last error %d, expected %d", where, last, g_unread);
}

/* A cached 30 MiB segment (threshold 0, set in the environment: it goes back at the next
 * synchronization); returns the runtime's live bytes with it. */
static unsigned long long cached_segment(void)
{
    void *p;
    CHECK_CUDA(cudaMalloc(&p, 30 * MIB));
    tag_block(p, 30 * MIB, 0x2E);
    CHECK_CUDA(cudaFree(p));
    return sim_stats(0).live_bytes;
}

/* A watched synchronization `sync(arg)` (the runtime function `func`) fails with g_err: the
 * program gets the runtime's answer; the pool takes no release point there (the cached segment
 * is still held), and takes one at the next synchronization that succeeds. */
static void failed_sync(const char *func, cudaError_t (*sync)(void *), void *arg)
{
    unsigned long long before = cached_segment();
    CHECK(cudasimFailNext(func, 1, (int)g_err) == 0, "arm");
    cudaError_t r = sync(arg);
    cudaError_t last = cudaGetLastError();
    CHECK(r == g_err && last == g_err, "%s %d/%d; expected %d", func, r, last, g_err);
    if (!g_stats)
        return;
    CHECK(before >= 30 * MIB, "the segment is held");
    CHECK(sim_stats(0).live_bytes == before, "memory released at a failed synchronization");
    CHECK_CUDA(sync(arg));
    CHECK(sim_stats(0).live_bytes + 30 * MIB <= before, "not released at the next one");
}

static cudaError_t stream_sync(void *s) { return cudaStreamSynchronize((cudaStream_t)s); }
static cudaError_t event_sync(void *e) { return cudaEventSynchronize((cudaEvent_t)e); }

/* The program's own call fails: exactly the runtime's answer, with or without the pool. */
static void program_call_fails(const char *func)
{
    cudaError_t e = g_err;
    cudaError_t r, last;
    if (strcmp(func, "cudaMalloc") == 0) {
        void *p = NULL;
        /* A size never asked for before: a miss, so the pool calls cudaMalloc itself. */
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        r = cudaMalloc(&p, 37 * MIB + 12345);
        last = cudaGetLastError();
        if (g_stats && e == cudaErrorMemoryAllocation) {
            /* The pool retries an out-of-memory (with the cache released, then exact size):
             * the transient refusal is absorbed and leaves no error behind. */
            CHECK(r == cudaSuccess && last == cudaSuccess, "pooled OOM retry: %d/%d", r, last);
        } else {
            CHECK(r == e && last == e, "cudaMalloc returned %d, last error %d; expected %d", r,
                  last, e);
        }
        if (r == cudaSuccess) {
            tag_block(p, 37 * MIB, 0x61);
            check_tag(p, 37 * MIB, 0x61);
            CHECK_CUDA(cudaFree(p));
        }
    } else if (strcmp(func, "cudaFree") == 0) {
        /* A pointer from another allocator passes through to the runtime. */
        void *m;
        CHECK_CUDA(cudaMallocManaged(&m, 4096, cudaMemAttachGlobal));
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        r = cudaFree(m);
        last = cudaGetLastError();
        CHECK(r == e && last == e, "cudaFree returned %d, last error %d; expected %d", r, last, e);
        CHECK_CUDA(cudaFree(m)); /* the injected failure did nothing: still live */
    } else if (strcmp(func, "cudaDeviceSynchronize") == 0) {
        /* A failed synchronization is no fence: the busy block is not reused after it. */
        free_while_busy(3 * MIB, 100000);
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        r = cudaDeviceSynchronize();
        last = cudaGetLastError();
        CHECK(r == e && last == e, "cudaDeviceSynchronize returned %d, last %d; expected %d", r,
              last, e);
        fresh_blocks("after a failed cudaDeviceSynchronize", 3 * MIB, 4);
        CHECK_CUDA(cudaDeviceSynchronize());
    } else if (strcmp(func, "cudaEventCreateWithFlags") == 0) {
        cudaEvent_t ev;
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        r = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        last = cudaGetLastError();
        CHECK(r == e && last == e, "cudaEventCreateWithFlags %d/%d; expected %d", r, last, e);
    } else if (strcmp(func, "cudaEventRecord") == 0) {
        cudaEvent_t ev;
        CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        r = cudaEventRecord(ev, 0);
        last = cudaGetLastError();
        CHECK(r == e && last == e, "cudaEventRecord %d/%d; expected %d", r, last, e);
        CHECK_CUDA(cudaEventDestroy(ev));
    } else if (strcmp(func, "cudaStreamWaitEvent") == 0) {
        cudaEvent_t ev;
        CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        r = cudaStreamWaitEvent(0, ev, 0);
        last = cudaGetLastError();
        CHECK(r == e && last == e, "cudaStreamWaitEvent %d/%d; expected %d", r, last, e);
        CHECK_CUDA(cudaEventDestroy(ev));
    } else if (strcmp(func, "cudaMemGetInfo") == 0) {
        size_t f = 1, t = 1;
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        r = cudaMemGetInfo(&f, &t);
        last = cudaGetLastError();
        CHECK(r == e && last == e, "cudaMemGetInfo %d/%d; expected %d", r, last, e);
    } else if (strcmp(func, "cudaStreamSynchronize") == 0) {
        cudaStream_t s;
        CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        failed_sync(func, stream_sync, s);
        CHECK_CUDA(cudaStreamDestroy(s));
    } else if (strcmp(func, "cudaEventSynchronize") == 0) {
        cudaEvent_t ev;
        CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        CHECK_CUDA(cudaEventRecord(ev, 0));
        failed_sync(func, event_sync, ev);
        CHECK_CUDA(cudaEventDestroy(ev));
    } else if (strcmp(func, "cudaLaunchKernel") == 0) {
        /* Barrier mode (environment): a launch on the legacy stream orders later blocking-stream
         * work after the busy block's kernel, so the pool may reuse the block without a barrier
         * of its own; a launch that failed orders nothing. */
        void *target;
        CHECK_CUDA(cudaMalloc(&target, 4096));
        free_while_busy(3 * MIB, 100000);
        unsigned long long barriers = sim_stats(0).stream_wait_events;
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        r = cudasim_launch_fill(target, 4096, 0, 0x33, 0);
        last = cudaGetLastError();
        CHECK(r == e && last == e, "cudaLaunchKernel %d/%d; expected %d", r, last, e);
        void *p;
        CHECK_CUDA(cudaMalloc(&p, 3 * MIB));
        CHECK(!cudasimRangeBusy(p, 3 * MIB) || sim_stats(0).stream_wait_events > barriers,
              "a block busy with a kernel handed out after a failed launch, without a barrier");
        CHECK_CUDA(cudaFree(p));
        CHECK_CUDA(cudaFree(target));
    } else {
        CHECK(0, "unknown function %s", func);
    }
    consistent("after the program's failed call");
}

/* The pool's own call fails: the program's calls succeed and nothing is left behind. */
static void pool_call_fails(const char *func)
{
    cudaError_t e = g_err;
    void *p;
    if (strcmp(func, "cudaMalloc") == 0) {
        /* The driver refuses the segment, both retries (whole segment, exact size) and the
         * runtime's own call the hook makes then: the program gets the runtime's answer. */
        if (e == cudaErrorMemoryAllocation) {
            for (int i = 1; i <= 4; i++)
                CHECK(cudasimFailNext(func, (unsigned)i, (int)e) == 0, "arm");
            cudaError_t r = cudaMalloc(&p, 45 * MIB);
            CHECK(r == e && cudaGetLastError() == e, "after the retries: %d", r);
        }
    } else if (strcmp(func, "cudaFree") == 0) {
        /* Threshold 0 (set in the environment): the free segment goes back at the next
         * synchronization; that release fails, the segment stays, the next one releases it. */
        CHECK_CUDA(cudaMalloc(&p, 30 * MIB));
        tag_block(p, 30 * MIB, 0x2F);
        CHECK_CUDA(cudaFree(p));
        unsigned long long before = sim_stats(0).live_bytes;
        CHECK(before >= 30 * MIB, "the segment is held");
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        leave_unread();
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK(cudaGetLastError() == g_unread, "the pool's failed cudaFree changed the last error");
        CHECK(sim_stats(0).live_bytes == before, "a segment whose cudaFree failed was dropped");
        consistent("after a failed release");
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK(sim_stats(0).live_bytes + 30 * MIB <= before, "the segment was not released later");
    } else if (strcmp(func, "cudaDeviceSynchronize") == 0) {
        /* Strict mode, 8 MiB fence budget (environment): 9 MiB of busy frees make the next
         * miss fence (the third one's miss saw 6 MiB waiting, and grew); that fence fails: the
         * pool grows instead and reuses nothing busy. */
        for (int i = 0; i < 3; i++)
            free_while_busy(3 * MIB, 100000);
        unsigned long long syncs = sim_stats(0).device_syncs;
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        leave_unread();
        fresh_blocks("after the pool's fence failed", 3 * MIB, 4);
        CHECK(sim_stats(0).device_syncs > syncs, "the pool's fence was not made here");
    } else if (strcmp(func, "cudaEventCreateWithFlags") == 0 ||
               strcmp(func, "cudaEventRecord") == 0 || strcmp(func, "cudaStreamWaitEvent") == 0) {
        /* Barrier mode (environment): the next miss issues a barrier, which fails. */
        free_while_busy(3 * MIB, 100000);
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        leave_unread();
        fresh_blocks("after the pool's barrier failed", 3 * MIB, 4);
    } else if (strcmp(func, "cudaMemGetInfo") == 0) {
        /* The pool samples the device's memory after each new segment. */
        CHECK(cudasimFailNext(func, 1, (int)e) == 0, "arm");
        leave_unread();
        fresh_blocks("after the pool's memory sample failed", 33 * MIB, 1);
    }
    g_unread = cudaSuccess;
    consistent("after the pool's failed call");
}

int main(int argc, char **argv)
{
    CHECK(argc == 3 || (argc == 4 && strcmp(argv[3], "unread") == 0),
          "usage: faults FUNCTION ERROR [unread]");
    g_err = (cudaError_t)atoi(argv[2]);
    g_stats = (stats_fn)dlsym(RTLD_DEFAULT, "gpupool_get_stats");
    CHECK_CUDA(cudaFree(NULL));
    program_call_fails(argv[1]);
    if (g_stats) {
        if (argc == 4)
            g_unread = cudaErrorInvalidValue;
        pool_call_fails(argv[1]);
    }
    /* Everything still works: a burst of mixed sizes, checked. */
    fresh_blocks("afterwards (small)", 1000, 16);
    fresh_blocks("afterwards (medium)", 5 * MIB, 4);
    CHECK_CUDA(cudaDeviceSynchronize());
    consistent("at the end");
    printf("faults %s %d ok (%s)\n", argv[1], g_err, g_stats ? "pooled" : "runtime");
    return 0;
}
