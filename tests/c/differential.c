/* A seeded program that uses the runtime and the driver as a correct CUDA program may, and prints
 * one line per step: what it did and what CUDA answered (return codes, the runtime's last error,
 * pitches, pointer attributes, the bytes it read back). Pointers are printed as block numbers,
 * never as addresses, so a run under the pool must print exactly what a run without it prints.
 *
 * usage: differential SEED STEPS any|ordered
 *   any:     every program CUDA allows: a cudaFree or cuMemFree while a kernel on any stream
 *            still writes the block (the real free waits for the device).
 *   ordered: what relaxed mode trusts: kernels on a block run on its own stream, a plain free
 *            waits for them first, a stream-ordered free names that stream.
 * Linked with the runtime and -lcuda; two devices of 4 GiB (CUDASIM_DEVICES=2,
 * CUDASIM_MEM=4GiB). Ends with "differential: STEPS steps". */
#include "cuda.h"

#include "check.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)

#define DEVICES 2
#define STREAMS 4 /* 0 legacy, 1 blocking, 2 non-blocking, 3 per-thread */
#define SLOTS 96
#define LIVE_CAP (1536ull * MiB) /* per device: far below 4 GiB, so every request fits */
#define CHECK_WHOLE (16ull * MiB)
#define SAMPLE (256ull * KiB)

enum kind { RUNTIME, DRIVER, RUNTIME_ASYNC, DRIVER_ASYNC, PITCHED, MANAGED };
static const char *const kind_name[] = {"cudaMalloc",      "cuMemAlloc",  "cudaMallocAsync",
                                        "cuMemAllocAsync", "cudaMallocPitch", "cudaMallocManaged"};

struct block {
    int used;
    char *ptr;
    size_t size;
    int device;
    enum kind kind;
    int home;    /* the stream it belongs to: 0 for blocks not allocated in stream order */
    int tag;     /* every byte holds it once `pending` is done */
    int pending; /* the stream of a kernel that may still run on it, or -1 */
};

static struct block blocks[SLOTS];
static cudaStream_t streams[DEVICES][STREAMS];
static size_t live[DEVICES];
static uint64_t rng = 88172645463325252ull;
static int ordered;
static int step;
static unsigned char *host;
static unsigned long_kernel; /* the next kernel's microseconds, if not 0 */

static uint64_t below(uint64_t n) { return n ? rng_next(&rng) % n : 0; }
static uint64_t between(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); }

/* Ends a step's line with the runtime's last error, which the pool must leave as CUDA does. */
static void end_line(void) { printf(" last=%d\n", (int)cudaGetLastError()); }

static cudaStream_t stream_of(int device, int s) { return streams[device][s]; }

static void set_device(int device)
{
    int current = -1;
    CHECK_CUDA(cudaGetDevice(&current));
    if (current != device)
        CHECK_CUDA(cudaSetDevice(device));
}

static int current_device(void)
{
    int d = -1;
    CHECK_CUDA(cudaGetDevice(&d));
    return d;
}

/* Waits for a kernel that may still write `b`, so its bytes are known. */
static void settle(struct block *b)
{
    int current;
    if (b->pending < 0)
        return;
    /* The legacy and per-thread handles name the current device's stream. */
    current = current_device();
    set_device(b->device);
    CHECK_CUDA(cudaStreamSynchronize(stream_of(b->device, b->pending)));
    set_device(current);
    b->pending = -1;
}

static void synchronized(int device, int s)
{
    int i;
    for (i = 0; i < SLOTS; i++) {
        if (blocks[i].used && blocks[i].device == device && (s < 0 || blocks[i].pending == s))
            blocks[i].pending = -1;
    }
}

static int free_slot(void)
{
    int i;
    for (i = 0; i < SLOTS; i++) {
        if (!blocks[i].used)
            return i;
    }
    return -1;
}

static int live_slot(void)
{
    int i, n = 0, pick;
    for (i = 0; i < SLOTS; i++)
        n += blocks[i].used;
    if (n == 0)
        return -1;
    pick = (int)below((uint64_t)n);
    for (i = 0; i < SLOTS; i++) {
        if (blocks[i].used && pick-- == 0)
            return i;
    }
    return -1;
}

static size_t request_size(void)
{
    uint64_t r = below(100);
    if (r < 30)
        return (size_t)between(1, 8 * KiB);
    if (r < 60)
        return (size_t)between(8 * KiB, 2 * MiB);
    if (r < 85)
        return (size_t)between(2 * MiB, 16 * MiB);
    if (r < 98)
        return (size_t)between(16 * MiB, 64 * MiB);
    return (size_t)between(64 * MiB, 128 * MiB);
}

