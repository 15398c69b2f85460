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
 *   async     backend:cudaMallocAsync, as c10/cuda/CUDAMallocAsyncAllocator.cpp does it:
 *             a device's first allocation sets up its default memory pool (release threshold
 *             UINT64_MAX, the three reuse attributes set to 1) and takes a side stream from
 *             the stream pool (non-blocking) to free tensors used on several streams; every
 *             allocation and free first checks cudaGetLastError and fails on a left-over
 *             error; cudaMallocAsync on the current stream (the legacy default stream, or the
 *             one named), and on out of memory the recent main's one retry (synchronize the
 *             stream, cudaMemPoolTrimTo(pool, 0), allocate again) before giving up with
 *             cudaMemGetInfo; cudaFreeAsync on the allocation's stream, or, for a tensor
 *             recorded on other streams (record_stream), an event from each into the side
 *             stream and cudaFreeAsync there. The figures are the default memory pool's
 *             attributes, read only for a device set up (0 otherwise, without a call);
 *             empty_cache is, per device set up, cudaDeviceGetDefaultMemPool,
 *             cudaDeviceSynchronize, cudaMemPoolTrimTo(pool, 0), each checked; reset_peak
 *             sets both high-water marks to 0; cache_info (cuDNN's workspace guess) probes
 *             with cudaMallocAsync from cudaMemGetInfo's free bytes down, halving on each
 *             out of memory.
 *
 * Each tensor's first bytes are written with a tag and checked at free, so reuse too early or
 * twice shows. Functions return 0 or a CUDA error code. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include "cudasim.h"

enum backend { NATIVE = 0, UNCACHED = 1, ASYNC = 2 };

static enum backend chosen = NATIVE;

/* PyTorch 2.9 to 2.11 read PYTORCH_ALLOC_CONF, or PYTORCH_CUDA_ALLOC_CONF only when that is
 * unset (main reads PYTORCH_CUDA_ALLOC_CONF first; before 2.9 only it: docs/pytorch.md). */
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

/* The async backend's state: which devices are set up, each one's side stream for frees of
 * tensors used on several streams, and each live tensor's stream and recorded streams. */
#define MAX_DEVICES 8
#define MAX_TENSORS 4096
#define MAX_RECORDED 4
static int set_up[MAX_DEVICES];
static cudaStream_t unifying[MAX_DEVICES];
struct tensor {
    void *ptr;
    int device;
    cudaStream_t stream;
    int nrecorded;
    cudaStream_t recorded[MAX_RECORDED];
};
static struct tensor tensors[MAX_TENSORS];
static int ntensors;

static int current_device(int *dev)
{
    return (int)cudaGetDevice(dev);
}

/* A device's first allocation: its default pool keeps everything and follows every reuse
 * rule, and a stream of the stream pool (non-blocking) is its side stream. */
static int lazy_init(int dev)
{
    if (dev < 0 || dev >= MAX_DEVICES)
        return cudaErrorInvalidDevice;
    if (set_up[dev])
        return 0;
    cudaMemPool_t pool;
    unsigned long long keep_all = ~0ULL;
    int enable = 1;
    int e = cudaDeviceGetDefaultMemPool(&pool, dev);
    if (e == 0)
        e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
    if (e == 0)
        e = cudaMemPoolSetAttribute(pool, cudaMemPoolReuseFollowEventDependencies, &enable);
    if (e == 0)
        e = cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &enable);
    if (e == 0)
        e = cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &enable);
    if (e == 0)
        e = cudaStreamCreateWithPriority(&unifying[dev], cudaStreamNonBlocking, 0);
    if (e == 0)
        set_up[dev] = 1;
    return e;
}

/* C10_CUDA_CHECK(cudaGetLastError()): an error left behind fails the next call. */
static int left_over_error(void)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        fprintf(stderr, "standin: CUDA error %d left over before an allocator call\n", (int)e);
    return (int)e;
}

static int async_malloc(void **p, size_t n, cudaStream_t stream)
{
    int dev, e;
    if ((e = current_device(&dev)) != 0 || (e = lazy_init(dev)) != 0)
        return e;
    if ((e = left_over_error()) != 0)
        return e;
    if (ntensors == MAX_TENSORS)
        return cudaErrorMemoryAllocation;
    e = cudaMallocAsync(p, n, stream);
    if (e == cudaErrorMemoryAllocation) {
        /* Recent main: trim the pool once and retry before raising OutOfMemoryError. */
        cudaMemPool_t pool;
        (void)cudaGetLastError();
        if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
            e = cudaStreamSynchronize(stream);
            if (e == cudaSuccess) {
                (void)cudaMemPoolTrimTo(pool, 0);
                e = cudaMallocAsync(p, n, stream);
            }
        }
    }
    if (e == cudaErrorMemoryAllocation) {
        size_t free_bytes, total;
        (void)cudaGetLastError();
        int info = cudaMemGetInfo(&free_bytes, &total);
        return info != 0 ? info : e;
    }
    if (e != 0)
        return e;
    tensors[ntensors++] = (struct tensor){*p, dev, stream, 0, {0}};
    return 0;
}

/* sync_raw: `dependent` waits for what is queued on `dependency` now. */
static int sync_raw(cudaStream_t dependency, cudaStream_t dependent)
{
    cudaEvent_t ev;
    int e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == 0)
        e = cudaEventRecord(ev, dependency);
    if (e == 0)
        e = cudaStreamWaitEvent(dependent, ev, 0);
    if (e == 0)
        e = cudaEventDestroy(ev);
    return e;
}

