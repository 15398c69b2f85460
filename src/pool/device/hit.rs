//! One device's part of the hit path (`pool/hit.rs`, with its budget): a request served from
//! the exact-size bin of its size, or from the blocks held for its stream.

use super::*;

impl DevicePool {
    /// `alloc_on` for a request served from the cache without the general path's ladder, when
    /// no pending block became reusable since the last operation and no release threshold is
    /// set: a block held for the request's stream (`serve_held`), else, for a small request, a
    /// block of its exact-size bin. The same steps and the same result as `alloc_on`, without
    /// its branches, and without a call to the backend. `None`, with nothing changed, when the
    /// request is not such a hit.
    #[inline(always)]
    pub fn alloc_hit(
        &mut self,
        requested: u64,
        stream: Option<StreamKey>,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Option<Addr> {
        // With a threshold, `alloc_on` may release segments after serving. The bins' hit tests
        // all at once; the held blocks' is apart.
        if requested > SMALL_LIMIT
            || (stream.is_some() && self.held_blocks > 0)
            || self.threshold != u64::MAX
        {
            let key = stream.filter(|_| self.held_blocks > 0 && self.threshold == u64::MAX)?;
            // `alloc_on`'s first step, then its `serve`'s first.
            if let Some(addr) = self.alloc_held(requested, key, clock, policy) {
                return Some(addr);
            }
            if requested > SMALL_LIMIT {
                return None;
            }
        }
        let fenced = clock.fenced.load(Ordering::Acquire);
        let barriered = clock.barriered.load(Ordering::Acquire);
        if self.promote_due(fenced, barriered) {
            return None;
        }
        // `round_request`, which cannot overflow here; blocks in bin `k` are `(k + 1) * ALIGN`
        // bytes, exactly the rounded request: no split.
        let k = (requested.max(1) - 1) / ALIGN;
        let idx = self.bins[k as usize].pop()?;
        let rounded = (k + 1) * ALIGN;
        debug_assert_eq!(self.blocks[idx as usize].size, rounded);
        self.stream_requests |= stream.is_some();
        self.binned_bytes -= rounded;
        counted! { self.stats.hits += 1; }
        let addr = self.hand_out(idx, requested);
        self.live.insert(addr, idx);
        if self.trace.is_some() {
            let id = stream.map_or(0, |k| self.stream_id(k));
            self.record(Kind::Alloc, requested, addr, rounded, id);
        }
        Some(addr)
    }

    /// `alloc_on`'s request on `stream` served by a block held for it, recorded as `alloc_on`
    /// records it, when no pending block became reusable since the last operation. Out of
    /// line: it is most of a stream-ordered pair's allocation, and the bins' hit stays short.
    #[inline(never)]
    fn alloc_held(
        &mut self,
        requested: u64,
        stream: StreamKey,
        clock: &ReuseClock,
        policy: &Policy,
    ) -> Option<Addr> {
        let fenced = clock.fenced.load(Ordering::Acquire);
        let barriered = clock.barriered.load(Ordering::Acquire);
        if self.promote_due(fenced, barriered) {
            return None;
        }
        let (addr, idx) = self.serve_held(requested, stream, policy)?;
        if self.trace.is_some() {
            let size = self.blocks[idx as usize].size;
            let id = self.stream_id(stream);
            self.record(Kind::Alloc, requested, addr, size, id);
        }
        Some(addr)
    }
}
