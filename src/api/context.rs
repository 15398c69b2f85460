//! What the C API functions share: the library state, device arguments, running on a device.

use std::ffi::c_int;

use super::{GPUPOOL_ALL_DEVICES, GPUPOOL_ERROR_INVALID_DEVICE, GPUPOOL_ERROR_UNKNOWN};
use crate::cuda::backend::CudaBackend;
use crate::cuda::last_error;
use crate::cuda::runtime::Runtime;
use crate::cuda::types::{CudaStatus, ERROR_INSUFFICIENT_DRIVER, SUCCESS};
use crate::global::{self, Global};
use crate::guard::{self, Inside};
use crate::pool::{LockWait, Pool};

/// The library state (made on first use), or the status to return without a runtime.
pub fn state() -> Result<&'static Global, c_int> {
    global::get().ok_or_else(global::missing_runtime)
}

/// The process's pool (`None` when off), for a call that reads or tunes every device and needs
/// no runtime to do it: reports, peaks, the release threshold, emptying the cache. Such a call
/// never looks for the runtime. Made before the program has loaded its own (a Python program
/// calls `gpupool.stats()` or `gpupool.set_release_threshold()` before it imports torch), a
/// search would load one by name, which may be another than the program's, or print that none
/// was found. Nothing went through the runtime yet, so the pool alone has every figure.
pub fn all_devices_pool() -> Option<&'static Pool<CudaBackend>> {
    global::process_pool()
}

/// Enter the pool for a call that takes its locks; a call made from inside the pool on this
/// thread (a runtime callback) is refused rather than deadlocked.
pub fn enter() -> Result<Inside, c_int> {
    guard::enter().ok_or(GPUPOOL_ERROR_UNKNOWN)
}

/// How long a report the program asked for may wait for a device's lock: as long as it takes,
/// unless the calling thread is inside the pool already (a signal handler that interrupted it,
/// a runtime callback during the pool's own call), where it may hold that lock: then briefly.
/// Keep the returned guard for the duration of the report.
pub fn report_patience() -> (Option<Inside>, LockWait) {
    match guard::enter() {
        Some(inside) => (Some(inside), LockWait::Unbounded),
        None => (None, LockWait::Brief),
    }
}

/// Which devices a call acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Devices {
    All,
    One(u32),
}

/// The pool and the devices a call on `device` acts on: for -1 (`GPUPOOL_ALL_DEVICES`) the
/// process's pool without the runtime (`all_devices_pool`), else the runtime's state's pool and
/// the ordinal it checked (`ordinal`).
pub fn target(device: c_int) -> Result<(Option<&'static Pool<CudaBackend>>, Devices), c_int> {
    if device == GPUPOOL_ALL_DEVICES {
        return Ok((all_devices_pool(), Devices::All));
    }
    let g = state()?;
    Ok((g.pool(), Devices::One(ordinal(g, device)?)))
}

/// Check a device argument: a device ordinal the runtime knows (-1, every device, is not one).
pub fn ordinal(g: &Global, device: c_int) -> Result<u32, c_int> {
    let d = u32::try_from(device).map_err(|_| GPUPOOL_ERROR_INVALID_DEVICE)?;
    if let Some(get_count) = g.runtime.get_device_count {
        let mut count = 0;
        // SAFETY: `count` is a valid out-pointer for the call.
        let r = last_error::own_call(&g.runtime, || unsafe { get_count(&mut count) });
        if r != SUCCESS {
            // No ordinal is a device when the runtime cannot count them.
            return Err(if r == ERROR_INSUFFICIENT_DRIVER {
                r
            } else {
                GPUPOOL_ERROR_INVALID_DEVICE
            });
        }
        if device >= count {
            return Err(GPUPOOL_ERROR_INVALID_DEVICE);
        }
    }
    Ok(d)
}

/// Run `f` with `device` current on this thread, then make the previous device current again.
pub fn on_device<T>(rt: &Runtime, device: u32, f: impl FnOnce() -> T) -> Result<T, CudaStatus> {
    let device = i32::try_from(device).map_err(|_| GPUPOOL_ERROR_INVALID_DEVICE)?;
    rt.on_device(device, f)
}

/// Run the body of a C API function inside the panic boundary; `Err` carries its status.
pub fn run(f: impl FnOnce() -> Result<(), c_int>) -> c_int {
    guard::boundary(GPUPOOL_ERROR_UNKNOWN, || f().err().unwrap_or(SUCCESS))
}
