/* A library that allocates through the runtime, for the per-library attribution test
 * (tests/report.rs): hold_runtime(n) makes n live 1 MiB blocks with cudaMalloc and keeps them. */
#include "check.h"

int hold_runtime(int n);

int hold_runtime(int n)
{
    int made = 0;
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        /* Not a tail call: the return address must lie in this library. */
        if (cudaMalloc(&p, 1 << 20) != cudaSuccess)
            return -1;
        made++;
    }
    return made;
}
