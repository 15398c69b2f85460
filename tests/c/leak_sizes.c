/* Leaves N blocks allocated at exit (argv[1]), each of its own size (4 KiB + i * 512 bytes), so
 * that the JSON summary's leak list is long: about 40 bytes a size, more than a pipe holds
 * (64 KiB) from N = 2000 on. */
#include "check.h"

int main(int argc, char **argv)
{
    CHECK(argc == 2, "usage: leak_sizes N");
    int n = atoi(argv[1]);
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        CHECK_CUDA(cudaMalloc(&p, 4096 + (size_t)i * 512));
    }
    printf("leak_sizes: all checks passed\n");
    return 0;
}
