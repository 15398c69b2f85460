/* What the C API test programs (api.c, api_edges.c) share: a check of a gpupool_* call, the
 * statistics of a device, and those of device 0 read through an older caller's struct. */
#ifndef GPUPOOL_TEST_API_CHECK_H
#define GPUPOOL_TEST_API_CHECK_H

#include "check.h"
#include "gpupool.h"

#define CHECK_POOL(call)                                                                       \
    do {                                                                                       \
        int e_ = (call);                                                                       \
        CHECK(e_ == GPUPOOL_SUCCESS, "%s returned %d", #call, e_);                             \
    } while (0)

#define MIB ((size_t)1 << 20)

static inline gpupool_stats pool_stats(int device)
{
    gpupool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_POOL(gpupool_get_stats(device, &st));
    CHECK(st.struct_size == sizeof st, "struct_size %zu", st.struct_size);
    return st;
}

/* gpupool_get_stats of device 0 into a caller's struct of `old_size` bytes, as a program built
 * against an older header has: it says it filled that size, and writes no byte beyond. The
 * fields it filled, the rest zero. */
static inline gpupool_stats old_caller_stats(size_t old_size)
{
    unsigned char raw[sizeof(gpupool_stats) + 16];
    gpupool_stats filled;
    memset(raw, 0xAB, sizeof raw);
    memset(&filled, 0, sizeof filled);
    gpupool_stats *old = (gpupool_stats *)(void *)raw;
    old->struct_size = old_size;
    CHECK_POOL(gpupool_get_stats(0, old));
    CHECK(old->struct_size == old_size, "old struct: size %zu, not %zu", old->struct_size,
          old_size);
    for (size_t i = old_size; i < sizeof raw; i++)
        CHECK(raw[i] == 0xAB, "byte %zu beyond the caller's struct_size was written", i);
    memcpy(&filled, raw, old_size);
    return filled;
}

#endif
