/* The gpupool_* C API at the pool's edges: queries it does not need, the runtime's last error,
 * outgrown segments, where the memory lies, devices beyond the 64 it serves, a runtime that
 * cannot count its devices, a forked child, and calls from a signal handler inside the pool.
 * Linked with -lgpupool ahead of -lcudart, so the program's own cudaMalloc is pooled too.
 *
 * usage: api_edges lasterr | devquery | outgrown | mapped | highdev | countfail | forkline |
 *        reentry */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <stdint.h>
#include <unistd.h>

#include "api_check.h"

/* Queries the pool does not need are not made: in a process that sees one device, which
 * device is current (it is that one, on every thread): the next cudaGetDevice is armed to
 * fail, and only the program's own call meets it; with two devices the pool asks in each call.
 * And in strict mode, whether a stream is blocking. Run in the default (strict) mode. */
static void devquery(void)
{
    int n = 0, d = -1;
    void *p;
    CHECK_CUDA(cudaGetDeviceCount(&n));
    CHECK_CUDA(cudaMalloc(&p, MIB));
    CHECK_CUDA(cudaFree(p));
    CHECK(cudasimFailNext("cudaGetDevice", 1, (int)cudaErrorUnknown) == 0, "arm");
    for (int i = 0; i < 10; i++) {
        CHECK_CUDA(cudaMalloc(&p, MIB));
        CHECK_CUDA(cudaFree(p));
        CHECK_POOL(gpupool_malloc_async(&p, MIB, NULL));
        CHECK_POOL(gpupool_free_async(p, NULL));
        p = gpupool_torch_malloc((ssize_t)MIB, 0, NULL);
        CHECK(p != NULL, "gpupool_torch_malloc");
        gpupool_torch_free(p, (ssize_t)MIB, 0, NULL);
    }
    cudaError_t e = cudaGetDevice(&d);
    if (n == 1)
        CHECK(e == cudaErrorUnknown, "one device, yet the pool asked for the current one");
    else
        CHECK(e == cudaSuccess && d == 0, "the pool did not ask (%d, device %d)", (int)e, d);
    (void)cudaGetLastError();
    /* In strict mode (the default) every free in stream order waits for a fence: whether its
     * stream is blocking does not matter, and is not asked. */
    cudaStream_t s;
    unsigned flags = 0;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudasimFailNext("cudaStreamGetFlags", 1, (int)cudaErrorUnknown) == 0, "arm");
    for (int i = 0; i < 10; i++) {
        CHECK_POOL(gpupool_malloc_async(&p, MIB, s));
        CHECK_POOL(gpupool_free_async(p, s));
    }
    e = cudaStreamGetFlags(s, &flags);
    CHECK(e == cudaErrorUnknown, "strict mode asked for the stream's flags");
    (void)cudaGetLastError();
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("devquery ok\n");
}

/* The pool's own stream queries (cudaStreamIsCapturing, cudaStreamGetId, cudaStreamGetFlags)
 * that fail leave no error behind in the program's cudaGetLastError. */
static void lasterr(void)
{
    cudaStream_t s;
    void *a = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaGetLastError() == cudaSuccess, "clean start");
    CHECK(cudasimFailNext("cudaStreamGetId", 1, (int)cudaErrorInvalidResourceHandle) == 0, "arm");
    CHECK_POOL(gpupool_malloc_async(&a, MIB, s));
    cudaError_t after_malloc = cudaGetLastError();
    CHECK(cudasimFailNext("cudaStreamIsCapturing", 1, (int)cudaErrorInvalidResourceHandle) == 0,
          "arm");
    CHECK(cudasimFailNext("cudaStreamGetFlags", 1, (int)cudaErrorInvalidResourceHandle) == 0,
          "arm");
    CHECK_POOL(gpupool_free_async(a, s));
    cudaError_t after_free = cudaGetLastError();
    CHECK(after_malloc == cudaSuccess && after_free == cudaSuccess,
          "the pool's own stream queries left errors %d and %d", (int)after_malloc,
          (int)after_free);
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaStreamDestroy(s));
    printf("lasterr ok\n");
}

