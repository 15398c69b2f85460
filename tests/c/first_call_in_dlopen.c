/* The process's first CUDA call while another thread is inside dlopen of a library whose
 * constructor uses CUDA: the first call makes the pool and looks for the runtime (dlsym, dladdr,
 * dlopen, each of which takes the dynamic linker's lock), while the constructor, under that
 * lock, calls cudaMalloc and waits for the pool to be made. Each round is a fresh child process
 * (a process has one first call); a child still running after HANG_GUARD seconds is stopped by
 * its alarm and counts as hung. The runtime is set up first by a call the pool does not take
 * (cudaStreamCreate): the runtime's own first call links its driver under a lock of its own
 * while it calls dladdr and dlopen, which would deadlock the same way without the pool.
 *
 * usage: first_call_in_dlopen LIBRARY ROUNDS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define HANG_GUARD 20
/* Enough hung rounds to tell: the rest would only wait out their guards. */
#define HUNG_ENOUGH 3

static pthread_barrier_t g_start;

static void *first_call(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&g_start);
    void *p;
    CHECK_CUDA(cudaMalloc(&p, 3000000));
    CHECK_CUDA(cudaMemset(p, 0x5A, 256));
    CHECK_CUDA(cudaFree(p));
    return NULL;
}

typedef void *(*block_fn)(int);

/* One round, in the child: a thread's first call against the main thread's dlopen. */
static int child(const char *library)
{
    alarm(HANG_GUARD);
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK_CUDA(cudaStreamDestroy(s));
    CHECK(pthread_barrier_init(&g_start, NULL, 2) == 0, "pthread_barrier_init");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, first_call, NULL) == 0, "pthread_create");
    pthread_barrier_wait(&g_start);
    void *h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen %s: %s", library, dlerror());
    block_fn block = (block_fn)dlsym(h, "cuda_ctor_block");
    CHECK(block != NULL, "dlsym cuda_ctor_block");
    CHECK(block(0) != NULL && block(0) != block(1), "the constructor's blocks");
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
    CHECK(dlclose(h) == 0, "dlclose: %s", dlerror());
    return 0;
}

int main(int argc, char **argv)
{
    CHECK(argc == 3, "usage: first_call_in_dlopen LIBRARY ROUNDS");
    int rounds = atoi(argv[2]);
    int hung = 0, failed = 0, run = 0;
    while (run < rounds && hung < HUNG_ENOUGH) {
        run++;
        fflush(stdout);
        pid_t pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0)
            _exit(child(argv[1]));
        int status;
        CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
            hung++;
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed++;
    }
    printf("first call in dlopen: %d rounds, %d hung, %d failed\n", run, hung, failed);
    return hung == 0 && failed == 0 ? 0 : 1;
}
