//! The one panic boundary every exported function goes through.

use crate::config;
use crate::errors::{self, Code, CudaResult, INVALID_VALUE, UNKNOWN};
use crate::faults::{self, Func};
use crate::teardown;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

/// Runs `body`, turning a panic into `on_panic`: nothing unwinds into C.
pub fn boundary<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(on_panic)
}

/// Runs the body of the runtime function `func`: refuses it after the runtime's teardown at
/// exit (`teardown`), counts the call for fault injection (an injected fault returns its error
/// and skips the body), turns a panic into
/// `cudaErrorUnknown`, and records a failure as the thread's last error.
pub fn runtime_call(func: Func, body: impl FnOnce() -> CudaResult) -> Code {
    let code = boundary(UNKNOWN, || {
        // Reading the configuration arms `CUDASIM_FAIL` before the first call is counted;
        // a bad configuration is reported by the bodies that need it.
        let _ = config::get();
        if let Err(unloading) = teardown::on_runtime_call() {
            return unloading;
        }
        match faults::on_call(func) {
            Some(injected) => injected,
            None => body().err().unwrap_or(errors::SUCCESS),
        }
    });
    errors::record(code);
    code
}

/// Like [`runtime_call`] for `cudaGetLastError`/`cudaPeekAtLastError`, whose result is the
/// last error itself: it is returned as is and not recorded again.
pub fn status_call(func: Func, body: impl FnOnce() -> Code) -> Code {
    boundary(UNKNOWN, || {
        let _ = config::get();
        faults::on_call(func).unwrap_or_else(body)
    })
}

/// A C out-parameter that was checked not to be NULL.
pub struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// Checks an out-pointer: NULL gives `cudaErrorInvalidValue`.
    ///
    /// # Safety
    /// `ptr` must be NULL or valid for writes of a `T` until the `Out` is dropped.
    pub unsafe fn new(ptr: *mut T) -> CudaResult<Out<T>> {
        NonNull::new(ptr).map(Out).ok_or(INVALID_VALUE)
    }

    /// Stores the result.
    pub fn set(&self, value: T) {
        // SAFETY: `new`'s caller guaranteed the pointer valid for writes; it is not NULL.
        unsafe { self.0.as_ptr().write(value) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_code() {
        assert_eq!(boundary(7, || -> i32 { panic!("boom") }), 7);
        let code = runtime_call(Func::cudaDeviceSynchronize, || panic!("boom"));
        assert_eq!(code, UNKNOWN);
        assert_eq!(errors::take_last(), UNKNOWN);
        assert_eq!(errors::take_last(), errors::SUCCESS);
    }
}
