//! Devices: current device, count, synchronization, reset, versions.

use crate::config;
use crate::context;
use crate::current;
use crate::errors::{CudaResult, STREAM_CAPTURE_UNSUPPORTED};
use crate::faults::Func;
use crate::ffi::{runtime_call, Out};
use crate::link;
use crate::state::{synchronize, with_state};
use crate::timeline;
use std::ffi::c_int;

/// CUDA 12.8, for both the driver and the runtime.
pub const VERSION: c_int = 12080;

/// Lock-free: touches only the thread-local current device (and atomics).
#[no_mangle]
pub unsafe extern "C" fn cudaGetDevice(device: *mut c_int) -> c_int {
    runtime_call(Func::cudaGetDevice, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        let out = unsafe { Out::new(device)? };
        out.set(current::get() as c_int);
        Ok(())
    })
}

/// Lock-free: touches only thread-locals (the current device, and the driver's context stack,
/// whose top becomes the device's primary context as in CUDA 12) and atomics.
#[no_mangle]
pub unsafe extern "C" fn cudaSetDevice(device: c_int) -> c_int {
    runtime_call(Func::cudaSetDevice, || {
        current::set(device)?;
        let d = current::get();
        context::set_device(d);
        // CUDA 12 makes the primary context here; its bytes are taken at the device's first use.
        with_state(|st| {
            st.devices[d].primary_active = true;
            Ok(())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetDeviceCount(count: *mut c_int) -> c_int {
    runtime_call(Func::cudaGetDeviceCount, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        let out = unsafe { Out::new(count)? };
        out.set(config::get()?.devices as c_int);
        Ok(())
    })
}

/// `cudaDeviceSynchronize` and `cuCtxSynchronize`: waits for the current context's work, as
/// CUDA does. A created context's synchronization does not wait for the primary context's
/// streams, nor the primary's for a created one's. Refused (900) while one of the device's
/// streams is being captured, which invalidates the capture.
pub fn synchronize_device() -> CudaResult {
    synchronize_context(current::get(), context::created_current())
}

/// The synchronization of device `d`'s `context` (`None`: its primary context), current or
/// not (`cuCtxSynchronize_v2`), as `synchronize_device` describes.
pub fn synchronize_context(d: usize, context: Option<usize>) -> CudaResult {
    let delay = config::get()?.sync_delay_ms;
    if delay > 0 {
        std::thread::sleep(std::time::Duration::from_millis(delay));
    }
    let deadline = with_state(|st| {
        if st.streams.refuse_device_sync(d) {
            return Err(STREAM_CAPTURE_UNSUPPORTED);
        }
        st.use_device(d).counters.device_syncs += 1;
        Ok(st.streams.context_tail(d, context))
    })?;
    synchronize(deadline, d)
}

/// Through the driver (`cuCtxSynchronize`).
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSynchronize() -> c_int {
    runtime_call(Func::cudaDeviceSynchronize, || match link::driver() {
        // SAFETY: the driver's cuCtxSynchronize.
        Some(drv) => link::result(unsafe { (drv.ctx_synchronize)() }),
        None => synchronize_device(),
    })
}

/// `cudaDeviceReset` (of the current device) and `cuDevicePrimaryCtxReset_v2`: waits for all
/// work of device `d`, then drops its allocations, streams, events and context.
pub fn reset(d: usize) -> CudaResult {
    let deadline = with_state(|st| Ok(st.device_tail(d)))?;
    timeline::sleep_until(deadline);
    with_state(|st| {
        st.reset_device(d);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaDeviceReset() -> c_int {
    runtime_call(Func::cudaDeviceReset, || reset(current::get()))
}

#[no_mangle]
pub unsafe extern "C" fn cudaDriverGetVersion(version: *mut c_int) -> c_int {
    runtime_call(Func::cudaDriverGetVersion, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        unsafe { Out::new(version)? }.set(VERSION);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaRuntimeGetVersion(version: *mut c_int) -> c_int {
    runtime_call(Func::cudaRuntimeGetVersion, || {
        // SAFETY: the caller passes NULL or a pointer valid for writing an int.
        unsafe { Out::new(version)? }.set(VERSION);
        Ok(())
    })
}
