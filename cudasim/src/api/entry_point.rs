//! `cudaGetDriverEntryPoint` and `…ByVersion`: the driver's functions through the runtime, found
//! as `cuGetProcAddress` finds them (by base name, version and flags; the runtime's own version
//! for the first).

use super::device::VERSION;
use crate::driver::proc;
use crate::errors::{CudaResult, INVALID_VALUE, SYMBOL_NOT_FOUND};
use crate::faults::Func;
use crate::ffi::{runtime_call, Out};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

/// The lookup both share: `*func` the function (NULL when not found), `*status` the query
/// result when given; a name the driver lacks gives `cudaErrorSymbolNotFound`.
///
/// # Safety
/// `symbol` NULL or NUL-terminated; `func` NULL or writable; `status` NULL or writable.
unsafe fn entry_point(
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CudaResult {
    // SAFETY: forwarded from the caller.
    let out = unsafe { Out::new(func)? };
    if symbol.is_null() || flags > 2 {
        return Err(INVALID_VALUE);
    }
    // SAFETY: not NULL, and by the caller's contract NUL-terminated.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    let found = proc::lookup(name, version, flags);
    out.set(found.map_or(std::ptr::null_mut(), |f| f as *mut c_void));
    if !status.is_null() {
        // SAFETY: not NULL, and writable by the caller's contract.
        unsafe { status.write(found.err().unwrap_or(0)) };
    }
    found.map(drop).map_err(|_| SYMBOL_NOT_FOUND)
}

/// CUDA 12.0's form: at the runtime's own version.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    func: *mut *mut c_void,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    // SAFETY: the caller's arguments, as documented.
    runtime_call(Func::cudaGetDriverEntryPoint, || unsafe {
        entry_point(symbol, func, VERSION, flags, status)
    })
}

/// CUDA 12.5's form: at the version asked for.
#[no_mangle]
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: c_uint,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    let version = c_int::try_from(version).unwrap_or(c_int::MAX);
    // SAFETY: the caller's arguments, as documented.
    runtime_call(Func::cudaGetDriverEntryPointByVersion, || unsafe {
        entry_point(symbol, func, version, flags, status)
    })
}