/* Fills the block with a new tag: a set on the legacy stream, or a kernel on its own stream. */
static void write_tag(struct block *b, int how)
{
    b->tag = (int)between(1, 255);
    set_device(b->device);
    if (how == 0 && b->kind != DRIVER && b->kind != DRIVER_ASYNC) {
        settle(b);
        printf(" set=%d", (int)cudaMemset(b->ptr, b->tag, b->size));
    } else if (how == 0) {
        size_t n = b->size < SAMPLE ? b->size : SAMPLE, off;
        settle(b);
        memset(host, b->tag, n);
        /* A copy of at most SAMPLE bytes at a time covers the whole block. */
        for (off = 0; off < b->size; off += n) {
            size_t len = b->size - off < n ? b->size - off : n;
            CUresult r = cuMemcpyHtoD_v2((CUdeviceptr)(b->ptr + off), host, len);
            if (r != CUDA_SUCCESS) {
                printf(" copy=%d", (int)r);
                return;
            }
        }
        printf(" copied");
    } else {
        int s = b->home;
        if (!ordered && b->home == 0)
            s = (int)below(STREAMS);
        unsigned usec = long_kernel ? long_kernel : (unsigned)between(20, 400);
        long_kernel = 0;
        if (b->pending >= 0 && b->pending != s)
            settle(b);
        if (b->kind == DRIVER || b->kind == DRIVER_ASYNC)
            printf(" cu_kernel=%d",
                   (int)cudasim_cu_launch_fill((CUdeviceptr)b->ptr, b->size, usec, b->tag,
                                               (CUstream)stream_of(b->device, s)));
        else
            printf(" kernel=%d", (int)cudasim_launch_fill(b->ptr, b->size, usec, b->tag,
                                                          stream_of(b->device, s)));
        printf("@%d", s);
        b->pending = s;
    }
}

/* Reads the block back and says whether every byte holds its tag (the whole block up to
 * CHECK_WHOLE, its first, middle and last SAMPLE bytes beyond). */
static void check_block(int i)
{
    struct block *b = &blocks[i];
    size_t offs[3], n, k, j;
    int parts;
    set_device(b->device);
    settle(b);
    if (b->size <= CHECK_WHOLE) {
        offs[0] = 0;
        n = b->size;
        parts = 1;
    } else {
        n = SAMPLE;
        offs[0] = 0;
        offs[1] = (b->size / 2) & ~(size_t)511;
        offs[2] = b->size - SAMPLE;
        parts = 3;
    }
    printf("step %d: check %d (%zu bytes)", step, i, b->size);
    for (k = 0; k < (size_t)parts; k++) {
        if (b->kind == DRIVER && below(2)) {
            CUresult r = cuMemcpyDtoH_v2(host, (CUdeviceptr)(b->ptr + offs[k]), n);
            if (r != CUDA_SUCCESS) {
                printf(" read=%d", (int)r);
                break;
            }
        } else {
            cudaError_t e = cudaMemcpy(host, b->ptr + offs[k], n, cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) {
                printf(" read=%d", (int)e);
                break;
            }
        }
        for (j = 0; j < n; j++) {
            if (host[j] != (unsigned char)b->tag) {
                printf(" CLOBBERED at %zu: %u, not %d", offs[k] + j, (unsigned)host[j], b->tag);
                break;
            }
        }
        if (j < n)
            break;
    }
    if (k == (size_t)parts)
        printf(" intact");
    end_line();
}

