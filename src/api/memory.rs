//! Allocate and free: `cudaMalloc`/`cudaFree` as the pool serves them (the same code path as the
//! hooks), and a stream-ordered pair.

use std::ffi::{c_int, c_void};

use super::context::state;
use super::{cudaStream_t, GPUPOOL_ERROR_INVALID_VALUE, GPUPOOL_ERROR_UNKNOWN, GPUPOOL_SUCCESS};
use crate::dispatch;
use crate::guard::{self, boundary};

/// Writes `value` to `out` when `status` is success.
///
/// # Safety
/// `out` is non-NULL and valid for a write.
unsafe fn set_on_success(status: c_int, out: *mut *mut c_void, value: *mut c_void) -> c_int {
    if status == GPUPOOL_SUCCESS {
        // SAFETY: the caller's contract.
        unsafe { *out = value };
    }
    status
}

/// Allocates `size` bytes of device memory on the calling thread's current device, from the
/// pool, like `cudaMalloc`.
///
/// On success `*ptr` is the memory (aligned to at least 256 bytes); a `size` of 0 succeeds with
/// `*ptr = NULL`, as `cudaMalloc` does. When the driver is out of memory the pool releases what
/// it has cached and retries before it returns `GPUPOOL_ERROR_MEMORY_ALLOCATION`. With
/// `GPUPOOL_DISABLE=1` the call goes to the runtime's `cudaMalloc` unchanged.
///
/// Returns 0, 1 (`ptr` is NULL), 2 (out of memory), 35 (no CUDA runtime), 999 (called while
/// this thread is inside the pool: from a signal handler that interrupted a pool call), or the
/// runtime's error. `*ptr` is written only on success.
///
/// # Safety
/// `ptr` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn gpupool_malloc(ptr: *mut *mut c_void, size: usize) -> c_int {
    boundary(GPUPOOL_ERROR_UNKNOWN, || {
        if ptr.is_null() {
            return GPUPOOL_ERROR_INVALID_VALUE;
        }
        if guard::inside() {
            return GPUPOOL_ERROR_UNKNOWN;
        }
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; `ptr` was checked and is the caller's to write.
        unsafe { set_on_success(dispatch::malloc_on(&mut p, size, None, None, 0), ptr, p) }
    })
}

/// Frees memory from `gpupool_malloc` or `gpupool_malloc_async` (or any `cudaMalloc`, which
/// goes to the runtime), like `cudaFree`: the memory goes back to the pool, and is handed out
/// again only once GPU work issued before this call can no longer touch it (see the reuse modes
/// in docs/reuse-modes.md).
///
/// Returns 0 (also for NULL, which does nothing), 1 (not the start of a live allocation: a
/// double or interior free, which leaves the pool intact), 35, 999 (called while this thread is
/// inside the pool, as for `gpupool_malloc`: nothing is freed), or the runtime's error.
///
/// # Safety
/// `ptr` is NULL or a device pointer; no work that is still to be issued may use it.
#[no_mangle]
pub unsafe extern "C" fn gpupool_free(ptr: *mut c_void) -> c_int {
    boundary(GPUPOOL_ERROR_UNKNOWN, || {
        if ptr.is_null() {
            return GPUPOOL_SUCCESS;
        }
        // From inside the pool the hook refuses it (999), nothing freed.
        // SAFETY: the caller's pointer, as cudaFree takes it.
        unsafe { dispatch::free(ptr) }
    })
}

