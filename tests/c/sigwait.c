/* A program that shuts down cleanly on SIGTERM the usual way: it blocks the signal after its
 * CUDA work started and collects it with sigwait. The pool's live-dump thread (started at the
 * first allocation) must not take the signal, whose default action would kill the process.
 * Prints "sigwait got SIGTERM". */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

int main(void)
{
    void *p;
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    CHECK_CUDA(cudaFree(p));
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    CHECK(pthread_sigmask(SIG_BLOCK, &set, NULL) == 0, "pthread_sigmask");
    /* Long enough for any thread the pool started to be running with its own mask. */
    struct timespec pause = {0, 200 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECK(kill(getpid(), SIGTERM) == 0, "kill");
    int sig = 0;
    CHECK(sigwait(&set, &sig) == 0, "sigwait");
    CHECK(sig == SIGTERM, "sigwait got signal %d", sig);
    printf("sigwait got SIGTERM\n");
    return 0;
}