/* A request larger than every segment so far gives the idle segments it outgrew back first:
 * the counters, the simulator and the peak agree. */
static void outgrown(void)
{
    void *a, *b, *c;
    cudasimResetStats();
    /* 600 MiB: a record, in a 768 MiB segment (room to grow); a 200 MiB one beside it. */
    CHECK_CUDA(cudaMalloc(&a, 600 * MIB));
    CHECK_CUDA(cudaMalloc(&c, 200 * MIB));
    CHECK_CUDA(cudaFree(a));
    /* 1000 MiB does not fit in the idle 768 MiB segment: that one goes back, then 1000 MiB
     * (a request that replaced what it outgrew gets no room to grow). */
    CHECK_CUDA(cudaMalloc(&b, 1000 * MIB));
    gpupool_stats st = pool_stats(0);
    cudasimStats sim = sim_stats(0);
    CHECK(st.outgrown_released_bytes == 768 * MIB, "outgrown %llu",
          (unsigned long long)st.outgrown_released_bytes);
    CHECK(st.driver_frees == 1 && sim.free_calls == 1, "driver frees %llu, simulator saw %llu",
          (unsigned long long)st.driver_frees, sim.free_calls);
    CHECK(st.reserved_bytes == (200 + 1000) * MIB && st.reserved_bytes == sim.live_bytes,
          "reserved %llu, simulator live %llu", (unsigned long long)st.reserved_bytes,
          sim.live_bytes);
    CHECK(st.reserved_bytes_peak == (200 + 1000) * MIB &&
              sim.peak_live_bytes == st.reserved_bytes_peak,
          "peak %llu, simulator peak %llu", (unsigned long long)st.reserved_bytes_peak,
          sim.peak_live_bytes);
    CHECK_CUDA(cudaFree(b));
    CHECK_CUDA(cudaFree(c));
    CHECK_POOL(gpupool_write_summary(1));
    printf("outgrown ok\n");
}

/* `"key":N` in a JSON document, or -1. */
static long long json_number(const char *json, const char *key)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    return at ? strtoll(at + strlen(pattern), NULL, 10) : -1;
}

/* Where the memory lies, in the struct: mapped bytes and address space of expandable segments
 * (none with GPUPOOL_EXPANDABLE=0), what could go back and what is stranded, against the
 * simulator, the JSON summary and what gpupool_empty_cache then gives back. Three 7 MiB blocks,
 * the middle one freed. */
