//! Tables of a CUDA library's entry points, built from a lookup by name: what the runtime's
//! (`runtime.rs`) and the driver's (`driver.rs`) tables share.

use std::ffi::c_void;

/// Resolves a symbol by name to a raw address, or null.
pub type Lookup<'a> = &'a dyn Fn(&[u8]) -> *mut c_void;

/// Reinterpret a symbol address as a function pointer.
///
/// # Safety
/// `F` must be a function pointer type matching the function at `p`.
pub(crate) unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked), and the caller vouches for the signature.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

/// The function `$name` of `$library` ("the runtime"), or an early `Err` naming what is missing.
macro_rules! required {
    ($lookup:expr, $library:literal, $name:literal) => {{
        let p = $lookup(concat!($name, "\0").as_bytes());
        if p.is_null() {
            return Err(concat!($library, " has no ", $name));
        }
        // SAFETY: the symbol is the library's own function of that name, whose C signature is
        // the one the field's type spells out.
        unsafe { $crate::cuda::symbols::as_fn(p) }
    }};
}

/// The function `$name`, or `None`.
macro_rules! optional {
    ($lookup:expr, $name:literal) => {{
        let p = $lookup(concat!($name, "\0").as_bytes());
        // SAFETY: as in `required!`.
        (!p.is_null()).then(|| unsafe { $crate::cuda::symbols::as_fn(p) })
    }};
}

pub(crate) use {optional, required};
