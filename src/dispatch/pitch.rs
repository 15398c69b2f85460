//! Pitched allocations served by the pool (`cudaMallocPitch`, `cuMemAllocPitch_v2`): each row
//! padded as CUDA pads it on the device, the rows together one block of pitch × height bytes,
//! freed like any other. OpenCV's `GpuMat` and NPP's images come this way, one per image.

use std::cell::Cell;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::cuda::driver::{CuDevicePtr, CuResult, CU_ERROR_OUT_OF_MEMORY, CU_SUCCESS};
use crate::cuda::last_error;
use crate::cuda::runtime::Runtime;
use crate::cuda::types::*;
use crate::pool::{Origin, MAX_DEVICES};
use crate::{global, guard};

use super::{current_device, driver, forward, malloc_with};
use crate::report::oom::RequestApi;

/// Each device's row alignments, the pitch CUDA gives a one-byte row: the runtime's, then the
/// driver's for elements of 4, 8 and 16 bytes (512 bytes on NVIDIA's GPUs so far, which also
/// meets the texture units' pitch alignment). 0 until asked.
static ROW_ALIGNMENT: [[AtomicUsize; 4]; MAX_DEVICES] =
    [const { [const { AtomicUsize::new(0) }; 4] }; MAX_DEVICES];

/// # Safety
/// As `cudaMallocPitch`: `dev_ptr` and `pitch` are NULL or valid for a write.
pub unsafe fn malloc_pitch(
    dev_ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
    origin: Origin,
) -> CudaStatus {
    let Some((g, pool)) = global::with_pool() else {
        return global::missing_runtime();
    };
    let rt = &g.runtime;
    let pass = || {
        forward(rt.malloc_pitch, |f| {
            // SAFETY: the caller's arguments, passed on unchanged.
            unsafe { f(dev_ptr, pitch, width, height) }
        })
    };
    // The runtime's own answers where there is nothing to pad or nowhere to write.
    let (Some(pool), false, false, false, false) = (
        pool,
        dev_ptr.is_null(),
        pitch.is_null(),
        width == 0,
        height == 0,
    ) else {
        return pass();
    };
    let Some(dev) = current_device(rt) else {
        return pass();
    };
    let rows = row_pitch(&ROW_ALIGNMENT[dev as usize][0], width, || {
        let ask = || runtime_row_alignment(rt);
        ask_with_room(ask, ERROR_MEMORY_ALLOCATION, || {
            guard::enter().map_or(0, |inside| {
                super::ready_for_backend(&inside, pool, dev);
                pool.release_for_others(dev)
            })
        })
    });
    let Some((row, size)) = rows.and_then(|row| Some((row, row.checked_mul(height)?))) else {
        return pass();
    };
    let passed = Cell::new(false);
    // SAFETY: `dev_ptr` as the caller's contract says; `pass` makes the runtime's own call.
    let r = unsafe {
        malloc_with(
            dev_ptr,
            size,
            None,
            Some(dev),
            origin,
            RequestApi::RuntimePitch,
            |_| {
                passed.set(true);
                pass()
            },
        )
    };
    if r == SUCCESS && !passed.get() {
        // SAFETY: non-NULL, and writable by the caller's contract.
        unsafe { *pitch = row };
    }
    r
}

/// `cuMemAllocPitch_v2` made by `origin`. `real` is the driver's own call with the caller's
/// arguments; `alignment` asks the driver for the pitch of a one-byte row of these elements
/// (its error when the driver refuses).
///
/// # Safety
/// As `cuMemAllocPitch_v2`: `dptr` and `pitch` are NULL or valid for a write.
#[allow(clippy::too_many_arguments)]
pub unsafe fn mem_alloc_pitch(
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
    origin: Origin,
    real: impl Fn() -> CuResult,
    alignment: impl Fn() -> Result<usize, CuResult>,
) -> CuResult {
    let Some((pool, d)) = driver::serving() else {
        return real();
    };
    let element = match element_size {
        4 => 1,
        8 => 2,
        16 => 3,
        _ => return real(),
    };
    if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 {
        return real();
    }
    let Some(dev) = driver::context_device(d) else {
        // What the driver took: its pitch, for each row.
        // SAFETY: `pitch` is non-NULL, and the driver wrote it (read only after its success).
        let taken = || unsafe { *pitch }.saturating_mul(height);
        return driver::unserved_context(pool, d, taken, real);
    };
    let rows = row_pitch(&ROW_ALIGNMENT[dev as usize][element], width, || {
        ask_with_room(alignment, CU_ERROR_OUT_OF_MEMORY, || {
            guard::enter().map_or(0, |_inside| driver::release_cache(pool, d))
        })
    });
    let Some((row, size)) = rows.and_then(|row| Some((row, row.checked_mul(height)?))) else {
        return real();
    };
    let passed = Cell::new(false);
    // SAFETY: `dptr` as the caller's contract says; `real` makes the driver's own call.
    let r = unsafe {
        driver::mem_alloc_as(dptr, size, None, origin, RequestApi::DriverPitch, || {
            passed.set(true);
            real()
        })
    };
    if r == CU_SUCCESS && !passed.get() {
        // SAFETY: non-NULL, and writable by the caller's contract.
        unsafe { *pitch = row };
    }
    r
}

/// The pitch of a `width`-byte row with the alignment in `slot`, asked of CUDA (`ask`) the
/// first time; `None` where CUDA cannot say (its own call then answers the program).
fn row_pitch(
    slot: &AtomicUsize,
    width: usize,
    ask: impl FnOnce() -> Option<usize>,
) -> Option<usize> {
    let alignment = match slot.load(Ordering::Relaxed) {
        0 => {
            let a = ask().filter(|&a| a > 0)?;
            slot.store(a, Ordering::Relaxed);
            a
        }
        a => a,
    };
    width.checked_next_multiple_of(alignment)
}

/// The row alignment `ask` gives; when CUDA is out of memory, asked again once `release` gave
/// the pool's cache on the device back (a device full of it has no room for the one-row query,
/// and without the pool the program's freed memory would be there). `None` where CUDA cannot
/// say.
fn ask_with_room<E: PartialEq>(
    ask: impl Fn() -> Result<usize, E>,
    out_of_memory: E,
    release: impl FnOnce() -> u64,
) -> Option<usize> {
    match ask() {
        Err(e) if e == out_of_memory && release() > 0 => ask().ok(),
        r => r.ok(),
    }
}

/// The pitch the runtime gives a one-byte row on the current device: one allocation of its
/// own, freed at once, per device and process.
fn runtime_row_alignment(rt: &Runtime) -> Result<usize, CudaStatus> {
    let f = rt.malloc_pitch.ok_or(ERROR_UNKNOWN)?;
    let (mut p, mut alignment) = (std::ptr::null_mut(), 0);
    // SAFETY: valid out-pointers for the duration of the call.
    let r = last_error::own_call(rt, || unsafe { f(&mut p, &mut alignment, 1, 1) });
    if r != SUCCESS {
        return Err(r);
    }
    // SAFETY: the runtime's own allocation, just made.
    last_error::own_call(rt, || unsafe { (rt.free)(p) });
    Ok(alignment)
}
