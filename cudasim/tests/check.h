/* Small helpers for the C test programs of cudasim: each prints what it checks and returns 1
 * with a message at the first failure. */
#ifndef CUDASIM_TEST_CHECK_H
#define CUDASIM_TEST_CHECK_H

#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cudasim.h"

#define CHECK(cond, ...)                                                \
    do {                                                                \
        if (!(cond)) {                                                  \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
            printf(__VA_ARGS__);                                        \
            printf("\n");                                               \
            fflush(stdout);                                             \
            return 1;                                                   \
        }                                                               \
    } while (0)

/* `call` must return `want`. */
#define EXPECT(call, want)                                                              \
    do {                                                                                \
        int got_ = (int)(call);                                                         \
        CHECK(got_ == (int)(want), "%s returned %d (%s), expected %d", #call, got_,     \
              cudaGetErrorName((cudaError_t)got_), (int)(want));                        \
    } while (0)

#define OK(call) EXPECT(call, cudaSuccess)

/* Starts a section of checks. */
#define SECTION(name)                  \
    do {                               \
        printf("check: %s\n", name);   \
        fflush(stdout);                \
    } while (0)

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline cudasimStats stats_of(int device)
{
    cudasimStats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    if (cudasimGetStats(device, &s) != 0) {
        memset(&s, 0xff, sizeof s);
    }
    return s;
}

#endif
