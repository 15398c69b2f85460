/* A library that is preloaded before gpupool-run adds libgpupool: it says that it was loaded. */
#include <stdio.h>

__attribute__((constructor)) static void marker_loaded(void)
{
    fputs("marker library loaded\n", stderr);
}
