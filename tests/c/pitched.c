/* Pitched allocations (cudaMallocPitch), as OpenCV's GpuMat and NPP make one per image.
 *   pitches: rows of several widths; prints "pitch WIDTH PITCH" for each, checks that the
 *            block is 512-byte aligned and that every row keeps its own bytes, then frees.
 *   churn:   200 images of 640 x 480 x 4 bytes, each allocated and freed in turn; prints
 *            "driver_mallocs N", the simulator's allocation calls meanwhile.
 *   hostile: NULL out-pointers, an empty row or height, a size past the address space, an
 *            image larger than the device; prints "code CASE N" with what cudaMallocPitch
 *            returned.
 *   full:    the device filled with 1 MiB blocks, all freed (a pool keeps them cached), then
 *            this process's first pitched image, which must fit in the memory freed. */
#include <stdint.h>

#include "check.h"

static void pitches(void)
{
    static const size_t widths[] = {1, 100, 511, 512, 513, 2560, 4000, 1 << 20, (1 << 20) + 1};
    const size_t height = 3;
    void *blocks[sizeof widths / sizeof widths[0]];
    size_t pitch_of[sizeof widths / sizeof widths[0]];
    size_t i, r;
    for (i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        size_t pitch = 0;
        CHECK_CUDA(cudaMallocPitch(&blocks[i], &pitch, widths[i], height));
        CHECK(pitch >= widths[i], "pitch %zu below width %zu", pitch, widths[i]);
        CHECK((uintptr_t)blocks[i] % 512 == 0, "block %p not 512-byte aligned", blocks[i]);
        printf("pitch %zu %zu\n", widths[i], pitch);
        pitch_of[i] = pitch;
        for (r = 0; r < height; r++)
            tag_block((char *)blocks[i] + r * pitch, pitch, (unsigned char)(16 * i + r + 1));
    }
    /* Every row of every block still holds its own tag: no two blocks share bytes. */
    for (i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        for (r = 0; r < height; r++)
            check_tag((char *)blocks[i] + r * pitch_of[i], pitch_of[i],
                      (unsigned char)(16 * i + r + 1));
        CHECK_CUDA(cudaFree(blocks[i]));
    }
}

static void churn(void)
{
    unsigned long long before = sim_stats(0).malloc_calls;
    int i;
    for (i = 0; i < 200; i++) {
        void *p;
        size_t pitch;
        CHECK_CUDA(cudaMallocPitch(&p, &pitch, 640 * 4, 480));
        tag_block(p, pitch * 480, (unsigned char)i);
        CHECK_CUDA(cudaFree(p));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("driver_mallocs %llu\n", sim_stats(0).malloc_calls - before);
}

static void hostile(void)
{
    void *p = NULL;
    size_t pitch = 0;
    printf("code null_pitch %d\n", (int)cudaMallocPitch(&p, NULL, 100, 10));
    cudaGetLastError();
    printf("code null_pointer %d\n", (int)cudaMallocPitch(NULL, &pitch, 100, 10));
    cudaGetLastError();
    printf("code zero_width %d\n", (int)cudaMallocPitch(&p, &pitch, 0, 10));
    cudaGetLastError();
    printf("code zero_height %d\n", (int)cudaMallocPitch(&p, &pitch, 100, 0));
    cudaGetLastError();
    printf("code past_the_address_space %d\n",
           (int)cudaMallocPitch(&p, &pitch, SIZE_MAX / 2, 4));
    printf("last_error %d\n", (int)cudaGetLastError());
    printf("code larger_than_the_device %d\n",
           (int)cudaMallocPitch(&p, &pitch, 1 << 20, (size_t)1 << 20));
    printf("last_error %d\n", (int)cudaGetLastError());
}

static void full(void)
{
    enum { MAX_BLOCKS = 4096 };
    static void *blocks[MAX_BLOCKS];
    size_t n = 0, i, pitch = 0;
    void *p = NULL;
    while (n < MAX_BLOCKS && cudaMalloc(&blocks[n], 1 << 20) == cudaSuccess)
        n++;
    cudaGetLastError();
    CHECK(n > 4 && n < MAX_BLOCKS, "filled the device with %zu blocks", n);
    for (i = 0; i < n; i++)
        CHECK_CUDA(cudaFree(blocks[i]));
    CHECK_CUDA(cudaMallocPitch(&p, &pitch, 640 * 4, 480));
    CHECK(pitch >= 640 * 4, "pitch %zu", pitch);
    tag_block(p, pitch * 480, 7);
    CHECK_CUDA(cudaFree(p));
    printf("full blocks %zu pitch %zu\n", n, pitch);
}

int main(int argc, char **argv)
{
    CHECK(argc == 2, "usage: pitched pitches|churn|hostile|full");
    if (strcmp(argv[1], "pitches") == 0)
        pitches();
    else if (strcmp(argv[1], "churn") == 0)
        churn();
    else if (strcmp(argv[1], "hostile") == 0)
        hostile();
    else if (strcmp(argv[1], "full") == 0)
        full();
    else
        CHECK(0, "unknown mode %s", argv[1]);
    printf("pitched ok\n");
    return 0;
}
