//! Allocation across devices: the device's lock or the thread's own cache.

use super::*;

impl<B: Backend> Pool<B> {
    /// Allocate `size` bytes on `device`, the calling thread's current device.
    pub fn alloc(&self, device: u32, size: u64) -> Result<Addr, CudaError> {
        self.alloc_on(device, size, None)
    }

    /// Whether a trace records the pool's decisions: it turns thread caches off, and makes frees
    /// carry what a replay in another mode needs. Off again once its file takes no more records.
    #[inline(always)]
    pub(super) fn tracing(&self) -> bool {
        self.settings.trace.as_ref().is_some_and(|t| t.on())
    }

    /// Whether frees and allocations should name their streams (`StreamKey`): for stream-ordered
    /// reuse (`relaxed`), or for the trace, so that replays in `relaxed` mode can reuse so too.
    pub fn names_streams(&self) -> bool {
        self.settings.reuse == ReuseMode::Relaxed || self.tracing()
    }

    /// Whether a free in stream order needs to say if its stream is blocking: not in `strict`
    /// mode, where every such free waits for a fence, unless a trace records it (a replay in
    /// another mode reads it).
    pub fn tells_blocking(&self) -> bool {
        self.settings.reuse != ReuseMode::Strict || self.tracing()
    }

    /// `alloc` for use on `stream` when there is one: a block freed on that stream (in
    /// `relaxed` mode, or by the runtime's `cudaFreeAsync` in any mode) serves it first, before
    /// a barrier or fence (`DevicePool::alloc_on`); such requests go to the device, not to a
    /// thread cache (whose blocks are not held by stream).
    #[inline(always)]
    pub fn alloc_on(
        &self,
        device: u32,
        size: u64,
        stream: Option<StreamKey>,
    ) -> Result<Addr, CudaError> {
        self.alloc_from(device, size, stream, 0)
    }

    /// `alloc_on`, the block recorded as allocated by `origin` (`Origin`).
    #[inline(always)]
    pub fn alloc_from(
        &self,
        device: u32,
        size: u64,
        stream: Option<StreamKey>,
        origin: Origin,
    ) -> Result<Addr, CudaError> {
        match self.alloc_hit(device, size, stream, origin) {
            Some(addr) => Ok(addr),
            None => self.alloc_general(device, size, stream, origin),
        }
    }

    /// `alloc_from` when the request is not a hit (`hit.rs`).
    #[inline(never)]
    pub fn alloc_general(
        &self,
        device: u32,
        size: u64,
        stream: Option<StreamKey>,
        origin: Origin,
    ) -> Result<Addr, CudaError> {
        let slot = self.slot(device).ok_or(CudaError::INVALID_VALUE)?;
        // A named stream may have blocks held for it: in `relaxed` mode, and in every mode for
        // `cudaMallocAsync` (the only request that names one outside `relaxed` mode, but with a
        // trace, which keeps thread caches off).
        if stream.is_none() && slot.flags.enabled() {
            if let Some(r) = self.alloc_cached(slot, device, size, origin) {
                return r;
            }
        }
        let mut p = Self::lock_to_allocate(slot);
        p.origin = origin;
        if slot.flags.any(Ordering::Relaxed) {
            slot.caches.sweep_orphans(&mut p, &slot.clock);
        }
        let r = p.alloc_on(
            size,
            stream,
            &self.timed(slot),
            &slot.clock,
            &self.settings.policy,
        );
        self.allocated_under_lock(slot, &mut p);
        r
    }

    /// After an allocation under the device's lock: which thread allocates is sampled (every
    /// allocation at first, then one in 64), so that a second thread that allocates often is
    /// seen soon, and one thread pays almost nothing.
    #[inline(always)]
    pub(super) fn allocated_under_lock(&self, slot: &DeviceSlot, p: &mut DevicePool) {
        p.until_sample -= 1;
        if p.until_sample == 0 {
            self.sample_allocation(slot, p);
        }
    }

    /// `allocated_under_lock`'s sampled part, out of line (the contention window is a multiple
    /// of 64 allocations, so its end is always sampled).
    #[inline(never)]
    fn sample_allocation(&self, slot: &DeviceSlot, p: &mut DevicePool) {
        // The allocations served under the lock so far.
        let n = p.next_sample;
        p.next_sample = if n < 1024 { n + 1 } else { (n / 64 + 1) * 64 };
        p.until_sample = p.next_sample - n;
        if slot.flags.second_thread_arrived()
            || std::mem::take(&mut p.trace_dropped)
            || self.caches_due(slot, p)
        {
            self.update_caches(slot, p);
        }
        // Contention is a rate: the count starts over every 65 536 allocations under the lock, so
        // threads that take turns by phases never start caches in a long run.
        if n.is_multiple_of(CONTENTION_WINDOW) {
            p.contention.restart();
        }
    }

