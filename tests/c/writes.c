/* Makes the pool write (a warning, the out-of-memory report, the exit summary, live dumps) while
 * the program's stderr may be a pipe without a reader or a file of its own. Failures are told on
 * stdout: stderr may be unusable. Modes:
 *   exit STATUS     an atexit handler registered before any CUDA call prints "checkpoint"
 *                   (not with a third argument "quiet"); one allocation; returns STATUS.
 *   double_free     frees a block twice (the pool warns), then prints "after double free".
 *   oom             asks for 1 GiB, then halves the size until an allocation succeeds; prints
 *                   "got N" (run with a small CUDASIM_MEM).
 *   dump            raises SIGUSR1, sleeps 600 ms (time for dumps), prints "after dumps".
 *   api_summary     gpupool_write_summary (found with dlsym: the pool is preloaded) to a pipe
 *                   whose reader is closed: prints its result and errno's name.
 *   reuse_fd2 PATH  closes fd 2, opens PATH (which becomes fd 2), writes "data 1", frees a
 *                   block twice, writes "data 2", prints "data written"; PATH stays open.
 *   reuse_fd3 PATH  closes fd 3, opens PATH (which becomes fd 3), writes "data 1", allocates
 *                   and frees a block, writes "data 2", prints "data written".
 *   capture_fd2     puts a pipe on fd 2 (as Jupyter captures the output of C code), frees a
 *                   block twice, prints "captured: " and what the pipe got. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(cond, what)                                                                     \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            printf("FAIL line %d: %s\n", __LINE__, what);                                      \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static void checkpoint(void)
{
    printf("checkpoint\n");
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void double_free(void)
{
    void *p = NULL;
    EXPECT(cudaMalloc(&p, 4096) == cudaSuccess, "cudaMalloc");
    EXPECT(cudaFree(p) == cudaSuccess, "cudaFree");
    EXPECT(cudaFree(p) == cudaErrorInvalidValue, "second cudaFree is not invalid value");
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    void *p = NULL;
    if (strcmp(mode, "exit") == 0 && argc > 2) {
        if (argc < 4 || strcmp(argv[3], "quiet") != 0)
            EXPECT(atexit(checkpoint) == 0, "atexit");
        EXPECT(cudaMalloc(&p, 1 << 20) == cudaSuccess, "cudaMalloc");
        EXPECT(cudaFree(p) == cudaSuccess, "cudaFree");
        return atoi(argv[2]);
    }
    if (strcmp(mode, "double_free") == 0) {
        double_free();
        printf("after double free\n");
        return 0;
    }
    if (strcmp(mode, "oom") == 0) {
        size_t size = (size_t)1 << 30;
        cudaError_t e;
        while ((e = cudaMalloc(&p, size)) == cudaErrorMemoryAllocation && size > 4096)
            size /= 2;
        EXPECT(e == cudaSuccess, "no size fits");
        EXPECT(cudaFree(p) == cudaSuccess, "cudaFree");
        printf("got %zu\n", size);
        return 0;
    }
    if (strcmp(mode, "dump") == 0) {
        EXPECT(cudaMalloc(&p, 1 << 20) == cudaSuccess, "cudaMalloc");
        EXPECT(raise(SIGUSR1) == 0, "raise");
        sleep_ms(600);
        EXPECT(cudaFree(p) == cudaSuccess, "cudaFree");
        printf("after dumps\n");
        return 0;
    }
    if (strcmp(mode, "api_summary") == 0) {
        int (*write_summary)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "gpupool_write_summary");
        int fds[2], r;
        EXPECT(write_summary != NULL, "gpupool_write_summary not found");
        EXPECT(cudaMalloc(&p, 1 << 20) == cudaSuccess, "cudaMalloc");
        EXPECT(pipe(fds) == 0, "pipe");
        close(fds[0]);
        errno = 0;
        r = write_summary(fds[1]);
        printf("write_summary %d %s\n", r, errno == EPIPE ? "EPIPE" : strerror(errno));
        EXPECT(cudaFree(p) == cudaSuccess, "cudaFree");
        return 0;
    }
    if (strcmp(mode, "reuse_fd2") == 0 && argc > 2) {
        int fd;
        close(2);
        fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        EXPECT(fd == 2, "the data file is not fd 2");
        EXPECT(write(fd, "data 1\n", 7) == 7, "write");
        double_free();
        EXPECT(write(fd, "data 2\n", 7) == 7, "write");
        printf("data written\n");
        return 0;
    }
    if (strcmp(mode, "reuse_fd3") == 0 && argc > 2) {
        int fd;
        void *p = NULL;
        close(3);
        fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        EXPECT(fd == 3, "the data file is not fd 3");
        EXPECT(write(fd, "data 1\n", 7) == 7, "write");
        EXPECT(cudaMalloc(&p, 4096) == cudaSuccess, "cudaMalloc");
        EXPECT(cudaFree(p) == cudaSuccess, "cudaFree");
        EXPECT(write(fd, "data 2\n", 7) == 7, "write");
        printf("data written\n");
        return 0;
    }
    if (strcmp(mode, "capture_fd2") == 0) {
        int fds[2];
        char got[4096];
        ssize_t n;
        EXPECT(pipe(fds) == 0, "pipe");
        EXPECT(dup2(fds[1], 2) == 2, "dup2");
        close(fds[1]);
        double_free();
        close(2);
        n = read(fds[0], got, sizeof got - 1);
        got[n > 0 ? n : 0] = 0;
        printf("captured: %s", got);
        return 0;
    }
    printf("usage: writes exit STATUS | double_free | oom | dump | api_summary | "
           "reuse_fd2 PATH | reuse_fd3 PATH | capture_fd2\n");
    return 2;
}
