//! The CUDA entry points this library exports: the runtime's (`runtime.rs`) and the driver's
//! (`driver.rs`, its graph captures in `driver_capture.rs`, its contexts in
//! `driver_contexts.rs`). Each is the panic boundary, then
//! the one path in `dispatch`.

/// Calls the driver's own function behind `$hook` (a `Hooked` variant's name, or with `@at`
/// any `Hooked` value) with `$call`, or answers `CUDA_ERROR_NOT_INITIALIZED` when no driver is
/// loaded (the library never loads one).
macro_rules! real {
    ($hook:ident, $ty:ty, |$f:ident| $call:expr) => {
        real!(@at $crate::cuda::hooked::Hooked::$hook, $ty, |$f| $call)
    };
    (@at $hook:expr, $ty:ty, |$f:ident| $call:expr) => {{
        // SAFETY: `$ty` is the C signature of the hooked function.
        match unsafe { $crate::cuda::hooked::real_fn::<$ty>($hook) } {
            // SAFETY: the driver's own function, called with the hook's arguments unchanged.
            Some($f) => unsafe { $call },
            None => $crate::cuda::driver::CU_ERROR_NOT_INITIALIZED,
        }
    }};
}

pub mod driver;
mod driver_capture;
mod driver_contexts;
mod origin;
pub mod runtime;

use crate::cuda::types::{Stream, STREAM_PER_THREAD};

/// Stream 0 of a `_ptsz` entry point (runtime or driver): the calling thread's per-thread
/// default stream, never the legacy one.
fn per_thread(stream: Stream) -> Stream {
    if stream.is_null() {
        STREAM_PER_THREAD as Stream
    } else {
        stream
    }
}
