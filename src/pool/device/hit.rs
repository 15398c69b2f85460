//! One device's part of the hit path (`pool/hit.rs`, with its budget): a request served from
//! the exact-size bin of its size.

use super::*;

impl DevicePool {
    /// `alloc_on` for a small request whose bin holds a block, when no pending block became
    /// reusable since the last operation, no block is held for a stream and no release
    /// threshold is set: the same steps and the same result, without the general path's
    /// branches, and without a call to the backend. `None`, with nothing changed, when the
    /// request is not such a hit.
    #[inline(always)]
    pub fn alloc_hit(
        &mut self,
        requested: u64,
        stream: Option<StreamKey>,
        clock: &ReuseClock,
    ) -> Option<Addr> {
        // With a threshold, `alloc_on` may release segments after serving.
        if requested > SMALL_LIMIT
            || (stream.is_some() && self.held_blocks > 0)
            || self.threshold != u64::MAX
        {
            return None;
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
}
