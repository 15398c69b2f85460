//! The runtime's teardown at exit, in NVIDIA's order: the runtime registers it with `atexit`
//! at its first call, so `exit` runs it after the `atexit` handlers (and C++ static
//! destructors) registered later, and before those registered earlier. From then on every
//! runtime call answers `cudaErrorCudartUnloading` ("called during process shut down, after
//! the driver has been unloaded"). The driver's own entry points are left as they are.

use crate::errors::{CudaResult, CUDART_UNLOADING};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static REGISTERED: Once = Once::new();
static TORN_DOWN: AtomicBool = AtomicBool::new(false);

/// Called at the start of every runtime call: registers the teardown at the first, and
/// refuses the call once the teardown ran.
pub fn on_runtime_call() -> CudaResult {
    if TORN_DOWN.load(Ordering::Acquire) {
        return Err(CUDART_UNLOADING);
    }
    REGISTERED.call_once(|| {
        // SAFETY: `tear_down` is an `extern "C" fn()` that only stores a flag. A failed
        // registration (no memory) leaves the runtime serving calls to the end.
        unsafe { libc::atexit(tear_down) };
    });
    Ok(())
}

extern "C" fn tear_down() {
    TORN_DOWN.store(true, Ordering::Release);
}
