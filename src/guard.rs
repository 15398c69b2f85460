//! The panic boundary every exported function goes through, and the reentrancy guard, which
//! also makes, at a thread's first entry, the per-thread state the pool's locks need
//! (docs/design-notes.md, "Note: the loader lock").

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;

use crate::log;

/// What the pool keeps per thread: whether the thread is inside the pool (`Where`), whether its
/// backend's per-thread state is made (`Inside::backend_ready`), and the device of its last
/// allocation from the pool (where its next `cudaFree` looks first); and the stream its last
/// stream-ordered allocation on a created stream named, with its id (the runtime's and the
/// driver's are the same), which its next free on that stream need not ask
/// (`dispatch::stream_names::remembered`). One thread-local, so a hook reaches all with one
/// access: in a preloaded library each access is a call to `__tls_get_addr`.
///
/// The backend's state and the last device also say whether the thread has the context its
/// first pooled call gave it (`dispatch::bind_context`): a thread that lost it has both set back
/// as they were before that call (`Inside::forget_context`), so that the hit path needs no test
/// of its own.
pub struct Thread {
    place: Cell<Where>,
    backend_ready: Cell<bool>,
    last_device: Cell<u32>,
    last_stream: Cell<(usize, u64)>,
}

/// Where a thread is. A thread's first entry is told apart from the others by the same test that
/// tells inside from outside, so the hit path pays nothing for it.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Where {
    /// Never entered the pool: its first entry makes what the pool's locks need (`first_entry`).
    New = 2,
    Outside = 0,
    Inside = 1,
}

/// `Thread::last_device` before the thread's first allocation from the pool, and again once it
/// lost its context (`Inside::forget_context`).
pub const NO_DEVICE: u32 = u32::MAX;

thread_local! {
    // Const-initialised and without a destructor: no allocation, no registration, usable at any
    // point of a thread's life.
    static THREAD: Thread = const {
        Thread {
            place: Cell::new(Where::New),
            backend_ready: Cell::new(false),
            last_device: Cell::new(NO_DEVICE),
            last_stream: Cell::new((0, u64::MAX)),
        }
    };
}

/// Held while this thread is inside the pool. Not `Send`: it points at this thread's `Thread`.
pub struct Inside(*const Thread);

impl Inside {
    /// The device of this thread's last allocation from the pool, or `NO_DEVICE`.
    #[inline(always)]
    pub fn last_device(&self) -> u32 {
        self.thread().last_device.get()
    }

    /// Make `device` the device of this thread's last allocation; returns the one before
    /// (`NO_DEVICE` at the thread's first).
    #[inline(always)]
    pub fn replace_last_device(&self, device: u32) -> u32 {
        self.thread().last_device.replace(device)
    }

    /// Whether this thread made the backend's per-thread state (`dispatch::ready_for_backend`).
    #[inline(always)]
    pub fn backend_ready(&self) -> bool {
        self.thread().backend_ready.get()
    }

    /// The stream handle this thread's last stream-ordered allocation named on a created
    /// stream, with its id (`dispatch::stream_names::remember`).
    pub fn set_last_stream(&self, last: (usize, u64)) {
        self.thread().last_stream.set(last);
    }

    /// This thread made the backend's per-thread state.
    pub fn set_backend_ready(&self) {
        self.thread().backend_ready.set(true);
    }

    /// Whether the pool counts this thread as having been given its context: it served the
    /// thread, or made its backend state, which binds the context too.
    pub fn gave_context(&self) -> bool {
        let t = self.thread();
        t.last_device.get() != NO_DEVICE || t.backend_ready.get()
    }

    /// This thread has no current context any more. Its next call the pool serves binds one
    /// again, as its first did, since CUDA's own call would have (`dispatch::bind_context`).
    /// Its next free then looks for the block on the current device first.
    pub fn forget_context(&self) {
        let t = self.thread();
        t.last_device.set(NO_DEVICE);
        t.backend_ready.set(false);
    }

    #[inline(always)]
    fn thread(&self) -> &Thread {
        // SAFETY: `THREAD` has no destructor, so its storage lives as long as this thread, and
        // `Inside` never leaves the thread that made it (a raw pointer is not `Send`).
        unsafe { &*self.0 }
    }
}

impl Drop for Inside {
    #[inline(always)]
    fn drop(&mut self) {
        self.thread().place.set(Where::Outside);
    }
}

/// Enter the pool, or `None` when this thread already is inside it (a runtime call the pool made
/// came back to a hook): such calls go straight to the runtime.
#[inline(always)]
pub fn enter() -> Option<Inside> {
    // The guard is made only when the thread was outside: dropping one made while inside would
    // mark the thread outside while its outer call goes on.
    THREAD
        .try_with(|t| {
            // Outside, the hit path's case, is one test of memory; the others are out of line,
            // and only their answer is tested again.
            if t.place.get() != Where::Outside && !enter_not_outside(t) {
                return None;
            }
            t.place.set(Where::Inside);
            Some(Inside(t))
        })
        .ok()
        .flatten()
}

