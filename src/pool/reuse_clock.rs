//! Each device's sequence numbers of frees, fences and barriers, readable without its lock:
//! what makes a freed block reusable, in the device and in thread caches.

use std::sync::atomic::{AtomicU64, Ordering};

use super::spin;

/// Sequence numbers of one device, readable without its lock. A free takes the next `freed`
/// number; a fence or barrier that started after `freed` reached `n` sets `fenced`/`barriered`
/// to at least `n`, which makes every block stamped below `n` reusable.
///
/// Thread caches stamp their frees with `cache_epoch` as it is, without the device's lock and
/// without writing it (a write on every free would move its line between the threads); every
/// fence or barrier, the pool's or the program's, moves the epoch on before it starts and
/// raises `cache_fenced`/`cache_barriered` to the epoch it started in once it completed.
#[derive(Default)]
pub struct ReuseClock {
    pub freed: AtomicU64,
    pub fenced: AtomicU64,
    pub barriered: AtomicU64,
    pub cache_epoch: AtomicU64,
    pub cache_fenced: AtomicU64,
    pub cache_barriered: AtomicU64,
}

/// What a fence or barrier will cover, read before it starts (`ReuseClock::before_sync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncSeq {
    /// Blocks the device stamped below this.
    pub freed: u64,
    /// Blocks thread caches stamped below this.
    pub epoch: u64,
}

impl ReuseClock {
    /// Read before a fence or barrier starts: what it will cover once it completed.
    pub fn before_sync(&self) -> SyncSeq {
        SyncSeq {
            freed: self.freed.load(Ordering::Acquire),
            epoch: self.cache_epoch.fetch_add(1, Ordering::SeqCst) + 1,
        }
    }

    /// A fence that started at `at` completed. Returns the device's fenced sequence.
    pub fn fenced_at(&self, at: SyncSeq) -> u64 {
        self.cache_fenced.fetch_max(at.epoch, Ordering::SeqCst);
        self.fenced
            .fetch_max(at.freed, Ordering::AcqRel)
            .max(at.freed)
    }

    /// A barrier that started at `at` completed. Returns the device's barriered sequence.
    pub fn barriered_at(&self, at: SyncSeq) -> u64 {
        self.cache_barriered.fetch_max(at.epoch, Ordering::SeqCst);
        self.barriered
            .fetch_max(at.freed, Ordering::AcqRel)
            .max(at.freed)
    }

    /// The cache epoch a block freed now into a thread cache waits on. The program's work issued
    /// before the free must be ordered ahead of this read. Contract: the caller holds `_locked`,
    /// the cache's lock, taken during this free after the program's call. On x86-64 the locked
    /// instruction that took it did the ordering (a full barrier there; one more cost a fifth of
    /// the free path under two threads); elsewhere a fence does.
    pub fn cache_stamp<T>(&self, _locked: &spin::SpinGuard<'_, T>) -> u64 {
        #[cfg(not(target_arch = "x86_64"))]
        std::sync::atomic::fence(Ordering::SeqCst);
        self.cache_epoch.load(Ordering::SeqCst)
    }

    /// The stamp of a block freed now. Only frees under the device's lock write the sequence:
    /// no atomic read-modify-write needed (the hit path's cost is its atomic operations).
    pub fn stamp_under_lock(&self) -> u64 {
        let seq = self.freed.load(Ordering::Relaxed);
        self.freed.store(seq + 1, Ordering::Release);
        seq
    }
}
