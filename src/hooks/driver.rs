//! The CUDA driver entry points this library exports, by their versioned names: a program
//! linked with `-lcuda` reaches them by symbol, and `dlsym` and `cuGetProcAddress` hand them
//! out in place of the driver's own (`swap`). Each is the panic boundary, then
//! `dispatch::driver`, with the driver's real function for what the pool does not handle.
//! Graph captures are in `driver_capture.rs`, contexts in `driver_contexts.rs`.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::cuda::driver::*;
use crate::cuda::hooked::{self, Hooked, COUNT};
use crate::cuda::types::{Event, Stream};
use crate::dispatch::default_pool;
use crate::dispatch::driver as dispatch;
use crate::guard::boundary;
use crate::pool::Origin;

use super::driver_capture as capture;
use super::driver_contexts as contexts;
use super::origin::exported_with_origin;
use super::per_thread;

/// The hooks' addresses, in `Hooked`'s order.
fn hooks() -> [usize; COUNT] {
    [
        cuGetProcAddress as *const () as usize,
        cuGetProcAddress_v2 as *const () as usize,
        cuMemAlloc_v2 as *const () as usize,
        cuMemFree_v2 as *const () as usize,
        cuMemAllocAsync as *const () as usize,
        cuMemAllocAsync_ptsz as *const () as usize,
        cuMemFreeAsync as *const () as usize,
        cuMemFreeAsync_ptsz as *const () as usize,
        cuMemGetInfo_v2 as *const () as usize,
        cuCtxSynchronize as *const () as usize,
        cuCtxSynchronize_v2 as *const () as usize,
        cuStreamSynchronize as *const () as usize,
        cuStreamSynchronize_ptsz as *const () as usize,
        cuEventSynchronize as *const () as usize,
        cuStreamCreate as *const () as usize,
        cuStreamCreateWithPriority as *const () as usize,
        cuLaunchKernel as *const () as usize,
        cuLaunchKernel_ptsz as *const () as usize,
        contexts::cuDevicePrimaryCtxReset_v2 as *const () as usize,
        contexts::cuDevicePrimaryCtxRelease_v2 as *const () as usize,
        cuIpcGetMemHandle as *const () as usize,
        contexts::cuCtxEnablePeerAccess as *const () as usize,
        cuMemGetAddressRange_v2 as *const () as usize,
        contexts::cuCtxSetCurrent as *const () as usize,
        contexts::cuCtxPushCurrent_v2 as *const () as usize,
        cuDeviceSetMemPool as *const () as usize,
        cuMemPoolDestroy as *const () as usize,
        cuMemPoolTrimTo as *const () as usize,
        cuMemPoolGetAttribute as *const () as usize,
        cuMemPoolSetAttribute as *const () as usize,
        cuMemAllocPitch_v2 as *const () as usize,
        contexts::cuCtxCreate_v2 as *const () as usize,
        contexts::cuCtxCreate_v3 as *const () as usize,
        contexts::cuCtxCreate_v4 as *const () as usize,
        capture::cuStreamBeginCapture as *const () as usize,
        capture::cuStreamBeginCapture_ptsz as *const () as usize,
        capture::cuStreamBeginCapture_v2 as *const () as usize,
        capture::cuStreamBeginCapture_v2_ptsz as *const () as usize,
        capture::cuStreamEndCapture as *const () as usize,
        capture::cuStreamEndCapture_ptsz as *const () as usize,
        capture::cuStreamBeginCaptureToGraph as *const () as usize,
        capture::cuStreamBeginCaptureToGraph_ptsz as *const () as usize,
        cuMemCreate as *const () as usize,
        contexts::cuCtxDestroy_v2 as *const () as usize,
        contexts::cuCtxPopCurrent_v2 as *const () as usize,
        contexts::cuGreenCtxCreate as *const () as usize,
        contexts::cuGreenCtxStreamCreate as *const () as usize,
        cuMemPoolSetAccess as *const () as usize,
        cuMemAllocManaged as *const () as usize,
        cuMemAllocFromPoolAsync as *const () as usize,
        cuMemAllocFromPoolAsync_ptsz as *const () as usize,
    ]
}

