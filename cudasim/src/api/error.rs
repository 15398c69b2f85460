//! Last error, error names and strings.

use crate::errors;
use crate::faults::Func;
use crate::ffi::{boundary, status_call};
use std::ffi::{c_char, c_int};

#[no_mangle]
pub unsafe extern "C" fn cudaGetLastError() -> c_int {
    status_call(Func::cudaGetLastError, errors::take_last)
}

#[no_mangle]
pub unsafe extern "C" fn cudaPeekAtLastError() -> c_int {
    status_call(Func::cudaPeekAtLastError, errors::peek_last)
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetErrorString(error: c_int) -> *const c_char {
    boundary(c"unknown error".as_ptr(), || {
        errors::description(error).as_ptr()
    })
}

#[no_mangle]
pub unsafe extern "C" fn cudaGetErrorName(error: c_int) -> *const c_char {
    boundary(c"cudaErrorUnknown".as_ptr(), || {
        errors::name(error).as_ptr()
    })
}
