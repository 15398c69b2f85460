/* Shared helpers for the C test programs: checks that print and exit, a seeded RNG, and the
 * simulator's counters. */
#ifndef GPUPOOL_TEST_CHECK_H
#define GPUPOOL_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime.h"
#include "cudasim.h"

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                    \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#define CHECK_CUDA(call)                                                                       \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        CHECK(e_ == cudaSuccess, "%s returned %d", #call, (int)e_);                            \
    } while (0)

/* The same for a driver call (a CUresult; CUDA_SUCCESS is 0), in programs that include cuda.h. */
#define CHECK_CU(call)                                                                         \
    do {                                                                                       \
        int e_ = (int)(call);                                                                  \
        CHECK(e_ == 0, "%s returned %d", #call, e_);                                           \
    } while (0)

static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

static inline cudasimStats sim_stats(int device)
{
    cudasimStats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(cudasimGetStats(device, &st) == 0, "cudasimGetStats(%d)", device);
    return st;
}

/* Fill a device block with `tag` through the runtime, as a program would. */
static inline void tag_block(void *p, size_t n, unsigned char tag)
{
    CHECK_CUDA(cudaMemset(p, tag, n));
}

/* Check that every byte of a device block still holds `tag`. */
static inline void check_tag(void *p, size_t n, unsigned char tag)
{
    unsigned char *h = (unsigned char *)malloc(n);
    size_t i;
    CHECK(h != NULL, "host buffer");
    CHECK_CUDA(cudaMemcpy(h, p, n, cudaMemcpyDeviceToHost));
    for (i = 0; i < n; i++) {
        CHECK(h[i] == tag, "block %p byte %zu is %u, expected tag %u (clobbered)", p, i,
              (unsigned)h[i], (unsigned)tag);
    }
    free(h);
}

#endif