static void mapped(void)
{
    const char *e = getenv("GPUPOOL_EXPANDABLE");
    int expandable = !(e && strcmp(e, "0") == 0);
    void *p[3];
    for (int i = 0; i < 3; i++)
        CHECK_CUDA(cudaMalloc(&p[i], 7 * MIB));
    CHECK_CUDA(cudaFree(p[1]));
    CHECK_CUDA(cudaDeviceSynchronize());
    gpupool_stats st = pool_stats(0);
    cudasimStats sim = sim_stats(0);
    CHECK(st.reserved_bytes == sim.live_bytes, "reserved %llu, simulator %llu",
          (unsigned long long)st.reserved_bytes, sim.live_bytes);
    CHECK(st.mapped_bytes == sim.vmm_mapped_bytes, "mapped %llu, simulator %llu",
          (unsigned long long)st.mapped_bytes, sim.vmm_mapped_bytes);
    if (expandable) {
        CHECK(st.mapped_bytes == st.reserved_bytes && st.mapped_bytes >= 21 * MIB,
              "mapped %llu of reserved %llu", (unsigned long long)st.mapped_bytes,
              (unsigned long long)st.reserved_bytes);
        CHECK(st.address_space_bytes >= st.mapped_bytes &&
                  st.address_space_bytes % (2 * MIB) == 0,
              "address space %llu", (unsigned long long)st.address_space_bytes);
        CHECK(st.releasable_bytes >= 4 * MIB && st.stranded_bytes > 0, "releasable %llu stranded %llu",
              (unsigned long long)st.releasable_bytes, (unsigned long long)st.stranded_bytes);
    } else {
        CHECK(st.mapped_bytes == 0 && st.address_space_bytes == 0, "classic: mapped %llu, %llu",
              (unsigned long long)st.mapped_bytes, (unsigned long long)st.address_space_bytes);
    }
    CHECK(st.releasable_bytes + st.stranded_bytes == st.cached_bytes,
          "releasable %llu + stranded %llu != cached %llu", (unsigned long long)st.releasable_bytes,
          (unsigned long long)st.stranded_bytes, (unsigned long long)st.cached_bytes);

    /* The JSON summary carries the same figures. */
    size_t len = 0;
    CHECK_POOL(gpupool_get_summary(1, NULL, 0, &len));
    char *json = malloc(len + 1);
    CHECK(json != NULL, "buffer");
    CHECK_POOL(gpupool_get_summary(1, json, len + 1, &len));
    CHECK(json_number(json, "mapped_bytes") == (long long)st.mapped_bytes, "JSON mapped");
    CHECK(json_number(json, "address_space_bytes") == (long long)st.address_space_bytes,
          "JSON address space");
    CHECK(json_number(json, "releasable_bytes") == (long long)st.releasable_bytes,
          "JSON releasable");
    CHECK(json_number(json, "stranded_bytes") == (long long)st.stranded_bytes, "JSON stranded");
    free(json);

    /* What could go back is what empty_cache gives back; the stranded bytes stay. */
    uint64_t released = 0;
    CHECK_POOL(gpupool_empty_cache(0, &released));
    CHECK(released == st.releasable_bytes, "released %llu of %llu releasable",
          (unsigned long long)released, (unsigned long long)st.releasable_bytes);
    CHECK(sim_stats(0).live_bytes == sim.live_bytes - released, "simulator live %llu",
          sim_stats(0).live_bytes);
    gpupool_stats after = pool_stats(0);
    CHECK(after.releasable_bytes == 0 && after.stranded_bytes == st.stranded_bytes,
          "after empty_cache: releasable %llu stranded %llu",
          (unsigned long long)after.releasable_bytes, (unsigned long long)after.stranded_bytes);

    /* A program built against the header before these fields gets the old ones only. */
    gpupool_stats old = old_caller_stats(offsetof(gpupool_stats, mapped_bytes));
    CHECK(old.stream_hits == after.stream_hits && old.reserved_bytes == after.reserved_bytes,
          "old struct: reserved %llu", (unsigned long long)old.reserved_bytes);

    CHECK_CUDA(cudaFree(p[0]));
    CHECK_CUDA(cudaFree(p[2]));
    printf("mapped ok (mapped %llu, address space %llu, releasable %llu, stranded %llu)\n",
           (unsigned long long)st.mapped_bytes, (unsigned long long)st.address_space_bytes,
           (unsigned long long)st.releasable_bytes, (unsigned long long)st.stranded_bytes);
}

/* Devices beyond the 64 the pool serves (run with CUDASIM_DEVICES above 64): their memory comes
 * from the runtime as it is, and the threshold calls refuse them. */
static void highdev(void)
{
    int n = 0;
    void *p;
    uint64_t t = 7;
    CHECK_CUDA(cudaGetDeviceCount(&n));
    CHECK(n > 64, "run with CUDASIM_DEVICES above 64 (%d)", n);
    int d = n - 1;
    CHECK(gpupool_set_release_threshold(d, 0) == GPUPOOL_ERROR_INVALID_DEVICE, "set on %d", d);
    CHECK(gpupool_get_release_threshold(d, &t) == GPUPOOL_ERROR_INVALID_DEVICE, "get on %d", d);
    CHECK(t == 7, "written on failure");
    CHECK_POOL(gpupool_get_release_threshold(63, &t));
    CHECK(t == GPUPOOL_KEEP_ALL, "device 63: %llu", (unsigned long long)t);
    CHECK_CUDA(cudaSetDevice(d));
    cudasimResetStats();
    CHECK_CUDA(cudaMalloc(&p, 1000));
    CHECK(sim_stats(d).malloc_calls == 1 && sim_stats(d).live_bytes == 1024,
          "device %d: %llu calls, %llu bytes: not the runtime's own allocation", d,
          sim_stats(d).malloc_calls, sim_stats(d).live_bytes);
    tag_block(p, 1000, 0x64);
    check_tag(p, 1000, 0x64);
    CHECK_CUDA(cudaFree(p));
    CHECK(sim_stats(d).live_bytes == 0, "not freed by the runtime");
    CHECK(pool_stats(d).alloc_calls == 0, "the pool counted device %d", d);
    CHECK_CUDA(cudaSetDevice(0));
    printf("highdev ok\n");
}

