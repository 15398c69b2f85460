/* Pitched allocations through the driver (cuMemAllocPitch_v2), reached by symbol (-lcuda) and
 * through cuGetProcAddress as a static runtime reaches the driver.
 *   pitches: rows of several widths and element sizes; prints "pitch WIDTH ELEMENT PITCH",
 *            checks that each block is 512-byte aligned and keeps its bytes, then frees.
 *   churn:   200 images of 640 x 480 x 4 bytes through cuGetProcAddress's function, each
 *            allocated and freed in turn; prints "driver_mallocs N" meanwhile.
 *   hostile: an element size of 3, an empty row or height, NULL out-pointers, a size past the
 *            address space, an image larger than the device; prints "code CASE N" with what
 *            the driver returned.
 *   full:    the device filled with 1 MiB blocks, all freed (a pool keeps them cached), then
 *            this process's first pitched image, which must fit in the memory freed.
 *   own:     an image of 100 x 3 bytes in a context the program made (cuCtxCreate), which the
 *            driver serves; prints "own pitch PITCH". */
#include <cuda.h>
#include <stdint.h>

#include "check.h"

#define CU(x) CHECK((x) == CUDA_SUCCESS, "%s", #x)

typedef CUresult (*alloc_pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);

static void fill_rows(CUdeviceptr p, size_t pitch, size_t height, unsigned char tag)
{
    size_t r;
    unsigned char *row = malloc(pitch);
    CHECK(row != NULL, "host row");
    for (r = 0; r < height; r++) {
        memset(row, tag + (int)r, pitch);
        CU(cuMemcpyHtoD(p + r * pitch, row, pitch));
    }
    free(row);
}

static void check_rows(CUdeviceptr p, size_t pitch, size_t height, unsigned char tag)
{
    size_t r, i;
    unsigned char *row = malloc(pitch);
    CHECK(row != NULL, "host row");
    for (r = 0; r < height; r++) {
        CU(cuMemcpyDtoH(row, p + r * pitch, pitch));
        for (i = 0; i < pitch; i++)
            CHECK(row[i] == (unsigned char)(tag + r), "row %zu byte %zu clobbered", r, i);
    }
    free(row);
}

static void pitches(void)
{
    static const size_t widths[] = {1, 100, 513, 2560, (1 << 20) + 1};
    static const unsigned int elements[] = {4, 8, 16};
    enum { N = 15 };
    CUdeviceptr blocks[N];
    size_t pitch_of[N];
    const size_t height = 3;
    int n = 0;
    size_t w, e;
    for (w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        for (e = 0; e < sizeof elements / sizeof elements[0]; e++, n++) {
            size_t pitch = 0;
            CU(cuMemAllocPitch(&blocks[n], &pitch, widths[w], height, elements[e]));
            CHECK(pitch >= widths[w], "pitch %zu below width %zu", pitch, widths[w]);
            CHECK(blocks[n] % 512 == 0, "block %llx not 512-byte aligned",
                  (unsigned long long)blocks[n]);
            printf("pitch %zu %u %zu\n", widths[w], elements[e], pitch);
            pitch_of[n] = pitch;
            fill_rows(blocks[n], pitch, height, (unsigned char)(8 * n));
        }
    }
    for (n = 0; n < N; n++) {
        check_rows(blocks[n], pitch_of[n], height, (unsigned char)(8 * n));
        CU(cuMemFree(blocks[n]));
    }
}

static void churn(void)
{
    alloc_pitch_fn alloc_pitch = NULL;
    CUdriverProcAddressQueryResult found;
    unsigned long long before = sim_stats(0).driver_mallocs;
    int i;
    CU(cuGetProcAddress_v2("cuMemAllocPitch", (void **)&alloc_pitch, 3020, 0, &found));
    CHECK(alloc_pitch != NULL, "cuGetProcAddress found no cuMemAllocPitch");
    for (i = 0; i < 200; i++) {
        CUdeviceptr p;
        size_t pitch;
        CU(alloc_pitch(&p, &pitch, 640 * 4, 480, 4));
        fill_rows(p, pitch, 1, (unsigned char)i);
        CU(cuMemFree(p));
    }
    CU(cuCtxSynchronize());
    printf("driver_mallocs %llu\n", sim_stats(0).driver_mallocs - before);
}

static void hostile(void)
{
    CUdeviceptr p = 0;
    size_t pitch = 0;
    printf("code element_3 %d\n", (int)cuMemAllocPitch(&p, &pitch, 100, 10, 3));
    printf("code zero_width %d\n", (int)cuMemAllocPitch(&p, &pitch, 0, 10, 4));
    printf("code zero_height %d\n", (int)cuMemAllocPitch(&p, &pitch, 100, 0, 4));
    printf("code null_pitch %d\n", (int)cuMemAllocPitch(&p, NULL, 100, 10, 4));
    printf("code null_pointer %d\n", (int)cuMemAllocPitch(NULL, &pitch, 100, 10, 4));
    printf("code past_the_address_space %d\n",
           (int)cuMemAllocPitch(&p, &pitch, SIZE_MAX / 2, 4, 4));
    printf("code larger_than_the_device %d\n",
           (int)cuMemAllocPitch(&p, &pitch, 1 << 20, (size_t)1 << 20, 4));
}

static void full(void)
{
    enum { MAX_BLOCKS = 4096 };
    static CUdeviceptr blocks[MAX_BLOCKS];
    size_t n = 0, i, pitch = 0;
    CUdeviceptr p = 0;
    while (n < MAX_BLOCKS && cuMemAlloc(&blocks[n], 1 << 20) == CUDA_SUCCESS)
        n++;
    CHECK(n > 4 && n < MAX_BLOCKS, "filled the device with %zu blocks", n);
    for (i = 0; i < n; i++)
        CU(cuMemFree(blocks[i]));
    CU(cuMemAllocPitch(&p, &pitch, 640 * 4, 480, 4));
    CHECK(pitch >= 640 * 4, "pitch %zu", pitch);
    fill_rows(p, pitch, 480, 7);
    CU(cuMemFree(p));
    printf("full blocks %zu pitch %zu\n", n, pitch);
}

static void own(void)
{
    CUcontext mine;
    CUdeviceptr p = 0;
    size_t pitch = 0;
    CU(cuCtxCreate(&mine, 0, 0));
    CU(cuMemAllocPitch(&p, &pitch, 100, 3, 4));
    CHECK(pitch >= 100, "pitch %zu", pitch);
    CU(cuMemFree(p));
    CU(cuCtxDestroy(mine));
    printf("own pitch %zu\n", pitch);
}

int main(int argc, char **argv)
{
    CUcontext ctx;
    CHECK(argc == 2, "usage: driver_pitched pitches|churn|hostile|full|own");
    CU(cuInit(0));
    CU(cuDevicePrimaryCtxRetain(&ctx, 0));
    CU(cuCtxSetCurrent(ctx));
    if (strcmp(argv[1], "pitches") == 0)
        pitches();
    else if (strcmp(argv[1], "churn") == 0)
        churn();
    else if (strcmp(argv[1], "hostile") == 0)
        hostile();
    else if (strcmp(argv[1], "full") == 0)
        full();
    else if (strcmp(argv[1], "own") == 0)
        own();
    else
        CHECK(0, "unknown mode %s", argv[1]);
    printf("driver_pitched ok\n");
    return 0;
}
