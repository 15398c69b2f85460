/* Not a CUDA runtime: a library that says on stderr that it was loaded. Named by
 * GPUPOOL_CUDART, it shows whether the pool opened the file the environment named. */
#include <stdio.h>

__attribute__((constructor)) static void loaded(void)
{
    fputs("marker runtime loaded\n", stderr);
}
