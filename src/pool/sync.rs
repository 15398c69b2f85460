//! What the program's synchronizations and streams tell the pool.

use super::*;

impl<B: Backend> Pool<B> {
    /// The program created a non-blocking stream. The first time, every device's trace records
    /// it (a device made meanwhile may miss it: only a replay's fidelity depends on it).
    pub fn note_nonblocking_stream(&self) {
        if !self.nonblocking_seen.swap(true, Ordering::Relaxed) && self.settings.trace.is_some() {
            for d in 0..MAX_DEVICES as u32 {
                if let Some(slot) = self.existing(d) {
                    Self::lock(slot).note_nonblocking_stream();
                }
            }
        }
    }

    /// The current sequence number of `device`, read before a program synchronization starts.
    /// (The thread caches' epoch moves on only while caches exist: a kernel launch in `barrier`
    /// mode reads this too, and needs no shared write otherwise.)
    pub fn seq_before_sync(&self, device: u32) -> SyncSeq {
        match self.existing(device) {
            None => SyncSeq::default(),
            Some(s) if s.flags.any.load(Ordering::Acquire) => s.clock.before_sync(),
            Some(s) => SyncSeq {
                freed: s.clock.freed.load(Ordering::Acquire),
                epoch: 0,
            },
        }
    }

    /// The program's `cudaDeviceSynchronize` on `device` returned: every block freed before
    /// `at` is safe. Also a release point for the threshold.
    pub fn observe_fence(&self, device: u32, at: SyncSeq) {
        if let Some(slot) = self.existing(device) {
            slot.clock.fenced_at(at);
            self.sync_point(device);
        }
    }

    /// The program put an action on `device`'s legacy stream after `at`.
    pub fn observe_barrier(&self, device: u32, at: SyncSeq) {
        if let Some(slot) = self.existing(device) {
            slot.clock.barriered_at(at);
        }
    }

    /// A synchronization the program made: apply the release threshold.
    pub fn sync_point(&self, device: u32) {
        if let Some(slot) = self.existing(device) {
            let mut p = Self::lock(slot);
            slot.caches.sweep_orphans(&mut p, &slot.clock);
            p.sync_point(&self.timed(slot), &slot.clock);
        }
    }
}
