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
    // Not `then_some(Inside(()))`: that makes the guard even when the thread is inside already,
    // and dropping the unused one would mark the thread outside while its outer call goes on.
    INSIDE
        .try_with(|c| {
            if c.replace(true) {
                None
            } else {
                Some(Inside(()))
            }
        })
        .ok()
        .flatten()
}

/// Whether this thread is inside the pool now (a call from a signal handler that interrupted
/// it, or from a runtime callback during the pool's own call).
pub fn inside() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(false)
}

static PANICKED: AtomicBool = AtomicBool::new(false);

/// Run `f`; a panic becomes `on_panic` and one line on stderr, never an unwind into C.
pub fn boundary<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            // Said already, with the place, by the hook `quiet_panics` installs.
            log::warn_once(&PANICKED, || {
                "internal error in libgpupool (a bug: please report it); the call failed".into()
            });
            on_panic
        }
    }
}

/// Replace the standard panic message (a multi-line report, a backtrace under the program's
/// `RUST_BACKTRACE`, on every panic) with the one line `boundary` promises, once per process,
/// naming where it happened. The shared library carries its own copy of Rust's standard library,
/// so this hook sees only the library's panics, never those of a Rust program that loads it.
pub fn quiet_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let place = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let payload = info.payload();
            let what = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("a panic");
            log::warn_once(&PANICKED, || {
                format!(
                    "internal error in libgpupool{place}: {what} (a bug: please report it); \
                     the call failed"
                )
            });
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_entry_leaves_the_thread_inside() {
        let outer = enter().expect("first entry");
        assert!(inside());
        // Nested attempts (a signal handler's calls) are refused, every one of them, and leave
        // the outer call's mark alone.
        for _ in 0..3 {
            assert!(enter().is_none());
            assert!(inside());
        }
        drop(outer);
        assert!(!inside());
        assert!(enter().is_some(), "free to enter again");
        assert!(!inside());
    }
}
