//! The lock of a thread cache (`tcache.rs`): almost only its own thread takes it, so the cost
//! that counts is the uncontended pair. `parking_lot`'s unlock is a compare-exchange (it must
//! see parked waiters); this one releases with a plain store, and a waiter (another thread
//! taking blocks back under the device lock, for a few microseconds at most) spins, then
//! yields. Measured on the two-thread churn (BENCHMARKS.md).

use parking_lot::lock_api::{self, GuardSend, RawMutex, RawMutexTimed};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Spins before each yield while the lock is taken.
const SPINS: u32 = 64;

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
        loop {
            for _ in 0..SPINS {
                if !self.0.load(Ordering::Relaxed) && self.try_lock() {
                    return;
                }
                std::hint::spin_loop();
            }
            std::thread::yield_now();
        }
    }
}

// SAFETY: as for `RawMutex`: a timed attempt only gives up sooner.
unsafe impl RawMutexTimed for RawSpin {
    type Duration = Duration;
    type Instant = Instant;

    fn try_lock_for(&self, timeout: Duration) -> bool {
        self.try_lock_until(Instant::now() + timeout)
    }

    fn try_lock_until(&self, deadline: Instant) -> bool {
        loop {
            if self.try_lock() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }
}

/// A mutex on `RawSpin`, with `parking_lot`'s interface.
pub type SpinMutex<T> = lock_api::Mutex<RawSpin, T>;
/// Its guard.
pub type SpinGuard<'a, T> = lock_api::MutexGuard<'a, RawSpin, T>;