/// The hook to hand out in place of `f`, a function a lookup in the driver returned: decided
/// by the identity of the driver's function, never by the name asked for. Anything else comes
/// back unchanged, a function of the same name in another library too (the functions behind
/// the hooks come from the next definition while no driver is loaded).
pub fn swap(f: *mut c_void) -> *mut c_void {
    if f.is_null() || !hooked::swapping() {
        return f;
    }
    let reals = hooked::reals();
    match reals
        .iter()
        .position(|r| r.load(std::sync::atomic::Ordering::Relaxed) == f as usize)
    {
        Some(i) if loaded().is_some_and(|d| d.contains(f)) => hooks()[i] as *mut c_void,
        _ => f,
    }
}

/// # Safety
/// As `cuGetProcAddress` (CUDA 11.3).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let r = real!(GetProcAddress, GetProcAddressFn, |f| f(
            symbol, pfn, version, flags
        ));
        // SAFETY: on success the driver wrote `*pfn`, which the caller passed writable.
        unsafe { swap_answer(r, pfn) };
        r
    })
}

/// # Safety
/// As `cuGetProcAddress_v2` (CUDA 12.0).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let r = real!(GetProcAddressV2, GetProcAddressV2Fn, |f| f(
            symbol, pfn, version, flags, status
        ));
        // SAFETY: on success the driver wrote `*pfn`, which the caller passed writable.
        unsafe { swap_answer(r, pfn) };
        r
    })
}

/// The function a successful `cuGetProcAddress` wrote, swapped for its hook.
///
/// # Safety
/// `pfn` is NULL or valid for reading and writing a pointer.
unsafe fn swap_answer(r: CuResult, pfn: *mut *mut c_void) {
    if r == CU_SUCCESS && !pfn.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *pfn = swap(*pfn) };
    }
}

exported_with_origin! {
    /// # Safety
    /// As `cuMemAlloc_v2`.
    fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, size: usize) -> CuResult = mem_alloc_from, "rdx"
}

/// `cuMemAlloc_v2` made by `origin`.
unsafe extern "C" fn mem_alloc_from(
    dptr: *mut CuDevicePtr,
    size: usize,
    origin: Origin,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || real!(MemAlloc, MemAllocFn, |f| f(dptr, size));
        // SAFETY: the caller's contract.
        unsafe { dispatch::mem_alloc(dptr, size, None, origin, real) }
    })
}

exported_with_origin! {
    /// # Safety
    /// As `cuMemAllocPitch_v2`.
    fn cuMemAllocPitch_v2(
        dptr: *mut CuDevicePtr,
        pitch: *mut usize,
        width: usize,
        height: usize,
        element_size: c_uint
    ) -> CuResult = mem_alloc_pitch_from, "r9"
}

/// `cuMemAllocPitch_v2` made by `origin`.
unsafe extern "C" fn mem_alloc_pitch_from(
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
    origin: Origin,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || {
            real!(MemAllocPitch, MemAllocPitchFn, |f| f(
                dptr,
                pitch,
                width,
                height,
                element_size
            ))
        };
        // The driver's pitch for a one-byte row of these elements: its row alignment.
        let alignment = || {
            let (mut p, mut a) = (0, 0);
            let r = real!(MemAllocPitch, MemAllocPitchFn, |f| f(
                &mut p,
                &mut a,
                1,
                1,
                element_size
            ));
            if r != CU_SUCCESS {
                return Err(r);
            }
            real!(MemFree, MemFreeFn, |f| f(p));
            Ok(a)
        };
        // SAFETY: the caller's contract.
        unsafe {
            crate::dispatch::mem_alloc_pitch(
                dptr,
                pitch,
                width,
                height,
                element_size,
                origin,
                real,
                alignment,
            )
        }
    })
}

/// # Safety
/// As `cuMemFree_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CuDevicePtr) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || real!(MemFree, MemFreeFn, |f| f(ptr));
        // SAFETY: the caller's contract.
        unsafe { dispatch::mem_free(ptr, None, real) }
    })
}

exported_with_origin! {
    /// # Safety
    /// As `cuMemAllocAsync`.
    fn cuMemAllocAsync(dptr: *mut CuDevicePtr, size: usize, stream: Stream) -> CuResult =
        mem_alloc_async_from, "rcx"
}

