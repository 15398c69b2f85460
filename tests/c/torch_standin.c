/* A stand-in for PyTorch's CUDA allocator front door (libc10_cuda), small enough for the tests.
 * Built as a shared library named libc10_cuda.so and loaded from Python with RTLD_LOCAL, as
 * PyTorch loads its own. Like PyTorch, it picks its backend when it loads, from the variables
 * PyTorch reads and in PyTorch's order, then calls the runtime as that backend does:
 *
 *   native    PyTorch's caching allocator: whole segments from cudaMalloc (2 MiB for requests
 *             up to 1 MiB, 20 MiB up to 10 MiB, else rounded to 2 MiB), kept for reuse;
 *             empty_cache gives the free ones back with cudaFree.
 *   uncached  PYTORCH_NO_CUDA_MEMORY_CACHING=1: cudaMalloc and cudaFree per tensor; no figures;
 *             empty_cache makes no CUDA call.
 *   async     backend:cudaMallocAsync: cudaMallocAsync/cudaFreeAsync on the current stream
 *             (the legacy default stream); its figures are the default memory pool's
 *             attributes; empty_cache is cudaDeviceSynchronize then cudaMemPoolTrimTo(pool, 0);
 *             reset_peak sets both high-water marks to 0.
 *
 * Each tensor's first bytes are written with a tag and checked at free, so reuse too early or
 * twice shows. Functions return 0 or a CUDA error code. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

enum backend { NATIVE = 0, UNCACHED = 1, ASYNC = 2 };

static enum backend chosen = NATIVE;

/* PyTorch reads PYTORCH_ALLOC_CONF, or PYTORCH_CUDA_ALLOC_CONF only when that is unset. */
static int conf_says_async(const char *conf)
{
    if (!conf)
        return 0;
    char *copy = strdup(conf), *save = NULL;
    int async = 0;
    for (char *kv = strtok_r(copy, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(kv, ':');
        if (!colon)
            continue;
        *colon = 0;
        char *key = kv, *value = colon + 1;
        while (*key == ' ')
            key++;
        while (*value == ' ')
            value++;
        size_t n = strlen(key);
        while (n && key[n - 1] == ' ')
            key[--n] = 0;
        n = strlen(value);
        while (n && value[n - 1] == ' ')
            value[--n] = 0;
        if (strcmp(key, "backend") == 0 && strcmp(value, "cudaMallocAsync") == 0)
            async = 1;
    }
    free(copy);
    return async;
}

__attribute__((constructor)) static void choose_backend(void)
{
    const char *conf = getenv("PYTORCH_ALLOC_CONF");
    if (!conf)
        conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
    const char *nocache = getenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
    if (conf_says_async(conf))
        chosen = ASYNC;
    else if (nocache && strcmp(nocache, "1") == 0)
        chosen = UNCACHED;
    else
        chosen = NATIVE;
}

int standin_backend(void) { return (int)chosen; }

/* The native backend's segments: one tensor each, cached by size when freed. */
#define MAX_SEGMENTS 4096
struct segment {
    void *ptr;
    size_t size;
    size_t used; /* the tensor's size; 0 when cached */
};
static struct segment segments[MAX_SEGMENTS];
static int nsegments;
static size_t native_allocated, native_reserved;

static size_t segment_size(size_t n)
{
    const size_t mib = 1 << 20;
    if (n <= mib)
        return 2 * mib;
    if (n <= 10 * mib)
        return 20 * mib;
    return (n + 2 * mib - 1) / (2 * mib) * (2 * mib);
}

static int native_alloc(void **p, size_t n)
{
    size_t want = segment_size(n);
    for (int i = 0; i < nsegments; i++) {
        if (segments[i].used == 0 && segments[i].size == want) {
            segments[i].used = n;
            native_allocated += n;
            *p = segments[i].ptr;
            return 0;
        }
    }
    if (nsegments == MAX_SEGMENTS)
        return cudaErrorMemoryAllocation;
    cudaError_t e = cudaMalloc(p, want);
    if (e != cudaSuccess)
        return e;
    segments[nsegments++] = (struct segment){*p, want, n};
    native_allocated += n;
    native_reserved += want;
    return 0;
}

static int native_free(void *p)
{
    for (int i = 0; i < nsegments; i++) {
        if (segments[i].ptr == p && segments[i].used) {
            native_allocated -= segments[i].used;
            segments[i].used = 0;
            return 0;
        }
    }
    return cudaErrorInvalidValue;
}

static int native_empty_cache(void)
{
    int kept = 0;
    for (int i = 0; i < nsegments; i++) {
        if (segments[i].used) {
            segments[kept++] = segments[i];
            continue;
        }
        cudaError_t e = cudaFree(segments[i].ptr);
        if (e != cudaSuccess)
            return e;
        native_reserved -= segments[i].size;
    }
    nsegments = kept;
    return 0;
}

static int default_pool(cudaMemPool_t *pool)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    return e != cudaSuccess ? (int)e : (int)cudaDeviceGetDefaultMemPool(pool, dev);
}

