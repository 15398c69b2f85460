/* Uses the CUDA runtime but never allocates: only cudaGetDeviceCount (which the pool does not
 * intercept), or, with the argument "sync", also cudaDeviceSynchronize (which it does, so the
 * pool starts). Prints "devices N". */
#include "check.h"

int main(int argc, char **argv)
{
    int n = 0;
    CHECK_CUDA(cudaGetDeviceCount(&n));
    if (argc > 1 && strcmp(argv[1], "sync") == 0)
        CHECK_CUDA(cudaDeviceSynchronize());
    printf("devices %d\n", n);
    return 0;
}
