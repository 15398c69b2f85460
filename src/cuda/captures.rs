//! The streams the program began capturing into a CUDA graph through the runtime.
//!
//! CUDA refuses a device synchronization while one of the device's streams is being captured,
//! and a use of the legacy stream while a blocking stream is: either invalidates the program's
//! capture. So while a capture is underway the pool takes no fence and issues no barrier; its
//! waiting blocks wait for the next one after the capture.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::runtime::Runtime;
use super::types::{Stream, STREAM_PER_THREAD, SUCCESS};

/// The streams seen to begin a capture and not seen to end it, by address.
static STREAMS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Their number: the fence path reads only this while no capture was ever begun.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn streams() -> std::sync::MutexGuard<'static, Vec<usize>> {
    STREAMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// `stream` began a capture.
pub fn began(stream: Stream) {
    let mut s = streams();
    s.push(stream as usize);
    COUNT.store(s.len(), Ordering::Release);
}

/// `stream`'s capture ended (with a graph or invalidated).
pub fn ended(stream: Stream) {
    let mut s = streams();
    if let Some(i) = s.iter().position(|&x| x == stream as usize) {
        s.swap_remove(i);
    }
    COUNT.store(s.len(), Ordering::Release);
}

/// Whether a capture is underway. A stream whose capture ended unseen (destroyed while
/// capturing) is dropped once the runtime says it is not capturing.
pub fn underway(rt: &Runtime) -> bool {
    if COUNT.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Some(is_capturing) = rt.stream_is_capturing else {
        return true;
    };
    let mut s = streams();
    s.retain(|&stream| {
        // Each thread's own: this thread cannot ask about the capturing thread's.
        if stream == STREAM_PER_THREAD {
            return true;
        }
        let mut status = 0;
        // SAFETY: a stream the program captured, and a valid out-pointer.
        let r = unsafe { is_capturing(stream as Stream, &mut status) };
        r == SUCCESS && status != 0
    });
    COUNT.store(s.len(), Ordering::Release);
    !s.is_empty()
}
