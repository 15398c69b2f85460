//! When thread caches keep, give back and fence: their share of the fence budget.

use super::*;

impl<B: Backend> Pool<B> {
    /// The fence budget's share of one thread cache: once its blocks waiting for a fence reach
    /// it, the thread fences itself (the caches together then fence about as often as the
    /// device would).
    pub(super) fn fence_share(&self, slot: &DeviceSlot) -> u64 {
        self.settings.policy.fence_bytes / slot.caches.count().max(1)
    }

    /// The reusable bytes a thread cache keeps: `Settings::thread_cache` in `relaxed` mode, where
    /// a free is reusable at once. Otherwise a thread reuses between two fences only what the
    /// last one made reusable, about its share of the budget, whose sizes follow its frees, not
    /// its next requests: twice the larger of the two, so that a size it frees less often than
    /// it asks for it does not send it to the device's lock (measured: 90-94% of allocations
    /// served by the caches at once the share, 97-98% at twice; BENCHMARKS.md).
    pub(super) fn cache_keep(&self, slot: &DeviceSlot) -> u64 {
        let bound = self.settings.thread_cache;
        if self.settings.reuse == ReuseMode::Relaxed {
            bound
        } else {
            2 * bound.max(self.fence_share(slot).min(MAX_CACHE_SHARE))
        }
    }

    /// Whether the calling thread, whose cache holds its share of the fence budget waiting
    /// (`own` bytes), fences itself now: when the caches together hold the budget (the device's
    /// rule: each fence then covers about a budget, as the device's own do, however the
    /// threads' cycles fall). Not to be called with a cache's lock held (it takes the list's).
    pub(super) fn fence_due(&self, slot: &DeviceSlot, own: u64) -> bool {
        let budget = self.settings.policy.fence_bytes;
        own >= budget || slot.caches.waiting_fence() >= budget
    }

    /// A fence or barrier (`need`) the calling thread takes for its cache `c`, whose lock `st`
    /// it releases meanwhile (the device may need it) and takes again; a fence only if still
    /// due (`fence_due`). Outside the device's lock: blocks freed into caches before it
    /// (every cache's) become reusable, and this cache's are promoted. Returns the lock and
    /// whether any block became reusable here. A failed fence or barrier leaves them waiting.
    pub(super) fn sync_for_cache<'c>(
        &self,
        slot: &DeviceSlot,
        device: u32,
        c: &'c tcache::ThreadCache,
        st: spin::SpinGuard<'c, tcache::CacheState>,
        need: ReuseWait,
    ) -> (spin::SpinGuard<'c, tcache::CacheState>, bool) {
        let own = st.waiting_fence_bytes;
        drop(st);
        let synced = (need == ReuseWait::Barrier || self.fence_due(slot, own))
            .then(|| {
                let at = slot.clock.before_sync();
                let t = std::time::Instant::now();
                let (r, done) = match need {
                    ReuseWait::Fence => (self.backend.fence(device), &slot.clock.cache_fenced),
                    _ => (self.backend.barrier(device), &slot.clock.cache_barriered),
                };
                r.ok()?;
                let ns = t.elapsed().as_nanos() as u64;
                // Caches only: the device, which takes a raised `fenced` or `barriered` for a
                // program synchronization (its summary counts those), keeps its own pending
                // blocks for its own fences and barriers.
                done.fetch_max(at.epoch, Ordering::SeqCst);
                Some(ns)
            })
            .flatten();
        let mut st = c.state.lock();
        let covered = synced.is_some_and(|ns| {
            st.counts.synced(need, ns);
            st.promote(&slot.clock)
        });
        (st, covered)
    }
}
