//! The calling thread's current device: a thread-local, so `cudaGetDevice`/`cudaSetDevice`
//! never take a lock (they sit on a benchmarked hot path).

use crate::config;
use crate::errors::{CudaResult, INVALID_DEVICE};
use std::cell::Cell;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The calling thread's current device (0 until `cudaSetDevice`).
pub fn get() -> usize {
    CURRENT.try_with(Cell::get).unwrap_or(0)
}

/// Makes `device` current for the calling thread; `cudaErrorInvalidDevice` if out of range.
pub fn set(device: i32) -> CudaResult {
    let count = config::get()?.devices;
    let d = usize::try_from(device).map_err(|_| INVALID_DEVICE)?;
    if d >= count {
        return Err(INVALID_DEVICE);
    }
    // A thread being torn down has no current device to keep.
    let _ = CURRENT.try_with(|c| c.set(d));
    Ok(())
}
