//! What the program's synchronizations and streams tell the pool.

use super::*;

impl<B: Backend> Pool<B> {
    /// Whether frees may still wait for barriers: a mode that uses them, and no work beyond them
    /// noted yet (`note_work_beyond_barriers` may then fence).
    pub fn barriers_in_use(&self) -> bool {
        self.settings.reuse != ReuseMode::Strict && !self.beyond_barriers.load(Ordering::Acquire)
    }

    /// The program made work that no barrier orders: a non-blocking stream, or a context of its
    /// own (whose streams order themselves against that context's legacy stream alone, not the
    /// primary context's where barriers are). From now on frees in `barrier` mode, and
    /// stream-ordered ones in `relaxed` mode, wait for a fence (`need_for`). The first time,
    /// each device whose frees no fence has covered yet takes one: a block freed before waited
    /// only for a barrier (or was reusable after one already) while its kernel may still run,
    /// and the new work would not wait for that kernel.
    /// Every device's trace records it too (a device made meanwhile may miss it: only a
    /// replay's fidelity depends on it).
    pub fn note_work_beyond_barriers(&self) {
        if self.beyond_barriers.swap(true, Ordering::SeqCst) {
            return;
        }
        let barriers = self.settings.reuse != ReuseMode::Strict;
        if !barriers && !self.tracing() {
            return;
        }
        for d in 0..MAX_DEVICES as u32 {
            let Some(slot) = self.existing(d) else {
                continue;
            };
            // Under the lock, which frees read the mode's rule under too (`free`): a free that
            // read it before the swap above is stamped, or in a cache, by the time this reads.
            let mut p = Self::lock(slot);
            // Frees into thread caches take no device number: with caches, fence anyway.
            let unfenced = slot.clock.fenced.load(Ordering::Acquire)
                < slot.clock.freed.load(Ordering::Acquire)
                || slot.flags.any(Ordering::Acquire);
            let fence = barriers && unfenced;
            if !fence && !self.tracing() {
                continue;
            }
            p.note_work_beyond_barriers();
            if fence {
                // What the caches hold waits in the device, for the fence.
                if slot.flags.any(Ordering::Relaxed) {
                    slot.caches.reclaim(&mut p, &slot.clock);
                }
                p.fence_for_work_beyond_barriers(&self.timed(slot), &slot.clock);
            }
        }
    }

    /// The current sequence number of `device`, read before a program synchronization starts.
    /// (The thread caches' epoch moves on only while caches exist: a kernel launch in `barrier`
    /// mode reads this too, and needs no shared write otherwise.)
    pub fn seq_before_sync(&self, device: u32) -> SyncSeq {
        match self.existing(device) {
            None => SyncSeq::default(),
            Some(s) if s.flags.any(Ordering::Acquire) => s.clock.before_sync(),
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
        }
        self.sync_point(device);
    }

    /// The program put an action on `device`'s legacy stream after `at`.
    pub fn observe_barrier(&self, device: u32, at: SyncSeq) {
        if let Some(slot) = self.existing(device) {
            slot.clock.barriered_at(at);
        }
    }

    /// A synchronization the program made on `device`: apply its release threshold, and that
    /// of every other device whose cache is above its own. Memory freed with another device
    /// current, or a threshold lowered from there, goes back at the program's next
    /// synchronization, not only once the program comes back to that device. The other
    /// devices' locks are only tried: the program's synchronization never waits for another
    /// thread's work there, and a device busy now is released at a later release point.
    pub fn sync_point(&self, device: u32) {
        if let Some(slot) = self.existing(device) {
            let mut p = Self::lock(slot);
            slot.caches.sweep_orphans(&mut p, &slot.clock);
            p.sync_point(&self.timed(slot), &slot.clock);
        }
        for d in (0..MAX_DEVICES as u32).filter(|&d| d != device) {
            let Some(slot) = self.existing(d) else {
                continue;
            };
            let Some(mut p) = slot.pool.try_lock() else {
                continue;
            };
            if p.cached() > p.cache_allowance() {
                slot.caches.sweep_orphans(&mut p, &slot.clock);
                p.sync_point(&self.timed(slot), &slot.clock);
            }
        }
    }
}
