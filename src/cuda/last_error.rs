//! The program's last error (`cudaGetLastError`). A call the pool makes on its own may fail and
//! set it; the program must then read what it would have read without the pool: the error it
//! had not read yet, or none.

use std::sync::atomic::AtomicBool;

use super::runtime::Runtime;
use super::types::{
    CudaStatus, ERROR_INVALID_DEVICE, ERROR_INVALID_VALUE, ERROR_MEMORY_ALLOCATION, SUCCESS,
};

static UNRESTORED: AtomicBool = AtomicBool::new(false);

/// The error the program has not read yet, left in place (`cudaPeekAtLastError`); none where
/// the runtime cannot say.
pub fn unread(rt: &Runtime) -> CudaStatus {
    match rt.peek_at_last_error {
        // SAFETY: no arguments.
        Some(peek) => unsafe { peek() },
        None => SUCCESS,
    }
}

/// `call`, one the pool makes on its own (a fence, a barrier, a query), with its status. When it
/// fails, the program's last error is what it was before (`restore`): the program did not make
/// the call, and would have read its own error without the pool.
pub fn own_call(rt: &Runtime, call: impl FnOnce() -> CudaStatus) -> CudaStatus {
    let before = unread(rt);
    let status = call();
    if status != SUCCESS {
        restore(rt, before);
    }
    status
}

/// After a call the pool made on its own failed: the thread's last error is `before` again,
/// what `unread` gave before that call. A failure that left it as it was (a driver call) needs
/// nothing. CUDA has no call that sets it, so an error is set by a call the runtime refuses
/// with that code and nothing else; for a code no such call gives, the error is cleared, and
/// one warning says so.
pub fn restore(rt: &Runtime, before: CudaStatus) {
    if before != SUCCESS && unread(rt) == before {
        return;
    }
    // SAFETY: no arguments; this clears the pool's own error.
    unsafe { (rt.get_last_error)() };
    if before != SUCCESS && !set(rt, before) {
        crate::log::warn_once(&UNRESTORED, || {
            format!(
                "a call the pool made for itself failed while CUDA error {before} was unread; \
                 cudaGetLastError no longer returns it (reported once)"
            )
        });
    }
}

/// Makes `code` the thread's last error, also for the program's own refusals the pool answers
/// itself: 1 (`cudaGetDevice(NULL)`), 2 (a request of `usize::MAX` bytes), 101
/// (`cudaSetDevice(-1)`). False for any other code, which is then not set.
pub fn set(rt: &Runtime, code: CudaStatus) -> bool {
    match code {
        ERROR_INVALID_VALUE => {
            // SAFETY: a NULL out-pointer, which the runtime refuses with cudaErrorInvalidValue.
            let r = unsafe { (rt.get_device)(std::ptr::null_mut()) };
            r == code
        }
        ERROR_MEMORY_ALLOCATION => {
            let mut p = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; no device has `usize::MAX` bytes.
            let r = unsafe { (rt.malloc)(&mut p, usize::MAX) };
            if r == SUCCESS {
                // SAFETY: the runtime's own allocation, just made.
                unsafe { (rt.free)(p) };
            }
            r == code
        }
        ERROR_INVALID_DEVICE => match rt.set_device {
            Some(set_device) => {
                // SAFETY: cudaSetDevice refuses a negative ordinal and changes nothing.
                let r = unsafe { set_device(-1) };
                r == code
            }
            None => false,
        },
        _ => false,
    }
}