static int async_free(void *p)
{
    int e, i, before;
    if ((e = left_over_error()) != 0)
        return e;
    for (i = 0; i < ntensors && tensors[i].ptr != p; i++)
        ;
    if (i == ntensors)
        return cudaErrorInvalidValue;
    struct tensor t = tensors[i];
    tensors[i] = tensors[--ntensors];
    /* The tensor's device current, as the free's guard makes it. */
    if ((e = current_device(&before)) != 0 || (e = cudaSetDevice(t.device)) != 0)
        return e;
    if (t.nrecorded == 0) {
        e = cudaFreeAsync(p, t.stream);
    } else {
        cudaStream_t u = unifying[t.device];
        e = sync_raw(t.stream, u);
        for (int r = 0; e == 0 && r < t.nrecorded; r++)
            e = sync_raw(t.recorded[r], u);
        if (e == 0)
            e = cudaFreeAsync(p, u);
    }
    int back = cudaSetDevice(before);
    return e != 0 ? e : back;
}

static int default_pool(cudaMemPool_t *pool)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    return e != cudaSuccess ? (int)e : (int)cudaDeviceGetDefaultMemPool(pool, dev);
}

/* getDeviceStats: a device not set up reads 0, with no call. */
static unsigned long long pool_attribute(enum cudaMemPoolAttr attr)
{
    cudaMemPool_t pool;
    unsigned long long v = 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess)
        return ~0ULL;
    if (dev < 0 || dev >= MAX_DEVICES || !set_up[dev])
        return 0;
    if (default_pool(&pool) != 0 || cudaMemPoolGetAttribute(pool, attr, &v) != cudaSuccess)
        return ~0ULL;
    return v;
}

static const uint32_t TAG = 0x70726f6d;

/* A tensor of n bytes (n >= 4) on `stream` (the async backend's current stream; the other
 * backends ignore it), its first word tagged. */
int standin_alloc_on(void **p, size_t n, cudaStream_t stream)
{
    int e;
    switch (chosen) {
    case ASYNC:
        e = async_malloc(p, n, stream);
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

int standin_alloc(void **p, size_t n) { return standin_alloc_on(p, n, 0); }

/* Tensor.record_stream(stream): the async backend frees the tensor in the side stream after
 * `stream`'s work. */
int standin_record_stream(void *p, cudaStream_t stream)
{
    if (chosen != ASYNC)
        return 0;
    for (int i = 0; i < ntensors; i++) {
        if (tensors[i].ptr != p)
            continue;
        if (stream == tensors[i].stream)
            return 0;
        for (int r = 0; r < tensors[i].nrecorded; r++)
            if (tensors[i].recorded[r] == stream)
                return 0;
        if (tensors[i].nrecorded == MAX_RECORDED)
            return cudaErrorInvalidValue;
        tensors[i].recorded[tensors[i].nrecorded++] = stream;
        return 0;
    }
    return cudaErrorInvalidValue;
}

/* Whether the tensor at p still holds its tag: 1, 0, or a negative CUDA error. */
int standin_tag_intact(void *p)
{
    uint32_t tag = 0;
    cudaError_t e = cudaMemcpy(&tag, p, sizeof tag, cudaMemcpyDeviceToHost);
    return e != cudaSuccess ? -(int)e : tag == TAG;
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
        return async_free(p);
    case UNCACHED:
        return cudaFree(p);
    default:
        return native_free(p);
    }
}

/* torch.cuda.empty_cache(). */
static int async_empty_cache(void)
{
    int before, e;
    if ((e = current_device(&before)) != 0)
        return e;
    for (int dev = 0; dev < MAX_DEVICES && e == 0; dev++) {
        if (!set_up[dev])
            continue;
        cudaMemPool_t pool;
        if ((e = cudaSetDevice(dev)) == 0 && (e = cudaDeviceGetDefaultMemPool(&pool, dev)) == 0 &&
            (e = cudaDeviceSynchronize()) == 0)
            e = cudaMemPoolTrimTo(pool, 0);
    }
    int back = cudaSetDevice(before);
    return e != 0 ? e : back;
}

int standin_empty_cache(void)
{
    switch (chosen) {
    case ASYNC:
        return async_empty_cache();
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

/* cacheInfo, cuDNN's workspace guess under the async backend: the largest size, from
 * cudaMemGetInfo's free bytes down by halves, that a cudaMallocAsync on the current stream
 * gives; that allocation is freed at once. */
int standin_cache_info(size_t *guess)
{
    int dev, e;
    size_t free_bytes, total;
    if ((e = current_device(&dev)) != 0 || (e = lazy_init(dev)) != 0)
        return e;
    if ((e = cudaMemGetInfo(&free_bytes, &total)) != 0)
        return e;
    if ((e = left_over_error()) != 0)
        return e;
    for (size_t g = free_bytes;; g >>= 1) {
        void *probe;
        e = cudaMallocAsync(&probe, g, 0);
        if (e == cudaSuccess) {
            *guess = g;
            return cudaFreeAsync(probe, 0);
        }
        if (e != cudaErrorMemoryAllocation)
            return e;
        (void)cudaGetLastError();
    }
}

/* A kernel on `stream` that uses the tensor at p for usec microseconds, then writes `fill`
 * over its first n bytes (the simulator's kernel). */
int standin_kernel(void *p, size_t n, unsigned usec, int fill, cudaStream_t stream)
{
    return (int)cudasim_launch_fill(p, n, usec, fill, stream);
}