/// `cuMemAllocAsync` made by `origin`.
unsafe extern "C" fn mem_alloc_async_from(
    dptr: *mut CuDevicePtr,
    size: usize,
    stream: Stream,
    origin: Origin,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || real!(MemAllocAsync, MemAllocAsyncFn, |f| f(dptr, size, stream));
        // SAFETY: the caller's contract.
        unsafe { dispatch::mem_alloc(dptr, size, Some(stream), origin, real) }
    })
}

exported_with_origin! {
    /// # Safety
    /// As `cuMemAllocAsync_ptsz`.
    fn cuMemAllocAsync_ptsz(dptr: *mut CuDevicePtr, size: usize, stream: Stream) -> CuResult =
        mem_alloc_async_ptsz_from, "rcx"
}

/// `cuMemAllocAsync_ptsz` made by `origin`.
unsafe extern "C" fn mem_alloc_async_ptsz_from(
    dptr: *mut CuDevicePtr,
    size: usize,
    stream: Stream,
    origin: Origin,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || {
            real!(MemAllocAsyncPtsz, MemAllocAsyncFn, |f| f(
                dptr, size, stream
            ))
        };
        // SAFETY: the caller's contract.
        unsafe { dispatch::mem_alloc(dptr, size, Some(per_thread(stream)), origin, real) }
    })
}

/// # Safety
/// As `cuMemAllocManaged`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CuDevicePtr,
    size: usize,
    flags: c_uint,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || real!(MemAllocManaged, MemAllocManagedFn, |f| f(dptr, size, flags));
        dispatch::alloc_unserved(real)
    })
}

/// # Safety
/// As `cuMemAllocFromPoolAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: CuMemoryPool,
    stream: Stream,
) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { alloc_from_pool(Hooked::MemAllocFromPoolAsync, dptr, size, pool, stream) }
}

/// # Safety
/// As `cuMemAllocFromPoolAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: CuMemoryPool,
    stream: Stream,
) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { alloc_from_pool(Hooked::MemAllocFromPoolAsyncPtsz, dptr, size, pool, stream) }
}

/// `cuMemAllocFromPoolAsync` or its `_ptsz` form (`h`): the driver's, never worse on memory.
///
/// # Safety
/// As `cuMemAllocFromPoolAsync`; `h` one of the two.
unsafe fn alloc_from_pool(
    h: Hooked,
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: CuMemoryPool,
    stream: Stream,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || {
            real!(@at h, MemAllocFromPoolAsyncFn, |f| f(
                dptr, size, pool, stream
            ))
        };
        dispatch::alloc_unserved(real)
    })
}

/// # Safety
/// As `cuMemFreeAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CuDevicePtr, stream: Stream) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || real!(MemFreeAsync, MemFreeAsyncFn, |f| f(ptr, stream));
        // SAFETY: the caller's contract.
        unsafe { dispatch::mem_free(ptr, Some(stream), real) }
    })
}

/// # Safety
/// As `cuMemFreeAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: CuDevicePtr, stream: Stream) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || real!(MemFreeAsyncPtsz, MemFreeAsyncFn, |f| f(ptr, stream));
        // SAFETY: the caller's contract.
        unsafe { dispatch::mem_free(ptr, Some(per_thread(stream)), real) }
    })
}

/// # Safety
/// As `cuMemGetInfo_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || real!(MemGetInfo, MemGetInfoFn, |f| f(free, total));
        // SAFETY: the caller's contract.
        unsafe { dispatch::mem_get_info(free, total, real) }
    })
}

/// # Safety
/// As `cuCtxSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_synchronize(|| real!(CtxSynchronize, VoidFn, |f| f()))
    })
}

/// # Safety
/// As `cuCtxSynchronize_v2` (CUDA 13).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CuContext) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ctx_synchronize_v2(ctx, || real!(CtxSynchronizeV2, CtxFn, |f| f(ctx)))
    })
}

/// # Safety
/// As `cuStreamSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: Stream) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::after_sync(real!(StreamSynchronize, StreamFn, |f| f(stream)))
    })
}

/// # Safety
/// As `cuStreamSynchronize_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(stream: Stream) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::after_sync(real!(StreamSynchronizePtsz, StreamFn, |f| f(stream)))
    })
}

/// # Safety
/// As `cuEventSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: Event) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::after_sync(real!(EventSynchronize, EventFn, |f| f(event)))
    })
}

