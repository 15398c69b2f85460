/* fragment: what fits when a device is filled with blocks of one size, then half of them are
 * freed and blocks twice the size are asked for (issue 20's measurement: classic segments strand
 * 6 MiB of each 20 MiB segment with 7 MiB blocks, and none of the 14 MiB blocks fit).
 *
 * usage: fragment [MIB]   (default 7). Prints blocks=N (of MIB MiB until the first refusal),
 * double_blocks=M (of 2*MIB MiB after every other block is freed), then "fragment=ok". */
#include "common.cuh"

#define MAX_BLOCKS 65536

static void *blocks[MAX_BLOCKS];

/* Blocks of `bytes` from slot `from` on, until the first refusal: the slot after the last. */
static int fill(size_t bytes, int from)
{
    int n = from;
    while (n < MAX_BLOCKS) {
        cudaError_t e = cudaMalloc(&blocks[n], bytes);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            break;
        }
        CHECK(e);
        n++;
    }
    return n;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 7;
    size_t bytes = mib << 20;
    CHECK(cudaFree(NULL));
    int n = fill(bytes, 0);
    printf("blocks=%d\n", n);
    for (int i = 0; i < n; i += 2) {
        CHECK(cudaFree(blocks[i]));
        blocks[i] = NULL;
    }
    CHECK(cudaDeviceSynchronize());
    int m = fill(2 * bytes, n);
    printf("double_blocks=%d\n", m - n);
    for (int i = 0; i < m; i++) {
        if (blocks[i]) {
            CHECK(cudaFree(blocks[i]));
        }
    }
    printf("fragment=ok\n");
    return 0;
}
