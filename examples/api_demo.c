/* api_demo.c: the libgpupool C API in one page. Allocates device memory from the pool, reads
 * the statistics, frees and allocates again, empties the cache and prints the summary. Needs no
 * CUDA header: the library finds the CUDA runtime itself.
 *
 * The second round is served from the cache as far as the reuse mode allows: with
 * GPUPOOL_REUSE=barrier or relaxed, 13 of its 16 allocations (the other 3 are larger than any
 * block freed); in the default strict mode a freed block waits until the program synchronizes
 * the device or the pool fences (once GPUPOOL_FENCE_BYTES, 256 MiB, wait), and this program
 * does neither, so only the blocks carved from free room already held are hits (7).
 *
 * build: cc -std=c99 -Wall -Wextra -Werror api_demo.c $(pkg-config --cflags --libs gpupool)
 * run:   ./a.out            (on the simulator: GPUPOOL_CUDART=target/release/simlib/libcudart.so.12) */
#include <stdio.h>

#include <gpupool.h>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        int e_ = (call);                                                                       \
        if (e_ != GPUPOOL_SUCCESS) {                                                           \
            fprintf(stderr, "%s failed with error %d\n", #call, e_);                          \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

#define BLOCKS 16
#define MIB ((size_t)1 << 20)

static void print_stats(const char *when)
{
    gpupool_stats st;
    st.struct_size = sizeof st;
    if (gpupool_get_stats(GPUPOOL_ALL_DEVICES, &st) != GPUPOOL_SUCCESS)
        return;
    printf("%-16s %6llu KiB in %2llu blocks, reserved %6llu KiB, cached %6llu KiB, "
           "%llu hits, %llu driver mallocs\n",
           when, (unsigned long long)(st.allocated_bytes >> 10),
           (unsigned long long)st.active_allocations, (unsigned long long)(st.reserved_bytes >> 10),
           (unsigned long long)(st.cached_bytes >> 10), (unsigned long long)st.cache_hits,
           (unsigned long long)st.driver_mallocs);
}

int main(void)
{
    void *blocks[BLOCKS];
    uint64_t released = 0;
    int i, round;

    printf("libgpupool %s (library %u, header %d), pool %s\n", gpupool_version(),
           gpupool_version_number(), GPUPOOL_VERSION_NUMBER, gpupool_enabled() ? "on" : "off");
    for (round = 0; round < 2; round++) {
        for (i = 0; i < BLOCKS; i++)
            CHECK(gpupool_malloc(&blocks[i], (size_t)(i + 1) * MIB));
        print_stats(round == 0 ? "allocated:" : "allocated again:");
        for (i = 0; i < BLOCKS; i++)
            CHECK(gpupool_free(blocks[i]));
        print_stats("freed:");
    }
    CHECK(gpupool_empty_cache(GPUPOOL_ALL_DEVICES, &released));
    printf("empty_cache released %llu bytes\n", (unsigned long long)released);
    print_stats("emptied:");
    return gpupool_write_summary(1);
}
