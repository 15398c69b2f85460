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

/// A number of the calling thread's own, never reused (its per-thread default streams are told
/// apart by it).
pub fn thread_key() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static KEY: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    // A thread being torn down gets a fresh number: it has no stream to find again.
    KEY.try_with(|k| *k)
        .unwrap_or_else(|_| NEXT.fetch_add(1, Ordering::Relaxed))
}