/// `enter` for a thread not outside the pool: false when it is inside it already; a new
/// thread's first entry makes what the pool's locks need first.
#[cold]
#[inline(never)]
fn enter_not_outside(t: &Thread) -> bool {
    match t.place.get() {
        Where::Inside => false,
        Where::New => {
            // Inside before the first entry's work: a signal handler's call that lands in it is
            // refused as during any other call, rather than make the same per-thread data again,
            // or wait for the lock of parking_lot's table that the interrupted entry holds.
            t.place.set(Where::Inside);
            first_entry();
            true
        }
        Where::Outside => true,
    }
}

/// Whether this thread never entered the pool: no state of its own to look after, and none
/// made by asking.
pub fn never_entered() -> bool {
    THREAD
        .try_with(|t| t.place.get() == Where::New)
        .unwrap_or(true)
}

/// The stream handle this thread's last stream-ordered allocation on a created stream named
/// and the name it got, `(0, u64::MAX)` before (`dispatch::stream_names::remembered`); `None`
/// while the thread is torn down. Its own thread-local access, made only by frees that ask the
/// runtime or the driver anyway: reached through the free's `Inside`, it cost every free on the
/// legacy stream an instruction.
pub fn last_stream() -> Option<(usize, u64)> {
    THREAD.try_with(|t| t.last_stream.get()).ok()
}

/// Whether this thread is yet to make the backend's per-thread state; marks it made. For calls
/// off the allocation path, where no `Inside` is at hand (`Inside::backend_ready` costs no
/// thread-local access).
pub fn backend_unready() -> bool {
    THREAD
        .try_with(|t| !t.backend_ready.replace(true))
        .unwrap_or(false)
}

/// Whether this thread is inside the pool now (a call from a signal handler that interrupted
/// it, or from a runtime callback during the pool's own call).
pub fn inside() -> bool {
    THREAD
        .try_with(|t| t.place.get() == Where::Inside)
        .unwrap_or(false)
}

/// A thread's first entry, holding none of the pool's locks: `parking_lot` makes its per-thread
/// data, whose destructor glibc registers under the dynamic linker's lock, now rather than at
/// the thread's first wait for a lock, which may come while it holds another of the pool's
/// locks. A thread inside `dlopen` holds the linker's lock and may wait for that one.
#[cold]
#[inline(never)]
fn first_entry() {
    #[cfg(test)]
    if let Some(interrupt) = tests::DURING_FIRST_ENTRY.with(Cell::take) {
        interrupt();
    }
    static KEY: u8 = 0;
    // SAFETY: the key is the address of a static of this module, which no lock uses, and the
    // validation refuses the wait: nothing is queued, nothing parks.
    unsafe {
        parking_lot_core::park(
            &KEY as *const u8 as usize,
            || false,
            || {},
            |_, _| {},
            parking_lot_core::DEFAULT_PARK_TOKEN,
            None,
        );
    }
}

static PANICKED: AtomicBool = AtomicBool::new(false);

/// Run `f`; a panic becomes `on_panic` and one line on stderr, never an unwind into C.
/// Inlined: each exported function is then one frame, the hit path's cost down by a call.
#[inline(always)]
pub fn boundary<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            panicked();
            on_panic
        }
    }
}

#[cold]
#[inline(never)]
fn panicked() {
    // Said already, with the place, by the hook `quiet_panics` installs.
    log::warn_once(&PANICKED, || {
        "internal error in libgpupool (a bug: please report it); the call failed".into()
    });
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

    thread_local! {
        /// Run once by this thread's first entry, as a signal handler that lands there would.
        pub(super) static DURING_FIRST_ENTRY: Cell<Option<fn()>> = const { Cell::new(None) };
        /// Whether the call `DURING_FIRST_ENTRY` made got in.
        static NESTED_GOT_IN: Cell<Option<bool>> = const { Cell::new(None) };
    }

    /// A signal handler's call during a thread's first entry is refused, as during any other
    /// call: let in, it would make parking_lot's per-thread data again, or wait for ever for
    /// the lock of parking_lot's table the interrupted entry holds.
    #[test]
    fn a_call_made_during_a_threads_first_entry_is_refused() {
        std::thread::spawn(|| {
            fn handler() {
                NESTED_GOT_IN.with(|n| n.set(Some(enter().is_some())));
            }
            DURING_FIRST_ENTRY.with(|h| h.set(Some(handler)));
            let outer = enter().expect("a new thread's first entry");
            assert_eq!(
                NESTED_GOT_IN.with(Cell::get),
                Some(false),
                "the nested call got in"
            );
            assert!(inside(), "the first entry's call is still inside");
            drop(outer);
            assert!(!inside());
        })
        .join()
        .expect("the test thread");
    }

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
