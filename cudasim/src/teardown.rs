//! The runtime's teardown at exit, in NVIDIA's order: the runtime registers it with `atexit`
//! at its first call, so `exit` runs it after the `atexit` handlers (and C++ static
//! destructors) registered later, and before those registered earlier. From then on every
//! runtime call answers `cudaErrorCudartUnloading` ("called during process shut down, after
//! the driver has been unloaded"). The driver's own entry points are left as they are.

use crate::errors::{CudaResult, CUDART_UNLOADING};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Once;

/// Before the first runtime call, then registered, then torn down: one load per call once
/// registered, so the simulator's own bookkeeping stays out of the pool's hit-path counts.
const FRESH: u8 = 0;
const REGISTERED: u8 = 1;
const TORN_DOWN: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(FRESH);
static REGISTER: Once = Once::new();

/// Called at the start of every runtime call: registers the teardown at the first, and
/// refuses the call once the teardown ran.
#[inline]
pub fn on_runtime_call() -> CudaResult {
    match STATE.load(Ordering::Acquire) {
        REGISTERED => Ok(()),
        _ => first_or_last(),
    }
}

#[cold]
fn first_or_last() -> CudaResult {
    REGISTER.call_once(|| {
        // SAFETY: `tear_down` is an `extern "C" fn()` that only stores a flag. A failed
        // registration (no memory) leaves the runtime serving calls to the end.
        unsafe { libc::atexit(tear_down) };
        STATE.store(REGISTERED, Ordering::Release);
    });
    if STATE.load(Ordering::Acquire) == TORN_DOWN {
        return Err(CUDART_UNLOADING);
    }
    Ok(())
}

extern "C" fn tear_down() {
    STATE.store(TORN_DOWN, Ordering::Release);
}
