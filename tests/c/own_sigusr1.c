/* A program that handles (or, with the argument "ignore", ignores) SIGUSR1 itself, before any
 * CUDA call: the pool must leave the signal alone, so raising it runs the program's handler and
 * writes no summary. Prints "own handler ok". */
#define _GNU_SOURCE
#include <signal.h>

#include "check.h"

static volatile sig_atomic_t g_caught;

static void on_usr1(int sig)
{
    (void)sig;
    g_caught++;
}

int main(int argc, char **argv)
{
    struct sigaction sa, now;
    int ignore = argc > 1 && strcmp(argv[1], "ignore") == 0;
    void *p = NULL;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ignore ? SIG_IGN : on_usr1;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    CHECK_CUDA(cudaFree(p));
    CHECK_CUDA(cudaMalloc(&p, 1 << 20));
    /* The pool did not replace the disposition. */
    CHECK(sigaction(SIGUSR1, NULL, &now) == 0, "sigaction query");
    CHECK(now.sa_handler == sa.sa_handler, "SIGUSR1 disposition was replaced");
    CHECK(raise(SIGUSR1) == 0, "raise");
    CHECK(raise(SIGUSR1) == 0, "raise");
    CHECK(g_caught == (ignore ? 0 : 2), "own handler ran %d times", (int)g_caught);
    CHECK_CUDA(cudaFree(p));
    printf("own handler ok\n");
    return 0;
}