/* A request of `want` bytes of kind `want_kind`, or of a random size and kind (`want` 0). */
static void allocate(size_t want, enum kind want_kind)
{
    int i = free_slot(), device = current_device(), s = (int)below(STREAMS);
    uint64_t r = below(100);
    struct block *b;
    size_t size = want ? want : request_size(), pitch = 0;
    int rc;
    enum kind kind = want    ? want_kind
                     : r < 30 ? RUNTIME
                     : r < 50 ? DRIVER
                     : r < 72 ? RUNTIME_ASYNC
                     : r < 90 ? DRIVER_ASYNC
                     : r < 96 ? PITCHED
                              : MANAGED;
    void *p = NULL;
    CUdeviceptr d = 0;

    if (i < 0 || live[device] + size > LIVE_CAP)
        return;
    if (kind == PITCHED) {
        size_t width = (size_t)between(1, 64 * KiB), height = (size_t)between(1, 64);
        rc = (int)cudaMallocPitch(&p, &pitch, width, height);
        printf("step %d: cudaMallocPitch dev %d %zux%zu -> %d pitch=%zu", step, device, width,
               height, rc, pitch);
        size = pitch * height;
    } else {
        printf("step %d: %s dev %d %zu", step, kind_name[kind], device, size);
        switch (kind) {
        case RUNTIME:
            rc = (int)cudaMalloc(&p, size);
            break;
        case DRIVER:
            rc = (int)cuMemAlloc_v2(&d, size);
            p = (void *)d;
            break;
        case RUNTIME_ASYNC:
            rc = (int)cudaMallocAsync(&p, size, stream_of(device, s));
            break;
        case DRIVER_ASYNC:
            rc = (int)cuMemAllocAsync(&d, size, (CUstream)stream_of(device, s));
            p = (void *)d;
            break;
        default:
            rc = (int)cudaMallocManaged(&p, size, cudaMemAttachGlobal);
            break;
        }
        if (kind == RUNTIME_ASYNC || kind == DRIVER_ASYNC)
            printf(" @%d", s);
        printf(" -> %d", rc);
    }
    if (rc != 0) {
        printf(" null=%d", p == NULL);
        end_line();
        return;
    }
    CHECK(((uintptr_t)p & 255) == 0, "step %d: %p is not 256-byte aligned", step, p);
    b = &blocks[i];
    b->used = 1;
    b->ptr = (char *)p;
    b->size = size;
    b->device = device;
    b->kind = kind;
    b->home = (kind == RUNTIME_ASYNC || kind == DRIVER_ASYNC) ? s : 0;
    b->pending = -1;
    live[device] += size;
    printf(" block %d", i);
    /* Blocks from a stream are first written on that stream, as stream order requires. */
    write_tag(b, b->home ? 1 : (int)below(2));
    end_line();
}

static void forget(int i)
{
    live[blocks[i].device] -= blocks[i].size;
    blocks[i].used = 0;
}

static const char *const free_name[] = {"cudaFree", "cuMemFree", "cudaFreeAsync",
                                        "cuMemFreeAsync"};

/* A free of `p` through `free_name[api]`; `s` is the stream of the stream-ordered two. */
static int free_by(int api, char *p, cudaStream_t s)
{
    switch (api) {
    case 0:
        return (int)cudaFree(p);
    case 1:
        return (int)cuMemFree_v2((CUdeviceptr)p);
    case 2:
        return (int)cudaFreeAsync(p, s);
    default:
        return (int)cuMemFreeAsync((CUdeviceptr)p, (CUstream)s);
    }
}

/* One free of a live block, by any API that may free it; sometimes a second one at once,
 * which CUDA refuses. */
static void release(int i)
{
    int api, rc, s;
    struct block *b;
    char *p;
    if (i < 0)
        return;
    b = &blocks[i];
    p = b->ptr;
    api = b->kind == MANAGED ? 0 : (int)below(4);
    if (below(3) == 0)
        set_device((int)below(DEVICES)); /* a free with another device current */
    printf("step %d: free %d (%s) dev %d", step, i, kind_name[b->kind], current_device());
    if (api < 2) {
        if (ordered)
            settle(b);
        rc = free_by(api, p, NULL);
        printf(" %s -> %d", free_name[api], rc);
    } else {
        s = b->pending >= 0 ? b->pending : b->home;
        /* The legacy and per-thread handles name the current device's stream. */
        if (s == 0 || s == 3)
            set_device(b->device);
        rc = free_by(api, p, stream_of(b->device, s));
        printf(" %s @%d -> %d", free_name[api], s, rc);
    }
    if (rc == 0)
        forget(i);
    if (rc == 0 && below(8) == 0) {
        api = (int)below(4);
        s = (int)below(STREAMS);
        printf(" again(%d) -> %d", api, free_by(api, p, stream_of(b->device, s)));
    }
    end_line();
}

