//! Waits inside a program's call kept out of reach of `pthread_cancel`.
//!
//! A thread with deferred cancellation acts on a pending cancel at the next cancellation point:
//! a sleep, a `write`, an `open`, a `close`. Inside the pool that would unwind through its frames.
//! The panic boundary cannot let such an unwind pass, so glibc aborts the process ("exception
//! not rethrown"), and the locks the thread held would stay taken. So every wait the pool makes
//! on a program's thread runs with cancellation off; a cancel sent meanwhile acts at the
//! thread's next cancellation point in the program, as it would without the pool.

use std::ffi::c_int;

/// glibc's and musl's value (the `libc` crate does not declare it for Linux).
const PTHREAD_CANCEL_DISABLE: c_int = 1;

extern "C" {
    fn pthread_setcancelstate(state: c_int, oldstate: *mut c_int) -> c_int;
}

/// Puts the thread's cancel state back when dropped, also if the wait panicked.
struct Restore(c_int);

impl Drop for Restore {
    fn drop(&mut self) {
        let mut previous = 0;
        // SAFETY: a state glibc gave back, and a valid out-parameter.
        unsafe { pthread_setcancelstate(self.0, &mut previous) };
    }
}

/// Run `f` (a wait: a sleep, a write, an open) with this thread's cancellation off. It costs two
/// atomic operations: for waits and system calls, never for the hit path.
pub fn uncancellable<T>(f: impl FnOnce() -> T) -> T {
    // Miri has no `pthread_setcancelstate`, and its threads are never cancelled.
    if cfg!(miri) {
        return f();
    }
    let mut old = 0;
    // SAFETY: a valid state and out-parameter; the call only changes this thread's state.
    unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
    let _restore = Restore(old);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's cancel state (read by setting it to itself).
    fn state() -> c_int {
        let mut old = 0;
        // SAFETY: valid out-parameters; the state is set back at once.
        unsafe {
            pthread_setcancelstate(0, &mut old);
            pthread_setcancelstate(old, &mut 0);
        }
        old
    }

    #[test]
    fn cancellation_is_off_inside_and_as_before_after_also_when_nested() {
        let before = state();
        assert_ne!(before, PTHREAD_CANCEL_DISABLE);
        let inner = uncancellable(|| {
            let outer = state();
            (outer, uncancellable(state), state())
        });
        assert_eq!(
            inner,
            (
                PTHREAD_CANCEL_DISABLE,
                PTHREAD_CANCEL_DISABLE,
                PTHREAD_CANCEL_DISABLE
            )
        );
        assert_eq!(state(), before);
        let _ = std::panic::catch_unwind(|| uncancellable(|| panic!("inside")));
        assert_eq!(state(), before, "a panic inside left cancellation off");
    }
}
