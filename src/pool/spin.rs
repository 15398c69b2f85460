//! The lock of a thread cache (`tcache/`): almost only its own thread takes it, so the cost
//! that counts is the uncontended pair. `parking_lot`'s unlock is a compare-exchange (it must
//! see parked waiters); this one releases with a plain store, and a waiter (another thread
//! taking blocks back, or freeing a block this thread handed out) spins, then yields, then
//! sleeps for growing spells: a holder that was preempted gets its CPU back even when the
//! waiter has a higher real-time priority or the process a CPU quota. Measured on the
//! two-thread churn (BENCHMARKS.md).

use parking_lot::lock_api::{self, GuardSend, RawMutex, RawMutexTimed};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Spins before each yield while the lock is taken.
const SPINS: u32 = 64;
/// Yields before the waiter starts to sleep.
const YIELDS: u32 = 16;
/// The longest sleep between two attempts.
const MAX_SLEEP: Duration = Duration::from_millis(1);

pub struct RawSpin(AtomicBool);

// SAFETY: `lock` returns only once this thread changed the flag from false to true (Acquire),
// and `unlock` stores false (Release): one holder at a time, and the holder's writes are seen
// by the next one.
unsafe impl RawMutex for RawSpin {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawSpin = RawSpin(AtomicBool::new(false));
    type GuardMarker = GuardSend;

    #[inline]
    fn lock(&self) {
        if !self.try_lock() {
            self.lock_slow();
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.0
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[inline]
    unsafe fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl RawSpin {
    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        let mut backoff = Backoff::default();
        loop {
            for _ in 0..SPINS {
                if !self.0.load(Ordering::Relaxed) && self.try_lock() {
                    return;
                }
                std::hint::spin_loop();
            }
            backoff.wait();
        }
    }
}

/// Between two rounds of spinning: yield, then sleep 1 µs, 2 µs, ... up to `MAX_SLEEP`.
#[derive(Default)]
struct Backoff {
    rounds: u32,
}

impl Backoff {
    fn wait(&mut self) {
        self.rounds = self.rounds.saturating_add(1);
        match self.rounds.checked_sub(YIELDS) {
            None => std::thread::yield_now(),
            Some(n) => {
                let sleep = Duration::from_micros(1 << n.min(10)).min(MAX_SLEEP);
                // A sleep is a cancellation point, and the waiter may hold the device's lock.
                super::cancel::uncancellable(|| std::thread::sleep(sleep));
            }
        }
    }
}

// SAFETY: as for `RawMutex`: a timed attempt only gives up sooner.
unsafe impl RawMutexTimed for RawSpin {
    type Duration = Duration;
    type Instant = Instant;

    fn try_lock_for(&self, timeout: Duration) -> bool {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_lock_until(deadline),
            None => {
                self.lock();
                true
            }
        }
    }

    fn try_lock_until(&self, deadline: Instant) -> bool {
        let mut backoff = Backoff::default();
        loop {
            if self.try_lock() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            backoff.wait();
        }
    }
}

/// A mutex on `RawSpin`, with `parking_lot`'s interface.
pub type SpinMutex<T> = lock_api::Mutex<RawSpin, T>;
/// Its guard.
pub type SpinGuard<'a, T> = lock_api::MutexGuard<'a, RawSpin, T>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_take_turns_and_see_each_others_writes() {
        let m = Arc::new(SpinMutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = Arc::clone(&m);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *m.lock() += 1;
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*m.lock(), 80_000);
    }

    #[test]
    fn a_timed_attempt_gives_up_while_the_lock_is_held_and_waits_for_a_release() {
        let m = Arc::new(SpinMutex::new(()));
        let held = m.lock();
        let t = Instant::now();
        assert!(m.try_lock_for(Duration::from_millis(30)).is_none());
        assert!(t.elapsed() >= Duration::from_millis(30));
        // A waiter that sleeps between attempts still gets the lock once it is released.
        let waiter = {
            let m = Arc::clone(&m);
            std::thread::spawn(move || m.try_lock_for(Duration::from_secs(30)).is_some())
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        assert!(waiter.join().unwrap());
        assert!(m.try_lock_for(Duration::MAX).is_some());
    }
}