/* Frees CUDA refuses, and the runtime's edge cases: the pool must answer them as CUDA does. */
static void hostile(void)
{
    int i = live_slot(), device = current_device();
    uint64_t r = below(10);
    void *p = NULL;
    CUdeviceptr d = 0;
    int local;
    printf("step %d: hostile %d", step, (int)r);
    switch (r) {
    case 0:
        if (i >= 0 && blocks[i].size >= 1024 && blocks[i].kind != MANAGED)
            printf(" interior cudaFree -> %d", (int)cudaFree(blocks[i].ptr + 512));
        break;
    case 1:
        if (i >= 0 && blocks[i].size >= 1024 && blocks[i].kind != MANAGED)
            printf(" interior cuMemFree -> %d",
                   (int)cuMemFree_v2((CUdeviceptr)(blocks[i].ptr + 256)));
        break;
    case 2:
        printf(" host cudaFree -> %d", (int)cudaFree(&local));
        printf(" host cuMemFree -> %d", (int)cuMemFree_v2((CUdeviceptr)(uintptr_t)&local));
        break;
    case 3:
        printf(" null frees -> %d %d %d %d", (int)cudaFree(NULL), (int)cuMemFree_v2(0),
               (int)cudaFreeAsync(NULL, stream_of(device, 1)),
               (int)cuMemFreeAsync(0, (CUstream)stream_of(device, 2)));
        break;
    case 4:
        printf(" zero -> %d", (int)cudaMalloc(&p, 0));
        printf(" null=%d", p == NULL);
        printf(" cu zero -> %d", (int)cuMemAlloc_v2(&d, 0));
        printf(" async zero -> %d", (int)cudaMallocAsync(&p, 0, stream_of(device, 1)));
        printf(" cu async zero -> %d", (int)cuMemAllocAsync(&d, 0, NULL));
        break;
    case 5:
        printf(" null out -> %d", (int)cudaMalloc(NULL, 4096));
        printf(" cu null out -> %d", (int)cuMemAlloc_v2(NULL, 4096));
        break;
    case 6:
        printf(" too big -> %d", (int)cudaMalloc(&p, 5 * GiB));
        printf(" cu too big -> %d", (int)cuMemAlloc_v2(&d, 5 * GiB));
        break;
    case 7:
        printf(" near max -> %d", (int)cudaMalloc(&p, SIZE_MAX - 100));
        printf(" cu near max -> %d", (int)cuMemAlloc_v2(&d, SIZE_MAX - 4096));
        printf(" async near max -> %d",
               (int)cudaMallocAsync(&p, SIZE_MAX / 2, stream_of(device, 2)));
        break;
    case 8:
        if (i >= 0 && blocks[i].size >= 1024 && blocks[i].kind != MANAGED)
            printf(" interior cudaFreeAsync -> %d",
                   (int)cudaFreeAsync(blocks[i].ptr + 1024, stream_of(blocks[i].device, 0)));
        break;
    default:
        printf(" wild cudaFree -> %d", (int)cudaFree((void *)(uintptr_t)0x7f0000000000ull));
        break;
    }
    end_line();
}

/* What CUDA says of a pointer: the pool's blocks look like CUDA's allocations. */
static void query(void)
{
    int i = live_slot();
    struct cudaPointerAttributes a;
    CUdeviceptr base = 0;
    size_t size = 0, free_b = 0, total = 0;
    char *p;
    int rc;
    if (i < 0)
        return;
    p = blocks[i].ptr + (below(2) ? 0 : (blocks[i].size / 2) & ~(size_t)255);
    memset(&a, 0, sizeof a);
    rc = (int)cudaPointerGetAttributes(&a, p);
    printf("step %d: query %d attributes -> %d type=%d device=%d same=%d host=%d", step, i, rc,
           (int)a.type, a.device, a.devicePointer == (void *)p, a.hostPointer != NULL);
    if (blocks[i].kind != MANAGED) {
        rc = (int)cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)p);
        printf(" range -> %d holds=%d", rc,
               rc == 0 && (char *)base <= blocks[i].ptr &&
                   blocks[i].ptr + blocks[i].size <= (char *)base + size);
    }
    rc = (int)cudaMemGetInfo(&free_b, &total);
    printf(" info -> %d total=%zu", rc, total);
    rc = (int)cuMemGetInfo_v2(&free_b, &total);
    printf(" cu info -> %d total=%zu", rc, total);
    end_line();
}

static void synchronize(void)
{
    int device = current_device(), s = (int)below(STREAMS);
    uint64_t r = below(4);
    cudaEvent_t e;
    printf("step %d: sync %d dev %d", step, (int)r, device);
    if (r == 0) {
        printf(" device -> %d", (int)cudaDeviceSynchronize());
        synchronized(device, -1);
    } else if (r == 1) {
        printf(" context -> %d", (int)cuCtxSynchronize());
        synchronized(device, -1);
    } else if (r == 2) {
        printf(" stream %d -> %d", s, (int)cudaStreamSynchronize(stream_of(device, s)));
        synchronized(device, s);
    } else {
        CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        printf(" event on %d -> %d", s, (int)cudaEventRecord(e, stream_of(device, s)));
        printf(" %d", (int)cudaEventSynchronize(e));
        CHECK_CUDA(cudaEventDestroy(e));
        synchronized(device, s);
    }
    end_line();
}

