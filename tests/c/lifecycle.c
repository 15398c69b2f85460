/* Process lifecycle under the pool: fork while other threads allocate, exit and _exit while
 * threads are inside the pool, CUDA from a static constructor before main, dlopen/dlclose of
 * a library that uses CUDA, and pthread_cancel of threads that allocate.
 *
 * usage: lifecycle fork exit|_exit|exec|cuda ROUNDS
 *        lifecycle exit-storm|_exit-storm
 *        lifecycle ctor
 *        lifecycle dlopen LIBRARY ROUNDS
 *        lifecycle fork-init        (run with GPUPOOL_TRACE set)
 *        lifecycle cancel ROUNDS
 * Every wait has a deadline: a child that does not finish in time is killed and reported as a
 * deadlock. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define THREADS 4

static volatile int g_stop;
static int g_devices = 1;
static volatile int g_in_init;
static volatile double g_slow_until;
static pid_t g_parent;
static void *g_ctor_block;

/* Before main: the pool starts from a constructor of the program. */
__attribute__((constructor)) static void early(void)
{
    if (getenv("LIFECYCLE_CTOR") == NULL)
        return;
    CHECK_CUDA(cudaMalloc(&g_ctor_block, 4096));
    tag_block(g_ctor_block, 4096, 0x5C);
}

/* A storm thread's call: the thread ends quietly once the runtime answers that it was torn
 * down (the main thread is in exit, past the runtime's teardown), as it does with NVIDIA's. */
#define STORM_CUDA(call)                                                                       \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ == cudaErrorCudartUnloading)                                                    \
            return NULL;                                                                       \
        CHECK(e_ == cudaSuccess, "%s returned %d", #call, (int)e_);                            \
    } while (0)

