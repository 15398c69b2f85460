//! The cache: give it back to the driver, and the release threshold.

use std::ffi::c_int;

use super::context::{all_devices_pool, enter, on_device, ordinal, run, state, target, Devices};
use super::{
    GPUPOOL_ALL_DEVICES, GPUPOOL_ERROR_INVALID_DEVICE, GPUPOOL_ERROR_INVALID_VALUE,
    GPUPOOL_KEEP_ALL,
};
use crate::config::DeviceBytes;
use crate::cuda::backend::CudaBackend;
use crate::dispatch::ready_for_backend;
use crate::global::Global;
use crate::pool::Pool;

/// Runs `f` about `device`'s threshold. A percentage threshold of a device the pool has not used
/// yet is resolved from that device's memory, so `device` is made current for it; otherwise
/// nothing is asked of the device (making a device current can create its context).
fn for_device<T>(
    g: &Global,
    pool: &Pool<CudaBackend>,
    device: u32,
    f: impl FnOnce() -> T,
) -> Result<T, c_int> {
    let percentage = matches!(pool.settings().threshold, DeviceBytes::Fraction(_));
    if percentage && !pool.used_devices().contains(&device) {
        on_device(&g.runtime, device, f)
    } else {
        Ok(f())
    }
}

/// Gives every cached block that the driver can take back to the driver: all memory of whole
/// segments that hold no live allocation, and the mapped granules of expandable segments that
/// no live block touches, on `device`, or on every device for -1 (`GPUPOOL_ALL_DEVICES`).
/// Blocks freed while GPU work may still use them are included (the driver's `cudaFree` waits
/// for that work; a granule is unmapped after a fence). Live allocations are untouched.
///
/// `released`, when not NULL, receives the bytes given back. With the pool disabled
/// (`GPUPOOL_DISABLE=1`) nothing is cached and 0 bytes are released.
///
/// Returns 0, 101 (not a device), 35 (for a device ordinal, without a runtime), or 999 (called
/// from inside the pool, e.g. from a runtime callback). For -1 it needs no runtime and never
/// looks for one: before the program's first CUDA call it releases 0 bytes.
///
/// # Safety
/// `released` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn gpupool_empty_cache(device: c_int, released: *mut u64) -> c_int {
    run(|| {
        let (pool, which) = target(device)?;
        let inside = enter()?;
        let empty = |pool: &Pool<CudaBackend>, d: u32| {
            ready_for_backend(&inside, pool, d);
            pool.empty_cache(d)
        };
        let bytes = match (pool, which) {
            (None, _) => 0,
            (Some(pool), Devices::All) => pool
                .used_devices()
                .into_iter()
                .map(|d| empty(pool, d))
                .sum(),
            (Some(pool), Devices::One(d)) => empty(pool, d),
        };
        if !released.is_null() {
            // SAFETY: non-NULL, and by the caller's contract writable.
            unsafe { *released = bytes };
        }
        Ok(())
    })
}

/// Starts the peaks over again on `device`, or on every device for -1 (`GPUPOOL_ALL_DEVICES`):
/// each figure's peak since the reset (the JSON summary's `peak_since_reset`) restarts from its
/// current value, as PyTorch's `reset_peak_memory_stats()` does. The run's peaks, which the
/// summary and `gpupool_get_stats` report, stay. With the pool disabled the call does nothing.
///
/// Returns 0, 101 (not a device), 35 (for a device ordinal, without a runtime), or 999. For -1
/// it needs no runtime and never looks for one.
#[no_mangle]
pub extern "C" fn gpupool_reset_peak_stats(device: c_int) -> c_int {
    run(|| {
        let (pool, which) = target(device)?;
        let _inside = enter()?;
        match (pool, which) {
            (None, _) => {}
            (Some(pool), Devices::All) => {
                for d in pool.used_devices() {
                    pool.reset_peaks(d);
                }
            }
            (Some(pool), Devices::One(d)) => pool.reset_peaks(d),
        }
        Ok(())
    })
}

/// Sets the release threshold at run time: the cached-but-unused bytes to keep on `device`, or
/// on every device, now and used later, for -1 (`GPUPOOL_ALL_DEVICES`). Above it, whole free
/// segments go back to the driver at the next synchronization the program makes or the next
/// allocation on that device (the meaning of CUDA's `cudaMemPoolAttrReleaseThreshold`; for an
/// immediate release call `gpupool_empty_cache`). `UINT64_MAX` (`GPUPOOL_KEEP_ALL`) keeps
/// everything. Replaces `GPUPOOL_RELEASE_THRESHOLD` for this process, and outranks a threshold
/// the program sets on CUDA's default memory pool afterwards (PyTorch's `cudaMallocAsync`
/// backend sets one). A device not used yet starts with it; the call makes no CUDA call about
/// that device. With the pool disabled the call does nothing.
///
/// Returns 0, 101 (not a device, or one beyond the 64 the pool serves), 35 (for a device ordinal,
/// without a runtime), or 999. For -1 it needs no runtime and never looks for one: set before the
/// program's first CUDA call, the threshold applies from that call on.
#[no_mangle]
pub extern "C" fn gpupool_set_release_threshold(device: c_int, bytes: u64) -> c_int {
    run(|| {
        if device == GPUPOOL_ALL_DEVICES {
            let _inside = enter()?;
            if let Some(pool) = all_devices_pool() {
                pool.set_threshold(bytes);
            }
            return Ok(());
        }
        let g = state()?;
        let d = ordinal(g, device)?;
        let _inside = enter()?;
        let Some(pool) = g.pool() else {
            return Ok(());
        };
        if !for_device(g, pool, d, || pool.set_device_threshold(d, bytes))? {
            return Err(GPUPOOL_ERROR_INVALID_DEVICE);
        }
        Ok(())
    })
}

/// Reads the release threshold of `device` (a device ordinal; -1 is not allowed) into `*bytes`:
/// the value set at run time, else `GPUPOOL_RELEASE_THRESHOLD` resolved for the device;
/// `UINT64_MAX` (`GPUPOOL_KEEP_ALL`) means everything is kept, and is also the answer with the
/// pool disabled.
///
/// Returns 0, 1 (`bytes` is NULL), 101 (not a device, or one beyond the 64 the pool serves), 35,
/// or 999. `*bytes` is written only on success.
///
/// # Safety
/// `bytes` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn gpupool_get_release_threshold(device: c_int, bytes: *mut u64) -> c_int {
    run(|| {
        if bytes.is_null() {
            return Err(GPUPOOL_ERROR_INVALID_VALUE);
        }
        let g = state()?;
        let d = ordinal(g, device)?;
        let _inside = enter()?;
        let value = match g.pool() {
            None => GPUPOOL_KEEP_ALL,
            Some(pool) if !pool.serves(d) => return Err(GPUPOOL_ERROR_INVALID_DEVICE),
            Some(pool) => for_device(g, pool, d, || pool.threshold(d))?,
        };
        // SAFETY: checked non-NULL above; writable by the caller's contract.
        unsafe { *bytes = value };
        Ok(())
    })
}
