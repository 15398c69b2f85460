/* A library that allocates through the driver, as a static runtime or XLA does, for the
 * per-library attribution test (tests/report.rs): hold_driver(n) makes n live 4 MiB blocks with
 * cuMemAlloc_v2 on the current context and keeps them. Linked with -lcuda only. */
#include "cuda.h"

int hold_driver(int n);

int hold_driver(int n)
{
    int made = 0;
    for (int i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        /* Not a tail call: the return address must lie in this library. */
        if (cuMemAlloc_v2(&p, 4 << 20) != CUDA_SUCCESS)
            return -1;
        made++;
    }
    return made;
}
