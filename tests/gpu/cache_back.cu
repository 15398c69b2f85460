/* cache_back: an allocator the pool does not serve gets the pool's cache back when CUDA is out
 * of memory (never worse on memory than without the pool).
 *
 * usage: cache_back
 *
 * The device's free memory, less 1 GiB, is allocated with cudaMalloc in blocks of up to 1 GiB
 * and freed: without the pool it goes back to the driver, under it it stays in the pool's cache.
 * Then 3/4 of it is asked of cudaMallocFromPoolAsync from the device's default memory pool,
 * which the pool leaves to CUDA. Built with -cudart shared it reaches the pool's runtime hook;
 * the static build's call is the driver's cuMemAllocFromPoolAsync, through the driver hooks.
 * Prints filled_bytes=N asked_bytes=M free_after_bytes=F, then cache_back=ok when the request
 * succeeded and its memory takes writes. */
#include "common.cuh"

#define GiB (1024ull * 1024ull * 1024ull)
#define MAX_BLOCKS 4096

int main(void)
{
    static void *blocks[MAX_BLOCKS];
    size_t free_b = 0, total_b = 0;
    CHECK(cudaFree(NULL));
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    REQUIRE(free_b > 2 * GiB, "only %zu bytes free", free_b);

    size_t fill = free_b - GiB, filled = 0;
    int n = 0;
    while (filled < fill && n < MAX_BLOCKS) {
        size_t size = fill - filled < GiB ? fill - filled : GiB;
        CHECK(cudaMalloc(&blocks[n], size));
        filled += size;
        n++;
    }
    for (int i = 0; i < n; i++)
        CHECK(cudaFree(blocks[i]));
    CHECK(cudaDeviceSynchronize());

    cudaMemPool_t pool;
    cudaStream_t stream;
    int device = 0;
    CHECK(cudaGetDevice(&device));
    CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    CHECK(cudaStreamCreate(&stream));
    size_t asked = filled / 4 * 3;
    void *p = NULL;
    CHECK(cudaMallocFromPoolAsync(&p, asked, pool, stream));
    CHECK(cudaGetLastError());
    fill_byte<<<grid_for(asked), FILL_THREADS, 0, stream>>>((unsigned char *)p, asked, 0x5a);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    CHECK(cudaFreeAsync(p, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaStreamDestroy(stream));
    printf("filled_bytes=%zu asked_bytes=%zu free_after_bytes=%zu\n", filled, asked, free_b);
    printf("cache_back=ok\n");
    return 0;
}