static unsigned long long pool_attribute(enum cudaMemPoolAttr attr)
{
    cudaMemPool_t pool;
    unsigned long long v = 0;
    if (default_pool(&pool) != 0 || cudaMemPoolGetAttribute(pool, attr, &v) != cudaSuccess)
        return ~0ULL;
    return v;
}

static const uint32_t TAG = 0x70726f6d;

/* A tensor of n bytes (n >= 4), its first word tagged. */
int standin_alloc(void **p, size_t n)
{
    int e;
    switch (chosen) {
    case ASYNC:
        e = cudaMallocAsync(p, n, 0);
        break;
    case UNCACHED:
        e = cudaMalloc(p, n);
        break;
    default:
        e = native_alloc(p, n);
    }
    if (e == 0)
        e = cudaMemcpy(*p, &TAG, sizeof TAG, cudaMemcpyHostToDevice);
    return e;
}

int standin_free(void *p)
{
    uint32_t tag = 0;
    cudaError_t e = cudaMemcpy(&tag, p, sizeof tag, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        return e;
    if (tag != TAG) {
        fprintf(stderr, "standin: tensor %p lost its tag (%#x)\n", p, tag);
        return 700; /* cudaErrorIllegalAddress */
    }
    switch (chosen) {
    case ASYNC:
        return cudaFreeAsync(p, 0);
    case UNCACHED:
        return cudaFree(p);
    default:
        return native_free(p);
    }
}

/* torch.cuda.empty_cache(). */
int standin_empty_cache(void)
{
    cudaMemPool_t pool;
    int e;
    switch (chosen) {
    case ASYNC:
        if ((e = cudaDeviceSynchronize()) != 0 || (e = default_pool(&pool)) != 0)
            return e;
        return cudaMemPoolTrimTo(pool, 0);
    case UNCACHED:
        return 0;
    default:
        return native_empty_cache();
    }
}

/* torch.cuda.memory_reserved(), memory_allocated(), and their peaks; ~0 on a failed query. */
unsigned long long standin_reserved(void)
{
    return chosen == ASYNC ? pool_attribute(cudaMemPoolAttrReservedMemCurrent)
                           : chosen == NATIVE ? native_reserved : 0;
}

unsigned long long standin_allocated(void)
{
    return chosen == ASYNC ? pool_attribute(cudaMemPoolAttrUsedMemCurrent)
                           : chosen == NATIVE ? native_allocated : 0;
}

unsigned long long standin_reserved_peak(void)
{
    return chosen == ASYNC ? pool_attribute(cudaMemPoolAttrReservedMemHigh) : 0;
}

unsigned long long standin_allocated_peak(void)
{
    return chosen == ASYNC ? pool_attribute(cudaMemPoolAttrUsedMemHigh) : 0;
}

/* torch.cuda.reset_peak_memory_stats(). */
int standin_reset_peak(void)
{
    if (chosen != ASYNC)
        return 0;
    cudaMemPool_t pool;
    unsigned long long zero = 0;
    int e = default_pool(&pool);
    if (e == 0)
        e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
    if (e == 0)
        e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
    return e;
}