/// # Safety
/// As `cuStreamCreate`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Stream, flags: c_uint) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let r = real!(StreamCreate, StreamCreateFn, |f| f(stream, flags));
        dispatch::stream_created(r, flags)
    })
}

/// # Safety
/// As `cuStreamCreateWithPriority`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut Stream,
    flags: c_uint,
    priority: c_int,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let r = real!(StreamCreateWithPriority, StreamCreateWithPriorityFn, |f| f(
            stream, flags, priority
        ));
        dispatch::stream_created(r, flags)
    })
}

/// # Safety
/// As `cuLaunchKernel`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    func: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Stream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::launch(stream, || {
            real!(LaunchKernel, LaunchKernelFn, |f| f(
                func, gx, gy, gz, bx, by, bz, shared, stream, params, extra
            ))
        })
    })
}

/// The per-thread form: a NULL stream is the thread's own, never the legacy one.
///
/// # Safety
/// As `cuLaunchKernel_ptsz`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    func: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Stream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::launch(per_thread(stream), || {
            real!(LaunchKernelPtsz, LaunchKernelFn, |f| f(
                func, gx, gy, gz, bx, by, bz, shared, stream, params, extra
            ))
        })
    })
}

/// # Safety
/// As `cuMemCreate`: `handle` writable, `prop` readable.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || real!(MemCreate, MemCreateFn, |f| f(handle, size, prop, flags));
        // SAFETY: the caller's contract.
        unsafe { dispatch::mem_create(prop, real) }
    })
}

/// # Safety
/// As `cuIpcGetMemHandle`.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(
    handle: *mut crate::cuda::types::IpcMemHandle,
    ptr: CuDevicePtr,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::ipc_get_mem_handle(ptr, handle.is_null(), || {
            real!(IpcGetMemHandle, IpcGetMemHandleFn, |f| f(handle, ptr))
        })
    })
}

/// # Safety
/// As `cuMemGetAddressRange_v2`: `base` and `size` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CuDevicePtr,
    size: *mut usize,
    dptr: CuDevicePtr,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || {
            real!(MemGetAddressRange, MemGetAddressRangeFn, |f| f(
                base, size, dptr
            ))
        };
        // SAFETY: the caller's contract.
        unsafe { dispatch::mem_get_address_range(base, size, dptr, real) }
    })
}

/// # Safety
/// As `cuDeviceSetMemPool`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CuDevice, pool: CuMemoryPool) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::device_set_mem_pool(dev, pool, || {
            real!(DeviceSetMemPool, DeviceSetMemPoolFn, |f| f(dev, pool))
        })
    })
}

/// # Safety
/// As `cuMemPoolDestroy`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CuMemoryPool) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        dispatch::mem_pool_destroyed(real!(MemPoolDestroy, MemPoolDestroyFn, |f| f(pool)))
    })
}

/// # Safety
/// As `cuMemPoolTrimTo`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CuMemoryPool, keep: usize) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || real!(MemPoolTrimTo, MemPoolTrimToFn, |f| f(pool, keep));
        // SAFETY: the caller's contract.
        unsafe { default_pool::driver_trim_to(pool, keep, real) }
    })
}

/// # Safety
/// As `cuMemPoolSetAccess`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CuMemoryPool,
    descs: *const MemAccessDesc,
    count: usize,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || {
            real!(MemPoolSetAccess, MemPoolSetAccessFn, |f| f(
                pool, descs, count
            ))
        };
        // SAFETY: the caller's contract.
        unsafe { default_pool::driver_set_access(pool, descs, count, real) }
    })
}

/// # Safety
/// As `cuMemPoolGetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CuMemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || {
            real!(MemPoolGetAttribute, MemPoolAttributeFn, |f| f(
                pool, attr, value
            ))
        };
        // SAFETY: the caller's contract.
        unsafe { default_pool::driver_get_attribute(pool, attr, value, real) }
    })
}

/// # Safety
/// As `cuMemPoolSetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CuMemoryPool,
    attr: c_int,
    value: *mut c_void,
) -> CuResult {
    boundary(CU_ERROR_UNKNOWN, || {
        let real = || {
            real!(MemPoolSetAttribute, MemPoolAttributeFn, |f| f(
                pool, attr, value
            ))
        };
        // SAFETY: the caller's contract.
        unsafe { default_pool::driver_set_attribute(pool, attr, value, real) }
    })
}