/* The runtime cannot count its devices (no GPU, a broken driver): the calls that take a device
 * answer 101 (35 without a driver), write nothing, and leave no error behind. */
static void countfail(void)
{
    static const int errors[] = {cudaErrorNoDevice, cudaErrorInitializationError,
                                 cudaErrorUnknown, cudaErrorInsufficientDriver};
    void *p;
    CHECK_CUDA(cudaMalloc(&p, MIB));
    CHECK_CUDA(cudaFree(p));
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        int e = errors[i];
        int want = e == cudaErrorInsufficientDriver ? 35 : GPUPOOL_ERROR_INVALID_DEVICE;
        gpupool_stats st;
        memset(&st, 0xAB, sizeof st);
        st.struct_size = sizeof st;
        uint64_t t = 7, released = 7;
        CHECK(cudasimFailNext("cudaGetDeviceCount", 1, e) == 0, "arm");
        CHECK(gpupool_get_stats(0, &st) == want, "get_stats with count error %d", e);
        CHECK(st.reserved_bytes == 0xABABABABABABABABull, "stats written on failure");
        CHECK(cudaGetLastError() == cudaSuccess, "get_stats left error %d behind", e);
        CHECK(cudasimFailNext("cudaGetDeviceCount", 1, e) == 0, "arm");
        CHECK(gpupool_empty_cache(0, &released) == want, "empty_cache with count error %d", e);
        CHECK(released == 7, "released written on failure");
        CHECK(cudaGetLastError() == cudaSuccess, "empty_cache left error %d behind", e);
        CHECK(cudasimFailNext("cudaGetDeviceCount", 1, e) == 0, "arm");
        CHECK(gpupool_get_release_threshold(0, &t) == want, "threshold with count error %d", e);
        CHECK(t == 7, "threshold written on failure");
        CHECK(cudaGetLastError() == cudaSuccess, "get_release_threshold left error %d", e);
    }
    uint64_t t = 0;
    CHECK_POOL(gpupool_get_release_threshold(0, &t));
    printf("countfail ok\n");
}

