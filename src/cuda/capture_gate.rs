//! The order between the pool's fences and barriers and the program's capture begins.
//!
//! A fence looks at the captures underway, then synchronizes the device; a capture begun in
//! between makes CUDA refuse the synchronization and invalidate the capture. So a fence stays
//! "in" from its look to its end (`enter_fence`), and a begin waits for the fences in to end
//! (`enter_begin`); fences wait while a begin waits or runs.
//!
//! Each wait is bounded (`PATIENCE`). CUDA checks for captures when a synchronization starts,
//! so only the moments from the pool's look to that start matter, a few microseconds; a fence
//! that lasts longer is synchronizing already, and a begin may go ahead. A bound also means no
//! hang where a fence's work can finish only after the waiting thread acts (another device's
//! half of a collective, a host function waiting for the program), nor where the runtime's
//! begin waits for the loader lock a fencing constructor holds (docs/design-notes.md, "Note:
//! the loader lock").

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest either side waits for the other.
const PATIENCE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    /// Fences and barriers between their look at the captures and their end.
    fences: u32,
    /// Begins waiting for those to end.
    waiting_begins: u32,
    /// Begins running.
    begins: u32,
}

static STATE: Mutex<State> = Mutex::new(State {
    fences: 0,
    waiting_begins: 0,
    begins: 0,
});
static CHANGED: Condvar = Condvar::new();

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `guard`, after waiting until `blocked` is false, or `PATIENCE` has passed.
fn wait_while(
    mut guard: MutexGuard<'static, State>,
    blocked: impl Fn(&State) -> bool,
) -> MutexGuard<'static, State> {
    let deadline = Instant::now() + PATIENCE;
    while blocked(&guard) {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            break;
        };
        guard = CHANGED
            .wait_timeout(guard, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    guard
}

/// A fence or barrier in: until it drops, begins wait (`PATIENCE` at most).
pub struct Fencing(());

/// Waits while a begin waits or runs (`PATIENCE` at most), then is in.
pub fn enter_fence() -> Fencing {
    let mut s = wait_while(state(), |s| s.begins > 0 || s.waiting_begins > 0);
    s.fences += 1;
    Fencing(())
}

impl Drop for Fencing {
    fn drop(&mut self) {
        let mut s = state();
        s.fences -= 1;
        if s.fences == 0 {
            CHANGED.notify_all();
        }
    }
}

/// A begin running: until it drops, fences wait (`PATIENCE` at most).
pub struct Beginning(());

/// Waits while fences are in (`PATIENCE` at most), then runs.
pub fn enter_begin() -> Beginning {
    let mut s = state();
    s.waiting_begins += 1;
    let mut s = wait_while(s, |s| s.fences > 0);
    s.waiting_begins -= 1;
    s.begins += 1;
    Beginning(())
}

impl Drop for Beginning {
    fn drop(&mut self) {
        let mut s = state();
        s.begins -= 1;
        if s.begins == 0 && s.waiting_begins == 0 {
            CHANGED.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the gate is the process's.
    #[test]
    fn each_side_waits_for_the_other_until_its_patience_runs_out() {
        // A begin waits for the fence in, which ends 100 ms later.
        use std::sync::atomic::{AtomicBool, Ordering};
        static ENDED: AtomicBool = AtomicBool::new(false);
        let fence = enter_fence();
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            ENDED.store(true, Ordering::SeqCst);
            drop(fence);
        });
        let begin = enter_begin();
        assert!(ENDED.load(Ordering::SeqCst), "it waited for the fence");
        ender.join().unwrap();
        drop(begin);
        // A fence that never ends holds a begin back for `PATIENCE`, then no longer.
        let stuck = enter_fence();
        let t = Instant::now();
        let begin = enter_begin();
        assert!(t.elapsed() >= PATIENCE, "it waited its patience");
        // And the fences after it wait for the begin, as long.
        let t = Instant::now();
        let second = enter_fence();
        assert!(t.elapsed() >= PATIENCE);
        drop((stuck, second, begin));
        let s = state();
        assert_eq!((s.fences, s.waiting_begins, s.begins), (0, 0, 0));
        drop(s);
        // Many threads at both sides at once: each gets in, and the counters come back to zero.
        let threads: Vec<_> = (0..8u64)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut x = i * 2654435761 + 1;
                    for _ in 0..3000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if x % 2 == 0 {
                            let _fence = enter_fence();
                            if x % 7 == 0 {
                                std::thread::sleep(Duration::from_micros(x % 300));
                            }
                        } else {
                            let _begin = enter_begin();
                            if x % 5 == 0 {
                                std::thread::yield_now();
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = state();
        assert_eq!((s.fences, s.waiting_begins, s.begins), (0, 0, 0));
    }
}
