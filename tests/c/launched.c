/* The command `python -m gpupool` runs in tests/python_package_test.py: allocates and frees
 * COUNT blocks of 1 MiB with cudaMalloc/cudaFree, then ends as told.
 *
 * usage: launched COUNT exit STATUS    exits with STATUS
 *        launched COUNT signal SIGNO   dies of signal SIGNO
 * Prints "pid N" first, so the caller can check that the launcher kept its pid. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <unistd.h>

#include "check.h"

int main(int argc, char **argv)
{
    CHECK(argc == 4, "usage: launched COUNT exit STATUS | launched COUNT signal SIGNO");
    printf("pid %ld\n", (long)getpid());
    fflush(stdout);
    int count = atoi(argv[1]);
    for (int i = 0; i < count; i++) {
        void *p = NULL;
        CHECK_CUDA(cudaMalloc(&p, 1 << 20));
        CHECK_CUDA(cudaFree(p));
    }
    int value = atoi(argv[3]);
    if (strcmp(argv[2], "signal") == 0) {
        signal(value, SIG_DFL);
        raise(value);
    }
    return value;
}
