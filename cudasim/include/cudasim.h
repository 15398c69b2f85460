/*
 * cudasim.h — the control API of cudasim, the project's CUDA runtime simulator
 * (see cudasim/README.md). C99 and C++.
 */
#ifndef CUDASIM_H
#define CUDASIM_H

#include <stddef.h>
#include <string.h>

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-device statistics. Set struct_size = sizeof(cudasimStats) before cudasimGetStats. */
typedef struct cudasimStats {
    size_t struct_size;
    unsigned long long malloc_calls;       /* cudaMalloc, cudaMallocAsync/Managed/Pitch */
    unsigned long long malloc_failures;    /* of those, the ones that failed */
    unsigned long long free_calls;         /* cudaFree, cudaFreeAsync of non-NULL pointers */
    unsigned long long live_allocations;   /* device allocations not freed */
    unsigned long long live_bytes;         /* their bytes, each rounded up to 512 */
    unsigned long long peak_live_bytes;    /* highest live_bytes (since cudasimResetStats) */
    unsigned long long device_syncs;       /* cudaDeviceSynchronize */
    unsigned long long stream_syncs;       /* cudaStreamSynchronize */
    unsigned long long event_syncs;        /* cudaEventSynchronize */
    unsigned long long implicit_syncs;     /* cudaFree calls that had to wait for the device */
    unsigned long long event_records;      /* cudaEventRecord */
    unsigned long long stream_wait_events; /* cudaStreamWaitEvent */
    unsigned long long kernels_launched;   /* cudaLaunchKernel of cudasim_fill_kernel */
    unsigned long long kernel_writes;      /* fills applied at kernel completion */
    /* Added later (older callers' smaller struct_size leaves them out): */
    unsigned long long async_mallocs;       /* cudaMallocAsync, cudaMallocFromPoolAsync */
    unsigned long long captured_mallocs;    /* of those, on a stream being captured */
    unsigned long long pool_used_bytes;     /* the default pool's UsedMemCurrent */
    unsigned long long pool_reserved_bytes; /* its ReservedMemCurrent (used + kept) */
    unsigned long long driver_mallocs;      /* cuMemAlloc_v2, cuMemAllocAsync (also in malloc_calls) */
    unsigned long long driver_frees;        /* cuMemFree_v2, cuMemFreeAsync (also in free_calls) */
    /* Virtual memory management (a handle counts in live_allocations, its bytes in live_bytes): */
    unsigned long long vmm_created_bytes;       /* bytes of live cuMemCreate handles */
    unsigned long long vmm_mapped_bytes;        /* bytes of this device's memory mapped (cuMemMap) */
    unsigned long long vmm_creates;             /* cuMemCreate calls, failed ones too */
    unsigned long long vmm_maps;                /* successful cuMemMap calls */
    unsigned long long vmm_unmaps;              /* successful cuMemUnmap calls */
    unsigned long long unmapped_while_busy;     /* cuMemUnmap calls with a kernel still on the range */
    unsigned long long accessed_without_access; /* copies, sets, launches refused: no cuMemSetAccess */
    unsigned long long vmm_rdma_creates;        /* of vmm_creates, successful ones asking GPUDirect RDMA */
} cudasimStats;

/* Fills *out for `device` (out->struct_size set by the caller). 0, 1 (bad out) or 101. */
int cudasimGetStats(int device, cudasimStats *out);
/* Zeroes every device's counters (not the live figures; the peak restarts from live_bytes). */
void cudasimResetStats(void);
/* The allocations the memory pool `pool` (a default or a created one) served, failed ones not
 * counted, since the start or cudasimResetStats. 0, or 1 (bad out, or no live pool). */
int cudasimGetPoolMallocs(cudaMemPool_t pool, unsigned long long *out);
/* The launched kernels not yet complete whose range overlaps [p, p+n). */
size_t cudasimRangeBusy(const void *p, size_t n);
/* The nth next call (1 = the very next) of the runtime or driver function `name` returns `error`.
 * 0, or 1 for an unknown name (or nth 0). */
int cudasimFailNext(const char *name, unsigned nth, int error);
/* The calls of the runtime or driver function `name` counted so far: counting starts at the
 * first such question (*out 0 then) or the first fault armed for it. 0, or 1 (unknown name, or
 * NULL out). */
int cudasimCallCount(const char *name, unsigned long long *out);
/* The simulated kernel's "function pointer" (launch it with cudasim_launch_fill). */
void cudasim_fill_kernel(void);

/* Launches the simulated kernel on `s`: busy on [ptr, ptr+bytes) for `usec` microseconds,
 * then writes the byte `fill` over the range (fill -1: no write). Goes through the dynamic
 * linker, so a preloaded library sees the launch. */
static inline cudaError_t cudasim_launch_fill(void *ptr, size_t bytes, unsigned usec, int fill,
                                              cudaStream_t s)
{
    void (*fn)(void) = cudasim_fill_kernel;
    const void *func;
    void *args[4];
    dim3 one;
    one.x = 1;
    one.y = 1;
    one.z = 1;
    /* ISO C has no cast from a function pointer to `const void *`; copy the bits. */
    memcpy(&func, &fn, sizeof func);
    args[0] = &ptr;
    args[1] = &bytes;
    args[2] = &usec;
    args[3] = &fill;
    return cudaLaunchKernel(func, one, one, args, 0, s);
}

#ifdef CUDASIM_CUDA_H
/* The same launch through the driver (cuLaunchKernel), with no runtime call: for programs that
 * include cuda.h before this header. */
static inline CUresult cudasim_cu_launch_fill(CUdeviceptr ptr, size_t bytes, unsigned usec,
                                              int fill, CUstream s)
{
    void (*fn)(void) = cudasim_fill_kernel;
    CUfunction f;
    void *args[4];
    memcpy(&f, &fn, sizeof f);
    args[0] = &ptr;
    args[1] = &bytes;
    args[2] = &usec;
    args[3] = &fill;
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
}
#endif

#ifdef __cplusplus
}
#endif

#endif /* CUDASIM_H */