/* Destroys a created stream and makes a new one; blocks of the old stream become the legacy
 * stream's. First a stream-ordered free on the destroyed stream, which CUDA refuses. */
static void new_stream(void)
{
    int device = current_device(), s = 1 + (int)below(2), i;
    cudaStream_t old = stream_of(device, s);
    printf("step %d: new stream %d dev %d sync -> %d", step, s, device,
           (int)cudaStreamSynchronize(old));
    synchronized(device, s);
    printf(" destroy -> %d", (int)cudaStreamDestroy(old));
    for (i = 0; i < SLOTS; i++) {
        if (blocks[i].used && blocks[i].device == device && blocks[i].home == s) {
            blocks[i].home = 0;
            if (below(4) == 0) {
                printf(" free on it -> %d", (int)cudaFreeAsync(blocks[i].ptr, old));
            }
        }
    }
    if (s == 1)
        CHECK_CUDA(cudaStreamCreate(&streams[device][s]));
    else
        CHECK(cuStreamCreate((CUstream *)&streams[device][s], CU_STREAM_NON_BLOCKING) ==
                  CUDA_SUCCESS,
              "cuStreamCreate");
    end_line();
}

int main(int argc, char **argv)
{
    int steps, d, i;
    size_t size;
    enum kind kind;
    if (argc != 4 || (strcmp(argv[3], "any") != 0 && strcmp(argv[3], "ordered") != 0)) {
        fprintf(stderr, "usage: differential SEED STEPS any|ordered\n");
        return 2;
    }
    rng ^= strtoull(argv[1], NULL, 10) * 0x9E3779B97F4A7C15ull;
    if (rng == 0)
        rng = 1;
    steps = atoi(argv[2]);
    ordered = strcmp(argv[3], "ordered") == 0;
    host = (unsigned char *)malloc(CHECK_WHOLE);
    CHECK(host != NULL, "host buffer");
    CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
    for (d = 0; d < DEVICES; d++) {
        CHECK_CUDA(cudaSetDevice(d));
        CHECK_CUDA(cudaFree(NULL));
        streams[d][0] = NULL;
        CHECK_CUDA(cudaStreamCreate(&streams[d][1]));
        CHECK_CUDA(cudaStreamCreateWithFlags(&streams[d][2], cudaStreamNonBlocking));
        streams[d][3] = cudaStreamPerThread;
    }
    CHECK_CUDA(cudaSetDevice(0));
    for (step = 0; step < steps; step++) {
        uint64_t r = below(100);
        if (r < 36) {
            allocate(0, RUNTIME);
        } else if (r < 60) {
            release(live_slot());
        } else if (r < 64) {
            /* A long kernel on a block, and its free at once: the block is reused only once
             * the kernel is done (or, freed in stream order, by work ordered after it). */
            i = live_slot();
            if (i >= 0) {
                long_kernel = (unsigned)between(1000, 3000);
                printf("step %d: long kernel %d", step, i);
                write_tag(&blocks[i], 1);
                end_line();
                size = blocks[i].size;
                kind = blocks[i].kind == MANAGED ? RUNTIME : blocks[i].kind;
                release(i);
                /* A program that recycles a buffer asks for the same size again. */
                if (kind != PITCHED && below(2)) {
                    set_device(blocks[i].device);
                    allocate(size, kind);
                }
            }
        } else if (r < 72) {
            i = live_slot();
            if (i >= 0) {
                printf("step %d: write %d", step, i);
                write_tag(&blocks[i], (int)below(2));
                end_line();
            }
        } else if (r < 82) {
            i = live_slot();
            if (i >= 0)
                check_block(i);
        } else if (r < 87) {
            synchronize();
        } else if (r < 91) {
            query();
        } else if (r < 95) {
            printf("step %d: set device -> %d", step, (int)cudaSetDevice((int)below(DEVICES)));
            end_line();
        } else if (r < 99) {
            hostile();
        } else {
            new_stream();
        }
    }
    /* Every block is read back once more, then freed. */
    for (i = 0; i < SLOTS; i++) {
        if (blocks[i].used) {
            check_block(i);
            printf("end: free %d -> %d\n", i, (int)cudaFree(blocks[i].ptr));
            forget(i);
        }
    }
    printf("differential: %d steps\n", steps);
    return 0;
}
