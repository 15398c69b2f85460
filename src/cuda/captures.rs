//! The streams the program began capturing into a CUDA graph, through the runtime or the driver.
//!
//! CUDA refuses a device synchronization while one of the device's streams is being captured,
//! and a use of the legacy stream while a blocking stream is: either invalidates the program's
//! capture. So while a capture is underway the pool takes no fence and issues no barrier; its
//! waiting blocks wait for the next one after the capture.
//!
//! One registry serves both APIs, keyed by stream: a capture begun through the runtime may end
//! through the driver, and a runtime that reaches the driver through the pool's hooks shows the
//! same capture to both. Noting a stream twice keeps one entry; one end removes it.
//!
//! A gate orders the two (`capture_gate`): a fence or barrier is in from its look at the
//! registry to its end (`quiet`), and a begin waits for it, from its call to its note
//! (`begin`). Without it a capture another thread began between the look and the
//! synchronization was invalidated.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::capture_gate::{self, Fencing};
use super::types::{Stream, STREAM_PER_THREAD};

/// `cudaStreamIsCapturing` or `cuStreamIsCapturing`: the same signature and status values.
pub type IsCapturingFn = unsafe extern "C" fn(Stream, *mut i32) -> i32;

/// A stream being captured: its address, and for the per-thread default stream (one address,
/// a stream per thread) the capturing thread; 0 for every other stream.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Entry {
    stream: usize,
    thread: u64,
}

impl Entry {
    fn of(stream: Stream) -> Entry {
        let stream = stream as usize;
        let thread = if stream == STREAM_PER_THREAD {
            this_thread()
        } else {
            0
        };
        Entry { stream, thread }
    }
}

fn this_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// The streams seen to begin a capture and not seen to end it.
static STREAMS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
/// Their number: the fence path reads only this while no capture was ever begun.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn streams() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    STREAMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A capture's begin on `stream` (`call`, which answers as CUDA does, 0 for success): made
/// once the pool's fences in progress end (`capture_gate`), and noted if it succeeded.
pub fn begin(stream: Stream, call: impl FnOnce() -> i32) -> i32 {
    let _beginning = capture_gate::enter_begin();
    noted(stream, call())
}

/// A begin on `stream` made from inside the pool: a signal handler that interrupted a pool
/// call on this thread, maybe a fence or barrier that is in, which it would wait for
/// (docs/guarantees.md, "Signal handlers"); or the runtime's begin, past the gate already,
/// reaching the driver's hook. Made without the gate: a fence in progress may invalidate the
/// capture. Noted if it succeeded.
pub fn begin_inside(stream: Stream, call: impl FnOnce() -> i32) -> i32 {
    noted(stream, call())
}

fn noted(stream: Stream, r: i32) -> i32 {
    if r == 0 {
        began(stream);
    }
    r
}

/// No capture underway, and none begins while it is held (`capture_gate`): what a fence or a
/// barrier of the pool holds for its whole length.
pub struct Quiet {
    _fencing: Fencing,
}

/// `Quiet`, or `None` while a capture is underway (`underway`).
pub fn quiet(is_capturing: Option<IsCapturingFn>) -> Option<Quiet> {
    let fencing = capture_gate::enter_fence();
    (!underway(is_capturing)).then_some(Quiet { _fencing: fencing })
}

/// `stream` began a capture (noted once, whichever layers saw it).
fn began(stream: Stream) {
    let entry = Entry::of(stream);
    let mut s = streams();
    if !s.contains(&entry) {
        s.push(entry);
    }
    COUNT.store(s.len(), Ordering::Release);
}

/// `stream`'s capture ended (with a graph or invalidated).
pub fn ended(stream: Stream) {
    let entry = Entry::of(stream);
    let mut s = streams();
    s.retain(|&e| e != entry);
    COUNT.store(s.len(), Ordering::Release);
}

/// Error 400 of both APIs: the stream no longer exists.
const INVALID_HANDLE: i32 = 400;
/// Error 709 of both APIs: the stream's context was destroyed with it.
const CONTEXT_IS_DESTROYED: i32 = 709;

/// Whether a capture is underway, asked of `is_capturing` (the runtime's where the pool's calls
/// go to a runtime, else the driver's). A stream whose capture ended unseen is dropped once it
/// is said not to be capturing, or to be gone (destroyed while capturing, or with its context).
/// Any other error (this thread has no context) says nothing of the capture, which stays.
/// Without a query, every noted capture counts as underway.
fn underway(is_capturing: Option<IsCapturingFn>) -> bool {
    if COUNT.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Some(is_capturing) = is_capturing else {
        return true;
    };
    let me = this_thread();
    let mut s = streams();
    s.retain(|e| {
        // Another thread's own: this thread cannot ask about it.
        if e.stream == STREAM_PER_THREAD && e.thread != me {
            return true;
        }
        let mut status = 0;
        // SAFETY: a stream the program captured, and a valid out-pointer.
        let r = unsafe { is_capturing(e.stream as Stream, &mut status) };
        match r {
            0 => status != 0,
            INVALID_HANDLE | CONTEXT_IS_DESTROYED => false,
            _ => true,
        }
    });
    COUNT.store(s.len(), Ordering::Release);
    !s.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The capture's state, as a query from a thread with or without a context answers it.
    unsafe extern "C" fn no_context(_: Stream, _: *mut i32) -> i32 {
        201
    }
    unsafe extern "C" fn gone(_: Stream, _: *mut i32) -> i32 {
        INVALID_HANDLE
    }

    // One test: the registry is the process's.
    #[test]
    fn a_capture_stays_underway_until_cuda_says_it_ended_or_its_stream_is_gone() {
        let stream = 0x5eed0 as Stream;
        began(stream);
        began(stream);
        assert!(
            underway(Some(no_context)),
            "a thread without a context cannot end it"
        );
        assert!(underway(None));
        assert!(!underway(Some(gone)), "a destroyed stream captures nothing");
        began(stream);
        ended(stream);
        assert!(!underway(None), "one end forgets a capture noted twice");
    }
}