/// Allocates `size` bytes on the calling thread's current device for use on `stream` (which
/// must belong to that device), like `cudaMallocAsync`. The memory is ready at once for any
/// stream, except in `GPUPOOL_REUSE=relaxed` mode when it is a block freed with
/// `gpupool_free_async` on the same stream whose earlier work may still run: then it is ready
/// in that stream's order, as `cudaMallocAsync` memory is (another stream must wait for this
/// one before using it). Free it with `gpupool_free_async` on the stream that last uses it.
/// With `GPUPOOL_DISABLE=1` the call goes to the runtime's `cudaMallocAsync` (or `cudaMalloc`
/// when the runtime has none).
///
/// Returns as `gpupool_malloc`. `*ptr` is written only on success.
///
/// # Safety
/// `ptr` is NULL or valid for a write; `stream` is NULL, `cudaStreamLegacy`,
/// `cudaStreamPerThread` or a live stream.
#[no_mangle]
pub unsafe extern "C" fn gpupool_malloc_async(
    ptr: *mut *mut c_void,
    size: usize,
    stream: cudaStream_t,
) -> c_int {
    // SAFETY: the caller's contract.
    boundary(GPUPOOL_ERROR_UNKNOWN, || unsafe {
        malloc_async_on(ptr, size, stream, None)
    })
}

/// `gpupool_malloc_async` when the caller knows the current device (it made it current).
///
/// # Safety
/// As `gpupool_malloc_async`; `current` is the current device or `None`.
pub(super) unsafe fn malloc_async_on(
    ptr: *mut *mut c_void,
    size: usize,
    stream: cudaStream_t,
    current: Option<u32>,
) -> c_int {
    if ptr.is_null() {
        return GPUPOOL_ERROR_INVALID_VALUE;
    }
    if guard::inside() {
        return GPUPOOL_ERROR_UNKNOWN;
    }
    let g = match state() {
        Ok(g) => g,
        Err(e) => return e,
    };
    let mut p = std::ptr::null_mut();
    let r = match (g.pool(), g.runtime.malloc_async) {
        // SAFETY: a valid out-pointer and the caller's stream, as cudaMallocAsync takes them.
        (None, Some(malloc_async)) => unsafe { malloc_async(&mut p, size, stream) },
        // SAFETY: a valid out-pointer; the caller's stream and knowledge of the device.
        _ => unsafe { dispatch::malloc_on(&mut p, size, Some(stream), current, 0) },
    };
    // SAFETY: `ptr` was checked and is the caller's to write.
    unsafe { set_on_success(r, ptr, p) }
}

/// Frees memory in stream order, like `cudaFreeAsync`: the block is handed out again only after
/// the work already issued on `stream` (a blocking stream: after one action on the legacy
/// stream; a non-blocking stream: after a device-wide fence; in `strict` mode: after a fence).
/// In `GPUPOOL_REUSE=relaxed` mode a `gpupool_malloc_async` on the same stream may take it at
/// once, its work then running after the work before the free. Pointers the pool did not hand
/// out go to the runtime's `cudaFreeAsync`.
///
/// Returns 0 (also for NULL, which does nothing), 1 (not the start of a live allocation), 35,
/// 999 (called while this thread is inside the pool: nothing is freed), or the runtime's error.
///
/// # Safety
/// `ptr` is NULL or a device pointer; `stream` as for `gpupool_malloc_async`.
#[no_mangle]
pub unsafe extern "C" fn gpupool_free_async(ptr: *mut c_void, stream: cudaStream_t) -> c_int {
    // SAFETY: the caller's contract.
    boundary(GPUPOOL_ERROR_UNKNOWN, || unsafe {
        free_async_on(ptr, stream, None)
    })
}

/// `gpupool_free_async` with the block's device when the caller knows it (looked in first).
///
/// # Safety
/// As `gpupool_free_async`.
pub(super) unsafe fn free_async_on(
    ptr: *mut c_void,
    stream: cudaStream_t,
    device: Option<u32>,
) -> c_int {
    if ptr.is_null() {
        return GPUPOOL_SUCCESS;
    }
    // From inside the pool the hook refuses it (999), nothing freed.
    // SAFETY: the caller's arguments, as cudaFreeAsync takes them.
    unsafe { dispatch::free_on(ptr, stream, device, dispatch::Promise::Pool) }
}
