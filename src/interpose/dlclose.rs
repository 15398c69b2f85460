//! The exported `dlclose`: the blocks a library allocated keep its name once it is unloaded.
//!
//! A block records who allocated it as an address inside the calling object (`Origin`),
//! resolved to a file only when a report is written. Once the object is unloaded that address
//! resolves to nothing, or to the object the dynamic linker maps there next: a plugin's blocks
//! would be listed as another plugin's. So before glibc's `dlclose` runs, the loaded objects'
//! names and address ranges are read; the objects missing from the list after it (the closed
//! one, if not merely a reference dropped, and the libraries only it needed) have the pool's
//! blocks with an origin in their range recorded as theirs (`report::unloaded`). A process
//! without a pool pays one atomic load.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::cuda::dl;
use crate::guard::boundary;

/// The `dlclose` the program's call goes on to, once found.
static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The `dlclose` after this library (`RTLD_NEXT`): another preloaded library's that stands in
/// front of glibc's, or glibc's default version; else glibc's (`dl::glibc_dlclose`).
fn real_dlclose() -> Option<dl::DlcloseFn> {
    let mut p = REAL.load(Ordering::Acquire);
    if p.is_null() {
        p = dl::next_after_this(c"dlclose");
        if p.is_null() {
            p = dl::glibc_dlclose().map_or(std::ptr::null_mut(), |f| f as *mut c_void);
        }
        REAL.store(p, Ordering::Release);
    }
    // SAFETY: a dlclose, of glibc's signature.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, dl::DlcloseFn>(p) })
}

/// # Safety
/// As glibc's `dlclose`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real) = real_dlclose() else {
        return -1;
    };
    let pool = crate::global::existing_process().and_then(|p| p.pool());
    // Every loaded object, not only the handle's: the libraries it alone needed go with it.
    let before = match pool {
        Some(_) if !handle.is_null() => boundary(Vec::new(), dl::loaded_with_ranges),
        _ => Vec::new(),
    };
    // SAFETY: the caller's contract, passed on.
    let rc = unsafe { real(handle) };
    if let (0, Some(pool), false) = (rc, pool, before.is_empty()) {
        boundary((), || {
            let after = dl::loaded_with_ranges();
            for object in before.iter().filter(|o| !after.contains(o)) {
                let to =
                    crate::report::unloaded::remember(object.name.to_string_lossy().into_owned());
                pool.rename_origins(object.range.start as u64..object.range.end as u64, to);
            }
        });
    }
    rc
}