/* A forked child's summary says the pool is off there (not that GPUPOOL_DISABLE was set). */
static void forkline(void)
{
    void *p;
    int fds[2];
    char text[4096];
    size_t len = 0;
    CHECK_POOL(gpupool_malloc(&p, MIB));
    CHECK(pipe(fds) == 0, "pipe");
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        close(fds[0]);
        int ok = gpupool_enabled() == 0 && gpupool_write_summary(fds[1]) == GPUPOOL_SUCCESS;
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    for (;;) {
        ssize_t r = read(fds[0], text + len, sizeof text - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    text[len] = 0;
    close(fds[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the child's summary failed");
    CHECK(strstr(text, "forked child") != NULL && strstr(text, "GPUPOOL_DISABLE") == NULL,
          "the child's summary: %s", text);
    CHECK_POOL(gpupool_free(p));
    printf("forkline ok\n");
}

/* Calls from a signal handler that interrupted the same thread inside the pool (run with
 * CUDASIM_MALLOC_US large: the interrupted call is making a segment). Each is refused with 999,
 * every time, and nothing is freed: a pooled block passed to the runtime's own cudaFree would
 * free its whole segment under the pool. */
enum { REENTRY_CALLS = 7 };
static void *g_victim;
static volatile int g_rc[REENTRY_CALLS];
static volatile sig_atomic_t g_handled, g_about_to_malloc;
static pthread_t g_main_thread;

static void on_usr1(int sig)
{
    (void)sig;
    gpupool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    void *q = NULL;
    uint64_t released = 0;
    g_rc[0] = gpupool_get_stats(0, &st);
    g_rc[1] = gpupool_get_stats(0, &st);
    g_rc[2] = gpupool_free(g_victim);
    g_rc[3] = gpupool_malloc(&q, 4096);
    g_rc[4] = cudaFree(g_victim);
    g_rc[5] = gpupool_free_async(g_victim, NULL);
    g_rc[6] = gpupool_empty_cache(0, &released);
    gpupool_torch_free(g_victim, 4096, 0, NULL);
    g_handled = 1;
}

static void *poke(void *arg)
{
    (void)arg;
    while (!g_about_to_malloc) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pthread_kill(g_main_thread, SIGUSR1);
    return NULL;
}

static void reentry(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
    g_main_thread = pthread_self();
    CHECK_POOL(gpupool_malloc(&g_victim, 4096));
    tag_block(g_victim, 4096, 0x5A);
    void *big[3] = {NULL, NULL, NULL};
    int tries = 0;
    /* The signal must land while the allocation is inside the pool (its segment takes
     * CUDASIM_MALLOC_US); a handler that ran outside it (a very slow machine) is retried. */
    for (; tries < 3; tries++) {
        pthread_t t;
        g_handled = 0;
        g_about_to_malloc = 0;
        CHECK(pthread_create(&t, NULL, poke, NULL) == 0, "thread");
        g_about_to_malloc = 1;
        CHECK_POOL(gpupool_malloc(&big[tries], (size_t)(100 + 10 * tries) * MIB));
        pthread_join(t, NULL);
        CHECK(g_handled, "the handler did not run");
        if (g_rc[0] == GPUPOOL_ERROR_UNKNOWN)
            break;
    }
    CHECK(tries < 3, "the signal never landed inside the pool");
    for (int i = 0; i < REENTRY_CALLS; i++)
        CHECK(g_rc[i] == GPUPOOL_ERROR_UNKNOWN, "call %d from the handler returned %d, not 999",
              i, g_rc[i]);
    /* Nothing was freed: the block and its segment are intact and still the program's. */
    check_tag(g_victim, 4096, 0x5A);
    CHECK_CUDA(cudasim_launch_fill(g_victim, 4096, 0, 0x42, NULL));
    CHECK_CUDA(cudaDeviceSynchronize());
    check_tag(g_victim, 4096, 0x42);
    gpupool_stats st = pool_stats(0);
    CHECK(sim_stats(0).live_bytes == st.reserved_bytes, "the runtime holds %llu, the pool %llu",
          sim_stats(0).live_bytes, (unsigned long long)st.reserved_bytes);
    CHECK(st.active_allocations == (uint64_t)tries + 2, "live allocations %llu",
          (unsigned long long)st.active_allocations);
    CHECK_POOL(gpupool_free(g_victim));
    for (int i = 0; i <= tries; i++)
        CHECK_POOL(gpupool_free(big[i]));
    CHECK(cudaGetLastError() == cudaSuccess, "an error was left behind");
    printf("reentry ok\n");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "lasterr") == 0)
        lasterr();
    else if (strcmp(mode, "devquery") == 0)
        devquery();
    else if (strcmp(mode, "outgrown") == 0)
        outgrown();
    else if (strcmp(mode, "mapped") == 0)
        mapped();
    else if (strcmp(mode, "highdev") == 0)
        highdev();
    else if (strcmp(mode, "countfail") == 0)
        countfail();
    else if (strcmp(mode, "forkline") == 0)
        forkline();
    else if (strcmp(mode, "reentry") == 0)
        reentry();
    else {
        fprintf(stderr, "usage: api_edges lasterr|devquery|outgrown|mapped|highdev|countfail|"
                        "forkline|reentry\n");
        return 2;
    }
    return 0;
}
