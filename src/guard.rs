//! The panic boundary every exported function goes through, and the reentrancy guard.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;

use crate::log;

thread_local! {
    // Const-initialised and without a destructor: no allocation, no registration, usable at any
    // point of a thread's life.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Held while this thread is inside the pool.
pub struct Inside(());

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|c| c.set(false));
    }
}

/// Enter the pool, or `None` when this thread already is inside it (a runtime call the pool made
/// came back to a hook): such calls go straight to the runtime.
pub fn enter() -> Option<Inside> {
    INSIDE
        .try_with(|c| (!c.replace(true)).then_some(Inside(())))
        .ok()
        .flatten()
}

static PANICKED: AtomicBool = AtomicBool::new(false);

/// Run `f`; a panic becomes `on_panic` and one line on stderr, never an unwind into C.
pub fn boundary<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            log::warn_once(&PANICKED, || {
                "internal error in libgpupool (a bug: please report it); the call failed".into()
            });
            on_panic
        }
    }
}