    /// Thread caches are off on `slot`'s device only for want of contention, which has come.
    pub(super) fn caches_due(&self, slot: &DeviceSlot, p: &DevicePool) -> bool {
        slot.flags.multi()
            && !slot.flags.enabled()
            && self.settings.reuse != ReuseMode::Relaxed
            && p.contention.reached(
                self.settings.cache_contention,
                slot.backend_ns.load(Ordering::Relaxed),
            )
    }

    /// Whether thread caches may take new blocks on this device, and if not, take back what
    /// they hold. Under the device lock.
    pub(super) fn update_caches(&self, slot: &DeviceSlot, p: &mut DevicePool) {
        let on = slot.flags.multi()
            && (self.settings.reuse == ReuseMode::Relaxed
                || slot.flags.enabled()
                || p.contention.reached(
                    self.settings.cache_contention,
                    slot.backend_ns.load(Ordering::Relaxed),
                ))
            && self.settings.thread_cache > 0
            && !self.tracing()
            && p.threshold == u64::MAX;
        slot.flags.set_enabled(on);
        if !on {
            slot.caches.reclaim(p, &slot.clock);
        }
    }

    /// A small allocation through the calling thread's cache: `None` when the request is not
    /// for it (too large) or the thread has none (it is exiting).
    pub(super) fn alloc_cached(
        &self,
        slot: &DeviceSlot,
        device: u32,
        size: u64,
        origin: Origin,
    ) -> Option<Result<Addr, CudaError>> {
        let rounded = size::round_request(size).filter(|&r| r <= tcache::LIMIT)?;
        slot.caches
            .with_mine(&slot.flags, self.id, device, true, |c| {
                let mut st = c.state.lock();
                if let Some(addr) = st.take_ready(rounded, size, origin) {
                    return Ok(addr);
                }
                // Blocks this thread freed may have become reusable since (a fence or barrier),
                // or this thread holds its share of the fence budget waiting: it fences itself,
                // without the device's lock (and without its cache's: the device may need it
                // meanwhile).
                let mut covered = st.promote(&slot.clock);
                // Enough blocks wait for a barrier, first in line (behind one that waits for a
                // fence, a barrier would make none reusable): a barrier costs no host wait, so
                // the thread takes one (`tcache::BARRIER_BATCH`).
                if !covered
                    && st.front_waits_for() == Some(ReuseWait::Barrier)
                    && st.waiting_bytes - st.waiting_fence_bytes
                        >= (rounded * tcache::BARRIER_BATCH).max(size::SMALL_SEGMENT)
                {
                    (st, covered) = self.sync_for_cache(slot, device, c, st, ReuseWait::Barrier);
                }
                let own = st.waiting_fence_bytes;
                if !covered && own > 0 && own >= self.fence_share(slot) {
                    (st, covered) = self.sync_for_cache(slot, device, c, st, ReuseWait::Fence);
                }
                if covered {
                    c.publish(&st);
                    // What became reusable counts against what the cache keeps: a fence could
                    // otherwise leave a cache holding any amount.
                    let mut spilled = Vec::new();
                    let keep = self.cache_keep(slot);
                    if st.ready_bytes > keep {
                        st.spill_ready(keep, &mut spilled);
                    }
                    let hit = st.take_ready(rounded, size, origin);
                    if !spilled.is_empty() || hit.is_some() {
                        let gen = st.generation;
                        st.send(&spilled);
                        drop(st);
                        if !spilled.is_empty() {
                            Self::receive_from_cache(slot, c, gen, &spilled);
                        }
                        if let Some(addr) = hit {
                            return Ok(addr);
                        }
                        st = c.state.lock();
                    }
                }
                // A miss: one trip to the device serves it and borrows a few ready blocks of
                // this size.
                let room = self.cache_keep(slot).saturating_sub(st.ready_bytes);
                drop(st);
                let extra = tcache::BATCH.min((room / rounded) as usize);
                let mut extras = tcache::Extras::default();
                let mut p = Self::lock(slot);
                slot.caches.sweep_orphans(&mut p, &slot.clock);
                let r = p.alloc_lent(
                    size,
                    &self.timed(slot),
                    &slot.clock,
                    &self.settings.policy,
                    extra,
                    &mut extras,
                );
                let (addr, idx, block) = r?;
                // The cache's lock before the device's goes (lock order: device, then cache):
                // a report, which reads both, never finds the blocks lent and nowhere else, and
                // no reset comes between.
                let mut st = c.state.lock();
                if st.generation != p.generation {
                    st.clear(p.generation);
                }
                drop(p);
                st.hand_out(addr, idx, block, size, origin);
                for (a, i) in extras.iter() {
                    // Extras come from the exact-size bin of the block served.
                    st.push_ready(a, i, block);
                }
                Ok(addr)
            })
    }
}
