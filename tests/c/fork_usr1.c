/* SIGUSR1 in a child forked after the pool started: the child has no dump thread, and the
 * program never handled the signal, so it ends the child as it would without the pool. The
 * parent allocates (the pool starts and takes SIGUSR1 for its live dump), forks a child that
 * sleeps up to 5 s and exits 7, sends it SIGUSR1, and prints how it ended:
 * "child killed by signal 10" or "child exited 7". */
#define _DEFAULT_SOURCE
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

int main(void)
{
    void *p = NULL;
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    pid_t child = fork();
    CHECK(child >= 0, "fork");
    if (child == 0) {
        for (int i = 0; i < 50; i++)
            usleep(100000);
        _exit(7);
    }
    usleep(200000);
    CHECK(kill(child, SIGUSR1) == 0, "kill");
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child, "waitpid");
    if (WIFSIGNALED(status))
        printf("child killed by signal %d\n", WTERMSIG(status));
    else
        printf("child exited %d\n", WEXITSTATUS(status));
    CHECK_CUDA(cudaFree(p));
    return 0;
}
