/* A process that allocated through the pool forks: the child exits normally (running the
 * inherited exit handlers) without repeating its parent's summary; the parent reports once.
 *
 * usage: fork_summary exit|_exit */
#define _POSIX_C_SOURCE 200809L
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

int main(int argc, char **argv)
{
    void *p;
    pid_t child;
    int status = 0;
    CHECK(argc == 2, "usage: fork_summary exit|_exit");
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    fflush(NULL);
    child = fork();
    CHECK(child >= 0, "fork");
    if (child == 0) {
        /* The child never touches CUDA (CUDA does not support it after fork). */
        if (strcmp(argv[1], "_exit") == 0)
            _exit(0);
        exit(0);
    }
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "child status %d", status);
    CHECK_CUDA(cudaFree(p));
    printf("fork_summary ok\n");
    return 0;
}
