//! When the library was loaded, noted by the load-time constructor (`lifecycle`): a summary
//! file written since then is another process's, never replaced by an `always:` line.

use std::sync::atomic::{AtomicU64, Ordering};

/// When the library was loaded (at the process's start when preloaded), in nanoseconds since
/// the epoch; 0 if unknown.
static LOADED_AT_NS: AtomicU64 = AtomicU64::new(0);

/// When the library was loaded: at the process's start when preloaded.
pub fn loaded_at() -> Option<std::time::SystemTime> {
    match LOADED_AT_NS.load(Ordering::Relaxed) {
        0 => None,
        ns => Some(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns)),
    }
}

/// Note the time now, with the coarse clock file times are taken from: a file written after
/// this is never older than it. libc-level work only, for the load-time constructor.
pub fn note_now() {
    // SAFETY: clock_gettime writes into the zeroed timespec on the stack.
    unsafe {
        let mut now: libc::timespec = std::mem::zeroed();
        if libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut now) == 0 && now.tv_sec > 0 {
            let ns = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
            LOADED_AT_NS.store(ns, Ordering::Relaxed);
        }
    }
}