static void *storm(void *arg)
{
    uint64_t rng = 0x1234567ull + (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull;
    unsigned char seen[4096];
    while (!g_stop) {
        int dev = (int)(rng_next(&rng) % (uint64_t)g_devices);
        size_t n = (size_t)(rng_next(&rng) % (96u << 10)) + 1;
        size_t k = n < sizeof seen ? n : sizeof seen;
        unsigned char tag = (unsigned char)(rng_next(&rng) % 255 + 1);
        void *p;
        STORM_CUDA(cudaSetDevice(dev));
        STORM_CUDA(cudaMalloc(&p, n));
        STORM_CUDA(cudaMemset(p, tag, k));
        STORM_CUDA(cudaMemcpy(seen, p, k, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < k; i++)
            CHECK(seen[i] == tag, "block %p byte %zu is %u, expected %u (clobbered)", p, i,
                  (unsigned)seen[i], (unsigned)tag);
        STORM_CUDA(cudaFree(p));
    }
    return NULL;
}

static void start_storm(pthread_t *tid)
{
    int count = 0;
    for (int t = 0; t < THREADS; t++)
        CHECK(pthread_create(&tid[t], NULL, storm, (void *)(uintptr_t)t) == 0, "thread");
    /* Let every thread get going (the pool exists and is busy). */
    while (count < 3) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
        count++;
    }
}

static void stop_storm(pthread_t *tid)
{
    g_stop = 1;
    for (int t = 0; t < THREADS; t++)
        pthread_join(tid[t], NULL);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Wait for `pid` at most `seconds`; a child still running then is killed: a deadlock. */
static int wait_child(pid_t pid, double seconds, const char *what)
{
    double deadline = now() + seconds;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        CHECK(r >= 0, "waitpid");
        if (r == pid)
            break;
        if (now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            CHECK(0, "%s: child %d did not finish in %.0f s (deadlock)", what, (int)pid, seconds);
        }
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(WIFEXITED(status), "%s: child ended by signal %d", what,
          WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    return WEXITSTATUS(status);
}

/* In a forked child: the runtime's answers, and no deadlock. */
static void child_uses_cuda(void)
{
    void *p = NULL;
    CHECK_CUDA(cudaSetDevice(0));
    CHECK_CUDA(cudaMalloc(&p, 100000));
    tag_block(p, 100000, 0x7E);
    check_tag(p, 100000, 0x7E);
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK(cudaFree((void *)0x7777000) == cudaErrorInvalidValue, "wild free in the child");
    cudaGetLastError();
}

static int fork_rounds(const char *how, int rounds)
{
    pthread_t tid[THREADS];
    start_storm(tid);
    for (int i = 0; i < rounds; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0) {
            if (strcmp(how, "exit") == 0)
                exit(0);
            if (strcmp(how, "_exit") == 0)
                _exit(0);
            if (strcmp(how, "exec") == 0) {
                execl("/bin/true", "true", (char *)NULL);
                _exit(127);
            }
            child_uses_cuda();
            exit(0);
        }
        CHECK(wait_child(pid, 60, how) == 0, "child %d (%s) failed", i, how);
    }
    stop_storm(tid);
    printf("fork %s ok: %d children\n", how, rounds);
    return 0;
}

/* The C library's getenv, replaced: the pool's first lookup of GPUPOOL_TRACE (made while the
 * pool is being made, on the first CUDA call) once fork_during_init armed it says so and takes a
 * second, which holds the pool's start open long enough for another thread to fork in the middle
 * of it. The program is linked with -rdynamic so that the pool's own calls reach this
 * definition. It reads `environ` itself: asking dlsym for the real getenv would ask the pool's
 * dlsym, which reads the environment. */
extern char **environ;
static volatile int g_slow_armed;

char *getenv(const char *name)
{
    if (g_slow_armed && strcmp(name, "GPUPOOL_TRACE") == 0 && getpid() == g_parent) {
        g_slow_armed = 0;
        g_slow_until = now() + 1.0;
        g_in_init = 1;
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    size_t n = strlen(name);
    for (char **e = environ; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

static void *first_cuda_call(void *arg)
{
    void **out = arg;
    CHECK_CUDA(cudaMalloc(out, 70000));
    tag_block(*out, 70000, 0x3D);
    return NULL;
}

/* gpupool_enabled(), looked up: this program is not linked with the pool. */
static int pool_enabled(void)
{
    int (*enabled)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpupool_enabled");
    CHECK(enabled != NULL, "gpupool_enabled not found (is the pool preloaded?)");
    return enabled();
}

/* A fork while another thread's first CUDA call is still making the pool: the child must not
 * wait for the parent's half-made pool (its maker does not exist in the child), and gets the
 * runtime's answers; the parent's pool starts normally. */
static int fork_during_init(void)
{
    pthread_t maker;
    void *block = NULL;
    g_slow_armed = 1;
    CHECK(pthread_create(&maker, NULL, first_cuda_call, &block) == 0, "thread");
    double deadline = now() + 20;
    while (!g_in_init) {
        CHECK(now() < deadline, "the pool never read GPUPOOL_TRACE");
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        child_uses_cuda();
        CHECK(pool_enabled() == 0, "the pool is on in a child forked while it was being made");
        exit(0);
    }
    CHECK(wait_child(pid, 60, "fork-init") == 0, "the child failed");
    /* The child did all that while the parent's pool was still being made. */
    CHECK(now() < g_slow_until, "the child outlived the pool's start: the fork missed it");
    pthread_join(maker, NULL);
    CHECK(block != NULL, "the first cudaMalloc gave nothing");
    check_tag(block, 70000, 0x3D);
    CHECK_CUDA(cudaFree(block));
    CHECK(pool_enabled() == 1, "the parent's pool is off");
    printf("fork-init ok\n");
    return 0;
}

/* One block of `n` bytes allocated, written with `tag`, read back and freed. */
static void program_allocates(size_t n, unsigned char tag)
{
    void *p;
    CHECK_CUDA(cudaMalloc(&p, n));
    tag_block(p, n, tag);
    check_tag(p, n, tag);
    CHECK_CUDA(cudaFree(p));
}

/* Blocks one cancelled thread allocated and another frees: a free of a block another thread's
 * cache handed out waits for that cache's lock. */
#define SLOTS 64
static void *g_slot[SLOTS];

/* Allocates, tags, and swaps its block with one another thread left; checks and frees that one.
 * Its only cancellation point is pthread_testcancel: a cancel acts between two rounds, never
 * inside a CUDA call of the program's. */
static void *cancelled(void *arg)
{
    uint64_t rng = 0xC0FFEEull + (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull;
    for (;;) {
        size_t n = (size_t)(rng_next(&rng) % (64u << 10)) + 1;
        void *p;
        CHECK_CUDA(cudaMalloc(&p, n));
        tag_block(p, n < 256 ? n : 256, 0xCA);
        void *other = __atomic_exchange_n(&g_slot[rng_next(&rng) % SLOTS], p, __ATOMIC_ACQ_REL);
        if (other != NULL) {
            check_tag(other, 1, 0xCA);
            CHECK_CUDA(cudaFree(other));
        }
        pthread_testcancel();
    }
    return NULL;
}

/* Threads cancelled in the middle of their allocations, ROUNDS times: as without the pool, each
 * ends at its cancellation point, and the program goes on allocating. */
static int cancel_rounds(int rounds)
{
    for (int r = 0; r < rounds; r++) {
        pthread_t tid[THREADS];
        for (int t = 0; t < THREADS; t++)
            CHECK(pthread_create(&tid[t], NULL, cancelled, (void *)(uintptr_t)(r * THREADS + t)) ==
                      0,
                  "thread");
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
        for (int t = 0; t < THREADS; t++)
            CHECK(pthread_cancel(tid[t]) == 0, "pthread_cancel");
        for (int t = 0; t < THREADS; t++) {
            void *ret;
            CHECK(pthread_join(tid[t], &ret) == 0, "pthread_join");
            CHECK(ret == PTHREAD_CANCELED, "thread %d of round %d was not cancelled", t, r);
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (g_slot[i] != NULL)
            CHECK_CUDA(cudaFree(g_slot[i]));
    program_allocates(100000, 0x5A);
    printf("cancel ok: %d rounds\n", rounds);
    return 0;
}

typedef int (*steps_fn)(int, size_t);

static int dlopen_rounds(const char *lib, int rounds)
{
    for (int i = 0; i < rounds; i++) {
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        CHECK(h != NULL, "dlopen %s: %s", lib, dlerror());
        steps_fn steps = (steps_fn)dlsym(h, "fw_train_steps");
        CHECK(steps != NULL, "dlsym fw_train_steps");
        CHECK(steps(50, (size_t)(i + 1) * 10000) == 0, "fw_train_steps in round %d", i);
        CHECK(dlclose(h) == 0, "dlclose");
        /* The program's own allocations still work between loads. */
        program_allocates(5000, 0x42);
    }
    printf("dlopen ok: %d rounds\n", rounds);
    return 0;
}

int main(int argc, char **argv)
{
    int count = 0;
    CHECK(argc >= 2, "usage: lifecycle MODE ...");
    g_parent = getpid();
    /* Before any CUDA call: the fork must land while the first one is making the pool. */
    if (strcmp(argv[1], "fork-init") == 0)
        return fork_during_init();
    CHECK_CUDA(cudaGetDeviceCount(&count));
    g_devices = count > 1 ? 2 : 1;
    const char *mode = argv[1];
    if (strcmp(mode, "fork") == 0 && argc >= 4)
        return fork_rounds(argv[2], atoi(argv[3]));
    if (strcmp(mode, "exit-storm") == 0 || strcmp(mode, "_exit-storm") == 0) {
        pthread_t tid[THREADS];
        start_storm(tid);
        printf("exiting with threads inside the pool\n");
        fflush(stdout);
        if (mode[0] == '_')
            _exit(0);
        exit(0);
    }
    if (strcmp(mode, "ctor") == 0) {
        CHECK(g_ctor_block != NULL, "the constructor did not allocate (set LIFECYCLE_CTOR)");
        check_tag(g_ctor_block, 4096, 0x5C);
        CHECK_CUDA(cudaFree(g_ctor_block));
        printf("ctor ok\n");
        return 0;
    }
    if (strcmp(mode, "dlopen") == 0 && argc >= 4)
        return dlopen_rounds(argv[2], atoi(argv[3]));
    if (strcmp(mode, "cancel") == 0 && argc >= 3)
        return cancel_rounds(atoi(argv[2]));
    CHECK(0, "unknown mode %s", mode);
    return 1;
}
