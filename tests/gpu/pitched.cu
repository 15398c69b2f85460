/* pitched: the pitch CUDA gives each row width, through the runtime (cudaMallocPitch) and the
 * driver (cuMemAllocPitch_v2 with elements of 4, 8 and 16 bytes, taken with dlsym as XLA takes
 * the driver's functions), and images that keep their bytes.
 *
 * usage: pitched record FILE   (without the pool: writes CUDA's pitches to FILE)
 *        pitched check FILE    (under the pool: each pitch must equal FILE's)
 *
 * Every image stays allocated until all are written, so none reuses another's memory; each is
 * filled row by row with cudaMemcpy2D at its pitch, read back and compared, then freed (every
 * other driver image with cudaFree, across the APIs). Prints pitches=N mismatched=M
 * unaligned=U (images not 512-byte aligned) bytes_verified=K bytes_wrong=B, then pitched=ok
 * when every pitch matched, every byte came back and, under the pool, every image is aligned. */
#include "common.cuh"

/* Row widths in bytes: around the 512-byte alignment, and wide rows up to 16 MiB. */
static const size_t WIDTHS[] = {1,     100,     511,         512,        513,
                                1000,  4096,    65535,       65536,      1 << 20,
                                (1 << 20) + 1, (3 << 20) + 7, 1 << 24};
#define NWIDTHS (sizeof(WIDTHS) / sizeof(WIDTHS[0]))
#define HEIGHT 4
/* Element sizes: 0 for the runtime's cudaMallocPitch, else the driver's ElementSizeBytes. */
static const unsigned ELEMENTS[] = {0, 4, 8, 16};
#define NELEMENTS (sizeof(ELEMENTS) / sizeof(ELEMENTS[0]))
#define NIMAGES (NWIDTHS * NELEMENTS)

typedef CUresult (*AllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*Free)(CUdeviceptr);

struct Image {
    unsigned element;
    size_t width;
    size_t pitch;
    void *ptr;
};

static unsigned char byte_at(size_t image, size_t row, size_t col)
{
    return (unsigned char)(image * 37 + row * 11 + col * 131 + 7);
}

int main(int argc, char **argv)
{
    REQUIRE(argc == 3 && (!strcmp(argv[1], "record") || !strcmp(argv[1], "check")),
            "usage: pitched record|check FILE");
    int record = !strcmp(argv[1], "record");
    CHECK(cudaFree(NULL));
    void *d = driver_library();
    AllocPitch alloc_pitch = (AllocPitch)driver_symbol(d, "cuMemAllocPitch_v2");
    Free driver_free = (Free)driver_symbol(d, "cuMemFree_v2");

    static Image images[NIMAGES];
    size_t n = 0, unaligned = 0;
    for (size_t e = 0; e < NELEMENTS; e++) {
        for (size_t w = 0; w < NWIDTHS; w++) {
            Image *im = &images[n++];
            im->element = ELEMENTS[e];
            im->width = WIDTHS[w];
            if (im->element == 0) {
                CHECK(cudaMallocPitch(&im->ptr, &im->pitch, im->width, HEIGHT));
            } else {
                CUdeviceptr p = 0;
                DRIVER_CHECK(alloc_pitch(&p, &im->pitch, im->width, HEIGHT, im->element));
                im->ptr = (void *)p;
            }
            REQUIRE(im->pitch >= im->width, "pitch %zu below width %zu", im->pitch, im->width);
            unaligned += (uintptr_t)im->ptr % 512 != 0;
        }
    }

    size_t mismatched = 0;
    FILE *f = fopen(argv[2], record ? "w" : "r");
    REQUIRE(f != NULL, "open %s", argv[2]);
    for (size_t i = 0; i < n; i++) {
        Image *im = &images[i];
        if (record) {
            fprintf(f, "%u %zu %zu\n", im->element, im->width, im->pitch);
            continue;
        }
        unsigned element = 0;
        size_t width = 0, pitch = 0;
        if (fscanf(f, "%u %zu %zu", &element, &width, &pitch) != 3 || element != im->element ||
            width != im->width) {
            fprintf(stderr, "no recorded pitch for element %u width %zu\n", im->element,
                    im->width);
            mismatched++;
        } else if (pitch != im->pitch) {
            fprintf(stderr, "element %u width %zu: pitch %zu, %zu without the pool\n",
                    im->element, im->width, im->pitch, pitch);
            mismatched++;
        }
    }
    REQUIRE(fclose(f) == 0, "close %s", argv[2]);

    /* Write every image, then read every one back: an image that overlapped another would
     * show the other's bytes. */
    size_t widest = WIDTHS[NWIDTHS - 1];
    unsigned char *host = (unsigned char *)malloc(widest * HEIGHT);
    REQUIRE(host != NULL, "host buffer");
    for (size_t i = 0; i < n; i++) {
        Image *im = &images[i];
        for (size_t r = 0; r < HEIGHT; r++)
            for (size_t c = 0; c < im->width; c++)
                host[r * im->width + c] = byte_at(i, r, c);
        CHECK(cudaMemcpy2D(im->ptr, im->pitch, host, im->width, im->width, HEIGHT,
                           cudaMemcpyHostToDevice));
    }
    size_t verified = 0, wrong = 0;
    for (size_t i = 0; i < n; i++) {
        Image *im = &images[i];
        memset(host, 0, im->width * HEIGHT);
        CHECK(cudaMemcpy2D(host, im->width, im->ptr, im->pitch, im->width, HEIGHT,
                           cudaMemcpyDeviceToHost));
        for (size_t r = 0; r < HEIGHT; r++)
            for (size_t c = 0; c < im->width; c++) {
                if (host[r * im->width + c] == byte_at(i, r, c))
                    verified++;
                else
                    wrong++;
            }
    }
    free(host);
    for (size_t i = 0; i < n; i++) {
        Image *im = &images[i];
        if (im->element != 0 && i % 2 == 0)
            DRIVER_CHECK(driver_free((CUdeviceptr)im->ptr));
        else
            CHECK(cudaFree(im->ptr));
    }
    CHECK(cudaDeviceSynchronize());
    printf("pitches=%zu mismatched=%zu unaligned=%zu bytes_verified=%zu bytes_wrong=%zu\n", n,
           mismatched, unaligned, verified, wrong);
    /* The pool aligns every block to 512 bytes; CUDA's own alignment is recorded, not judged. */
    int passed = mismatched == 0 && wrong == 0 && (record || unaligned == 0);
    printf("pitched=%s\n", passed ? "ok" : "FAILED");
    return passed ? 0 : 1;
}
